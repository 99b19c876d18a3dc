"""policies.py: each model family's adapter on hand-written answers (parsed to the same action,
coordinates within a pixel of the hand-computed ones), the history written back in each family's
format, and the served policy against real HTTP servers on loopback: the project's checkpoint served
by tests/openai_server.py gives the same SOP PG / TSR and static step SR as the in-process policy,
greedy; a wrong --base-url and a server that answers garbage are per-episode errors and the run
still writes its report."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import eval_sop
import gui
import policies
from evaluation import served

sys.path.insert(0, str(Path(__file__).resolve().parent))  # openai_server, rl_checkpoint
from openai_server import Loopback, Reply, completion, dead_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIZE = (980, 2100)  # resized screenshot (W, H): 0-1000 relative (500, 250) is pixel (490, 525)


def parsed(fmt, raw):
    return gui.parse_response(policies.ADAPTERS[fmt].to_response(raw, SIZE))


def close(a, b):
    return all(abs(p - q) <= 1 for p, q in zip(a, b))


CLICKS = {
    "uis1": '<think>\nthe button\n</think>\n<action>\n{"action": "click", "coordinate": [490, 525]}\n</action>',
    "qwen25vl": 'the button\n<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [490, 525]}}'
                '\n</tool_call>',
    "uitars": "Thought: the button\nAction: click(start_box='(500,250)')",
    "agentcpm": '{"thought": "the button", "POINT": [500, 250]}',
}


@pytest.mark.parametrize("fmt", list(CLICKS))
def test_each_family_click_is_the_same_action(fmt):
    p = parsed(fmt, CLICKS[fmt])
    assert p.error is None and p.action["action"] == "click" and close(p.action["coordinate"], (490, 525))
    assert p.thought == "the button"


def test_uitars_forms_and_actions():
    assert close(parsed("uitars", "Action: click(start_box='<|box_start|>(500,250)<|box_end|>')").action["coordinate"],
                 (490, 525))
    assert close(parsed("uitars", "Action: click(start_box='[400, 200, 600, 300]')").action["coordinate"], (490, 525))
    s = parsed("uitars", "Thought: more\nAction: scroll(start_box='(500,500)', direction='down')").action
    assert s["action"] == "swipe" and gui.swipe_direction(s["coordinate"], s["coordinate2"]) == "up"  # content down
    assert parsed("uitars", "Action: type(content='hello')").action == {"action": "type", "text": "hello"}
    assert parsed("uitars", "Action: press_back()").action == {"action": "system_button", "button": "Back"}
    assert parsed("uitars", "Action: open_app(app_name='Maps')").action == {"action": "open", "text": "Maps"}
    assert parsed("uitars", "Action: finished(content='done')").action["action"] == "terminate"
    assert parsed("uitars", "Action: long_press(start_box='(0,1000)')").action == {"action": "long_press",
                                                                                    "coordinate": [0, 2100]}


def test_agentcpm_forms_and_actions():
    s = parsed("agentcpm", '{"thought": "x", "POINT": [500, 500], "to": "up"}').action
    assert s["action"] == "swipe" and gui.swipe_direction(s["coordinate"], s["coordinate2"]) == "up"  # the finger
    s = parsed("agentcpm", '{"POINT": [500, 500], "to": [500, 900]}').action
    assert close(s["coordinate2"], (490, 1890))
    assert parsed("agentcpm", '{"POINT": [500, 250], "duration": 1500}').action["action"] == "long_press"
    assert parsed("agentcpm", '{"TYPE": "hi"}').action == {"action": "type", "text": "hi"}
    assert parsed("agentcpm", '{"PRESS": "HOME"}').action == {"action": "system_button", "button": "Home"}
    assert parsed("agentcpm", '{"STATUS": "finish"}').action["action"] == "terminate"
    assert parsed("agentcpm", 'noise {"duration": 200}').action["action"] == "wait"


@pytest.mark.parametrize("fmt", list(CLICKS))
@pytest.mark.parametrize("raw", ["", "I cannot help", "Action: click(start_box='(a,b)')", '{"POINT": ["x", 1]}',
                                 "<tool_call>{bad json</tool_call>", '{"thought": "x"}'])
def test_malformed_answers_are_wrong_steps_never_errors(fmt, raw):
    assert parsed(fmt, raw).action is None or fmt == "uis1"


@pytest.mark.parametrize("fmt", ["qwen25vl", "uitars", "agentcpm"])
@pytest.mark.parametrize("action", [{"action": "click", "coordinate": [490, 525]},
                                    {"action": "swipe", "coordinate": [490, 1050], "coordinate2": [490, 420]},
                                    {"action": "type", "text": "hello"},
                                    {"action": "system_button", "button": "Back"}])
def test_history_written_in_the_family_format_reads_back(fmt, action):
    a = policies.ADAPTERS[fmt]
    text = a.from_response(gui.format_response("why", action), SIZE)
    assert "<action>" not in text  # the family's own format
    back = gui.parse_response(a.to_response(text, SIZE)).action
    assert back["action"] == action["action"]
    if action["action"] == "click":
        assert close(back["coordinate"], action["coordinate"])
    if action["action"] == "swipe":
        assert gui.swipe_direction(back["coordinate"], back["coordinate2"]) == "up"


# --- real servers on loopback

DATA = str(REPO / "data" / "miniwob" / "train.jsonl")
COMMON = ["--data", DATA, "--limit", "4", "--protocol", "sop", "static", "--max-new-tokens", "48",
          "--max-pixels", "20000", "--system-prompt", "full", "--report-episodes", "1"]


@pytest.fixture(scope="module")
def checkpoint(rl_checkpoint_dir):
    return str(rl_checkpoint_dir)  # rl_checkpoint.py's, fitted to step 0 of the first 2 episodes: PG > 0 greedy


@pytest.fixture(scope="module")
def server(checkpoint):
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "openai_server.py"), "--model", checkpoint],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield f"http://127.0.0.1:{int(line.split()[-1])}/v1"
    proc.terminate()
    proc.wait(timeout=30)


def same_answer(local: str, answer: str, message: dict) -> bool:
    """The served answer is the in-process one; where vLLM's reasoning parser put an answer without </think>
    all in `reasoning` (content null), the <think> it drops (and what came before it) is lost."""
    whole = message.get("content") is None and not message.get("tool_calls") and \
        bool(message.get("reasoning") or message.get("reasoning_content"))
    return answer == (local.partition("<think>")[2] if whole and "<think>" in local else local)


def answers(row: dict) -> tuple[list, list]:
    """(answers, server messages) of an episodes.jsonl row (SOP) or a static_steps.jsonl row."""
    if "responses" in row:
        return row["responses"], row.get("raw_messages", [None] * len(row["responses"]))
    return [row["response"]], [row.get("message")]


def test_served_policy_equals_the_in_process_policy(checkpoint, server, tmp_path, capsys):
    """Served in every shape in turn ("rotate": plain content, transformers serve's reasoning_content, vLLM's
    reasoning / tool parsers, text parts): the same figures, rewards and answers as in process."""
    local = eval_sop.main(COMMON + ["--policy", "model", "--model", checkpoint, "--out", str(tmp_path / "local")])
    served = eval_sop.main(COMMON + ["--policy", "openai", "--base-url", server, "--served-model", "rotate",
                                     "--tokenizer", checkpoint, "--concurrency", "2", "--out", str(tmp_path / "served")])
    with capsys.disabled():  # the figures, for the log (pytest -s)
        print("\nin-process vs served:", json.dumps({k: (local[k], served[k]) for k in
                                                     ("sop_pg", "sop_tsr", "static_step_sr", "static_type_acc",
                                                      "episodes", "steps_run", "static_steps")}))
    assert 0 < local["sop_pg"] < 1  # the fitted first steps are right, the rest are not: a real comparison
    for k in ("sop_pg", "sop_tsr", "static_step_sr", "static_type_acc", "static_steps", "steps_run"):
        assert served[k] == local[k], k
    read = lambda d, f: [json.loads(x) for x in (tmp_path / d / f).read_text().splitlines()]  # noqa: E731
    for f in ("episodes.jsonl", "static_steps.jsonl"):
        got, want = read("served", f), read("local", f)
        rewards = lambda rows: [r["rewards"] if "rewards" in r else r["reward"] for r in rows]  # noqa: E731
        assert rewards(got) == rewards(want), f
        pairs = [(a, b, m) for g, w in zip(got, want) for a, (b, m) in zip(answers(w)[0], zip(*answers(g)))]
        assert len(pairs) == served["steps_run" if f == "episodes.jsonl" else "static_steps"] > 0
        assert all(same_answer(*p) for p in pairs), (f, [p for p in pairs if not same_answer(*p)])
    msgs = [r["message"] for r in read("served", "responses.jsonl")]
    assert len({json.dumps(sorted(k for k, v in m.items() if v is not None)) for m in msgs}) >= 4  # the shapes met
    assert any(m.get("reasoning_content") and isinstance(m["content"], str) for m in msgs)  # a think block split off
    assert served["served"]["failed"] == 0 and served["served"]["requests"] == served["steps_run"] + served["static_steps"]
    assert (tmp_path / "served" / "report.html").is_file()
    # the raw answers re-score offline to the same static matches
    capsys.readouterr()
    eval_sop.main(["score", "--data", DATA, "--responses", str(tmp_path / "served" / "responses.jsonl"), "--subset",
                   "--out", str(tmp_path / "scores.jsonl"), "--max-pixels", "20000"])
    scores = [json.loads(x) for x in (tmp_path / "scores.jsonl").read_text().splitlines()]
    static = read("served", "static_steps.jsonl")
    assert [s["match"] for s in scores[:len(static)]] == [r["match"] for r in static]


def test_wrong_url_and_garbage_server_are_per_episode_errors(tmp_path, capsys):
    args = ["--data", DATA, "--limit", "2", "--protocol", "sop", "static", "--max-pixels", "20000", "--policy", "openai",
            "--served-model", "m", "--model", "tiny", "--retries", "0"]
    args.remove("--model"), args.remove("tiny")
    with Loopback(lambda req: Reply(200, b"<html>not an API</html>")) as garbage:
        for url, why in ((garbage.url, "answered no chat completion"),
                         (f"http://127.0.0.1:{dead_port()}/v1", "no answer from")):
            out = tmp_path / why.replace(" ", "_")
            res = eval_sop.main(args + ["--base-url", url, "--out", str(out)])
            assert res["sop_pg"] == 0 and res["static_step_sr"] == 0
            s = res["served"]
            assert s["episodes_server_error"] == 2 and s["failed"] == s["requests"]
            eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
            assert all(why in e["server_error"] for e in eps)
            assert (out / "report.html").is_file() and (out / "result.json").is_file()
            assert why in capsys.readouterr().err


def flaky(req):
    """503 to the first request of each prompt, then a UI-TARS answer."""
    return Reply(503) if req.n % 2 == 0 else completion("Thought: t\nAction: click(start_box='(500,250)')")


def test_served_sampler_retries_a_503_sends_the_key_and_the_family_prompt(monkeypatch):
    import chat
    from PIL import Image
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    from argparse import Namespace
    msgs = [{"role": "system", "content": [{"type": "text", "text": "ours"}]},
            {"role": "user", "content": [{"type": "text", "text": "goal"}, {"type": "image", "image": Image.new("RGB", SIZE)}]}]
    prompt = chat.Prompt(None, None, None, SIZE, 0, messages=msgs)
    with Loopback(flaky) as srv:
        s = policies.served_sampler(Namespace(base_url=srv.url, served_model="m", action_format="uitars", retries=3,
                                              max_new_tokens=8, concurrency=1, timeout=10.0, temperature=1.0))
        s.backoff = 0.01
        out = s.generate([prompt], n=1, greedy=True)[0][0]
    assert out.finish_reason == "stop" and close(gui.parse_response(out.text).action["coordinate"], (490, 525))
    assert s.stats == {"requests": 2, "retries": 1, "failed": 0, "content_filter": 0, "lone_surrogates": 0}
    seen = [(r.headers.get("Authorization"), r.body["temperature"], r.body["messages"][0]["content"][:11])
            for r in srv.seen]
    assert seen == [("Bearer sk-test", 0.0, "You are a G")] * 2  # UI-TARS's system prompt, greedy
    assert s.raw[id(prompt)] == ("Thought: t\nAction: click(start_box='(500,250)')", None)


def test_served_policy_online_equals_the_in_process_policy(checkpoint, server, capsys):
    """Online MiniWob++ through the server: the same outcomes and response counts as in process (the
    fitted checkpoint's answers on fresh pages are mostly malformed: this checks the path, not skill)."""
    online = ["--online", "--online-tasks", "click-test", "click-button", "--online-seeds", "2", "--online-max-steps", "2",
              "--max-new-tokens", "48", "--max-pixels", "20000", "--system-prompt", "full", "--report-episodes", "0"]
    local = eval_sop.main(online + ["--policy", "model", "--model", checkpoint])
    served = eval_sop.main(online + ["--policy", "openai", "--base-url", server, "--served-model", "transformers",
                                     "--tokenizer", checkpoint])  # the think block in reasoning_content
    with capsys.disabled():
        print("\nonline in-process vs served:", local["online_sr"], served["online_sr"], local["online_mean_steps"],
              served["online_mean_steps"])
    assert served["n_online_episodes"] == local["n_online_episodes"] == 4
    for k in ("online_sr", "online_failures", "online_mean_steps", "malformed_responses", "responses"):
        assert served[k] == local[k], k
    # every online step went through the server (a failed request would also be a malformed no-op)
    assert served["served"]["failed"] == 0 and served["served"]["requests"] == served["responses"] > 0


@pytest.mark.parametrize("budget", [None, 400])  # 400: the oldest turns summarised (the messages after the budget)
def test_sent_messages_rebuild_the_very_prompt(budget):
    """What the served policy sends, decoded as the test server does, is the in-process prompt: the same
    ids (pads expanded) and the same pixels, also when the budget summarised turns."""
    import torch
    from PIL import Image

    import chat
    import vlm
    from openai_server import encode
    tok, ip = vlm.load_processor("tiny", max_pixels=20000)
    spec = chat.PromptSpec(max_pixels=20000, max_prompt_tokens=budget, num_images=2)
    shots = [Image.new("RGB", (168, 224), c) for c in ("red", "green", "blue")]
    hist = [gui.format_response("a", {"action": "click", "coordinate": [5, 6]}),
            gui.format_response("b", {"action": "type", "text": "hi"})]
    p = chat.build_prompt(tok, ip, spec, goal="do it", screenshots=shots, history=hist)
    assert budget is None or p.n_dropped_turns > 0
    q = encode(tok, ip, json.loads(json.dumps(served.openai_messages(p.messages, policies.ADAPTERS["uis1"],
                                                                       p.resized_size))))
    assert torch.equal(q.input_ids, p.input_ids) and torch.equal(q.pixel_values, p.pixel_values)
    assert q.resized_size == p.resized_size

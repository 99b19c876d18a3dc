"""evaluation/served.py, the served model's client: the answer read back from every shape the servers
send (transformers serve's own response template, run; vLLM's reasoning and tool parsers; content "",
null or in parts) is the answer the model wrote; a request is bounded by --timeout in all (a server that
trickles bytes is cut), its retries wait at most 60 s and honour Retry-After; a withheld answer
(content_filter) and a failed request are the server's, never malformed answers of the model's; a lone
surrogate is replaced and counted, through SOP, static and `score`; the prompt contract of the served
checkpoint is read from --prompt-from / --served-model, a disagreeing flag is a one-line error.
Loopback servers, a fake clock for the waits: nothing here sleeps for long."""
import itertools
import json
import socket
import sys
import time
import zlib
from argparse import Namespace
from pathlib import Path

import pytest
from PIL import Image

import chat
import eval_sop
import gui
import policies
import utils
import vlm
from evaluation import served

sys.path.insert(0, str(Path(__file__).resolve().parent))  # openai_server
from openai_server import SHAPES, Loopback, Reply, completion, shape_message  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = str(REPO / "data" / "miniwob" / "train.jsonl")
SIZE = (980, 2100)
TOK, _ = vlm.load_processor("tiny")

CALL = '{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [50, 60]}}'
ANSWERS = {  # (family, the answer as the model wrote it)
    "uis1 think + action": ("uis1", '<think>\nthe button\n</think>\n<action>\n'
                            '{"action": "click", "coordinate": [490, 525]}\n</action>'),
    "uis1 think cut": ("uis1", "<think>\nI click it.\n</action>"),
    "uis1 action alone": ("uis1", '<action>\n{"action": "type", "text": "hi \u00e9"}\n</action>'),
    "qwen thought + call": ("qwen25vl", f"the button\n<tool_call>\n{CALL}\n</tool_call>"),
    "qwen call alone": ("qwen25vl", f"<tool_call>\n{CALL}\n</tool_call>"),
    "qwen think + call": ("qwen25vl", f"<think>\nwhy\n</think>\n<tool_call>\n{CALL}\n</tool_call>"),
    "qwen think + thought + call": ("qwen25vl",
                                    f"<think>\nwhy\n</think>\nthe button\n<tool_call>\n{CALL}\n</tool_call>"),
    "uitars": ("uitars", "Thought: the button\nAction: click(start_box='(500,250)')"),
    "agentcpm": ("agentcpm", '{"thought": "the button", "POINT": [500, 250]}'),
}


def action_of(fmt, raw):
    return gui.parse_response(policies.ADAPTERS[fmt].to_response(raw, SIZE)).action


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", list(ANSWERS))
def test_every_server_shape_reads_back_to_the_models_answer(name, shape):
    """transformers serve (its Qwen template run), vLLM's parsers, parts: the answer read back parses to the
    action of the text the model wrote; where the format is the families' own (one newline between the
    parts), it is that very text. The answer read from `content` alone (what was done before) loses it."""
    fmt, text = ANSWERS[name]
    message, finish = shape_message(text, "stop", shape, TOK)
    back = served.answer_text(json.loads(json.dumps(message)))
    assert finish in served.FINISH and served.FINISH[finish] == "stop"
    assert action_of(fmt, back) == action_of(fmt, text)
    vllm_reasoning = shape in ("vllm-reasoning", "vllm-reasoning-new", "vllm-both")
    unsure = vllm_reasoning and "<think>" in text and "</think>" not in text
    if fmt in ("uis1", "qwen25vl") and not unsure:  # vLLM: no </think>, all is reasoning; a <think> is dropped
        assert back == text, (message, back)
    if shape == "transformers" and ("think" in name or "call" in name):
        assert message["content"] != text  # `content` alone is not what the model wrote
        assert "call" not in name or action_of(fmt, message["content"]) is None  # and loses a tool call's action


def test_reader_by_hand():
    a = served.answer_text
    assert a({"content": None}) == "" and a({"content": "x"}) == "x"
    assert a({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "ab"
    assert a({"content": "", "reasoning_content": "r\n"}) == "<think>\nr"  # transformers, no </think>: an open block
    assert a({"content": None, "reasoning": "r\n", "tool_calls": []}) == "r\n"  # vLLM, no </think>: as it came
    call = {"type": "function", "function": {"name": "mobile_use", "arguments": {"action": "wait"}}}  # an object
    assert a({"content": "", "tool_calls": [call]}) == \
        '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "wait"}}\n</tool_call>'
    bad = {"type": "function", "function": {"name": "mobile_use", "arguments": '{"action": "click", '}}  # not JSON
    text = a({"content": None, "tool_calls": [bad]})
    assert "<tool_call>" in text and action_of("qwen25vl", text) is None  # the model's malformed answer, no crash
    assert a({"content": None, "refusal": "I can't"}) == "I can't"
    for broken in ({"content": 3}, {"content": "", "tool_calls": {"a": 1}}, {"tool_calls": [{"function": {}}]}, []):
        with pytest.raises(served.ServerError):
            a(broken)


def test_clean_text_replaces_lone_surrogates_and_joins_pairs():
    assert served.clean_text("a\ud83db") == ("a\ufffdb", 1)
    assert served.clean_text("\udc00x\ud800") == ("\ufffdx\ufffd", 2)
    assert served.clean_text("\ud83d\ude00") == ("\U0001F600", 0)  # a pair spelled as two code points: the emoji
    assert served.clean_text("plain \u00e9") == ("plain \u00e9", 0)
    assert served.clean_text(json.loads('"\\ud83d"'))[0].encode("utf-8") == b"\xef\xbf\xbd"


# --- loopback servers


def sampler(url, fmt="uis1", **kw):
    args = dict(base_url=url, served_model="m", action_format=fmt, max_new_tokens=8, concurrency=1, timeout=10.0,
                retries=0, temperature=1.0)
    return policies.served_sampler(Namespace(**{**args, **kw}))


def one_prompt():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "goal"},
                                         {"type": "image", "image": Image.new("RGB", SIZE)}]}]
    return chat.Prompt(None, None, None, SIZE, 0, messages=msgs)


def trickle(where):
    """Answers one byte every 0.05 s, forever: in the headers (`where` "headers") or in the body."""
    def chunks(req):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"
        if where == "body":
            yield head + b"\r\n"
            head = b'{"choices": [{"message": {"content": "' + b"x" * 99000
        for i in range(len(head)):
            yield head[i:i + 1]
            time.sleep(0.05)
    return chunks


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_server_cannot_hold_a_request_past_the_timeout(where):
    with Loopback(trickle(where)) as srv:
        s = sampler(srv.url, timeout=0.5)
        t0 = time.monotonic()
        out = s.generate([one_prompt()])[0][0]
        took = time.monotonic() - t0
    assert out.finish_reason.startswith("error: no complete answer") and "within --timeout 0.5 s" in out.finish_reason
    assert took < 1.5, took  # a socket timeout alone: each byte arrives in time, the request never ends
    assert s.stats["failed"] == 1


@pytest.mark.parametrize("after, retries, waits", [
    (None, 9, [1, 2, 4, 8, 16, 32, 60, 60, 60]),  # doubling, capped at 60 s (uncapped: 256 s at the 9th)
    ("7", 3, [7, 7, 7]), ("2.5", 1, [2.5]), ("86400", 2, [60, 60]),  # the server's wait, capped too
    ("Wed, 21 Oct 2026 07:28:00 GMT", 3, [1, 2, 4]),  # a date: not read, the backoff's
])
def test_backoff_is_capped_and_honours_retry_after(after, retries, waits):
    busy = Reply(503, headers={} if after is None else {"Retry-After": after})  # always
    with Loopback(lambda req: busy) as srv:
        s = sampler(srv.url, retries=retries)
        slept = []
        s.sleep = slept.append  # a fake clock: the waits are recorded, not slept
        out = s.generate([one_prompt()])[0][0]
    assert slept == waits and out.finish_reason.startswith("error: HTTP 503")
    assert s.stats["requests"] == retries + 1 and s.stats["retries"] == retries and s.stats["failed"] == 1


def canned(answers, finish="stop"):
    """A server answering each request with one of `answers` (chosen by the CRC of its messages, so the same
    prompt gets the same answer whatever the order), in the shape its "model" names ("rotate": the next one),
    with `finish`."""
    rotation = itertools.cycle(SHAPES)

    def answer(req):
        text = answers[zlib.crc32(json.dumps(req.body["messages"]).encode()) % len(answers)]
        shape = next(rotation) if req.body["model"] == "rotate" else req.body["model"]
        return completion(*shape_message(text, finish, shape, TOK))
    return Loopback(answer)


RUN = ["--data", DATA, "--limit", "3", "--protocol", "sop", "static", "--max-pixels", "20000", "--policy", "openai",
       "--retries", "0", "--report-episodes", "1"]
read = lambda d, f: [json.loads(x) for x in (d / f).read_text().splitlines()]  # noqa: E731


def test_tool_call_shapes_score_as_the_plain_answer(tmp_path, capsys):
    """Qwen2.5-VL tool-call answers (some with a think block) served plain and served in every shape in turn
    (transformers' tool_calls with content "", vLLM's with content null, ...): the same responses, rewards,
    SOP and static figures, so the same history sent back; none malformed, none a server error."""
    answers = [f"<think>\nwhy\n</think>\n<tool_call>\n{CALL}\n</tool_call>", f"<tool_call>\n{CALL}\n</tool_call>",
               f"the button\n<tool_call>\n{CALL}\n</tool_call>",
               '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "type", "text": "a"}}\n</tool_call>']
    res = {}
    with canned(answers) as srv:
        for model in ("plain", "rotate"):  # concurrency 1: one order of shapes
            res[model] = eval_sop.main(RUN + ["--base-url", srv.url, "--served-model", model, "--action-format",
                                              "qwen25vl", "--concurrency", "1", "--out", str(tmp_path / model)])
    for k in ("sop_pg", "sop_tsr", "static_step_sr", "static_type_acc", "step_reward_mean", "malformed_responses"):
        assert res["rotate"][k] == res["plain"][k], k
    assert res["plain"]["malformed_responses"] == 0 and res["rotate"]["served"]["failed"] == 0
    for f, key in (("episodes.jsonl", "responses"), ("static_steps.jsonl", "response"),
                   ("static_steps.jsonl", "reward")):
        assert [r[key] for r in read(tmp_path / "rotate", f)] == [r[key] for r in read(tmp_path / "plain", f)]
    msgs = [r["message"] for r in read(tmp_path / "rotate", "responses.jsonl")]
    assert any(m.get("tool_calls") and m["content"] == "" for m in msgs)  # transformers serve
    assert any(m.get("tool_calls") and m["content"] is None for m in msgs)  # vLLM's hermes parser
    assert any(m.get("reasoning") for m in msgs) and any(m.get("reasoning_content") for m in msgs)


def test_content_filter_is_the_servers_never_a_malformed_answer(tmp_path, capsys):
    with canned(['<think>\nx\n</think>\n<action>\n{"action": "wait"}\n</action>'], finish="content_filter") as srv:
        res = eval_sop.main(RUN + ["--base-url", srv.url, "--served-model", "plain", "--out", str(tmp_path)])
    s = res["served"]
    assert s["content_filter"] == s["failed"] == s["requests"] == res["responses"] > 0 and s["retries"] == 0, (s, res)
    assert res["malformed_responses"] == 0 and s["episodes_server_error"] == res["episodes"] == 3
    assert all("content_filter" in r["error"] for r in read(tmp_path, "static_steps.jsonl"))
    assert "content_filter" in capsys.readouterr().err


def test_a_lone_surrogate_runs_through_sop_static_and_score(tmp_path, capsys):
    """'\\ud83d' alone in an answer: SOP's next prompt, static's report.html and `score` used to crash on it."""
    right = '<think>\nhi \ud83d\n</think>\n<action>\n{"action": "type", "text": "x\ud83d"}\n</action>'
    with canned([right]) as srv:
        res = eval_sop.main(RUN + ["--base-url", srv.url, "--served-model", "transformers",
                                   "--out", str(tmp_path / "run")])
    assert res["served"]["lone_surrogates"] == 2 * res["responses"] > 0 and res["served"]["failed"] == 0
    assert (tmp_path / "run" / "report.html").is_file()
    assert all("\ufffd" in r["response"] for r in read(tmp_path / "run", "static_steps.jsonl"))
    capsys.readouterr()
    rows = tmp_path / "responses.jsonl"
    rows.write_text("\n".join(json.dumps({"episode_id": r["episode_id"], "step": r["step"], "response": right})
                              for r in read(tmp_path / "run", "responses.jsonl")) + "\n")
    out = eval_sop.main(["score", "--data", DATA, "--responses", str(rows), "--subset", "--out",
                         str(tmp_path / "scores.jsonl"), "--max-pixels", "20000"])
    assert out["lone_surrogates"] == 2 * out["responses"]
    assert len(read(tmp_path, "scores.jsonl")) == out["responses"]  # every row written


# --- the prompt contract of a served checkpoint

CONTRACT = {"system_prompt": "short", "max_pixels": 20000, "num_images": 1}


@pytest.fixture()
def run_folder(tmp_path):
    """A run folder as train_sft.py leaves it, as far as the contract goes: ckpt/latest -> a step with args.json."""
    ckpt = tmp_path / "ckpt" / "step_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "args.json").write_text(json.dumps({"prompt": CONTRACT}))
    (tmp_path / "ckpt" / "latest").write_text("step_000003")
    return tmp_path / "ckpt"


def parse(argv):
    p = eval_sop.sop_parser()
    args = p.parse_args(["--data", DATA, "--policy", "openai", "--base-url", "http://x/v1"] + argv)
    eval_sop.check_flags(p, args, argv + ["--data", DATA, "--policy", "openai", "--base-url", "http://x/v1"])
    return args


def test_the_contract_comes_from_prompt_from_or_the_served_folder(run_folder, capsys):
    for argv in (["--served-model", "m", "--prompt-from", str(run_folder)], ["--served-model", str(run_folder)],
                 ["--served-model", "m", "--prompt-from", str(run_folder / "step_000003"), "--num-images", "1"]):
        args = parse(argv)
        spec = served.prompt_spec(args, say=lambda s: None)
        assert spec == chat.PromptSpec(**CONTRACT) and args.prompt_from == str(run_folder / "step_000003"), argv
    args = parse(["--served-model", "m"])
    assert served.prompt_spec(args, say=lambda s: None) == chat.PromptSpec() and args.prompt_from is None
    assert "--prompt-from" in capsys.readouterr().err  # a uis1 run without a contract is said


@pytest.mark.parametrize("argv, msg", [
    (["--system-prompt", "full"], "--system-prompt full: the served checkpoint's prompt contract has short"),
    (["--max-pixels", "40000"], "--max-pixels 40000: the served checkpoint's prompt contract has 20000"),
])
def test_a_flag_against_the_served_contract_is_an_error(run_folder, argv, msg):
    args = parse(["--served-model", "m", "--prompt-from", str(run_folder)] + argv)
    with pytest.raises(utils.UsageError, match=msg):
        served.prompt_spec(args, say=lambda s: None)


def test_prompt_from_needs_args_json_and_the_served_policy(tmp_path):
    with pytest.raises(utils.UsageError, match="no args.json"):
        served.prompt_spec(parse(["--served-model", "m", "--prompt-from", str(tmp_path)]), say=lambda s: None)
    p = eval_sop.sop_parser()
    argv = ["--data", DATA, "--policy", "model", "--prompt-from", str(tmp_path)]
    with pytest.raises(utils.UsageError, match="--prompt-from"):
        eval_sop.check_flags(p, p.parse_args(argv), argv)


def test_the_served_run_uses_and_records_the_contract(run_folder, tmp_path, capsys):
    with canned(['<think>\nx\n</think>\n<action>\n{"action": "wait"}\n</action>']) as srv:
        res = eval_sop.main(["--data", DATA, "--limit", "1", "--policy", "openai", "--base-url", srv.url,
                             "--served-model", "plain", "--prompt-from", str(run_folder), "--out", str(tmp_path / "run")])
    seen = [r.body for r in srv.seen]
    assert seen and all(b["messages"][0]["content"][0]["text"] == chat.SHORT_SYSTEM_PROMPT for b in seen)
    assert all(sum(c["type"] == "image_url" for m in b["messages"] for c in m["content"] if isinstance(c, dict)) == 1
               for b in seen)  # num_images 1
    saved = json.loads((tmp_path / "run" / "result.json").read_text())["served"]
    assert saved["prompt_from"] == str(run_folder / "step_000003")
    assert {k: saved["prompt_contract"][k] for k in CONTRACT} == CONTRACT and res["served"]["failed"] == 0


def test_socket_is_shut_at_the_deadline_even_if_opened_after_it():
    w = served._Sockets()
    w.cut()
    a, b = socket.socketpair()
    w.add(a)  # shut on arrival: the deadline has passed
    assert a.recv(1) == b""
    a.close(), b.close()

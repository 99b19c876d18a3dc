"""eval_sop.py: expert replay under the SOP protocol, PG/TSR by hand, and the `score` subcommand."""

import json
import re
from pathlib import Path

import pytest
import torch

import dataset
import eval_sop
import gui
import policies
from evaluation import metrics
from sampler import SampleOutput
from vlm import load_processor

DATA = Path(__file__).resolve().parent.parent / "data" / "android_control"
FILES = [DATA / "android_control_test_uis1.jsonl", DATA / "android_control_train_example_uis1.jsonl",
         DATA / "thought_example_uis1.jsonl", DATA / "android_control_test_native_steps.json"]
FAST = ["--blank-screens", "1080x2400", "--max-pixels", "50176"]  # full-size blanks, small images to a model


def last_json(capsys):
    """The summary printed by eval_sop.py --json: the last stdout line."""
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_sop_metrics_by_hand():
    # episodes: 2 of 4 right, 3 of 3, 0 of 5 -> PG = (0.5 + 1 + 0) / 3 = 0.5, TSR = 1/3
    m = metrics.sop_metrics([(2, 4), (3, 3), (0, 5)])
    assert m == {"pg": pytest.approx(0.5), "tsr": pytest.approx(1 / 3), "episodes": 3, "steps": 12}


def test_expert_replay_is_perfect_on_every_real_file(capsys):
    argv = ["--data", *map(str, FILES), "--limit", "12", *FAST, "--json"]
    s = eval_sop.main(argv)
    assert last_json(capsys) == s
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["episodes"] == 12 * 3 + 1
    assert s["steps"] == s["steps_run"] == sum(len(e.steps) for f in FILES for e in dataset.load_episodes(f, limit=12))
    for f in FILES:
        assert s["sources"][str(f)]["pg"] == 1.0 and s["sources"][str(f)]["tsr"] == 1.0
    assert s["step_reward_mean"] == pytest.approx(0.9)  # expert responses carry an empty think block


class PromptReadingExpert:
    """A "model" that reads its real prompt: the episode from the goal line, the step from the
    summarised turns ("Earlier steps: N") plus the assistant turns, and answers the expert action."""

    def __init__(self, tokenizer, episodes):
        self.model = torch.nn.Linear(1, 1)  # lent to sampling_mode; no config: no context cap
        self.tok, self.by_goal = tokenizer, {e.goal: e for e in episodes}

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        outs = []
        for p in prompts:
            text = self.tok.decode(p.input_ids.tolist())
            ep = self.by_goal[re.search(r"Task goal: (.*)", text).group(1)]
            summarised = re.search(r"Earlier steps: (\d+)", text)
            t = text.count("<|im_start|>assistant") - 1 + (int(summarised.group(1)) if summarised else 0)
            resp = gui.expert_response(ep.steps[t], (1080, 2400), p.resized_size)
            outs.append([SampleOutput([0], resp, torch.zeros(1), "stop", len(outs))] * (n if isinstance(n, int) else n[len(outs)]))
        return outs


def test_prompts_survive_the_budget(capsys, monkeypatch):
    # longest histories of the train file, with a budget that forces summaries: still every step right
    eps = dataset.load_episodes(FILES[1], limit=12)
    fake = PromptReadingExpert(load_processor()[0], eps)
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: fake)
    s = eval_sop.main(["--data", str(FILES[1]), "--limit", "12", *FAST, "--max-prompt-tokens", "700", "--system-prompt", "full",
                       "--step-instruction", "--policy", "model"])
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["prompts_budgeted"] > 0 and s["max_prompt_tokens_seen"] <= 700
    assert s["prompts_over_budget"] == 0 and s["responses"] == s["steps_run"] == s["steps"]


def test_sop_stops_at_the_first_wrong_step(capsys, monkeypatch, tmp_path):
    calls, expert = [], eval_sop.expert_policy

    def wrong_at_step_1(prompt):
        calls.append(prompt.step_idx)
        if prompt.step_idx == 1:
            return gui.format_response("no", {"action": "answer", "text": "nothing"})  # no expert answers here
        return expert(prompt)

    monkeypatch.setattr(eval_sop, "expert_policy", wrong_at_step_1)
    out = tmp_path / "episodes.jsonl"
    s = eval_sop.main(["--data", str(FILES[1]), *FAST, "--out", str(out)])
    lengths = [len(e.steps) for e in dataset.load_episodes(FILES[1])]
    # each episode: step 0 right, step 1 wrong -> 1 correct (an episode of 1 step is fully right)
    assert s["pg"] == pytest.approx(sum(min(1, n) / n for n in lengths) / len(lengths))
    assert s["tsr"] == pytest.approx(sum(n == 1 for n in lengths) / len(lengths))
    assert s["steps_run"] == sum(min(2, n) for n in lengths) == len(calls)  # nothing after the error
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["correct"] for r in rows] == [1] * len(lengths)
    assert all(r["rewards"][1] == pytest.approx(0.19) for r in rows if len(r["rewards"]) > 1)  # wrong type


def test_missing_screenshots_are_an_error_without_blank_screens():
    with pytest.raises(FileNotFoundError, match="--blank-screens"):
        eval_sop.main(["--data", str(FILES[2])])


# -----------------------------------------------------------------------------
# score subcommand


def test_score_subcommand(tmp_path, capsys):
    ep = dataset.load_episodes(FILES[1])[0]  # line-1: open, wait, click [540, 390] in bbox [360, 327, 695, 466], terminate
    orig, resized = (1080, 2400), gui.resized_size((1080, 2400))
    lines = [
        {"episode_id": "line-1", "step": 0, "response": gui.expert_response(ep.steps[0], orig, resized, "go")},  # 1.0
        {"episode_id": "line-1", "step": 1, "response": gui.format_response("", {"action": "wait"})},           # 0.9
        # click at resized (1000, 2000) -> original (989, 1993): outside the box, far from (540, 390): 0.1 + 0.45
        {"episode_id": "line-1", "step": 2, "response": gui.format_response("hm", {"action": "click", "coordinate": [1000, 2000]})},
        {"episode_id": "line-1", "step": 3, "response": "<think>done</think><action>{bad json</action>"},        # 0
    ]
    rfile, ofile = tmp_path / "r.jsonl", tmp_path / "out" / "s.jsonl"
    rfile.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = eval_sop.main(["score", "--data", str(FILES[1]), "--responses", str(rfile), "--out", str(ofile),
                       "--image-size", "1080x2400", "--subset"])
    assert last_json(capsys) == s
    assert s["steps_scored"] == 4 and s["steps_unscored"] == 202 and s["steps_total"] == 206
    rows = [json.loads(x) for x in ofile.read_text().splitlines()]
    assert [r["reward"] for r in rows] == pytest.approx([1.0, 0.9, 0.55, 0.0])
    assert [r["match"] for r in rows] == [True, True, False, False]
    assert [r["type_match"] for r in rows] == [True, True, True, False]
    assert [(r["episode_id"], r["step"]) for r in rows] == [("line-1", t) for t in range(4)]
    assert rows[2]["action"] == {"action": "click", "coordinate": [989, 1993]}
    assert s["responses"] == 4 and s["reward_mean"] == pytest.approx(2.45 / 4) and s["match_rate"] == 0.5


@pytest.mark.parametrize("line, extra, match", [
    ({"episode_id": "nope", "step": 0, "response": ""}, ["--image-size", "1080x2400"], "line 1: field 'episode_id'"),
    ({"episode_id": "line-1", "step": 4, "response": ""}, ["--image-size", "1080x2400"], "line 1: field 'step'"),
    ({"episode_id": "line-1", "step": 0, "response": ""}, [], "records no screenshot size"),
])
def test_score_errors(tmp_path, line, extra, match):
    rfile = tmp_path / "r.jsonl"
    rfile.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=match):
        eval_sop.main(["score", "--data", str(FILES[1]), "--responses", str(rfile), "--out", str(tmp_path / "s.jsonl"),
                       "--subset", *extra])


# -----------------------------------------------------------------------------
# malformed, truncated and looping responses: strict vs the release's rules, SOP PG by hand

# three episodes: E1 click, type, Back, wait (4 steps); E2 Back, click (2); E3 click, wait, click, type, Back (5)
_C = lambda x, y: {"action": "click", "coordinate": [x, y]}  # noqa: E731
_EPISODES = [
    [_C(540, 1200), {"action": "type", "text": "hello"}, {"action": "system_button", "button": "Back"},
     {"action": "wait", "time": 2}],
    [{"action": "system_button", "button": "Back"}, _C(100, 300)],
    [_C(200, 400), {"action": "wait", "time": 2}, _C(900, 2000), {"action": "type", "text": "bye"},
     {"action": "system_button", "button": "Back"}],
]


def _defect(kind):
    """A policy: the expert everywhere, except the defect `kind` at step 2 (or at every wait step).
    Returns StepPrompt -> (response text, finish_reason)."""
    def policy(p):
        good = gui.expert_response(p.step, p.orig_size, p.resized_size, thought="go")
        if kind == "coordinate null on a wait":
            if p.step.action["action"] == "wait":
                return good.replace('"action": "wait"', '"action": "wait", "coordinate": null'), "stop"
            return good, "stop"
        if p.step_idx != 2:
            return good, "stop"
        return {"malformed": (good.replace("</action>", ""), "stop"),            # no closing tag
                "truncated": (good[:len(good) // 2], "length"),                  # cut mid-action at the cap
                "looping": ((good + "\n") * 3, "length"),                        # its right action, again and again
                "second action": (good + "\n" + gui.format_response("x", {"action": "wait"}), "stop"),
                "quoted in the thought": (good.replace("<think>\ngo", '<think>\nnot <action>{"action": "wait"}</action>'),
                                          "stop")}[kind]
    return policy


class _Scripted:
    prompt_builder = policies.StepPrompts

    def __init__(self, policy):
        self.policy = policy

    def generate(self, prompts, n=1, greedy=True, seeds=None):
        outs = []
        for i, p in enumerate(prompts):
            text, reason = self.policy(p)
            outs.append([SampleOutput([0], text, torch.zeros(1), reason, i)] * (n if isinstance(n, int) else n[i]))
        return outs


# strict: E1 2/4, E2 2/2, E3 2/5 -> PG (0.5 + 1 + 0.4) / 3 = 0.6333, TSR 1/3.
# release: a raise zeroes its episode -> PG (0 + 1 + 0) / 3 = 0.3333; a well-formed response it reads is right.
@pytest.mark.parametrize("kind, strict, release, raised", [
    ("malformed", (1.9 / 3, 1 / 3), (1 / 3, 1 / 3), 2),
    ("truncated", (1.9 / 3, 1 / 3), (1 / 3, 1 / 3), 2),
    ("looping", (1.9 / 3, 1 / 3), (1.0, 1.0), 0),                 # the release reads the first action: right
    ("second action", (1.9 / 3, 1 / 3), (1.0, 1.0), 0),
    ("coordinate null on a wait", (1.0, 1.0), (1 / 3, 1 / 3), 2),  # E1 raises at step 3, E3 at step 1: 0, 1, 0
    ("quoted in the thought", (1.0, 1.0), (1.9 / 3, 1 / 3), 0),    # the release reads the quoted wait: wrong
])
def test_sop_strict_and_release_by_hand(tmp_path, monkeypatch, kind, strict, release, raised):
    data = tmp_path / "eps.jsonl"
    data.write_text("".join(json.dumps({"goal": f"g{i}", "episode_id": f"e{i}", "steps": [
        {"action_content": a, "screenshot": "none.png"} for a in acts]}) + "\n" for i, acts in enumerate(_EPISODES)))
    monkeypatch.setattr(eval_sop, "ExpertSampler", lambda: _Scripted(_defect(kind)))
    for rules, (pg, tsr) in (("strict", strict), ("release", release)):
        s = eval_sop.main(["--data", str(data), "--blank-screens", "1080x2400", "--match-rules", rules])
        assert (s["pg"], s["tsr"]) == (pytest.approx(pg), pytest.approx(tsr)), rules
        assert s["sop_episodes_raised"] == (raised if rules == "release" else None)
        cut = kind in ("truncated", "looping")  # step 2 of E1 and E3 (2 of the walked responses)
        assert s["truncated_rate"] == pytest.approx(2 / s["steps_run"] if cut else 0.0)


def test_static_release_rules_count_a_raise_as_a_wrong_step(tmp_path, monkeypatch):
    # every wait carries "coordinate": null: strict ignores the key (11/11 right); the release raises on
    # both waits (E1 step 3, E3 step 1): 9/11 steps right, and a raise is no type match either
    data = tmp_path / "eps.jsonl"
    data.write_text("".join(json.dumps({"goal": f"g{i}", "episode_id": f"e{i}", "steps": [
        {"action_content": a, "screenshot": "none.png"} for a in acts]}) + "\n" for i, acts in enumerate(_EPISODES)))
    monkeypatch.setattr(eval_sop, "ExpertSampler", lambda: _Scripted(_defect("coordinate null on a wait")))
    base = ["--data", str(data), "--blank-screens", "1080x2400", "--protocol", "static"]
    s = eval_sop.main(base)
    assert s["static_step_sr"] == 1.0 and s["static_type_acc"] == 1.0
    s = eval_sop.main(base + ["--match-rules", "release"])
    assert s["static_step_sr"] == pytest.approx(9 / 11) and s["static_type_acc"] == pytest.approx(9 / 11)

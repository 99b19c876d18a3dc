"""eval_sop.py --online --samples K: greedy success, pass@K and the flippable fraction. A stand-in for
miniwob_env.evaluate_online (one-step episodes, no browser) and a scripted sampler whose sampled
answers differ from its greedy ones, fixed by the per-prompt seeds, give counts checked by hand; K = 1
is one sampled run; a seeded rerun of the real tiny model repeats every response; one short test in
a real browser."""

import json
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

import utils
import eval_sop
import gui
from envs import miniwob_env
from sampler import SampleOutput

A, B = "click-test", "click-button"
RIGHT = gui.format_response("go", {"action": "click", "coordinate": [5, 5]})
WRONG = gui.format_response("wait", {"action": "wait", "time": 1})
SMALL = ["--max-pixels", "20000", "--report-episodes", "0"]
T = 0.7


class FlipSampler:
    """answer(task, seed, play, t) -> text, play None for a greedy call, else the sampled play j the
    prompt's seed belongs to (found by inverting eval_sop.play_seed; an unknown seed is an error). The
    stand-in env's goal names the episode; in a real browser the greedy answer gets (None, None)."""

    def __init__(self, tokenizer, answer, tasks, seeds, plays=4, steps=2, base=0):
        self.model = torch.nn.Linear(1, 1)  # sampling_mode needs a module
        self.tok, self.answer, self.temperature = tokenizer, answer, 0.25
        self.of_seed = {eval_sop.play_seed(base, task, s, j, t): (task, s, j, t)
                        for task in tasks for s in seeds for j in range(plays) for t in range(steps)}
        self.calls = []

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        assert n == 1 and (greedy == (seeds is None))
        self.calls.append((greedy, len(prompts), self.temperature))
        outs = []
        for i, p in enumerate(prompts):
            m = re.search(r"Task goal: reach (\S+) (\d+)", self.tok.decode(p.input_ids.tolist()))
            key = (m.group(1), int(m.group(2))) if m else (None, None)
            if greedy:
                text = self.answer(*key, None, None)
            else:
                task, s, j, t = self.of_seed[seeds[i]]
                assert m is None or (task, s) == key  # the seed is that episode's
                text = self.answer(task, s, j, t)
            outs.append([SampleOutput([0], text, torch.zeros(1), "stop", i)])
        return outs


def stand_in(policy, tasks, seeds, max_steps=15, *, batch_size=1, **kw):
    """evaluate_online without a browser: one-step episodes in task, then seed order, batch_size at a
    time in one policy call; a click succeeds, anything else fails."""
    keys = [(t, s) for t in tasks for s in seeds]
    eps = []
    for lo in range(0, len(keys), batch_size):
        chunk = keys[lo:lo + batch_size]
        obs = [{"task": t, "seed": s, "goal": f"reach {t} {s}", "screenshot": Image.new("RGB", (168, 224), "white"),
                "elements": "", "history": []} for t, s in chunk]
        for (t, s), a in zip(chunk, policy(obs, [0] * len(chunk))):
            ok = isinstance(a, dict) and a["action"] == "click"
            eps.append({"task": t, "seed": s, "success": ok, "steps": 1, "cause": "success" if ok else "wrong_action"})

    def summary(es):
        return {"episodes": len(es), "success_rate": sum(e["success"] for e in es) / max(len(es), 1),
                "mean_steps": 1.0, "failures": {c: sum(e["cause"] == c for e in es) for c in miniwob_env.CAUSES}}
    return {"per_task": {t: summary([e for e in eps if e["task"] == t]) for t in tasks}, "overall": summary(eps),
            "episodes": eps}


@pytest.fixture(scope="module")
def tokenizer():
    from vlm import load_processor
    return load_processor()[0]


# greedy succeeds on A0 and B1; the sampled plays that succeed:
GREEDY_OK = {(A, 0), (B, 1)}
SAMPLE_OK = {(A, 0, 1), (A, 1, 2), (B, 0, 0), (B, 0, 2), (B, 2, 1)}


def table(task, seed, play, t):
    return RIGHT if ((task, seed) in GREEDY_OK if play is None else (task, seed, play) in SAMPLE_OK) else WRONG


def run(monkeypatch, tokenizer, answer, argv):
    fake = FlipSampler(tokenizer, answer, [A, B], [0, 1, 2])
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: fake)
    monkeypatch.setattr(miniwob_env, "evaluate_online", stand_in)
    return eval_sop.main(["--policy", "model", "--online", "--online-tasks", A, B, "--online-seeds", "3",
                          "--online-seed-base", "0", "--online-max-steps", "1", *SMALL, *argv]), fake


def counts(c):
    return {name: (c[name]["successes"], c[name]["n"]) for name in ("greedy", "pass_at_k", "flippable", "sampled_sr")}


@pytest.mark.parametrize("batch", [1, 4])
def test_flippable_counts_by_hand(monkeypatch, capsys, tokenizer, tmp_path, batch):
    """A: greedy A0; samples hit A0 (play 1) and A1 (play 2): pass@3 2/3, flippable A1 1/3, 2 of 9 plays.
    B: greedy B1; samples hit B0 (plays 0, 2) and B2 (play 1), never B1: pass@3 2/3, flippable B0, B2 2/3.
    The same at any --online-batch: each prompt's seed is its episode's, play's and step's."""
    s, fake = run(monkeypatch, tokenizer, table, ["--samples", "3", "--temperature", str(T),
                                                   "--online-batch", str(batch), "--out", str(tmp_path)])
    sm = s["online_sampled"]
    assert (sm["samples"], sm["temperature"], sm["sample_seed"]) == (3, T, 0)
    assert counts(sm["per_task"][A]) == {"greedy": (1, 3), "pass_at_k": (2, 3), "flippable": (1, 3), "sampled_sr": (2, 9)}
    assert counts(sm["per_task"][B]) == {"greedy": (1, 3), "pass_at_k": (2, 3), "flippable": (2, 3), "sampled_sr": (3, 9)}
    assert counts(sm["pooled"]) == {"greedy": (2, 6), "pass_at_k": (4, 6), "flippable": (3, 6), "sampled_sr": (5, 18)}
    # Wilson 95% of 3/6 by hand: centre 0.5, half-width 1.96 sqrt(0.25/6 + 1.96^2/144) / (1 + 1.96^2/6) = 0.3124
    f = sm["pooled"]["flippable"]
    assert f["rate"] == 0.5 and [f["lo"], f["hi"]] == pytest.approx([0.1876, 0.8124], abs=1e-4)
    assert s["online_sr"] == pytest.approx(2 / 6) and sm["responses"] == 18 and sm["malformed_responses"] == 0
    # greedy calls at the sampler's own temperature, sampled ones at T; the temperature is put back
    assert {(g, temp) for g, _, temp in fake.calls} == {(True, 0.25), (False, T)} and fake.temperature == 0.25
    assert max(n for _, n, _ in fake.calls) == batch
    lines = [json.loads(ln) for ln in (tmp_path / "online_episodes.jsonl").read_text().splitlines()]
    assert {(e["task"], e["seed"]): e["sampled_success"] for e in lines}[(B, 0)] == [True, False, True]
    # every sampled play's transcript is kept, play by play (B0: plays 0 and 2 right), not only greedy's
    by_key = {(e["task"], e["seed"]): e for e in lines}
    assert by_key[(B, 0)]["sampled_responses"] == [[RIGHT], [WRONG], [RIGHT]] and by_key[(B, 0)]["responses"] == [WRONG]
    assert all(e["sampled_responses"] == [[table(e["task"], e["seed"], j, 0)] for j in range(3)] for e in lines)
    assert "flippable 3 (0.500" in capsys.readouterr().err
    assert "online_sampled" in (tmp_path / "result.json").read_text()
    assert s["per_task"][B]["online_flippable"] == pytest.approx(2 / 3) and s["per_task"][A]["online_pass_at_k"] == 2 / 3
    assert "3 sampled plays per episode at temperature 0.7" in (tmp_path / "report.html").read_text()


def test_k1_is_one_sampled_run(monkeypatch, capsys, tokenizer, tmp_path):
    """K = 1 at T: its outcomes are those of one sampled run (an OnlineModelPolicy of play 0 at T through
    the same evaluator), and play 0 of K = 3 is the same play."""
    def sampled_success(k):
        s, fake = run(monkeypatch, tokenizer, table, ["--samples", str(k), "--temperature", str(T),
                                                       "--out", str(tmp_path / str(k))])
        lines = [json.loads(ln) for ln in (tmp_path / str(k) / "online_episodes.jsonl").read_text().splitlines()]
        return s, fake, {(e["task"], e["seed"]): e["sampled_success"] for e in lines}

    s1, fake, one_k = sampled_success(1)

    def make_prompt(obs, shots, history):  # what FlipSampler and the policy read of a prompt
        return SimpleNamespace(input_ids=torch.tensor(tokenizer.encode(f"Task goal: {obs['goal']}")),
                               resized_size=(168, 224))

    one = stand_in(eval_sop.OnlineModelPolicy(fake, make_prompt, set(), Counter(), sample=0, temperature=T),
                   [A, B], [0, 1, 2])
    played = {(e["task"], e["seed"]): e["success"] for e in one["episodes"]}
    assert played == {(t, s): (t, s, 0) in SAMPLE_OK for t in (A, B) for s in (0, 1, 2)}  # B0 alone
    assert one_k == {k: [ok] for k, ok in played.items()}
    pooled = s1["online_sampled"]["pooled"]
    assert pooled["pass_at_k"]["successes"] == pooled["sampled_sr"]["successes"] == pooled["flippable"]["successes"] == 1
    _, _, three = sampled_success(3)
    assert {k: v[:1] for k, v in three.items()} == one_k


def test_flip_counts_and_flags(capsys):
    g = {(A, 0): True, (A, 1): False}
    c = eval_sop.flip_counts(g, [{(A, 0): False, (A, 1): True}], [A])
    assert counts(c["pooled"]) == {"greedy": (1, 2), "pass_at_k": (1, 2), "flippable": (1, 2), "sampled_sr": (1, 2)}
    with pytest.raises(ValueError, match="greedy play's episodes"):
        eval_sop.flip_counts(g, [{(A, 0): True}], [A])
    for argv, msg in ((["--online", "--samples", "2"], "only with --online --policy model"),
                      (["--policy", "model", "--samples", "2", "--data", "README.md"], "only with --online")):
        with pytest.raises(utils.UsageError, match=msg):
            eval_sop.main(argv)
    # a flag's own range: refused while parsing, the trainer's temperature rule (cli.check_temperature)
    for argv, msg in ((["--online", "--policy", "model", "--samples", "-1"], "argument --samples: -1: must be >= 0"),
                      (["--online", "--policy", "model", "--samples", "1", "--temperature", "0"], "argument --temperature: 0"),
                      (["--online", "--policy", "model", "--samples", "1", "--temperature", "1e-9"], "argument --temperature: 1e-9"),
                      (["--online", "--policy", "model", "--samples", "1", "--temperature", "inf"], "argument --temperature: inf")):
        with pytest.raises(SystemExit) as e:
            eval_sop.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_seeded_rerun_of_the_tiny_model_is_identical(monkeypatch, capsys):
    """The real tiny model and sampler on the stand-in evaluator, K = 2 at T = 1, played 4 at a time:
    a rerun gives every sampled response again; sampled responses differ from the greedy ones."""
    monkeypatch.setattr(miniwob_env, "evaluate_online", stand_in)
    real_load = eval_sop.load_sampler
    texts = []

    def recording(args, tok):
        sampler = real_load(args, tok)
        generate = sampler.generate

        def gen(prompts, **kw):
            outs = generate(prompts, **kw)
            texts.append((kw.get("greedy"), tuple(kw.get("seeds") or ()), tuple(o[0].text for o in outs)))
            return outs
        sampler.generate = gen
        return sampler

    monkeypatch.setattr(eval_sop, "load_sampler", recording)
    runs = []
    for _ in range(2):
        texts.clear()
        s = eval_sop.main(["--policy", "model", "--model", "tiny", "--online", "--online-tasks", A, B,
                           "--online-seeds", "2", "--online-max-steps", "1", "--max-new-tokens", "6",
                           "--online-batch", "4", "--samples", "2", "--temperature", "1.0", *SMALL])
        runs.append((list(texts), {k: v for k, v in s["online_sampled"].items() if k != "seconds"}))
    assert runs[0] == runs[1]
    greedy = [t for g, _, ts in runs[0][0] if g for t in ts]
    sampled = [ts for g, _, ts in runs[0][0] if not g]
    assert len(sampled) == 2 and all(list(ts) != greedy for ts in sampled) and sampled[0] != sampled[1]


def test_real_browser_flip(monkeypatch, capsys, tokenizer):
    """click-test seeds 100000 (button at (37, 118) of 168x224, (25, 74) in 112x140 model pixels) and
    100001, two at a time: greedy writes garbage (0/2); sampled play 0 clicks (25, 74), play 1 writes
    garbage. Seed 100000 flips on play 0 only."""
    def answer(task, seed, play, t):
        return gui.format_response("press", {"action": "click", "coordinate": [25, 74]}) if play == 0 else "garbage"

    fake = FlipSampler(tokenizer, answer, [A], [100000, 100001], plays=2, steps=1)
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: fake)
    s = eval_sop.main(["--policy", "model", "--online", "--online-tasks", A, "--online-seeds", "2",
                       "--online-seed-base", "100000", "--online-max-steps", "1", "--online-batch", "2",
                       "--samples", "2", "--temperature", "0.5", *SMALL])
    p = s["online_sampled"]["pooled"]
    assert s["online_sr"] == 0.0 and p["greedy"]["successes"] == 0
    assert 1 <= p["flippable"]["successes"] == p["pass_at_k"]["successes"] == p["sampled_sr"]["successes"]
    assert s["online_sampled"]["per_task"][A]["flippable"]["n"] == 2

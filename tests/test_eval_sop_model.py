"""eval_sop.py, model part: SOP and static metrics through the batched-sampler path against hand-computed
values (a scripted fake sampler), the tiny model end to end, the HTML report, and online MiniWob++."""

import base64
import io
import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

import chat
import dataset
import eval_sop
import gui
import rollout
from rollout import RolloutSpec, semi_online_rollout
import vlm
from evaluation import views
from vlm import load_processor

REPO = Path(__file__).resolve().parent.parent
MINIWOB = REPO / "data" / "miniwob"
ANDROID = REPO / "data" / "android_control" / "android_control_test_uis1.jsonl"
# A: click, terminate;  B: click, click, terminate;  C: click, type, click, terminate
EPISODES = ["click-button-100000", "click-button-sequence-100000", "enter-text-100000"]
SMALL = ["--max-pixels", "20000"]  # 168x224 -> 112x140: model pixels differ from screenshot pixels


def last_json(capsys):
    """The summary printed by eval_sop.py --json: the last stdout line."""
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tokenizer():
    return load_processor()[0]


@pytest.fixture()
def miniwob_file(tmp_path):
    """The three episodes above in their own file (screenshots found with --image-root)."""
    lines = [ln for ln in (MINIWOB / "test.jsonl").read_text().splitlines()
             if json.loads(ln)["episode_id"] in EPISODES]
    lines.sort(key=lambda ln: EPISODES.index(json.loads(ln)["episode_id"]))
    path = tmp_path / "eps.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


class Out:
    def __init__(self, text):
        self.text, self.ids, self.logprobs, self.finish_reason = text, [0] * 3, torch.zeros(3), "stop"


class FakeSampler:
    """Answers by a script answer(episode_or_None, t, prompt, decoded_prompt) -> text. The episode is found
    by the goal in the decoded prompt, t by the number of assistant turns in it. Records every call."""

    def __init__(self, tokenizer, episodes, answer):
        self.model = torch.nn.Linear(1, 1)  # sampling_mode needs a module; no config: no context cap
        self.tok, self.by_goal, self.answer = tokenizer, {e.goal: e for e in episodes}, answer
        self.calls, self.seen = [], []

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        assert set([n] if isinstance(n, int) else n) == {1} and greedy  # one greedy sample per prompt
        self.calls.append(len(prompts))
        outs = []
        for p in prompts:
            text = self.tok.decode(p.input_ids.tolist())
            goal = re.search(r"Task goal: (.*)", text).group(1)
            t = text.count("<|im_start|>assistant") - 1
            ep = self.by_goal.get(goal)
            self.seen.append((ep.episode_id if ep else goal, t, text))
            outs.append([Out(self.answer(ep, t, p, text))])
        return outs


def respond(thought, action):
    return gui.format_response(thought, action)


def scripted(ep, t, prompt, text):
    """A right; B right, then a click far from the target, then right; C malformed, a wrongly typed
    text, a right click, a wait instead of terminate. Coordinates in pixels of the resized screenshot."""
    right = gui.expert_response(ep.steps[t], ep.steps[t].image_size, prompt.resized_size, f"fake-{ep.episode_id}-{t}")
    w, h = prompt.resized_size
    far = {"action": "click", "coordinate": [w - 1, h - 1]}
    wrong = {("click-button-sequence-100000", 1): respond("far-away-click", far),
             ("enter-text-100000", 0): "<think>hm</think><action>{not json</action>",
             ("enter-text-100000", 1): respond("typo", {"action": "type", "text": "Xavier"}),
             ("enter-text-100000", 3): respond("wait", {"action": "wait", "time": 1})}
    return wrong.get((ep.episode_id, t), right)


def run_fake(monkeypatch, tokenizer, data, answer, argv):
    eps = dataset.load_episodes(data)
    fake = FakeSampler(tokenizer, eps, answer)
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: fake)
    s = eval_sop.main(["--data", str(data), "--policy", "model", *argv])
    return s, fake


# -----------------------------------------------------------------------------
# SOP


@pytest.mark.parametrize("batch_size, calls", [(32, [3, 2]), (2, [2, 2, 1])])
def test_sop_by_hand(monkeypatch, capsys, tokenizer, miniwob_file, batch_size, calls):
    s, fake = run_fake(monkeypatch, tokenizer, miniwob_file, scripted,
                       ["--image-root", str(MINIWOB), *SMALL, "--batch-size", str(batch_size), "--json"])
    assert last_json(capsys) == s
    # A 2/2, B 1/3 (wrong point at step 1), C 0/4 (malformed at step 0)
    assert s["sop_pg"] == pytest.approx((1 + 1 / 3 + 0) / 3) and s["pg"] == s["sop_pg"]
    assert s["sop_tsr"] == pytest.approx(1 / 3)
    assert s["steps_run"] == 5 and s["episodes"] == 3 and s["steps"] == 9
    # one generate call per step of eval_sop.greedy_rollouts over --batch-size episodes: {A, B, C} runs 3 then A1, B1;
    # {A, B} runs 2, 2, then {C} 1
    assert fake.calls == calls
    assert s["step_reward_mean"] == pytest.approx((1 + 1 + 1 + 0.55 + 0) / 5)  # wrong point: 0.1 + 0.9 * 0.5
    assert s["malformed_responses"] == 1 and s["responses"] == 5
    pt = s["per_task"]
    assert (pt["click-button"]["sop_pg"], pt["click-button"]["sop_tsr"]) == (1.0, 1.0)
    assert pt["click-button-sequence"]["sop_pg"] == pytest.approx(1 / 3) and pt["enter-text"]["sop_pg"] == 0.0
    # own history: A's step-1 prompt holds A's own step-0 response
    a1 = next(text for ep, t, text in fake.seen if ep == "click-button-100000" and t == 1)
    assert "fake-click-button-100000-0" in a1


def test_sop_walks_as_the_training_driver(monkeypatch, capsys, tokenizer, miniwob_file, tmp_path):
    """SOP evaluation and the training driver called as SOP defines it (one greedy rollout, patch
    threshold 0, own history) give the scripted policy the same prompts, visit the same steps and
    stop at the same first error; a patch threshold of 1 (training's kind of walk) visits more."""
    out = tmp_path / "sop.jsonl"
    s, fake = run_fake(monkeypatch, tokenizer, miniwob_file, scripted, ["--image-root", str(MINIWOB), *SMALL,
                                                                         "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    eps = dataset.load_episodes(miniwob_file)
    image_processor = load_processor()[1]

    def drive(threshold):
        sampler = FakeSampler(tokenizer, eps, scripted)
        how = RolloutSpec(n_rollouts=1, patch_threshold=threshold, greedy=True, image_root=str(MINIWOB))
        recs = semi_online_rollout(sampler, eps, tokenizer, image_processor, how,
                                   spec=chat.PromptSpec(max_pixels=20000, system_prompt="short"))  # eval of "tiny": its contract
        return recs, sampler

    recs, drv = drive(0)
    # by hand: A right at 0, 1; B right at 0, wrong at 1; C malformed at 0
    visited = [("click-button-100000", 0), ("click-button-sequence-100000", 0), ("enter-text-100000", 0),
               ("click-button-100000", 1), ("click-button-sequence-100000", 1)]
    assert [(ep, t) for ep, t, _ in drv.seen] == [(ep, t) for ep, t, _ in fake.seen] == visited
    assert [text for _, _, text in drv.seen] == [text for _, _, text in fake.seen]  # the very same prompts
    assert rollout.sop_progress(recs, {k: len(e.steps) for k, e in enumerate(eps)}) == \
        {(0, 0): (2, 2), (1, 0): (1, 3), (2, 0): (0, 4)}
    assert [r["correct"] for r in rows] == [2, 1, 0]
    assert [r["responses"] for r in rows] == [[r.response for r in recs if r.task_idx == k] for k in range(3)]
    assert [r["rewards"] for r in rows] == [[r.reward for r in recs if r.task_idx == k] for k in range(3)]
    # with one patch B goes on to step 2 and C to step 1: a different walk, which SOP must not be
    _, patched = drive(1)
    assert ("click-button-sequence-100000", 2) in [(ep, t) for ep, t, _ in patched.seen]
    assert len(patched.seen) > len(fake.seen)


# -----------------------------------------------------------------------------
# static


@pytest.mark.parametrize("batch_size, calls", [(4, [3, 3, 2, 1]), (2, [2, 2, 1, 1, 1, 1, 1])])
def test_static_by_hand(monkeypatch, capsys, tokenizer, miniwob_file, batch_size, calls):
    s, fake = run_fake(monkeypatch, tokenizer, miniwob_file, scripted,
                       ["--image-root", str(MINIWOB), *SMALL, "--protocol", "static", "--batch-size", str(batch_size),
                        "--json"])
    assert last_json(capsys) == s
    # 9 steps: type right on A0 A1 B0 B1 B2 C1 C2 (7); full match A0 A1 B0 B2 C2 (5);
    # click steps with the type right: A0 B0 B1 C2, of which 3 match
    # one call per step of eval_sop.greedy_rollouts over --batch-size episodes: {A, B, C} has 3, 3, 2, 1 steps
    # at t = 0..3; {A, B} then {C}: 2, 2, 1 (B's last step), then 1, 1, 1, 1 (C's four)
    assert s["static_steps"] == 9 and fake.calls == calls
    assert s["static_type_acc"] == pytest.approx(7 / 9)
    assert s["static_step_sr"] == pytest.approx(5 / 9)
    assert s["static_grounding_acc"] == pytest.approx(3 / 4) and s["static_grounding_steps"] == 4
    assert "sop_pg" not in s and s["static_variant"] == "high"
    assert s["per_task"]["enter-text"]["static_step_sr"] == pytest.approx(1 / 4)
    # expert history: B's step-2 prompt holds the expert's step-1 click (67, 165) in 112x140 pixels,
    # not the model's wrong one
    b2 = next(text for ep, t, text in fake.seen if ep == "click-button-sequence-100000" and t == 2)
    assert '{"action": "click", "coordinate": [45, 103]}' in b2 and "far-away-click" not in b2


def test_history_gap_by_hand(monkeypatch, capsys, tokenizer, miniwob_file):
    """Own vs expert history on the steps SOP reaches (A0 A1 B0 B1 C0). The fake answers as `scripted`,
    except that under the expert's history (no "fake-" response in the prompt) it misses A1 (a wait
    for the terminate) and gets B1 right: A0 both, A1 own only, B0 both, B1 expert only, C0 neither."""
    def answer(ep, t, prompt, text):
        if t == 1 and "fake-" not in text:
            if ep.episode_id == "click-button-100000":
                return respond("wait", {"action": "wait", "time": 1})
            if ep.episode_id == "click-button-sequence-100000":
                return gui.expert_response(ep.steps[1], ep.steps[1].image_size, prompt.resized_size, "expert-seen")
        return scripted(ep, t, prompt, text)

    s, _ = run_fake(monkeypatch, tokenizer, miniwob_file, answer,
                    ["--image-root", str(MINIWOB), *SMALL, "--protocol", "sop", "static"])
    g = s["history_gap"]
    pooled = {k: g["pooled"][k] for k in ("steps", "own_right", "expert_right", "own_only", "expert_only", "gap")}
    assert pooled == {"steps": 5, "own_right": 3, "expert_right": 3, "own_only": 1, "expert_only": 1, "gap": 0.0}
    assert (g["pooled"]["later"]["steps"], g["pooled"]["later"]["own_right"], g["pooled"]["later"]["expert_right"]) == (2, 1, 1)
    a, b, c = (g["per_task"][t] for t in ("click-button", "click-button-sequence", "enter-text"))
    assert (a["own_acc"], a["expert_acc"], a["gap"], a["own_only"]) == (1.0, 0.5, 0.5, 1)
    assert (b["own_acc"], b["expert_acc"], b["gap"], b["expert_only"]) == (0.5, 1.0, -0.5, 1)
    assert (c["steps"], c["own_right"], c["expert_right"], c["later"]["steps"], c["later"]["gap"]) == (1, 0, 0, 0, None)
    assert s["sop_pg"] == pytest.approx((1 + 1 / 3 + 0) / 3)  # SOP as in test_sop_by_hand


def test_static_low_has_step_instructions(monkeypatch, capsys, tokenizer):
    eps = dataset.load_episodes(ANDROID, limit=2)

    def expert(ep, t, prompt, text):
        assert f"Step instruction: {ep.steps[t].step_instruction}" in text
        return gui.expert_response(ep.steps[t], (1080, 2400), prompt.resized_size, "x")

    s, fake = run_fake(monkeypatch, tokenizer, ANDROID, expert,
                       ["--limit", "2", "--blank-screens", "1080x2400", "--max-pixels", "50176",
                        "--protocol", "static", "--step-instruction"])
    n = sum(len(e.steps) for e in eps)
    assert s["static_variant"] == "low" and s["static_steps"] == n == len(fake.seen)
    assert s["static_type_acc"] == s["static_step_sr"] == s["static_grounding_acc"] == 1.0


# -----------------------------------------------------------------------------
# report


def images_in(section: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(b)))
            for b in re.findall(r"src='data:image/png;base64,([^']+)'", section)]


def has_colour(im, xy, colour, r=9):
    x0, y0 = int(xy[0]), int(xy[1])
    px = [im.getpixel((x, y)) for x in range(max(0, x0 - r), min(im.width, x0 + r + 1))
          for y in range(max(0, y0 - r), min(im.height, y0 + r + 1))]
    return any(all(abs(a - b) <= 30 for a, b in zip(p, colour)) for p in px)


def test_report(monkeypatch, capsys, tokenizer, miniwob_file, tmp_path):
    out = tmp_path / "run"
    s, _ = run_fake(monkeypatch, tokenizer, miniwob_file, scripted,
                    ["--image-root", str(MINIWOB), *SMALL, "--protocol", "sop", "static", "--out", str(out)])
    assert json.loads((out / "result.json").read_text())["sop_pg"] == s["sop_pg"]
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 3
    assert len((out / "static_steps.jsonl").read_text().splitlines()) == 9
    page = (out / "report.html").read_text()
    assert s["report"] == str(out / "report.html")
    sections = {h.split("</h2>")[0].split(":")[0]: h for h in page.split("<h2>")[1:]}
    assert "<td>0.333</td>" in sections["Per task"]  # click-button-sequence: SOP PG 1/3
    sop, static = sections["SOP"], sections["Static (-High"]
    # one image per shown step: SOP shows the steps run (5), static every step (9)
    assert sop.count("<img") == 5 and static.count("<img") == 9
    # the first wrong step of B (step 1) and of C (step 0) is framed, in each protocol
    assert sop.count("class='step wrong first'") == 2 and static.count("class='step wrong first'") == 2
    # B's step 1 under SOP: expert point (67, 165) as a green cross, the far click (166, 222) as a red ring,
    # drawn at REPORT_WIDTH / 168 of the original pixels
    k = views.REPORT_WIDTH / 168
    b1 = images_in(sop)[3]  # A0, A1, B0, B1, C0
    assert b1.size == (300, 400)
    assert has_colour(b1, (67 * k, 165 * k), (0, 200, 0)) and has_colour(b1, (166 * k, 222 * k), (230, 0, 0))
    assert not has_colour(b1, (67 * k, 165 * k), (230, 0, 0))
    a0 = images_in(sop)[0]  # right: a blue ring at the expert point
    assert has_colour(a0, (18 * k, 73 * k), (40, 90, 255))


# -----------------------------------------------------------------------------
# the tiny model, end to end


def test_tiny_model_end_to_end(capsys, miniwob_file, tmp_path):
    out = tmp_path / "tiny"
    s = eval_sop.main(["--data", str(miniwob_file), "--limit", "2", "--image-root", str(MINIWOB), "--policy", "model",
                       "--model", "tiny", "--max-new-tokens", "8", "--elements", "--protocol", "sop", "static",
                       "--out", str(out), "--json"])
    assert last_json(capsys) == s
    # 8 new tokens cannot hold '<think>..</think><action>{json}</action>': no step can parse, so every
    # metric is exactly 0 and SOP stops each episode at its first step (2 steps run in all)
    for k in ("sop_pg", "sop_tsr", "static_type_acc", "static_step_sr"):
        assert s[k] == 0.0, k
    assert s["static_grounding_acc"] in (None, 0.0)
    assert s["episodes"] == 2 and s["static_steps"] == 5 and s["steps_run"] == 2
    assert s["responses"] == s["steps_run"] + s["static_steps"]
    assert s["prompt_budget"] == 8192 - 8  # the tiny model's context minus the response budget
    page = (out / "report.html").read_text()
    assert page.count("<img") == s["steps_run"] + s["static_steps"]


def test_model_path(tmp_path):
    """--model of every script (eval_sop.py included) goes through vlm.model_path."""
    import utils
    ckpt = tmp_path / "ckpt" / "step_000300"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (tmp_path / "ckpt" / "latest").write_text("step_000300")
    assert vlm.model_path(str(tmp_path / "ckpt")) == str(ckpt)
    assert vlm.model_path(str(ckpt)) == str(ckpt) and vlm.model_path("tiny") == "tiny"
    assert vlm.model_path("tiny:128x4") == "tiny:128x4"
    with pytest.raises(utils.UsageError, match="latest"):
        vlm.model_path(str(tmp_path))
    with pytest.raises(ValueError, match="tiny:HxL"):
        vlm.model_path("tiny:12x")
    assert eval_sop.sop_parser().parse_args(["--model", str(tmp_path / "ckpt")]).model == str(ckpt)


# -----------------------------------------------------------------------------
# online MiniWob++ (a real browser)


def test_online_default_seeds_are_fresh(monkeypatch, capsys, tokenizer):
    """Without --online-seed-base the online episodes start at 200000: pages neither data file uses
    (train seeds 0+, test seeds 100000+)."""
    fake = FakeSampler(tokenizer, [], lambda ep, t, prompt, text: "garbage")
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: fake)
    s = eval_sop.main(["--policy", "model", "--online", "--online-tasks", "click-test", "--online-seeds", "2",
                       "--online-max-steps", "1", *SMALL])
    assert s["online_seeds"] == [200000, 200001] and s["n_online_episodes"] == 2 and s["online_sr"] == 0.0


def test_online_fake_model(monkeypatch, capsys, tokenizer, tmp_path):
    """click-test seeds 100000 (button at (37, 118), box 19..56 x 100..137) and 100001. The fake clicks
    the button on its first call, in 112x140 model pixels, then writes garbage: episode 1 succeeds only
    if the click is mapped back to the 168x224 screenshot; episode 2 runs into the step limit."""
    answers = iter([respond("pressing-it", {"action": "click", "coordinate": [25, 74]})])

    def answer(ep, t, prompt, text):
        assert prompt.resized_size == (112, 140)
        return next(answers, f"garbage-{len(fake.seen)}")

    fake = FakeSampler(tokenizer, [], answer)
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: fake)
    report = tmp_path / "online.html"
    s = eval_sop.main(["--policy", "model", "--online", "--online-tasks", "click-test", "--online-seeds", "2",
                       "--online-seed-base", "100000", "--online-max-steps", "2", *SMALL, "--report", str(report), "--json"])
    assert last_json(capsys) == s
    assert s["online_sr"] == 0.5 and s["n_online_episodes"] == 2
    # Wilson 95% for 1 of 2 by hand: centre 0.5, half-width 1.96 sqrt(0.125 + 1.96^2/16) / (1 + 1.96^2/2) = 0.4055
    assert s["online_sr_ci95"] == pytest.approx([0.0945, 0.9055], abs=1e-4)
    assert s["per_task"]["click-test"] == {"online_sr": 0.5, "online_sr_ci95": s["online_sr_ci95"], "n_online_episodes": 2}
    assert s["online_failures"]["step_limit"] == 1 and s["episodes"] == 0
    assert [t for _, t, _ in fake.seen] == [0, 0, 1]
    assert fake.calls == [2, 1]  # both episodes answered in one call, then the one still running
    # own history, reset per episode: the last prompt holds episode 2's first answer only
    assert "garbage-2" in fake.seen[2][2] and "pressing-it" not in fake.seen[2][2]
    assert report.read_text().count("<img") == 3


def test_online_batched_tiny_model_answers_as_one_at_a_time(monkeypatch, capsys):
    """The real tiny model, 4 live episodes on two tasks: played 3 at a time (one generate call for the
    episodes in flight) it gives every episode the same responses and outcomes as one at a time."""
    real_load = eval_sop.load_sampler
    seen = {}

    def recording(args, tok):
        sampler = real_load(args, tok)
        generate = sampler.generate

        def gen(prompts, **kw):
            outs = generate(prompts, **kw)
            calls.append(len(prompts))
            for p, o in zip(prompts, outs):
                text = tok.decode(p.input_ids.tolist())
                seen.setdefault(args.online_batch, []).append(
                    (re.search(r"Task goal: (.*)", text).group(1), text.count("<|im_start|>assistant") - 1, o[0].text))
            return outs
        sampler.generate = gen
        return sampler

    monkeypatch.setattr(eval_sop, "load_sampler", recording)
    ends = {}
    for batch in (1, 3):
        calls = []
        s = eval_sop.main(["--policy", "model", "--model", "tiny", "--online", "--online-tasks", "click-test",
                           "click-button", "--online-seeds", "2", "--online-max-steps", "2", "--max-new-tokens", "6",
                           "--online-batch", str(batch)])
        ends[batch] = (s["online_failures"], s["malformed_responses"], s["responses"], s["response_tokens_mean"])
        assert max(calls) == batch and sum(calls) == s["responses"]
    assert sorted(seen[1]) == sorted(seen[3]) and len(seen[1]) >= 4  # (goal, step, response) of every call
    assert ends[1] == ends[3]

"""The semi-online rollout driver (rollout.semi_online_rollout, docs/method.md §5) on a
hand-built 3-step episode with a scripted "policy": the histories, patches, early ends
and rewards are written out by hand for patch thresholds 0, 1 and -1."""
import re

import pytest
import torch

import dataset
import gui
import vlm
from rollout import RolloutSpec, semi_online_rollout
from sampler import SampleOutput

W, H = 280, 560  # multiples of 28 inside [min, max] pixels: smart_resize keeps them, resized == original

CLICK = {"action": "click", "coordinate": [100, 200]}
TYPE = {"action": "type", "text": "hello"}
DONE = {"action": "terminate", "status": "success"}


def episode():
    steps = [
        dataset.Step(screenshot=None, action=CLICK, candidate_bbox=[[80, 180, 120, 220]]),
        dataset.Step(screenshot=None, action=TYPE),
        dataset.Step(screenshot=None, action=DONE),
    ]
    return dataset.Episode(goal="say hello", episode_id="hand-1", steps=steps, source="test")


# rollout i's response at step t; r0 is always right, r1 types the wrong text at step 1,
# r2 picks the wrong action type at step 0 and the wrong text at step 1.
WRONG_TYPE = {"action": "type", "text": "x"}
SCRIPT = {
    0: [CLICK, TYPE, DONE],
    1: [CLICK, {"action": "type", "text": "bye"}, DONE],
    2: [WRONG_TYPE, {"action": "type", "text": "nope"}, DONE],
}


def response(i, t):
    return gui.format_response(f"r{i} thinks at step {t}", SCRIPT[i][t])


class ScriptedSampler:
    """Stands in for sampler.Sampler: sample j of a step-0 prompt is rollout j; later, the
    rollout is read back from the first history turn in the prompt ("r<i> thinks ...")."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = []
        self.seen = []  # (prompt text, seed) of every prompt, in call order

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        outs = []
        n = [n] * len(prompts) if isinstance(n, int) else n  # an int or one count per prompt
        for j, (p, k) in enumerate(zip(prompts, n)):
            text = self.tok.decode(p.input_ids)
            self.seen.append((text, None if seeds is None else seeds[j]))
            m = re.search(r"r(\d) thinks at step 0", text)
            t = text.count("<|im_start|>assistant") - 1  # earlier assistant turns = step index
            self.calls.append((t, k))
            rollouts = [int(m.group(1))] * k if m else list(range(k))
            outs.append([self._out(response(i, t)) for i in rollouts])
        return outs

    def _out(self, text):
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        return SampleOutput(ids=ids, text=text, logprobs=torch.zeros(len(ids)), finish_reason="stop", prompt_index=0)


@pytest.fixture(scope="module")
def proc():
    return vlm.load_processor()


def run(proc, threshold, mode="thought-free", history="own", seed=None):
    tok, ip = proc
    sampler = ScriptedSampler(tok)
    recs = semi_online_rollout(sampler, [episode()], tok, ip, RolloutSpec(n_rollouts=3, patch_mode=mode,
                               patch_threshold=threshold, history_mode=history, blank_screens=(W, H)),
                               seed=seed)
    return {(r.rollout_idx, r.step_idx): r for r in recs}, sampler


# rewards by hand (docs/method.md §4): think block non-empty -> format 1 (0.1); full match 0.9 * 1.0,
# type only 0.9 * 0.5, parsed but wrong type 0.9 * 0.1
R_RIGHT, R_TYPE_ONLY, R_WRONG_TYPE = 0.1 + 0.9, 0.1 + 0.45, 0.1 + 0.09


def test_threshold_0_ends_at_first_error(proc):
    recs, sampler = run(proc, 0)
    assert sorted(recs) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]
    assert recs[(2, 0)].reward == pytest.approx(R_WRONG_TYPE) and recs[(2, 0)].ended and not recs[(2, 0)].patched
    assert recs[(1, 1)].reward == pytest.approx(R_TYPE_ONLY) and recs[(1, 1)].ended
    assert [recs[(0, t)].reward for t in range(3)] == pytest.approx([R_RIGHT] * 3)
    assert recs[(0, 2)].history == [response(0, 0), response(0, 1)]  # own outputs as history
    assert sampler.calls[0] == (0, 3)  # step 0: one prompt, 3 samples (prefilled once)


def test_threshold_1_patches_once(proc):
    recs, _ = run(proc, 1)
    assert sorted(recs) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    # r1: wrong at step 1 -> patched (its own thought, the expert's action), goes on
    assert recs[(1, 1)].patched and not recs[(1, 1)].ended
    assert recs[(1, 2)].history == [response(1, 0), gui.format_response("r1 thinks at step 1", TYPE)]
    # r2: patched at step 0, wrong again at step 1 with its one patch spent -> ends there
    assert recs[(2, 0)].patched
    assert recs[(2, 1)].history == [gui.format_response("r2 thinks at step 0", CLICK)]
    assert recs[(2, 1)].ended and not recs[(2, 1)].patched
    assert recs[(2, 1)].reward == pytest.approx(R_TYPE_ONLY)


def test_on_policy_patch_keeps_the_policys_hinted_thought(proc):
    """--patch on-policy (extras/on_policy_patch.py): a wrong step's prompt is sent again with the hint
    naming the expert action; the patch is the thought written then, with the expert's action. The
    scripted policy answers a hinted step-0 prompt as rollout 0 would ("r0 thinks at step 0")."""
    recs, sampler = run(proc, 1, mode="on-policy", seed=5)
    assert sorted(recs) == [(i, t) for i in range(3) for t in range(3)]  # one patch each: nobody ends
    assert recs[(2, 0)].patched and recs[(1, 1)].patched and not recs[(1, 1)].ended
    assert recs[(2, 1)].history == [gui.format_response("r0 thinks at step 0", CLICK)]
    assert recs[(1, 2)].history == [response(1, 0), gui.format_response("r1 thinks at step 1", TYPE)]
    hinted = [(text, sd) for text, sd in sampler.seen if "Hint: the correct action" in text]
    assert len(hinted) == 2 and all(isinstance(sd, int) for _, sd in hinted)  # one per patch, seeded
    assert '"text": "hello"' in hinted[1][0]  # step 1's hint names the expert's text


def test_threshold_unlimited_patches_every_error(proc):
    recs, _ = run(proc, -1)
    assert len(recs) == 9
    assert recs[(2, 0)].patched and recs[(2, 1)].patched
    assert recs[(2, 2)].history == [gui.format_response("r2 thinks at step 0", CLICK),
                                    gui.format_response("r2 thinks at step 1", TYPE)]
    assert recs[(2, 2)].match and recs[(2, 2)].ended  # last step ends every rollout


def test_expert_history_is_offline_rl(proc):
    recs, _ = run(proc, 0, history="expert")
    assert len(recs) == 9  # nobody ends early
    expert = [gui.format_response("", CLICK), gui.format_response("", TYPE)]
    assert recs[(2, 2)].history == expert and recs[(0, 2)].history == expert


def test_task_ids_name_the_records_and_change_nothing_else(proc):
    """task_ids (the trainer's global task slots) only relabel task_idx."""
    tok, ip = proc
    how = RolloutSpec(n_rollouts=2, patch_threshold=1, blank_screens=(W, H))
    plain = semi_online_rollout(ScriptedSampler(tok), [episode(), episode()], tok, ip, how)
    named = semi_online_rollout(ScriptedSampler(tok), [episode(), episode()], tok, ip, how, task_ids=[7, 3])
    assert [r.task_idx for r in named] == [[7, 3][r.task_idx] for r in plain]
    assert {r.task_idx for r in named} == {7, 3}
    strip = lambda r: (r.rollout_idx, r.step_idx, r.response, r.reward, r.patched, r.ended, r.history)  # noqa: E731
    assert [strip(r) for r in named] == [strip(r) for r in plain]


class HintSampler(ScriptedSampler):
    """ScriptedSampler that also answers the on-policy hint prompts (an int n: one text each, in
    one call per step): a thought "r<i> thinks at step <t>, hinted" and an action of its own, which
    the patch must drop. The hinted rollout is read from its first history turn; at step 0 (no
    history) it is r2, the one rollout the script has wrong there."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.hint_calls = []

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        if not isinstance(n, int):
            return super().generate(prompts, n, greedy, seeds)
        texts = [self.tok.decode(p.input_ids) for p in prompts]
        self.hint_calls.append(texts)
        outs = []
        for text in texts:
            m = re.search(r"r(\d) thinks at step 0", text)
            t = text.count("<|im_start|>assistant") - 1
            own = {"action": "click", "coordinate": [1, 1]}  # not the expert's: must not reach the patch
            i = m.group(1) if m else 2
            outs.append([self._out(gui.format_response(f"r{i} thinks at step {t}, hinted", own))])
        return outs


def test_on_policy_patch_is_the_hinted_thought_with_the_expert_action(proc):
    """--patch on-policy through the driver, threshold -1: every wrong step is patched with the thought the
    policy writes for a hint naming the expert action, then that action (resized == original pixels here);
    the sampled wrong response is still the record's, and each step's hints are generated in one call."""
    tok, ip = proc
    sampler = HintSampler(tok)
    recs = semi_online_rollout(sampler, [episode()], tok, ip, RolloutSpec(n_rollouts=3, patch_mode="on-policy",
                               patch_threshold=-1, blank_screens=(W, H)))
    recs = {(r.rollout_idx, r.step_idx): r for r in recs}
    hinted = lambda i, t, a: gui.format_response(f"r{i} thinks at step {t}, hinted", a)  # noqa: E731
    assert len(recs) == 9 and recs[(2, 0)].patched and recs[(1, 1)].patched and recs[(2, 1)].patched
    assert recs[(2, 0)].response == response(2, 0)  # y_t is still trained on; the patch is history only
    assert recs[(1, 2)].history == [response(1, 0), hinted(1, 1, TYPE)]
    assert recs[(2, 2)].history == [hinted(2, 0, CLICK), hinted(2, 1, TYPE)]
    # step 0: r2's hint; step 1: r1's and r2's in one call; each names the expert action
    assert [len(c) for c in sampler.hint_calls] == [1, 2]
    assert 'Hint: the correct action for this step is {"action": "click", "coordinate": [100, 200]}' in \
        sampler.hint_calls[0][0]
    assert all('{"action": "type", "text": "hello"}' in text for text in sampler.hint_calls[1])

"""The task schedule, dynamic-sampling refills and rollout bookkeeping of train_semionline.py,
against cases computed by hand: `schedule.step_tasks` (a pure function of seed, step, slot; refills without
replacement), `TaskDraw` (global keep decision, refill rounds, the cap, 1 vs 2 ranks), per-slot
sampling seeds, SOP progress (and the release's exception rule), the overlong penalty, flag checks."""
import hashlib
import threading
from types import SimpleNamespace

import pytest
import torch

import schedule  # the task schedule: dynamic sampling's draw
import reward
import rollout
import train_semionline as ts
from rollout import RolloutSpec, semi_online_rollout


def dist(rank, world):
    return SimpleNamespace(rank=rank, world_size=world, device=torch.device("cpu"), is_main=rank == 0)


# -----------------------------------------------------------------------------
# step_tasks


def test_step_tasks_epochs_and_purity():
    n_eps, B = 5, 2
    stream = sum((schedule.step_tasks(3, s, 0, B, n_eps, B) for s in range(10)), [])  # 20 positions = 4 epochs
    for e in range(4):
        assert sorted(stream[5 * e:5 * e + 5]) == list(range(5))  # every episode once per epoch
    assert stream[:5] != stream[5:10] or stream[5:10] != stream[10:15]  # epochs are reshuffled
    # pure: step 7 alone, in any order of calls, gives positions 14, 15 of the stream
    assert schedule.step_tasks(3, 7, 0, B, n_eps, B) == stream[14:16]
    # refill rounds continue the step's draw without replacement: first the 3 episodes round 0 did not
    # draw, each once, then (pool exhausted) all 5 again in a fresh permutation
    r1 = schedule.step_tasks(3, 7, 1, 8, n_eps, B)
    assert r1 == schedule.step_tasks(3, 7, 1, 8, n_eps, B)  # pure
    assert sorted(r1[:3]) == sorted(set(range(5)) - set(stream[14:16])) and sorted(r1[3:]) == list(range(5))
    # a later round takes the next positions: rounds of 2 and 1 draw what one round of 3 draws
    assert schedule.step_tasks(3, 7, 1, 2, n_eps, B) + schedule.step_tasks(3, 7, 2, 1, n_eps, B, offset=2) == r1[:3]
    assert schedule.step_tasks(3, 7, 3, 4, n_eps, B, offset=3) == r1[3:7]
    assert {tuple(schedule.step_tasks(3, s, 1, 3, n_eps, B)) for s in range(6)}.__len__() > 1  # reshuffled per step
    assert schedule.step_tasks(4, 7, 0, B, n_eps, B) != stream[14:16] or schedule.step_tasks(4, 8, 0, B, n_eps, B) != stream[16:18]
    with pytest.raises(ValueError, match="seed -1"):
        schedule.step_tasks(-1, 0, 0, 2, 5, 2)
    with pytest.raises(ValueError, match="offset -1"):
        schedule.step_tasks(0, 0, 1, 2, 5, 2, offset=-1)


def test_task_seed():
    seeds = {schedule.task_seed(0, step, slot) for step in range(3) for slot in range(6)}
    assert len(seeds) == 18 and schedule.task_seed(0, 1, 2) == schedule.task_seed(0, 1, 2)
    assert all(0 <= s < 2 ** 47 for s in seeds)


# -----------------------------------------------------------------------------
# TaskDraw: the rounds of dynamic sampling as main runs them


class Rec:
    def __init__(self, slot):
        self.task_idx = slot


def run_fill(world, keep_slots, batch_size=4, max_rounds=3, seed=0, step=5, n_eps=7):
    """A step's TaskDraw loop, as train_semionline.main runs it, on `world` simulated ranks (threads;
    schedule.all_sum summed through a barrier). The fake rollout keeps the slots in keep_slots (a rank can only
    keep its own)."""
    calls = {r: [] for r in range(world)}
    results = {}
    box, barrier = {}, threading.Barrier(world)

    def all_sum(values, d):
        box[d.rank] = list(values)
        barrier.wait()
        out = [sum(v[i] for v in box.values()) for i in range(len(values))]
        barrier.wait()
        return out

    def worker(rank):
        def rollout_round(slots, episode_ids):
            calls[rank].append((list(slots), list(episode_ids)))
            return [Rec(s) for s in slots], {s for s in slots if s in keep_slots}
        results[rank] = drive(schedule.TaskDraw(seed, step, n_eps, batch_size, max_rounds, dist(rank, world)), rollout_round)

    orig = schedule.all_sum
    schedule.all_sum = all_sum
    try:
        threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        schedule.all_sum = orig
    return results, calls


def drive(draw, rollout_round):
    """main's loop: (kept records, every record, info with slot_episode)."""
    kept, every = [], []
    while (drawn := draw.next_round()) is not None:
        records, keep = rollout_round(*drawn)
        kept_slots = draw.keep(keep)
        kept += [r for r in records if r.task_idx in kept_slots]
        every += records
    return kept, every, {**draw.info(), "slot_episode": draw.slot_episode}


@pytest.mark.parametrize("world", [1, 2])
def test_task_draw_refills_by_hand(world):
    # batch 4. round 0: slots 0-3, keep {1}; round 1: the missing 3, slots 4-6, keep {4, 6};
    # round 2: the missing 1, slot 7, dropped; the cap (3 rounds) is reached: partial, 3 of 4 kept
    results, calls = run_fill(world, keep_slots={1, 4, 6})
    for rank, (kept, every, info) in results.items():
        assert info["rounds"] == 3 and info["tasks_tried"] == 8 and info["tasks_kept"] == 3 and info["partial"]
        if world == 1:
            assert [r.task_idx for r in every] == list(range(8))
        assert info["slot_episode"] == dict(zip(range(8), schedule.step_tasks(0, 5, 0, 4, 7, 4) + schedule.step_tasks(0, 5, 1, 3, 7, 4)
                                                 + schedule.step_tasks(0, 5, 2, 1, 7, 4, offset=3)))
        # refills continue without replacement: slots 4-7 are 4 distinct episodes that round 0 did not draw
        # (round 0, positions 20-23 of the epoch stream, straddles two epochs of 7: it holds one twice)
        first, refills = [info["slot_episode"][s] for s in range(4)], [info["slot_episode"][s] for s in range(4, 8)]
        assert len(set(first)) == 3 and len(set(refills)) == 4 and not set(first) & set(refills)
    union_kept = sorted(r.task_idx for _, (kept, _, _) in results.items() for r in kept)
    union_all = sorted(r.task_idx for _, (_, every, _) in results.items() for r in every)
    assert union_kept == [1, 4, 6] and union_all == list(range(8))
    if world == 2:  # rank r rolls out every 2nd slot of each round
        assert [c[0] for c in calls[0]] == [[0, 2], [4, 6], [7]]
        assert [c[0] for c in calls[1]] == [[1, 3], [5], []]
        assert calls[0][0][1] == [results[0][2]["slot_episode"][s] for s in (0, 2)]


def test_task_draw_full_and_capped():
    results, _ = run_fill(1, keep_slots=set(range(100)))
    assert results[0][2] | {"slot_episode": None} == {"rounds": 1, "tasks_tried": 4, "tasks_kept": 4, "partial": False,
                                                      "slot_episode": None}
    results, _ = run_fill(2, keep_slots=set(), max_rounds=2)  # nothing kept: 2 rounds of 4, then stop
    assert all(info["rounds"] == 2 and info["tasks_tried"] == 8 and info["tasks_kept"] == 0 and info["partial"]
               for _, _, info in results.values())


def test_task_draw_rejects_foreign_slots():
    def bad(slots, episode_ids):
        return [], {99}
    with pytest.raises(RuntimeError, match="99"):
        drive(schedule.TaskDraw(0, 0, 3, 2, 2, dist(0, 1)), bad)


def test_refills_never_redraw_a_kept_episode():
    """The paper command's sizes (32 episodes, batch 8) with the release's 10 rounds (--max-resample 9),
    200 steps, each slot kept with probability 1/2: before, each refill round drew from its own
    permutation and 89 of these 200 steps kept some episode twice (the issue measured 115 with its
    rollouts); now none does, and no step draws an episode twice while one is left undrawn."""
    def rollout_round(step):
        def run(slots, episode_ids):
            keep = {s for s in slots if hashlib.blake2b(repr((step, s)).encode(), digest_size=2).digest()[0] % 2 == 0}
            return [Rec(s) for s in slots], keep
        return run

    dup_kept = dup_drawn = refilled = 0
    for step in range(200):
        kept, _, info = drive(schedule.TaskDraw(0, step, 32, 8, 10, dist(0, 1)), rollout_round(step))
        eps = [info["slot_episode"][r.task_idx] for r in kept]
        dup_kept += len(eps) != len(set(eps))
        drawn = list(info["slot_episode"].values())
        dup_drawn += len(set(drawn[:32])) != len(drawn[:32])
        refilled += info["rounds"] > 1
    assert refilled > 150  # refills do run (the test can fail)
    assert dup_kept == 0 and dup_drawn == 0


def test_overlong_penalty_by_hand():
    # cap 48, buffer 8: free up to 40 tokens, then -1/8 per token, -1 at the cap
    penalty = lambda n, buffer: reward.shaped_reward(0.0, n, max_new_tokens=48, overlong_buffer=buffer)  # noqa: E731
    assert [penalty(n, 8) for n in (1, 40, 41, 44, 48)] == pytest.approx([0, 0, -0.125, -0.5, -1])
    assert penalty(48, 0) == 0.0  # off
    # the trainer's reward: score_response's plus every shaping term (here the penalty alone)
    assert reward.shaped_reward(0.9, 44, max_new_tokens=48, overlong_buffer=8) == pytest.approx(0.4)
    assert reward.shaped_reward(0.9, 48, max_new_tokens=48) == 0.9  # off by default


@pytest.mark.parametrize("flags, message", [
    # out of a flag's own range: refused while the flags are parsed (argparse's one line, exit 2)
    (["--temperature", "0"], "argument --temperature: 0: temperature must be finite and >= 0.001"),
    (["--temperature", "-1"], "argument --temperature: -1: temperature must be finite and >= 0.001"),
    (["--temperature", "nan"], "argument --temperature: nan: temperature must be finite and >= 0.001"),
    (["--top-p", "0"], "argument --top-p: 0: must be a finite number in (0, 1]"),
    (["--top-p", "1.5"], "argument --top-p: 1.5: must be a finite number in (0, 1]"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: 0: must be >= 1"),
    (["--n-rollouts", "0"], "argument --n-rollouts: 0: must be >= 1"),
    (["--max-resample", "-1"], "argument --max-resample: -1: must be >= 0"),
    # flags that contradict each other: check_args, before any model loads
    (["--overlong-buffer", "49"], "--overlong-buffer 49: must be in [0, --max-new-tokens 48]"),
    (["--old-logp", "sampler", "--top-p", "0.9"], "--old-logp sampler needs --top-p 1"),
])
def test_bad_flags_stop_before_anything_is_written(tmp_path, flags, message, capsys):
    import utils
    out = tmp_path / "run"
    with pytest.raises((utils.UsageError, SystemExit)) as e:
        ts.main(["--model", "tiny", "--out", str(out), *flags])
    said = str(e.value) if isinstance(e.value, utils.UsageError) else capsys.readouterr().err
    assert isinstance(e.value, utils.UsageError) or e.value.code == 2
    assert message in said, said
    assert not out.exists()  # no args.json, no metrics.jsonl


# -----------------------------------------------------------------------------
# sampling seeds: a task drawn twice is sampled afresh


class SeedSampler:
    def __init__(self):
        self.seeds = []

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        self.seeds.append(list(seeds))
        return [[SimpleNamespace(text="no action", ids=[1], logprobs=torch.zeros(1), finish_reason="stop")] * k
                for k in n]


def test_duplicate_task_gets_its_own_seed(monkeypatch):
    from PIL import Image

    import chat
    import dataset
    ep = dataset.Episode(goal="g", episode_id="e1", source="x",
                         steps=[dataset.Step(screenshot=None, action={"action": "wait", "time": 1})])
    monkeypatch.setattr(dataset, "load_screenshot", lambda *a, **k: Image.new("RGB", (56, 56)))
    monkeypatch.setattr(chat, "step_prompt", lambda *a, **k: SimpleNamespace(resized_size=(56, 56)))
    s = SeedSampler()
    how = RolloutSpec(n_rollouts=2, blank_screens=(56, 56))
    semi_online_rollout(s, [ep, ep], None, None, how, seed=[schedule.task_seed(0, 0, 0), schedule.task_seed(0, 0, 1)])
    assert len(s.seeds[0]) == 2 and s.seeds[0][0] != s.seeds[0][1]  # the two slots: different draws
    s2 = SeedSampler()
    semi_online_rollout(s2, [ep, ep], None, None, how, seed=0)  # one run seed: same draws
    assert s2.seeds[0][0] == s2.seeds[0][1]


# -----------------------------------------------------------------------------
# SOP progress


def test_sop_progress_by_hand():
    R = lambda task, roll, t, match: SimpleNamespace(task_idx=task, rollout_idx=roll, step_idx=t, match=match)  # noqa
    recs = [R(0, 0, 0, True), R(0, 0, 1, True), R(0, 0, 2, False),  # 10-step episode: 2 right, then wrong: 0.2
            R(0, 1, 0, False), R(0, 1, 1, True),  # wrong first, patched, then right: 0
            R(1, 0, 0, True), R(1, 0, 1, True), R(1, 0, 2, True)]  # 3-step episode, all right: 1
    # the trainer logs the sum of correct / length over rollouts
    assert rollout.sop_progress(recs, {0: 10, 1: 3}) == {(0, 0): (2, 10), (0, 1): (0, 10), (1, 0): (3, 3)}
    assert sum(c / n for c, n in rollout.sop_progress(recs, {0: 10, 1: 3}).values()) == pytest.approx(0.2 + 0.0 + 1.0)


def test_sop_progress_release_exception_rule():
    R = lambda task, t, match, error=None: SimpleNamespace(task_idx=task, rollout_idx=0, step_idx=t,  # noqa: E731
                                                           match=match, error=error)
    recs = [R(0, 0, True), R(0, 1, True), R(0, 2, False, "no 'action' key"),  # 2 right, then a raise
            R(1, 0, True), R(1, 1, False, "text after </action>")]  # strict: malformed, no raise rule
    assert rollout.sop_progress(recs, {0: 4, 1: 2}) == {(0, 0): (2, 4), (1, 0): (1, 2)}
    from extras.release import release_progress
    assert release_progress(rollout.sop_progress(recs, {0: 4, 1: 2}), recs) == {(0, 0): (0, 4), (1, 0): (0, 2)}


def test_trainer_match_rules_reach_the_rollout(tmp_path, monkeypatch):
    """--match-rules (strict by default, as evaluation's) decides the match of the trainer's rollouts too."""
    seen = []

    class Stop(Exception):
        pass

    def fake_rollout(sampler, episodes, tokenizer, image_processor, walk, **k):
        seen.append(walk.match_rules)  # the RolloutSpec the trainer built from its config
        raise Stop

    monkeypatch.setattr(ts, "semi_online_rollout", fake_rollout)
    for flags, want in (([], "strict"), (["--match-rules", "release"], "release")):
        with pytest.raises(Stop):
            ts.main(["--model", "tiny", "--out", str(tmp_path / want), "--max-steps", "1", "--kl-coef", "0", *flags])
        assert seen[-1] == want

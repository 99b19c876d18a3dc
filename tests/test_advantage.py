"""Returns, advantages and dynamic sampling (docs/method.md §6) against cases computed by hand.

The scenario below: three tasks with non-contiguous ids, ragged rollouts (some end
early, some are patched and go on), a task with a single rollout (groups of one).
Expected values are written out as plain arithmetic here; `z` is the textbook
(x - mean) / (unbiased std + eps) in plain Python, independent of kernels/.
Tolerance: fp32 throughout, atol 1e-5 (eps = 1e-6 moves a z-score by < 1e-5 here).
"""

import math
import random
import statistics

import pytest
import torch

from advantage import (
    compute_advantages,
    discounted_returns,
    discounted_returns_ragged,
    dynamic_sampling_keep,
    dynamic_sampling_tasks,
    episode_advantages,
    step_advantages,
)

ATOL = 1e-5
EPS = 1e-6


def close(actual, expected, atol=ATOL):
    actual = torch.as_tensor(actual, dtype=torch.float32)
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def z(values):
    """Plain-Python reference: (x - mean) / (unbiased std + eps); a group of one -> 0."""
    if len(values) == 1:
        return [0.0]
    m = statistics.mean(values)
    s = statistics.stdev(values)
    return [(v - m) / (s + EPS) for v in values]


# -----------------------------------------------------------------------------
# discounted returns


def test_returns_gamma_half():
    # R3 = 1; R2 = 0.55 + 0.5*1 = 1.05; R1 = 0.1 + 0.5*1.05 = 0.625; R0 = 1 + 0.5*0.625 = 1.3125
    close(discounted_returns([1.0, 0.1, 0.55, 1.0], 0.5), [1.3125, 0.625, 1.05, 1.0])


def test_returns_gamma_zero_is_reward():
    close(discounted_returns(torch.tensor([1.0, 0.1, 0.55, 0.0]), 0.0), [1.0, 0.1, 0.55, 0.0])


def test_returns_gamma_one_is_suffix_sum():
    close(discounted_returns([1.0, 0.1, 0.55], 1.0), [1.65, 0.65, 0.55])


def test_returns_release_reset():
    r = [1.0, 0.1, 1.0, 1.0]
    wrong = [False, True, False, False]
    # paper: R3 = 1, R2 = 1.5, R1 = 0.1 + 0.75 = 0.85, R0 = 1 + 0.425 = 1.425
    close(discounted_returns(r, 0.5), [1.425, 0.85, 1.5, 1.0])
    # release: R1 = r1 = 0.1 (chain cut), and R0 = 1 + 0.5*0 = 1.0 (not passed back)
    close(discounted_returns(r, 0.5, reset_mask=wrong), [1.0, 0.1, 1.5, 1.0])
    # a wrong last step (the rollout ended there): R1 = 0.55, R0 = 1.0
    close(discounted_returns([1.0, 0.55], 0.5, reset_mask=[False, True]), [1.0, 0.55])


def test_returns_bad_gamma_and_lengths():
    with pytest.raises(ValueError):
        discounted_returns([1.0], 1.5)
    with pytest.raises(ValueError):
        discounted_returns([1.0, 0.0], 0.5, reset_mask=[True])


def test_returns_ragged_any_order():
    # rollout 4: rewards [1, 0.1, 0.55] -> [1 + 0.5*(0.1 + 0.5*0.55), 0.1 + 0.275, 0.55] = [1.1875, 0.375, 0.55]
    # rollout 9: rewards [0, 1] -> [0.5, 1]
    rid = [9, 4, 4, 9, 4]
    step = [1, 2, 0, 0, 1]
    rew = [1.0, 0.55, 1.0, 0.0, 0.1]
    close(discounted_returns_ragged(rew, rid, step, 0.5), [1.0, 0.55, 1.1875, 0.5, 0.375])


def test_returns_ragged_rejects_gaps_and_duplicates():
    with pytest.raises(ValueError, match="0..L-1"):
        discounted_returns_ragged([1.0, 1.0], [0, 0], [0, 2], 0.5)
    with pytest.raises(ValueError, match="0..L-1"):
        discounted_returns_ragged([1.0, 1.0], [0, 0], [0, 0], 0.5)


# -----------------------------------------------------------------------------
# step-level and episode-level advantages, small cases


def test_step_advantages_small():
    # task 0 step 0: [1, 0, 0.5] -> mean 0.5, unbiased std 0.5 -> [1, -1, 0]
    # task 0 step 1: [1, 0] -> mean 0.5, unbiased std sqrt(0.5) -> [+0.70711, -0.70711]
    # task 1 step 0: one rollout -> 0
    R = [1.0, 0.0, 0.5, 1.0, 0.0, 0.8]
    task = [0, 0, 0, 0, 0, 1]
    step = [0, 0, 0, 1, 1, 0]
    s2 = math.sqrt(0.5)
    close(step_advantages(R, task, step), [1.0, -1.0, 0.0, 0.5 / s2, -0.5 / s2, 0.0])


def test_constant_group_is_exactly_zero():
    # fp32 residue in mean/std of [0.1, 0.1, 0.1] must not turn into a nonzero advantage
    adv = step_advantages([0.1, 0.1, 0.1], [0, 0, 0], [0, 0, 0])
    close(adv, [0.0, 0.0, 0.0], atol=1e-6)


def test_episode_paper_takes_last_step_return():
    # rollout 0: returns at steps 0,1 = [2.0, 1.0] (last = 1.0); rollout 1: [0.3] (last = 0.3)
    # over the task: [1.0, 0.3] -> mean 0.65, std sqrt(0.245) -> +-0.35/0.494975 = +-0.70711
    R = [2.0, 1.0, 0.3]
    r = [9.0, 9.0, 9.0]  # ignored by the paper form
    adv = episode_advantages(R, r, [5, 5, 5], [0, 0, 1], [0, 1, 0], form="paper")
    s = math.sqrt(0.5)
    close(adv, [s, s, -s])


# -----------------------------------------------------------------------------
# the whole path on a ragged scenario (what the trainer calls)
#
# task 7 (3 steps, 3 rollouts)
#   rollout 0: r = [1, 1, 1]      match [T, T, T]
#   rollout 1: r = [1, 0.1]       match [T, F]       (wrong at step 1, no patch left: ended)
#   rollout 2: r = [0.55, 1, 1]   match [F, T, T]    (wrong at step 0, patched, went on)
# task 3 (2 steps, 2 rollouts)
#   rollout 0: r = [0]            match [F]          (nothing parsed, ended)
#   rollout 1: r = [1, 1]         match [T, T]
# task 5 (2 steps, 1 rollout): r = [1, 0.55] match [T, F]  -> every group has one member

SCENARIO = [
    # (task, rollout, step, reward, match)
    (7, 0, 0, 1.0, True),
    (7, 0, 1, 1.0, True),
    (7, 0, 2, 1.0, True),
    (7, 1, 0, 1.0, True),
    (7, 1, 1, 0.1, False),
    (7, 2, 0, 0.55, False),
    (7, 2, 1, 1.0, True),
    (7, 2, 2, 1.0, True),
    (3, 0, 0, 0.0, False),
    (3, 1, 0, 1.0, True),
    (3, 1, 1, 1.0, True),
    (5, 0, 0, 1.0, True),
    (5, 0, 1, 0.55, False),
]


def records(rows=SCENARIO, as_dict=True):
    out = []
    for task, roll, step, rew, match in rows:
        d = dict(task_idx=task, rollout_idx=roll, step_idx=step, reward=rew, match=match)
        out.append(d if as_dict else type("Rec", (), d)())
    return out


# gamma 0.5, paper returns, in SCENARIO order
RET_PAPER = [1.75, 1.5, 1.0, 1.05, 0.1, 1.3, 1.5, 1.0, 0.0, 1.5, 1.0, 1.275, 0.55]
# gamma 0.5, release returns: task 7 rollout 1: R1 = 0.1, R0 = 1 + 0 = 1.0;
# task 7 rollout 2: R0 = 0.55 (cut); task 5: R1 = 0.55, R0 = 1.0
RET_RELEASE = [1.75, 1.5, 1.0, 1.0, 0.1, 0.55, 1.5, 1.0, 0.0, 1.5, 1.0, 1.0, 0.55]


def expected_step_adv(R):
    # groups (task, step): (7,0) = rows 0,3,5; (7,1) = 1,4,6; (7,2) = 2,7; (3,0) = 8,9; (3,1) = 10; (5,*) alone
    out = [0.0] * 13
    for rows in ([0, 3, 5], [1, 4, 6], [2, 7], [8, 9], [10], [11], [12]):
        for i, a in zip(rows, z([R[i] for i in rows])):
            out[i] = a
    return out


def expected_episode_paper(R):
    # last-step return of each rollout: task 7: R[2], R[4], R[7]; task 3: R[8], R[10]; task 5: R[12]
    a7 = z([R[2], R[4], R[7]])
    a3 = z([R[8], R[10]])
    per_row_rollout = [0, 0, 0, 1, 1, 2, 2, 2]
    return [a7[k] for k in per_row_rollout] + [a3[0], a3[1], a3[1], 0.0, 0.0]


def expected_episode_release():
    r = [row[3] for row in SCENARIO]
    return z(r[0:8]) + z(r[8:11]) + z(r[11:13])


def test_scenario_returns_gamma_half_and_zero():
    out = compute_advantages(records(), gamma=0.5)
    close(out.returns, RET_PAPER)
    out0 = compute_advantages(records(), gamma=0.0)
    close(out0.returns, [row[3] for row in SCENARIO])
    close(compute_advantages(records(), gamma=0.5, returns_form="release").returns, RET_RELEASE)


def test_scenario_paper_forms():
    out = compute_advantages(records(), gamma=0.5, omega=1.0)
    # a few numbers by hand: step group (7, 0) = [1.75, 1.05, 1.3]: mean 4.1/3, unbiased var 0.251667/2
    m, s = 4.1 / 3, math.sqrt(((1.75 - 4.1 / 3) ** 2 + (1.05 - 4.1 / 3) ** 2 + (1.3 - 4.1 / 3) ** 2) / 2)
    close(out.adv_step[[0, 3, 5]], [(1.75 - m) / s, (1.05 - m) / s, (1.3 - m) / s])
    # episode task 7: last returns [1, 0.1, 1]: mean 0.7, std sqrt(0.27) -> [0.57735, -1.1547, 0.57735]
    close(out.adv_episode[[0, 3, 5]], [0.3 / math.sqrt(0.27), -0.6 / math.sqrt(0.27), 0.3 / math.sqrt(0.27)])
    # constant group (7, 2) = [1, 1] -> 0; lone groups -> 0; task 5 (one rollout) -> 0 everywhere
    close(out.adv_step[[2, 7, 10, 11, 12]], [0.0] * 5)
    close(out.adv_episode[[11, 12]], [0.0, 0.0])
    close(out.adv_step, expected_step_adv(RET_PAPER))
    close(out.adv_episode, expected_episode_paper(RET_PAPER))
    close(out.adv, [a + b for a, b in zip(expected_episode_paper(RET_PAPER), expected_step_adv(RET_PAPER))])


def test_scenario_weights_of_the_two_levels():
    """A = w_episode * A^E + omega * A^S (eq. 6.4), each weight applied to its own level."""
    step, episode = expected_step_adv(RET_PAPER), expected_episode_paper(RET_PAPER)
    out = compute_advantages(records(), gamma=0.5, w_episode=0.0, omega=2.0)
    close(out.adv, [2.0 * b for b in step])
    out = compute_advantages(records(), gamma=0.5, w_episode=-1.0, omega=0.5)
    close(out.adv, [-a + 0.5 * b for a, b in zip(episode, step)])


def test_scenario_release_forms():
    out = compute_advantages(records(), gamma=0.5, returns_form="release", episode_form="release", omega=0.5)
    close(out.returns, RET_RELEASE)
    close(out.adv_step, expected_step_adv(RET_RELEASE))
    # release episode: immediate rewards over all step samples of the task; task 5 has two samples
    # [1, 0.55] -> +-0.70711 (not 0: the group is the task, not the rollout)
    close(out.adv_episode[[11, 12]], [math.sqrt(0.5), -math.sqrt(0.5)])
    close(out.adv_episode, expected_episode_release())
    close(out.adv, [a + 0.5 * b for a, b in zip(expected_episode_release(), expected_step_adv(RET_RELEASE))])


def test_scenario_order_and_task_independence():
    ref = compute_advantages(records(as_dict=False), gamma=0.5)  # attribute records work too
    perm = list(range(len(SCENARIO)))
    random.Random(0).shuffle(perm)
    shuffled = compute_advantages(records([SCENARIO[i] for i in perm]), gamma=0.5)
    close(shuffled.adv, ref.adv[perm])
    close(shuffled.returns, ref.returns[perm])
    # dropping other tasks (dynamic sampling) does not change a task's advantages
    only7 = compute_advantages(records(SCENARIO[:8]), gamma=0.5)
    close(only7.adv, ref.adv[:8])


def test_empty_and_bad_flags():
    out = compute_advantages([], gamma=0.5)
    assert out.adv.shape == (0,) and out.returns.shape == (0,)
    with pytest.raises(ValueError):
        compute_advantages(records(), gamma=0.5, returns_form="paperish")
    with pytest.raises(ValueError):
        compute_advantages(records(), gamma=0.5, episode_form="x")


# -----------------------------------------------------------------------------
# dynamic sampling


def test_dynamic_sampling_keep():
    keep = dynamic_sampling_keep(
        [
            [1.75, 1.05, 1.3],  # population std sqrt(0.251667/3) = 0.2896 <= 0.3 -> drop (unbiased 0.3547 would keep)
            [0.0, 1.5],  # population std 0.75 -> keep
            [1.275],  # one rollout -> keep (release)
            [1.0, 1.0, 1.0, 1.0],  # std 0 -> drop
        ],
        threshold=0.3,
    )
    assert keep == [False, True, True, False]
    # strict ">": std exactly at the threshold is dropped ([0, 1] has population std 0.5)
    assert dynamic_sampling_keep([[0.0, 1.0]], threshold=0.5) == [False]
    assert dynamic_sampling_keep([[0.0, 1.0]], threshold=0.49) == [True]
    # threshold 0: a constant group is dropped exactly (no float residue), any spread is kept
    assert dynamic_sampling_keep([[0.1, 0.1, 0.1], [0.1, 0.1, 0.2]], threshold=0.0) == [False, True]


def test_dynamic_sampling_tasks_on_scenario():
    out = compute_advantages(records(), gamma=0.5)
    # step-0 returns: task 7 [1.75, 1.05, 1.3] -> drop; task 3 [0, 1.5] -> keep; task 5 [1.275] -> keep
    assert dynamic_sampling_tasks(records(), out.returns, threshold=0.3) == {3, 5}
    assert dynamic_sampling_tasks(records(), out.returns, threshold=0.8) == {5}


def test_shaped_rewards_replace_the_records_own():
    """rewards= (the trainer's overlong-shaped rewards) gives what records carrying those rewards give."""
    recs = [dict(task_idx=0, rollout_idx=i, step_idx=t, reward=r, match=r > 0.5)
            for i, rs in enumerate([[1.0, 0.55], [0.55, 1.0], [1.0, 1.0]]) for t, r in enumerate(rs)]
    shaped = [r["reward"] - 0.25 * (k % 2) for k, r in enumerate(recs)]
    want = compute_advantages([dict(r, reward=x) for r, x in zip(recs, shaped)], gamma=0.5)
    got = compute_advantages(recs, rewards=shaped, gamma=0.5)
    close(got.adv, want.adv)
    close(got.returns, want.returns)
    assert not torch.allclose(got.returns, compute_advantages(recs, gamma=0.5).returns)  # the shaping is used
    with pytest.raises(ValueError):
        compute_advantages(recs, rewards=shaped[:-1], gamma=0.5)


def test_a_bad_record_field_names_itself():
    """A record field that is not a number is an error naming the field; a missing one is a KeyError."""
    good = dict(task_idx=0, rollout_idx=0, step_idx=0, reward=1.0, match=True)
    with pytest.raises(ValueError, match="field 'reward'"):
        compute_advantages([good, dict(good, rollout_idx=1, reward="high")], gamma=0.5)
    with pytest.raises(ValueError, match="field 'step_idx'"):
        compute_advantages([good, dict(good, rollout_idx=1, step_idx=[0])], gamma=0.5)
    with pytest.raises(KeyError):
        compute_advantages([{k: v for k, v in good.items() if k != "task_idx"}], gamma=0.5)


def test_mean_only_norm_dr_grpo_by_hand():
    """--adv-norm mean (Dr.GRPO): both levels centre on the group mean without dividing by the std.
    One task, rollouts 0 and 1 of one step, rewards 1 and 0 (returns = rewards): A^S = A^E = +-0.5,
    combined +-1; under mean_std each level is +-0.5 / std([1, 0]) = +-1/sqrt(2), combined +-sqrt(2)."""
    import advantage

    recs = [dict(task_idx=0, rollout_idx=i, step_idx=0, reward=r, match=bool(r)) for i, r in enumerate((1.0, 0.0))]
    mean = advantage.compute_advantages(recs, gamma=0.5, norm="mean")
    assert mean.adv_step.tolist() == [0.5, -0.5] and mean.adv_episode.tolist() == [0.5, -0.5]
    assert mean.adv.tolist() == [1.0, -1.0]
    std = advantage.compute_advantages(recs, gamma=0.5)
    assert std.adv.tolist() == pytest.approx([math.sqrt(2), -math.sqrt(2)], rel=1e-5)
    with pytest.raises(ValueError, match="advantage norm"):
        advantage.compute_advantages(recs, gamma=0.5, norm="std")

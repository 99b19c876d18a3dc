"""Returns and advantages of semi-online RL (docs/method.md §6).

The rollout driver (rollout.py) hands over one flat record per sampled response, i.e. per (task,
rollout, step): task_idx, rollout_idx, step_idx, the rule reward r and whether the action matched.
This module gives each record one scalar advantage, which the trainer gives to every response token:

    R_t     = r_t + gamma * R_(t+1)                                      eq. 6.1
    A^S_i,t = (R_i,t - mean(G_t)) / (std(G_t) + eps), G_t: same task, step t   eq. 6.2
    A^E_i   = (R_i - mean) / (std + eps) over the task's N rollouts      eq. 6.3
    A_i,t   = w_episode * A^E_i + omega * A^S_i,t                        eq. 6.4

The release's variants (`returns_form` / `episode_form` "release": returns cut at a wrong step,
eq. 6.1'; an episode advantage of immediate rewards, eq. 6.3') are in docs/method.md §6 too.
A group of one gets advantage 0 at both levels. Every group normalisation goes through
`normalize_groups`, the one place that divides by the std (or not: Dr.GRPO's "mean").
"""

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from kernels import group_stats

RETURNS_FORMS = ("paper", "release")
EPISODE_FORMS = ("paper", "release")
# group normalisation: the paper's (R - mean) / (std + eps), or Dr.GRPO's R - mean
NORMS = ("mean_std", "mean")

# -----------------------------------------------------------------------------
# small helpers


def _as_1d(x, dtype) -> torch.Tensor:
    return torch.as_tensor(x, dtype=dtype).reshape(-1).contiguous()


def _dense_ids(*keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map the rows of the key columns (each (M,) int64) to dense ids 0..G-1 (M,)."""
    stacked = torch.stack([k.to(torch.int64) for k in keys], dim=1)  # (M, K)
    uniq, inv = torch.unique(stacked, dim=0, return_inverse=True)  # (G, K), (M,)
    return inv.to(torch.int64).contiguous(), uniq.shape[0]


def _check_same_len(**tensors: torch.Tensor) -> None:
    lens = {name: t.numel() for name, t in tensors.items()}
    if len(set(lens.values())) > 1:
        raise ValueError(f"inputs must have one length each, got {lens}")


# -----------------------------------------------------------------------------
# the group normalisation of eq. 6.2 and 6.3 (a fork of it, e.g. Dr.GRPO's, is a change here)


def normalize_groups(scores, group_ids, *, norm: str = "mean_std",
                     eps: float = 1e-6) -> torch.Tensor:
    """Each score against its group: (s - mean_G) / (std_G + eps) (norm "mean_std", eq. 6.2-6.3), or
    s - mean_G (norm "mean": Dr.GRPO, Liu et al. 2025, arXiv 2503.20783, drops the std division).

    scores (M,) float, group_ids (M,) int (arbitrary ids) -> fp32 (M,), no grad; in fp64 from
    kernels.group_stats (unbiased std). A group whose scores are all equal (a group of one
    included) gets exactly 0, whatever eps. Raises ValueError: norm not in NORMS; eps < 0; scores
    and group_ids not both (M,). TypeError: scores not floating point, group_ids not integer."""
    if norm not in NORMS:
        raise ValueError(f"advantage norm must be one of {NORMS}, got {norm!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    mean, std = group_stats(scores, group_ids)  # (M,) each
    s = scores.detach().to(torch.float64)  # (M,)
    mean, std = mean.to(torch.float64), std.to(torch.float64)
    adv = s - mean  # (M,)
    if norm == "mean_std":
        adv = adv / (std + eps)
    return torch.where(std == 0, torch.zeros_like(adv), adv).float()


# -----------------------------------------------------------------------------
# discounted returns (docs/method.md §6: R_t = r_t + gamma * R_(t+1), computed backwards)


def discounted_returns(rewards, gamma: float, reset_mask=None) -> torch.Tensor:
    """Discounted return of one rollout (eq. 6.1): R_t = r_t + gamma * R_(t+1), R_T = 0.

    rewards: (T,) in step order 0..T-1. reset_mask: optional bool (T,), True at a wrong step, where
    the release cuts the chain (eq. 6.1'): R_t = r_t, and the running return restarts from 0.
    Returns fp32 (T,). Raises ValueError: gamma outside [0, 1]; reset_mask of another length."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = _as_1d(rewards, torch.float64)  # (T,) float64 so long chains add up exactly
    if reset_mask is None:
        reset = torch.zeros(r.numel(), dtype=torch.bool)  # (T,) the paper's: no cut
    else:
        reset = _as_1d(reset_mask, torch.bool)  # (T,)
    _check_same_len(rewards=r, reset_mask=reset)
    R = torch.empty_like(r)  # (T,)
    running = 0.0
    for t in reversed(range(r.numel())):
        if reset[t]:
            R[t] = r[t]
            running = 0.0  # release: a wrong step neither receives nor passes on future return
        else:
            running = float(r[t]) + gamma * running
            R[t] = running
    return R.float()


def discounted_returns_ragged(rewards, rollout_ids, step_idx, gamma: float,
                              reset_mask=None) -> torch.Tensor:
    """`discounted_returns` over many rollouts of different lengths, stored flat, in any order.

    rewards (M,), rollout_ids (M,) int (unique across tasks), step_idx (M,) int, reset_mask optional
    bool (M,). Each rollout holds the steps 0..L-1 once (a semi-online rollout is a prefix of its
    episode). Returns fp32 (M,) in the input order. Raises ValueError: inputs of different lengths;
    a rollout whose steps are not 0..L-1 once each; gamma outside [0, 1]."""
    r = _as_1d(rewards, torch.float32)  # (M,)
    rid = _as_1d(rollout_ids, torch.int64)  # (M,)
    sidx = _as_1d(step_idx, torch.int64)  # (M,)
    if reset_mask is None:
        reset = torch.zeros(r.numel(), dtype=torch.bool)  # (M,) the paper's: no cut
    else:
        reset = _as_1d(reset_mask, torch.bool)  # (M,)
    _check_same_len(rewards=r, rollout_ids=rid, step_idx=sidx, reset_mask=reset)
    out = torch.empty_like(r)  # (M,)
    for u in torch.unique(rid).tolist():
        rows = (rid == u).nonzero(as_tuple=True)[0]  # (L,)
        steps, order = torch.sort(sidx[rows])
        if not torch.equal(steps, torch.arange(steps.numel())):
            raise ValueError(f"rollout {u}: step indices must be 0..L-1 once each, "
                             f"got {sidx[rows].tolist()}")
        rows = rows[order]  # (L,) in step order
        out[rows] = discounted_returns(r[rows], gamma, reset[rows])
    return out


# -----------------------------------------------------------------------------
# step-level advantage (docs/method.md §6: group G_t = same task, same step)


def step_advantages(returns, task_ids, step_idx, eps: float = 1e-6,
                    norm: str = "mean_std") -> torch.Tensor:
    """A^S_i,t (eq. 6.2), G_t = same task and same step t: returns (M,) float, task_ids (M,) int,
    step_idx (M,) int -> fp32 (M,). A group of one gets 0 (only one rollout reached step t).
    norm, eps: normalize_groups'. Raises ValueError: inputs of different lengths; eps < 0; bad
    norm."""
    R = _as_1d(returns, torch.float32)  # (M,)
    tid, sidx = _as_1d(task_ids, torch.int64), _as_1d(step_idx, torch.int64)
    _check_same_len(returns=R, task_ids=tid, step_idx=sidx)
    gid, _ = _dense_ids(tid, sidx)  # (M,) one id per (task, step)
    return normalize_groups(R, gid, norm=norm, eps=eps)


# -----------------------------------------------------------------------------
# episode-level advantage (docs/method.md §6: paper form and release form)


def episode_advantages(returns, rewards, task_ids, rollout_ids, step_idx, *, form: str = "paper",
                       eps: float = 1e-6, norm: str = "mean_std") -> torch.Tensor:
    """Episode-level advantage of every record, fp32 (M,); norm, eps: normalize_groups'.

    returns (M,) (discounted_returns_ragged's), rewards (M,) immediate, task_ids (M,), rollout_ids
    (M,) (unique across tasks), step_idx (M,). form "paper" (eq. 6.3): R_i is rollout i's return at
    its last step, normalised over the task's rollouts and broadcast to all its steps; "release"
    (eq. 6.3'): each record's r_i,t normalised against all records of its task.
    Raises ValueError: form not in EPISODE_FORMS; inputs of different lengths; eps < 0."""
    if form not in EPISODE_FORMS:
        raise ValueError(f"episode form must be one of {EPISODE_FORMS}, got {form!r}")
    R, r = _as_1d(returns, torch.float32), _as_1d(rewards, torch.float32)  # (M,) each
    tid, rid, sidx = (_as_1d(x, torch.int64) for x in (task_ids, rollout_ids, step_idx))
    _check_same_len(returns=R, rewards=r, task_ids=tid, rollout_ids=rid, step_idx=sidx)
    task_dense, _ = _dense_ids(tid)  # (M,)
    if form == "release":
        return normalize_groups(r, task_dense, norm=norm, eps=eps)

    roll, K = _dense_ids(tid, rid)  # (M,) rollout of each record, K rollouts
    last_step = torch.full((K,), -1, dtype=torch.int64)  # (K,) each rollout's last step
    last_step = last_step.scatter_reduce(0, roll, sidx, reduce="amax")
    is_last = sidx == last_step[roll]  # (M,) exactly one True per rollout
    R_last = torch.zeros(K, dtype=torch.float32)
    R_last[roll[is_last]] = R[is_last]  # (K,) trajectory return of each rollout
    task_of_roll = torch.zeros(K, dtype=torch.int64)
    task_of_roll[roll] = task_dense  # (K,)
    adv_roll = normalize_groups(R_last, task_of_roll, norm=norm, eps=eps)  # (K,)
    return adv_roll[roll]  # (M,) broadcast to every step of the rollout


# -----------------------------------------------------------------------------
# dynamic sampling (docs/method.md §6, DAPO-style)


def dynamic_sampling_keep(step0_returns: Sequence[Sequence[float]],
                          threshold: float = 0.3) -> list[bool]:
    """Which tasks to keep (eq. 6.5): std of the task's step-0 returns > threshold.

    step0_returns: one sequence per task, the step-0 return of each of its rollouts. The POPULATION
    std (ddof=0, the release's np.std); a task with a single rollout is kept, as in the release; a
    constant group has std exactly 0, so threshold 0 drops exactly the tasks with no variation.
    Raises ValueError when a task has no step-0 return."""
    keep = []
    for vals in step0_returns:
        v = [float(x) for x in vals]
        if not v:
            raise ValueError("a task has no step-0 return")
        mean = math.fsum(v) / len(v)
        std = 0.0 if max(v) == min(v) else math.sqrt(math.fsum((x - mean) ** 2 for x in v) / len(v))
        keep.append(len(v) == 1 or std > threshold)
    return keep


# -----------------------------------------------------------------------------
# the trainer's entry point: flat records in, one advantage and return per record out


@dataclass
class Advantages:
    adv: torch.Tensor  # (M,) fp32, combined A_i,t of each record, in record order
    returns: torch.Tensor  # (M,) fp32, R_i,t
    adv_episode: torch.Tensor  # (M,) fp32, A^E
    adv_step: torch.Tensor  # (M,) fp32, A^S


def _column(records: Sequence[Any], name: str, dtype) -> torch.Tensor:
    """Field `name` of every record (a dict or an object with that attribute) as a (M,) tensor.
    Raises KeyError / AttributeError: a record without it; ValueError naming it: not a number."""
    values = [r[name] if isinstance(r, Mapping) else getattr(r, name) for r in records]
    try:
        return torch.tensor([float(v) for v in values] if dtype.is_floating_point else values,
                            dtype=dtype)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the records' field {name!r}: {e}") from None


def compute_advantages(records: Sequence[Any], *, gamma: float,
                       rewards: Sequence[float] | None = None, returns_form: str = "paper",
                       episode_form: str = "paper", w_episode: float = 1.0, omega: float = 1.0,
                       eps: float = 1e-6, norm: str = "mean_std") -> Advantages:
    """Returns and advantages of the flat per-(task, rollout, step) records (docs/method.md §6).

    records: dicts or objects with task_idx, rollout_idx (unique within its task), step_idx, reward
    and match. Groups never cross tasks, so a task's result does not depend on the other tasks in
    the list. rewards: one per record, replacing the records' own (the trainer's
    reward.shaped_reward). A_i,t = w_episode * A^E_i + omega * A^S_i,t (eq. 6.4; release: both
    1.0); norm: normalize_groups', for both levels. Raises ValueError: returns_form, episode_form
    or norm unknown, gamma outside [0, 1], eps < 0, a rollout whose steps are not 0..L-1, rewards
    of another length; KeyError / AttributeError: a record without a field."""
    if returns_form not in RETURNS_FORMS:
        raise ValueError(f"returns form must be one of {RETURNS_FORMS}, got {returns_form!r}")
    tid, sidx = _column(records, "task_idx", torch.int64), _column(records, "step_idx", torch.int64)
    rollout_idx = _column(records, "rollout_idx", torch.int64)  # (M,) unique within its task
    rid, _ = _dense_ids(tid, rollout_idx)  # (M,) the rollout's id, unique across tasks
    r = _column(records, "reward", torch.float32)  # (M,)
    if rewards is not None:
        r = _as_1d([float(x) for x in rewards], torch.float32)
        _check_same_len(rewards=r, records=tid)
    reset = ~_column(records, "match", torch.bool) if returns_form == "release" else None  # (M,)
    returns = discounted_returns_ragged(r, rid, sidx, gamma, reset)  # (M,)
    adv_step = step_advantages(returns, tid, sidx, eps=eps, norm=norm)  # (M,)
    adv_episode = episode_advantages(returns, r, tid, rid, sidx, form=episode_form, eps=eps,
                                     norm=norm)  # (M,)
    adv = w_episode * adv_episode + omega * adv_step  # (M,) eq. 6.4
    return Advantages(adv=adv, returns=returns, adv_episode=adv_episode, adv_step=adv_step)


def dynamic_sampling_tasks(records: Sequence[Any], returns, threshold: float = 0.3) -> set[int]:
    """The task_idx values to keep: `dynamic_sampling_keep` on each task's step-0 returns.
    returns (M,) in record order (compute_advantages(...).returns). Raises ValueError when returns
    and records differ in length."""
    tid, sidx = _column(records, "task_idx", torch.int64), _column(records, "step_idx", torch.int64)
    R = _as_1d(returns, torch.float32)  # (M,)
    _check_same_len(records=tid, returns=R)
    step0: dict[int, list[float]] = {t: [] for t in tid.tolist()}
    for t, s, ret in zip(tid.tolist(), sidx.tolist(), R.tolist()):
        if s == 0:
            step0[t].append(ret)
    tasks = sorted(step0)
    keep = dynamic_sampling_keep([step0[t] for t in tasks], threshold)
    return {t for t, k in zip(tasks, keep) if k}

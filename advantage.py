"""
Returns and advantages of semi-online RL (docs/method.md §6).

The rollout driver (rollout.py) hands over one flat record per sampled response,
i.e. per (task, rollout, step): its task index, rollout index, step index, rule
reward r and whether the action matched the expert's. This module turns those
records into one scalar advantage per record; the trainer gives that scalar to
every response token of the record (docs/method.md §6, last lines).

    R_t     = r_t + gamma * R_(t+1)                                  (docs/method.md eq. 6.1)
    A^S_i,t = (R_i,t - mean(G_t)) / (std(G_t) + eps)                  (docs/method.md eq. 6.2)
              G_t = the rollouts of the same task at step t, unbiased std, |G_t| = 1 -> 0
    A^E_i   = (R_i - mean) / (std + eps) over the task's N rollouts  (docs/method.md eq. 6.3)
    A_i,t   = w_episode * A^E_i + omega * A^S_i,t                    (docs/method.md eq. 6.4)

Where the paper and the released code disagree, both are here behind a flag
(`returns_form`, `episode_form`, each "paper" or "release"):

1. returns, release form: the chain is cut at a wrong step (match False): there
   R_t = r_t, and, as in the release's loop, the running return is set to 0, so the
   wrong step's reward is not passed back either (R_(t-1) = r_(t-1) when step t is
   wrong). A wrong step followed by a patch has no say over what follows it.
2. episode advantage, paper form: R_i is the return at the LAST step of rollout i
   (its trajectory return), normalised over the task's rollouts and broadcast to
   every step of rollout i. Release form: every step's IMMEDIATE reward r_i,t is
   normalised against all step samples (all rollouts, all steps) of the same task.
3. groups of one get advantage 0 in every group here (the kernel's rule). The
   release leaves a lone sample's episode score un-normalised instead; we do not
   copy that (a lone sample has no baseline to compare against).
4. dynamic sampling (DAPO): the release keeps a task whose step-0 returns have a
   POPULATION std (numpy's np.std, ddof=0) above the threshold, or that has one
   rollout only; we do the same, and make a constant group's std exactly 0.

The task schedule that dynamic sampling refills (which episodes a step rolls out) is schedule.py's.

All group normalisations go through `normalize_groups`, the one place that decides the division
by the std (`norm`: the paper's "mean_std", or Dr.GRPO's "mean"); it takes each group's mean and
std from `kernels.group_stats` (Triton on GPU, torch reference on CPU).

Run the tests: python -m pytest -q tests/test_advantage.py
"""

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from kernels import group_stats

RETURNS_FORMS = ("paper", "release")
EPISODE_FORMS = ("paper", "release")
NORMS = ("mean_std", "mean")  # group normalisation: the paper's (R - mean) / (std + eps), or Dr.GRPO's R - mean

# -----------------------------------------------------------------------------
# small helpers


def _as_1d(x, dtype) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=dtype).reshape(-1)
    return t.contiguous()


def _dense_ids(*keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map the rows of the key columns (each (M,) int64) to dense ids 0..G-1 (M,)."""
    stacked = torch.stack([k.to(torch.int64) for k in keys], dim=1)  # (M, K)
    uniq, inv = torch.unique(stacked, dim=0, return_inverse=True)  # (G, K), (M,)
    return inv.to(torch.int64).contiguous(), uniq.shape[0]


def _check_same_len(**tensors: torch.Tensor) -> int:
    lens = {name: t.numel() for name, t in tensors.items()}
    if len(set(lens.values())) > 1:
        raise ValueError(f"inputs must have one length each, got {lens}")
    return next(iter(lens.values()))


# -----------------------------------------------------------------------------
# the group normalisation of eq. 6.2 and 6.3 (a fork of it, e.g. Dr.GRPO's, is a change here)


def normalize_groups(scores, group_ids, *, norm: str = "mean_std", eps: float = 1e-6) -> torch.Tensor:
    """Each score against its group: (s - mean_G) / (std_G + eps) (norm "mean_std", eq. 6.2-6.3), or
    s - mean_G (norm "mean": Dr.GRPO, Liu et al. 2025, arXiv 2503.20783, drops the std division).

    scores (M,) float, group_ids (M,) int (arbitrary ids) -> fp32 (M,), no grad. std unbiased; a group
    whose scores are all equal (a group of one included) gets exactly 0, whatever eps (the statistics
    of kernels.group_stats are exact there: mean = the score, std = 0). Computed in fp64.
    Raises ValueError: norm not in NORMS; eps < 0; scores and group_ids not both (M,).
    TypeError: scores not floating point, group_ids not integer.
    """
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
    """Discounted return of one rollout: R_t = r_t + gamma * R_(t+1), R_T = r_T.

    rewards: list[float] or Tensor (T,) in step order 0..T-1.
    reset_mask: optional bool (T,); True marks a wrong step, where the release cuts
        the chain: R_t = r_t, and the running return restarts from 0 so the steps
        before it do not see r_t either (see note 1 of the module docstring).
    Returns fp32 (T,). gamma = 0 gives R = r.
    Raises ValueError: gamma outside [0, 1]; reset_mask not of the rewards' length.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = _as_1d(rewards, torch.float64)  # (T,) float64 so long chains add up exactly
    T = r.numel()
    reset = torch.zeros(T, dtype=torch.bool) if reset_mask is None else _as_1d(reset_mask, torch.bool)
    _check_same_len(rewards=r, reset_mask=reset)
    R = torch.empty(T, dtype=torch.float64)  # (T,)
    running = 0.0
    for t in reversed(range(T)):
        if reset[t]:
            R[t] = r[t]
            running = 0.0  # release: a wrong step neither receives nor passes on future return
        else:
            running = float(r[t]) + gamma * running
            R[t] = running
    return R.float()


def discounted_returns_ragged(rewards, rollout_ids, step_idx, gamma: float, reset_mask=None) -> torch.Tensor:
    """`discounted_returns` over many rollouts of different lengths, stored flat.

    rewards (M,), rollout_ids (M,) int (one id per rollout, unique across tasks),
    step_idx (M,) int, reset_mask optional bool (M,). Records may come in any order;
    each rollout must hold the steps 0..L-1 exactly once (a semi-online rollout is a
    prefix of its episode). Returns fp32 (M,) in the input order.
    Raises ValueError: inputs of different lengths; a rollout whose steps are not 0..L-1 once
    each; gamma outside [0, 1].
    """
    r = _as_1d(rewards, torch.float32)  # (M,)
    rid = _as_1d(rollout_ids, torch.int64)  # (M,)
    sidx = _as_1d(step_idx, torch.int64)  # (M,)
    reset = torch.zeros_like(r, dtype=torch.bool) if reset_mask is None else _as_1d(reset_mask, torch.bool)
    _check_same_len(rewards=r, rollout_ids=rid, step_idx=sidx, reset_mask=reset)
    out = torch.empty_like(r)  # (M,)
    for u in torch.unique(rid).tolist():
        rows = (rid == u).nonzero(as_tuple=True)[0]  # (L,)
        steps, order = torch.sort(sidx[rows])
        if not torch.equal(steps, torch.arange(steps.numel())):
            raise ValueError(f"rollout {u}: step indices must be 0..L-1 once each, got {sidx[rows].tolist()}")
        rows = rows[order]  # (L,) in step order
        out[rows] = discounted_returns(r[rows], gamma, reset[rows])
    return out


# -----------------------------------------------------------------------------
# step-level advantage (docs/method.md §6: group G_t = same task, same step)


def step_advantages(returns, task_ids, step_idx, eps: float = 1e-6, norm: str = "mean_std") -> torch.Tensor:
    """A^S_i,t = (R_i,t - mean(G_t)) / (std(G_t) + eps), G_t = same task and same step t.

    returns (M,) float, task_ids (M,) int, step_idx (M,) int -> fp32 (M,).
    Unbiased std; a group of one gets 0 (only one rollout reached step t). norm="mean": no division
    by the std (Dr.GRPO, Liu et al. 2025: A = R - mean(G)).
    Raises ValueError: inputs of different lengths; eps < 0; norm not in NORMS.
    """
    R = _as_1d(returns, torch.float32)  # (M,)
    tid, sidx = _as_1d(task_ids, torch.int64), _as_1d(step_idx, torch.int64)
    if _check_same_len(returns=R, task_ids=tid, step_idx=sidx) == 0:
        return R.clone()
    gid, _ = _dense_ids(tid, sidx)  # (M,) one id per (task, step)
    return normalize_groups(R, gid, norm=norm, eps=eps)


# -----------------------------------------------------------------------------
# episode-level advantage (docs/method.md §6: paper form and release form)


def episode_advantages(
    returns,
    rewards,
    task_ids,
    rollout_ids,
    step_idx,
    *,
    form: str = "paper",
    eps: float = 1e-6,
    norm: str = "mean_std",
) -> torch.Tensor:
    """Episode-level advantage of every record, fp32 (M,). norm: as step_advantages'.

    returns (M,) (from `discounted_returns_ragged`), rewards (M,) immediate rewards,
    task_ids (M,), rollout_ids (M,) (unique across tasks), step_idx (M,).
    form="paper": A^E_i = (R_i,last - mean) / (std + eps) over the task's rollouts,
        where R_i,last is rollout i's return at its last step; broadcast to all its steps.
    form="release": each record's r_i,t normalised against all records of its task.
    Raises ValueError: form not in EPISODE_FORMS; inputs of different lengths; eps < 0.
    """
    if form not in EPISODE_FORMS:
        raise ValueError(f"episode form must be one of {EPISODE_FORMS}, got {form!r}")
    R = _as_1d(returns, torch.float32)  # (M,)
    r = _as_1d(rewards, torch.float32)  # (M,)
    tid = _as_1d(task_ids, torch.int64)
    rid = _as_1d(rollout_ids, torch.int64)
    sidx = _as_1d(step_idx, torch.int64)
    M = _check_same_len(returns=R, rewards=r, task_ids=tid, rollout_ids=rid, step_idx=sidx)
    if M == 0:
        return R.clone()
    task_dense, _ = _dense_ids(tid)  # (M,)
    if form == "release":
        return normalize_groups(r, task_dense, norm=norm, eps=eps)

    roll, K = _dense_ids(tid, rid)  # (M,) rollout of each record, K rollouts
    last_step = torch.full((K,), -1, dtype=torch.int64).scatter_reduce(0, roll, sidx, reduce="amax")  # (K,)
    is_last = sidx == last_step[roll]  # (M,) exactly one True per rollout
    R_last = torch.zeros(K, dtype=torch.float32)
    R_last[roll[is_last]] = R[is_last]  # (K,) trajectory return of each rollout
    task_of_roll = torch.zeros(K, dtype=torch.int64)
    task_of_roll[roll] = task_dense  # (K,)
    adv_roll = normalize_groups(R_last, task_of_roll, norm=norm, eps=eps)  # (K,)
    return adv_roll[roll]  # (M,) broadcast to every step of the rollout


def combine(adv_episode, adv_step, w_episode: float = 1.0, omega: float = 1.0) -> torch.Tensor:
    """A_i,t = w_episode * A^E_i + omega * A^S_i,t (docs/method.md §6; release: both weights 1.0), fp32 (M,).
    Raises ValueError when adv_episode and adv_step differ in length."""
    aE, aS = _as_1d(adv_episode, torch.float32), _as_1d(adv_step, torch.float32)
    _check_same_len(adv_episode=aE, adv_step=aS)
    return w_episode * aE + omega * aS


# -----------------------------------------------------------------------------
# dynamic sampling (docs/method.md §6, DAPO-style)


def dynamic_sampling_keep(step0_returns: Sequence[Sequence[float]], threshold: float = 0.3) -> list[bool]:
    """Which tasks to keep: std of the task's step-0 returns > threshold.

    step0_returns: one sequence per task, the step-0 return of each of its rollouts.
    The std is the POPULATION std (ddof=0), as the release's np.std; a task with a
    single rollout is kept, as in the release. A constant group has std exactly 0
    (no float residue), so threshold 0 drops exactly the tasks with no variation.
    Raises ValueError when a task has no step-0 return.
    """
    keep = []
    for vals in step0_returns:
        v = [float(x) for x in vals]
        if len(v) == 0:
            raise ValueError("a task has no step-0 return")
        if len(v) == 1:
            keep.append(True)
            continue
        if max(v) == min(v):
            std = 0.0
        else:
            mean = math.fsum(v) / len(v)
            std = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / len(v))
        keep.append(std > threshold)
    return keep


# -----------------------------------------------------------------------------
# the trainer's entry point: flat records in, one advantage and return per record out


def _field(rec: Any, name: str):
    return rec[name] if isinstance(rec, Mapping) else getattr(rec, name)


@dataclass
class Advantages:
    adv: torch.Tensor  # (M,) fp32, combined A_i,t of each record, in record order
    returns: torch.Tensor  # (M,) fp32, R_i,t
    adv_episode: torch.Tensor  # (M,) fp32, A^E
    adv_step: torch.Tensor  # (M,) fp32, A^S


def records_to_tensors(records: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Columns of the records: task_idx, rollout_idx, step_idx (int64), reward (fp32), match (bool).

    A record is a dict or any object with those attributes. rollout_idx need only
    be unique within its task; "rollout" below is the dense id of (task_idx, rollout_idx).
    Raises KeyError / AttributeError when a record lacks a field, ValueError / TypeError when a
    field is not a number.
    """
    cols = {
        "task_idx": _as_1d([_field(x, "task_idx") for x in records], torch.int64),
        "rollout_idx": _as_1d([_field(x, "rollout_idx") for x in records], torch.int64),
        "step_idx": _as_1d([_field(x, "step_idx") for x in records], torch.int64),
        "reward": _as_1d([float(_field(x, "reward")) for x in records], torch.float32),
        "match": _as_1d([bool(_field(x, "match")) for x in records], torch.bool),
    }
    if len(records):
        cols["rollout"], _ = _dense_ids(cols["task_idx"], cols["rollout_idx"])
    else:
        cols["rollout"] = torch.zeros(0, dtype=torch.int64)
    return cols


def compute_advantages(
    records: Sequence[Any],
    *,
    gamma: float,
    rewards: Sequence[float] | None = None,
    returns_form: str = "paper",
    episode_form: str = "paper",
    w_episode: float = 1.0,
    omega: float = 1.0,
    eps: float = 1e-6,
    norm: str = "mean_std",
) -> Advantages:
    """Returns and advantages of the flat per-(task, rollout, step) records (docs/method.md §6).

    records: see `records_to_tensors`. Groups never cross tasks, so the result of a
    task does not depend on which other tasks are in the list (dynamic sampling may
    drop tasks before or after this call alike). rewards: one per record, replacing the
    records' own (reward.shaped_reward: e.g. with DAPO's overlong penalty); default: theirs.
    norm: "mean_std" (the paper's group normalisation) or "mean" (Dr.GRPO: no std division), for
    both levels.
    Raises ValueError: returns_form not in RETURNS_FORMS, episode_form not in EPISODE_FORMS, norm not in NORMS,
    gamma outside [0, 1], eps < 0, a rollout whose steps are not 0..L-1.
    """
    if returns_form not in RETURNS_FORMS:
        raise ValueError(f"returns form must be one of {RETURNS_FORMS}, got {returns_form!r}")
    if norm not in NORMS:
        raise ValueError(f"advantage norm must be one of {NORMS}, got {norm!r}")
    c = records_to_tensors(records)
    if rewards is not None:
        c["reward"] = _as_1d([float(x) for x in rewards], torch.float32)
        _check_same_len(rewards=c["reward"], records=c["task_idx"])
    reset = ~c["match"] if returns_form == "release" else None  # (M,)
    returns = discounted_returns_ragged(c["reward"], c["rollout"], c["step_idx"], gamma, reset)  # (M,)
    adv_step = step_advantages(returns, c["task_idx"], c["step_idx"], eps=eps, norm=norm)  # (M,)
    adv_episode = episode_advantages(
        returns, c["reward"], c["task_idx"], c["rollout"], c["step_idx"], form=episode_form, eps=eps, norm=norm
    )  # (M,)
    adv = combine(adv_episode, adv_step, w_episode=w_episode, omega=omega)  # (M,)
    return Advantages(adv=adv, returns=returns, adv_episode=adv_episode, adv_step=adv_step)


def dynamic_sampling_tasks(records: Sequence[Any], returns, threshold: float = 0.3) -> set[int]:
    """The task_idx values to keep: `dynamic_sampling_keep` on each task's step-0 returns.

    returns (M,) in record order, e.g. `compute_advantages(...).returns`.
    Raises ValueError when returns and records differ in length.
    """
    R = _as_1d(returns, torch.float32).tolist()
    if len(R) != len(records):
        raise ValueError(f"{len(records)} records but {len(R)} returns")
    step0: dict[int, list[float]] = {}
    for rec, ret in zip(records, R):
        step0.setdefault(int(_field(rec, "task_idx")), [])
        if int(_field(rec, "step_idx")) == 0:
            step0[int(_field(rec, "task_idx"))].append(ret)
    tasks = sorted(step0)
    keep = dynamic_sampling_keep([step0[t] for t in tasks], threshold)
    return {t for t, k in zip(tasks, keep) if k}

"""Grouped statistics for the advantage normalisation (docs/method.md §6).

For scores s (M,) and integer group ids g (M,) -- ids arbitrary, unsorted, non-contiguous -- every
score gets the mean and the unbiased std of its group G:

    mean_i = sum_{j in G} s_j / n_G,      std_i = sqrt(sum_{j in G} (s_j - mean_G)^2 / (n_G - 1))

What to do with them (divide by the std or not, the eps, the rule for a group without spread) is
advantage.py's decision (`advantage.normalize_groups`), so a normalisation without the std (Dr.GRPO)
is a change there alone. One rule here keeps the statistics exact:

1. A group whose scores are all equal (a group of one included) gets mean = that score and std = 0
   exactly. Without it fp rounding residue in mean_G (three 0.1s do not sum to exactly 0.3) turns
   into a "std" of ~1e-8 and an advantage residue / (residue + eps) of order 0.01 instead of 0
   (docs/method.md §11, numerics).

Where it runs in training: advantage.py asks for the statistics of the rollout records' returns,
which are CPU tensors, so train_semionline.py takes the fp64 reference on every device; a step has
tasks x rollouts x steps scores (hundreds), far too few for a kernel launch to pay. The Triton
kernel serves GPU callers with many groups on the device (it is tested, and timed by
bench/gpu_check.py, at up to millions of scores) and runs only when scores are on CUDA or
UIS1_FORCE_TRITON=1.

Triton path: the launcher maps ids to dense 0..G-1 (torch.unique) and sorts score indices by group
(stable argsort), so group g owns the segment order[starts[g] : starts[g] + counts[g]]. One program
per group makes two passes over its segment (sum/min/max, then sum of squared deviations -- the
two-pass form, no E[x^2] - E[x]^2 cancellation) in fp32 and a third that scatters the group's mean
and std back through `order`. The reference computes in fp64; it is also the CPU path.
"""

import torch
import triton
import triton.language as tl

from kernels._dispatch import check_runnable, use_triton


# ---------------------------------------------------------------------------------------------------
# Triton kernel


@triton.jit
def _group_stats_fwd_kernel(
    scores_ptr,
    order_ptr,
    starts_ptr,
    counts_ptr,
    mean_ptr,
    std_ptr,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    start = tl.load(starts_ptr + g)  # int64
    n = tl.load(counts_ptr + g)  # int64
    cols = tl.arange(0, BLOCK).to(tl.int64)

    # pass 1: sum, min, max
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    lo = tl.full([BLOCK], float("inf"), dtype=tl.float32)
    hi = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for off in range(0, n, BLOCK):
        idx = off + cols
        m = idx < n
        pos = tl.load(order_ptr + start + idx, mask=m, other=0)
        s = tl.load(scores_ptr + pos, mask=m, other=0.0).to(tl.float32)
        acc += s
        lo = tl.minimum(lo, tl.where(m, s, float("inf")))
        hi = tl.maximum(hi, tl.where(m, s, float("-inf")))
    n_f = n.to(tl.float32)
    lo_g = tl.min(lo, axis=0)
    constant = lo_g == tl.max(hi, axis=0)  # also true for n == 1
    mean = tl.where(constant, lo_g, tl.sum(acc, axis=0) / n_f)  # rule 1: exact for a constant group

    # pass 2: unbiased std from squared deviations
    ssd = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, n, BLOCK):
        idx = off + cols
        m = idx < n
        pos = tl.load(order_ptr + start + idx, mask=m, other=0)
        s = tl.load(scores_ptr + pos, mask=m, other=0.0).to(tl.float32)
        d = tl.where(m, s - mean, 0.0)
        ssd += d * d
    var = tl.sum(ssd, axis=0) / tl.maximum(n_f - 1.0, 1.0)
    std = tl.where(constant, 0.0, tl.sqrt(var))

    # pass 3: write the group's statistics to each of its scores, through the permutation
    for off in range(0, n, BLOCK):
        idx = off + cols
        m = idx < n
        pos = tl.load(order_ptr + start + idx, mask=m, other=0)
        tl.store(mean_ptr + pos, tl.zeros([BLOCK], dtype=tl.float32) + mean, mask=m)
        tl.store(std_ptr + pos, tl.zeros([BLOCK], dtype=tl.float32) + std, mask=m)


# ---------------------------------------------------------------------------------------------------
# launcher, reference, dispatch


def _check(scores, group_ids):
    if scores.dim() != 1 or group_ids.dim() != 1 or scores.shape != group_ids.shape:
        raise ValueError(
            f"group_stats: scores and group_ids must both be (M,), got "
            f"{tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    if not scores.dtype.is_floating_point:
        raise TypeError(f"group_stats: scores must be floating point, got {scores.dtype}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise TypeError(f"group_stats: group_ids must be an integer tensor, got {group_ids.dtype}")
    if scores.device != group_ids.device:
        raise ValueError(f"group_stats: scores on {scores.device}, group_ids on {group_ids.device}")


def group_stats_triton(scores, group_ids, block=128):
    """Triton path (CUDA, or CPU under TRITON_INTERPRET=1). Same contract and errors as group_stats;
    block = scores per loop iteration of a program. Returns (mean, std), each (M,) fp32."""
    _check(scores, group_ids)
    check_runnable(_group_stats_fwd_kernel, scores, "group_stats")
    M = scores.numel()
    mean = torch.empty(M, dtype=torch.float32, device=scores.device)
    std = torch.empty(M, dtype=torch.float32, device=scores.device)
    if M == 0:
        return mean, std
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)  # inv (M,), counts (G,)
    order = torch.argsort(inv, stable=True).contiguous()  # (M,) int64, grouped by dense id
    counts = counts.to(torch.int64).contiguous()
    starts = (torch.cumsum(counts, 0) - counts).contiguous()  # (G,)
    _group_stats_fwd_kernel[(counts.numel(),)](
        scores.detach().contiguous(),
        order,
        starts,
        counts,
        mean,
        std,
        BLOCK=block,
    )
    return mean, std


@torch.no_grad()
def group_stats_ref(scores, group_ids):
    """Pure-torch reference (fp64) and CPU path. Returns (mean, std), each (M,) fp64, no grad.

    Raises:
        ValueError: scores and group_ids not both (M,); different devices.
        TypeError: scores not floating point; group_ids not an integer tensor.
    """
    _check(scores, group_ids)
    s = scores.detach().to(torch.float64)  # (M,)
    if s.numel() == 0:
        return s.clone(), s.clone()
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    G = counts.numel()
    n = counts.to(torch.float64)  # (G,)
    lo = torch.full((G,), float("inf"), dtype=torch.float64, device=s.device).scatter_reduce_(0, inv, s, "amin")
    hi = torch.full((G,), float("-inf"), dtype=torch.float64, device=s.device).scatter_reduce_(0, inv, s, "amax")
    constant = lo == hi  # (G,) rule 1
    mean = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, s) / n
    mean = torch.where(constant, lo, mean)  # (G,)
    dev = s - mean[inv]  # (M,)
    var = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, dev * dev)
    std = (var / (n - 1).clamp(min=1)).sqrt()
    std = torch.where(constant, torch.zeros_like(std), std)  # (G,)
    return mean[inv], std[inv]


@torch.no_grad()
def group_stats(scores, group_ids):
    """(M,) scores, (M,) integer group ids -> (mean, std): each (M,), the mean and the unbiased std of
    the score's group (see the module doc; a group without spread: its score and exactly 0).

    The statistics of the step- and episode-level advantage normalisation of docs/method.md §6
    (GRPO-style; UI-S1 paper, the policy optimisation); advantage.normalize_groups decides what to do
    with them. Triton on CUDA (or with UIS1_FORCE_TRITON=1; see kernels/_dispatch.py): fp32; the fp64
    torch reference otherwise: fp64. No grad (advantages are constants of the PPO objective).

    Raises:
        ValueError: scores and group_ids not both (M,); different devices.
        TypeError: scores not floating point; group_ids not an integer tensor.
        RuntimeError: the Triton path forced on CPU without the interpreter (TRITON_INTERPRET=1),
            or on a device that is neither CUDA nor CPU.
    """
    if use_triton(scores):
        return group_stats_triton(scores, group_ids)
    return group_stats_ref(scores, group_ids)

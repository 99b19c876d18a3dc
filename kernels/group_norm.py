"""Grouped advantage normalization (docs/method.md §6).

For scores s (M,) and integer group ids g (M,) -- ids arbitrary, unsorted, non-contiguous:

    mode "mean_std":  A_i = (s_i - mean_G) / (std_G + eps),   std unbiased: sqrt(sum (s - mean)^2 / (n_G - 1))
    mode "mean":      A_i =  s_i - mean_G

where G is the group of i and n_G its size. Two rules that keep the output exact:

1. A group of size 1 gives 0 (no baseline to compare against).
2. A group whose scores are all equal gives exactly 0. Without this rule fp rounding residue in
   mean_G (e.g. three 0.1s do not sum to exactly 0.3) turns into a "std" of ~1e-8 and
   residue / (residue + eps) of order 0.01 instead of 0 (docs/method.md §11, numerics).
   Rule 1 is a special case of rule 2 (min == max).

Advantages are constants of the PPO objective, so group_normalize returns a tensor without grad.

Where it runs in training: advantage.py calls group_normalize on the rollout records' returns,
which are CPU tensors, so train_semionline.py takes the fp64 reference on every device; a step has
tasks x rollouts x steps scores (hundreds), far too few for a kernel launch to pay. The Triton
kernel serves GPU callers with many groups on the device (it is tested, and timed by
bench/gpu_check.py, at up to millions of scores) and runs only when scores are on CUDA or
UIS1_FORCE_TRITON=1.

Triton path: the launcher maps ids to dense 0..G-1 (torch.unique) and sorts token indices by group
(stable argsort), so group g owns the segment order[starts[g] : starts[g] + counts[g]]. One program
per group makes two passes over its segment (sum/min/max, then sum of squared deviations -- the
two-pass form, no E[x^2] - E[x]^2 cancellation) in fp32 and scatters the result back through
`order`. The reference computes in fp64; it is also the CPU path.
"""

import torch
import triton
import triton.language as tl

from kernels._dispatch import check_runnable, use_triton

MODES = ("mean_std", "mean")


# ---------------------------------------------------------------------------------------------------
# Triton kernel


@triton.jit
def _group_norm_fwd_kernel(
    scores_ptr,
    order_ptr,
    starts_ptr,
    counts_ptr,
    out_ptr,
    eps,
    USE_STD: tl.constexpr,
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
    mean = tl.sum(acc, axis=0) / n_f
    constant = tl.min(lo, axis=0) == tl.max(hi, axis=0)  # also true for n == 1

    # pass 2: unbiased std from squared deviations
    denom = 1.0
    if USE_STD:
        ssd = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, n, BLOCK):
            idx = off + cols
            m = idx < n
            pos = tl.load(order_ptr + start + idx, mask=m, other=0)
            s = tl.load(scores_ptr + pos, mask=m, other=0.0).to(tl.float32)
            d = tl.where(m, s - mean, 0.0)
            ssd += d * d
        var = tl.sum(ssd, axis=0) / tl.maximum(n_f - 1.0, 1.0)
        denom = tl.sqrt(var) + eps

    # pass 3: write back through the permutation
    for off in range(0, n, BLOCK):
        idx = off + cols
        m = idx < n
        pos = tl.load(order_ptr + start + idx, mask=m, other=0)
        s = tl.load(scores_ptr + pos, mask=m, other=0.0).to(tl.float32)
        a = (s - mean) / denom
        a = tl.where(constant, 0.0, a)
        tl.store(out_ptr + pos, a, mask=m)


# ---------------------------------------------------------------------------------------------------
# launcher, reference, dispatch


def _check(scores, group_ids, mode, eps):
    if mode not in MODES:
        raise ValueError(f"group_normalize: mode must be one of {MODES}, got {mode!r}")
    if scores.dim() != 1 or group_ids.dim() != 1 or scores.shape != group_ids.shape:
        raise ValueError(
            f"group_normalize: scores and group_ids must both be (M,), got "
            f"{tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    if not scores.dtype.is_floating_point:
        raise TypeError(f"group_normalize: scores must be floating point, got {scores.dtype}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise TypeError(f"group_normalize: group_ids must be an integer tensor, got {group_ids.dtype}")
    if scores.device != group_ids.device:
        raise ValueError(f"group_normalize: scores on {scores.device}, group_ids on {group_ids.device}")
    if not eps >= 0:
        raise ValueError(f"group_normalize: eps must be >= 0, got {eps}")


def group_normalize_triton(scores, group_ids, mode="mean_std", eps=1e-6, block=128):
    """Triton path (CUDA, or CPU under TRITON_INTERPRET=1). Same contract and errors as group_normalize;
    block = scores per loop iteration of a program. Statistics in fp32 (the reference: fp64)."""
    _check(scores, group_ids, mode, eps)
    check_runnable(_group_norm_fwd_kernel, scores, "group_normalize")
    M = scores.numel()
    out = torch.empty(M, dtype=torch.float32, device=scores.device)
    if M == 0:
        return out
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)  # inv (M,), counts (G,)
    order = torch.argsort(inv, stable=True).contiguous()  # (M,) int64, grouped by dense id
    counts = counts.to(torch.int64).contiguous()
    starts = (torch.cumsum(counts, 0) - counts).contiguous()  # (G,)
    _group_norm_fwd_kernel[(counts.numel(),)](
        scores.detach().contiguous(),
        order,
        starts,
        counts,
        out,
        float(eps),
        USE_STD=(mode == "mean_std"),
        BLOCK=block,
    )
    return out


@torch.no_grad()
def group_normalize_ref(scores, group_ids, mode="mean_std", eps=1e-6):
    """Pure-torch reference (fp64 internally) and CPU path. Returns (M,) fp32, no grad.

    Raises:
        ValueError: mode not in MODES; scores and group_ids not both (M,); different devices; eps < 0.
        TypeError: scores not floating point; group_ids not an integer tensor.
    """
    _check(scores, group_ids, mode, eps)
    s = scores.detach().to(torch.float64)  # (M,)
    if s.numel() == 0:
        return s.float()
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    G = counts.numel()
    n = counts.to(torch.float64)  # (G,)
    mean = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, s) / n
    dev = s - mean[inv]  # (M,)
    lo = torch.full((G,), float("inf"), dtype=torch.float64, device=s.device).scatter_reduce_(0, inv, s, "amin")
    hi = torch.full((G,), float("-inf"), dtype=torch.float64, device=s.device).scatter_reduce_(0, inv, s, "amax")
    constant = (lo == hi)[inv]  # (M,) rule 2 (and 1)
    if mode == "mean_std":
        var = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, dev * dev)
        std = (var / (n - 1).clamp(min=1)).sqrt()
        out = dev / (std[inv] + eps)
    else:
        out = dev
    out = torch.where(constant, torch.zeros_like(out), out)
    return out.float()


@torch.no_grad()
def group_normalize(scores, group_ids, mode="mean_std", eps=1e-6):
    """(M,) scores, (M,) integer group ids -> (M,) fp32 group-normalized scores (see module doc).

    The step- and episode-level advantage normalisation of docs/method.md §6 (GRPO-style; UI-S1
    paper, section 3). Triton on CUDA (or with UIS1_FORCE_TRITON=1; see kernels/_dispatch.py), the
    fp64 torch reference otherwise.

    Raises:
        ValueError: mode not in MODES; scores and group_ids not both (M,); different devices; eps < 0.
        TypeError: scores not floating point; group_ids not an integer tensor.
        RuntimeError: the Triton path forced on CPU without the interpreter (TRITON_INTERPRET=1),
            or on a device that is neither CUDA nor CPU.
    """
    if use_triton(scores):
        return group_normalize_triton(scores, group_ids, mode=mode, eps=eps)
    return group_normalize_ref(scores, group_ids, mode=mode, eps=eps)

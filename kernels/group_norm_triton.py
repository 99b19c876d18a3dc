"""group_stats' Triton path (CUDA; CPU only under TRITON_INTERPRET=1 with UIS1_FORCE_TRITON=1): the
kernel and its launcher. The statistics, their exactness rule and the fp64 reference are
kernels/group_norm.py's; that module imports this one only when kernels/_dispatch.py chooses Triton.

The launcher maps ids to dense 0..G-1 (torch.unique) and sorts score indices by group
(stable argsort), so group g owns the segment order[starts[g] : starts[g] + counts[g]]. One program
per group makes two passes over its segment (sum/min/max, then sum of squared deviations -- the
two-pass form, no E[x^2] - E[x]^2 cancellation) in fp32 and a third that scatters the group's mean
and std back through `order`.
"""

import torch
import triton
import triton.language as tl

from kernels._dispatch import check_runnable

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
# launcher


def group_stats_triton(scores, group_ids, block=128):
    """Triton path (CUDA, or CPU under TRITON_INTERPRET=1). Same contract as group_stats, whose checks
    (shapes, dtypes, devices) run before it dispatches here; block = scores per loop iteration of a
    program. Returns (mean, std), each (M,) fp32. Raises RuntimeError where the kernel cannot run."""
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

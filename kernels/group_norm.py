"""Grouped statistics for the advantage normalisation (docs/method.md §6).

For scores s (M,) and integer group ids g (M,) (arbitrary, unsorted), every score gets the mean and
the unbiased std of its group G:

    mean_i = sum_{j in G} s_j / n_G,      std_i = sqrt(sum_{j in G} (s_j - mean_G)^2 / (n_G - 1))

(advantage.normalize_groups uses them). A group whose scores are all equal (a group of one
included) gets mean = that score and std = 0 exactly, not fp residue (three 0.1s do not sum to 0.3)
that would turn into an advantage of order 0.01. A step's returns (hundreds) live on the CPU, so
training runs the fp64 reference; the Triton kernel (kernels/group_norm_triton.py) serves CUDA
callers with many groups.
"""

import torch

from kernels._dispatch import use_triton

# ---------------------------------------------------------------------------------------------------
# checks, reference, dispatch


def _check(scores, group_ids):
    if scores.dim() != 1 or group_ids.dim() != 1 or scores.shape != group_ids.shape:
        raise ValueError(f"group_stats: scores and group_ids must both be (M,), got "
                         f"{tuple(scores.shape)} and {tuple(group_ids.shape)}")
    if not scores.dtype.is_floating_point:
        raise TypeError(f"group_stats: scores must be floating point, got {scores.dtype}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise TypeError(f"group_stats: group_ids must be an integer tensor, got {group_ids.dtype}")
    if scores.device != group_ids.device:
        raise ValueError(f"group_stats: scores on {scores.device}, group_ids on {group_ids.device}")


@torch.no_grad()
def group_stats_ref(scores, group_ids):
    """Pure-torch reference (fp64) and CPU path. Returns (mean, std), each (M,) fp64, no grad.
    Same contract and errors as group_stats."""
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
    """(M,) scores, (M,) integer group ids -> (mean, std), each (M,), no grad (the module docstring).
    Triton on CUDA (or UIS1_FORCE_TRITON=1): fp32; the torch reference otherwise: fp64.
    Raises ValueError: scores and group_ids not both (M,); different devices. TypeError: scores not
    floating point; group_ids not integer. RuntimeError: the Triton path forced on CPU without
    TRITON_INTERPRET=1, or another device."""
    if not use_triton(scores):
        return group_stats_ref(scores, group_ids)
    from kernels import group_norm_triton  # CUDA (or the interpreter) only: triton is imported here

    _check(scores, group_ids)
    return group_norm_triton.group_stats_triton(scores, group_ids)

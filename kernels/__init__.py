"""Fused kernels for the RL loss.

- group_stats:     per-group mean and std for the advantage normalisation (docs/method.md §6)
- fused_logprob:   lm_head log-prob / entropy without the (N, V) logits (docs/method.md §7)
- ppo_loss:        per-token dual-clip PPO loss + k3 KL and its gradient in one pass (docs/method.md §7),
                   and beside it every loss aggregation (aggregate_loss, loss_denominator)

Each op: kernels/<op>.py holds the math, `<op>_ref` (a pure-torch reference that is also the CPU
path) and the public entry point; kernels/<op>_triton.py holds its Triton kernels and launchers.
Which one runs is decided in one place, kernels/_dispatch.py: Triton on CUDA tensors (CPU only under
TRITON_INTERPRET=1 with UIS1_FORCE_TRITON=1), the reference otherwise; the _triton module is imported
only then, so a CPU run never imports triton.
"""

from kernels.group_norm import group_stats, group_stats_ref
from kernels.logprob import fused_logprob, fused_logprob_ref
from kernels.ppo_loss import LOSS_AGGS, aggregate_loss, loss_denominator, ppo_loss, ppo_loss_ref

__all__ = [
    "LOSS_AGGS",
    "aggregate_loss",
    "loss_denominator",
    "fused_logprob",
    "fused_logprob_ref",
    "group_stats",
    "group_stats_ref",
    "ppo_loss",
    "ppo_loss_ref",
]

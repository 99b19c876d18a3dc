"""Fused kernels for the RL loss (issue 4).

- group_normalize: grouped advantage normalization (SPEC section 6)
- fused_logprob:   lm_head log-prob / entropy without the (N, V) logits
- ppo_loss:        per-token dual-clip PPO loss + k3 KL and its gradient in one pass (SPEC section 7)

Each op: Triton kernels (CUDA; CPU only under TRITON_INTERPRET=1 with UIS1_FORCE_TRITON=1), an
autograd wrapper, and `<op>_ref`, a pure-torch reference that is also the CPU path.
"""

from kernels.group_norm import group_normalize, group_normalize_ref
from kernels.logprob import fused_logprob, fused_logprob_ref
from kernels.ppo_loss import ppo_loss, ppo_loss_ref

__all__ = [
    "fused_logprob",
    "fused_logprob_ref",
    "group_normalize",
    "group_normalize_ref",
    "ppo_loss",
    "ppo_loss_ref",
]

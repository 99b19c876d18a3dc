"""Per-token PPO loss with dual-clip and k3 KL (docs/method.md §7; verl's compute_policy_loss and
kl_penalty("low_var_kl"), as the UI-S1 release uses them). Forward and d loss / d logp in one pass.

Per token (eq. 7.1-7.3), with A the advantage, m the mask and lrc = log_ratio_clamp (20):

    r      = exp(clamp(logp - old_logp, -lrc, lrc))                 ratio
    pg     = max(-A r, -A clamp(r, 1 - clip_low, 1 + clip_high))    clipped when the second is larger
    pg     = min(pg, -A clip_c)   if A < 0                          dual clip (Ye et al. 2020)
    d      = clamp(ref_logp - logp, -lrc, lrc)
    kl     = clamp(exp(d) - d - 1, -kl_clamp, kl_clamp)             k3 / "low_var_kl", >= 0
    loss   = m * (pg + kl_coef * kl)

d loss / d logp (clamps pass gradient only inside [lo, hi], inclusive, as torch.clamp does):

    d pg  = -A r 1[|logp - old| <= lrc]   unless the clip or the dual clip chose a constant, then 0
    d kl  = -(exp(d) - 1) 1[|ref - logp| <= lrc] 1[|exp(d) - d - 1| <= kl_clamp]

Clamping the log-ratios before exp keeps a stale or far-off token from overflowing into inf/NaN
(docs/method.md §11). Masked tokens are zeroed with a select, not a multiply, so garbage in padded
positions cannot leak into the loss or the gradient. aggregate_loss (below) turns the per-token
losses into the mini-batch loss. Triton path: kernels/ppo_loss_triton.py.
"""

import torch

from kernels._dispatch import use_triton

# ---------------------------------------------------------------------------------------------------
# checks, reference and dispatch


def _check(logp, old_logp, adv, mask, ref_logp):
    named = {"old_logp": old_logp, "adv": adv, "mask": mask, "ref_logp": ref_logp}
    for name, t in named.items():
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"ppo_loss: {name} has shape {tuple(t.shape)}, logp has {tuple(logp.shape)}")
        if t is not None and t.device != logp.device:
            raise ValueError(f"ppo_loss: {name} is on {t.device}, logp on {logp.device}")
    for name, t in [("logp", logp), ("old_logp", old_logp), ("adv", adv), ("ref_logp", ref_logp)]:
        if t is not None and not t.dtype.is_floating_point:
            raise TypeError(f"ppo_loss: {name} must be floating point, got {t.dtype}")


def ppo_loss_ref(logp, old_logp, adv, mask, ref_logp=None, clip_low=0.2, clip_high=0.2, clip_c=3.0, kl_coef=1e-4,
                 kl_clamp=10.0, log_ratio_clamp=20.0):
    """Pure-torch reference and CPU path, in fp32; the gradient w.r.t. logp comes from autograd.
    Same contract and errors as ppo_loss."""
    _check(logp, old_logp, adv, mask, ref_logp)
    m = mask != 0
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    # select before any arithmetic so garbage in masked positions gets neither value nor NaN gradient
    logp = torch.where(m, logp.float(), zero)
    old = torch.where(m, old_logp.detach().float(), zero)
    adv = torch.where(m, adv.detach().float(), zero)

    ratio = torch.exp(torch.clamp(logp - old, -log_ratio_clamp, log_ratio_clamp))
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip = pg2 > pg1
    pg = torch.where(clip, pg2, pg1)
    pg3 = -adv * clip_c
    dual = (adv < 0) & (pg > pg3)
    loss = torch.where(dual, pg3, pg)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        ref = torch.where(m, ref_logp.detach().float(), zero)
        d = torch.clamp(ref - logp, -log_ratio_clamp, log_ratio_clamp)
        kl = torch.clamp(torch.exp(d) - d - 1.0, -kl_clamp, kl_clamp)
        loss = loss + kl_coef * kl
    stats = {"ratio": torch.where(m, ratio, zero).detach(), "clipped": (m & (clip | dual)).float(),
             "dual_clipped": (m & dual).float(), "kl": torch.where(m, kl, zero).detach()}
    return torch.where(m, loss, zero), stats


def ppo_loss(logp, old_logp, adv, mask, ref_logp=None, clip_low=0.2, clip_high=0.2, clip_c=3.0, kl_coef=1e-4,
             kl_clamp=10.0, log_ratio_clamp=20.0):
    """Per-token PPO loss (N,) fp32 (the module docstring's) and stats {'ratio', 'clipped' (the
    clip or the dual clip chose a constant), 'dual_clipped', 'kl'}, all 0 where mask == 0.
    logp, old_logp, adv (and ref_logp) any float dtype, mask any dtype (nonzero: the token counts),
    all of one shape (typically (N,)). Differentiable w.r.t. logp only, in logp's dtype. Triton on
    CUDA (or UIS1_FORCE_TRITON=1), ppo_loss_ref otherwise.
    Raises ValueError: old_logp, adv, mask or ref_logp of another shape or device than logp.
    TypeError: a log-prob or adv not floating point. RuntimeError: the Triton path forced on CPU
    without TRITON_INTERPRET=1, or another device.
    """
    if not use_triton(logp):
        return ppo_loss_ref(logp, old_logp, adv, mask, ref_logp, clip_low, clip_high, clip_c, kl_coef, kl_clamp,
                            log_ratio_clamp)
    from kernels.ppo_loss_triton import _PPOLoss  # CUDA (or the interpreter) only: triton is imported here

    _check(logp, old_logp, adv, mask, ref_logp)
    loss, ratio, clipped, dual, kl = _PPOLoss.apply(
        logp, old_logp, adv, mask, ref_logp, clip_low, clip_high, clip_c, kl_coef, kl_clamp, log_ratio_clamp
    )
    return loss, {"ratio": ratio, "clipped": clipped, "dual_clipped": dual, "kl": kl}


# ---------------------------------------------------------------------------------------------------
# aggregation: per-token losses -> one mini-batch loss (docs/method.md §7). Every aggregation is here,
# beside the per-token loss, with the lengths and the denominator as explicit arguments; the trainer
# sums loss_denominator over every micro-batch and rank of a mini-batch and passes the total.

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "dr-grpo")


def loss_denominator(lengths, agg: str, max_len: int | None = None) -> float:
    """This micro-batch's share of the denominator of `agg` for sequences of `lengths` tokens: the
    token count (token-mean, the release's); the sequence count (seq-mean-*); dr-grpo (Dr.GRPO):
    sequences times max_len, the generation budget, so a long response is not down-weighted.
    Raises ValueError: agg not in LOSS_AGGS; dr-grpo without a positive max_len."""
    if agg not in LOSS_AGGS:
        raise ValueError(f"loss aggregation must be one of {LOSS_AGGS}, got {agg!r}")
    if agg == "token-mean":
        return float(sum(lengths))
    if agg == "dr-grpo":
        if not max_len or max_len <= 0:
            raise ValueError(f"loss aggregation dr-grpo needs the generation budget max_len > 0, got {max_len!r}")
        return float(len(lengths) * max_len)
    return float(len(lengths))


def aggregate_loss(per_token: torch.Tensor, lengths, agg: str, denominator: float) -> torch.Tensor:
    """The mini-batch loss's share of one micro-batch: sum_t w_t * per_token_t / denominator.
    per_token (N,) fp32: the per-token losses of sequences of `lengths` tokens (sum N); w_t = 1 /
    L_i for seq-mean-token-mean, else 1; denominator: loss_denominator summed over the whole
    mini-batch (all micro-batches and ranks), at least 1. Returns a scalar with per_token's
    gradient. Raises ValueError: agg not in LOSS_AGGS; sum(lengths) != N."""
    if agg not in LOSS_AGGS:
        raise ValueError(f"aggregate_loss: agg must be one of {LOSS_AGGS}, got {agg!r}")
    lengths = [int(n) for n in lengths]
    if sum(lengths) != per_token.numel():
        raise ValueError(f"aggregate_loss: lengths sum to {sum(lengths)}, per_token has {per_token.numel()} tokens")
    if agg == "seq-mean-token-mean":
        w = torch.cat([torch.full((n,), 1.0 / max(n, 1)) for n in lengths]) if lengths else torch.zeros(0)
        return (per_token * w.to(per_token)).sum() / max(denominator, 1.0)
    return per_token.sum() / max(denominator, 1.0)

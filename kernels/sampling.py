"""The sampler's token draw (docs/method.md §5): the sampling distribution (temperature, banned
tokens, top-p nucleus) and one inverse-CDF draw per row, in two levels so that no (B, V)
cumulative sum is built. Pure torch (CPU and GPU alike); rollout.Sampler calls it once per
decode step, and its log-probabilities are the ones the trainer's old-policy ratio starts from.
"""
from __future__ import annotations

import torch


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                   banned_ids: torch.Tensor | None = None, *, normalise: bool = True) -> torch.Tensor:
    """logits (B, V) -> (B, V) fp32 probabilities of the sampling distribution.
    p(v) is proportional to exp(logit_v / temperature) over the allowed tokens; a token is not
    allowed if it is banned or lies outside the top-p nucleus: the smallest set of most likely
    tokens whose probability reaches top_p (Holtzman et al. 2020; the most likely token is always
    kept). The only place temperature is applied (rollout.py, engine design note 4). normalise=False skips the final
    division (sampling normalises through the CDF). Raises ValueError: temperature <= 0, top_p
    outside (0, 1]."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature} (use greedy=True for argmax)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    x = logits.float()
    if banned_ids is not None and banned_ids.numel():   # before the softmax: no underflow if they dominate
        x = x.index_fill(-1, banned_ids.to(x.device), float("-inf"))
    if temperature != 1.0:
        x = x / temperature
    probs = torch.softmax(x, dim=-1)                                         # (B, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)               # (B, V)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p    # mass of the strictly more likely tokens
        drop_sorted = mass_before >= top_p * sorted_p.sum(dim=-1, keepdim=True)
        probs.masked_fill_(torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True) if normalise else probs


_CDF_BLOCK = 1024  # vocab entries per block of the two-level inverse CDF


def _inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (B, V) fp32 >= 0 with a positive sum per row, u (B, 1) in [0, 1) -> (tokens (B,) long,
    total (B,) fp64 = sum of w). Token = the first v with w_0 + ... + w_v > u * total: the
    inverse-CDF draw from p = w / total, in two levels so that no (B, V) cumulative sum is built
    (a flat cumsum cost as much as the softmax): block sums (one read of w) and their cumsum pick
    the block, a cumsum over that block's _CDF_BLOCK entries picks the token. Block sums are fp32
    (an fp64 reduction is ~10x slower on CPU), both cumsums fp64, so the token is that of a flat
    cumsum except where u * total falls within fp32 rounding of a CDF boundary. A token of weight 0
    is never returned: the target is clipped below each level's own total, and the first entry
    whose cumulative sum exceeds it has positive weight."""
    B, V = w.shape
    K = _CDF_BLOCK
    full = V // K * K
    sums = [w[:, :full].view(B, -1, K).sum(-1)] if full else []                          # (B, V // K)
    if full < V:
        sums.append(w[:, full:].sum(-1, keepdim=True))                                   # (B, 1) the tail
    cdf = torch.cat(sums, dim=-1).double().cumsum(dim=-1)                                # (B, nb) fp64
    total = cdf[:, -1:]
    zero = torch.zeros_like(total)
    t = torch.minimum(u.to(total) * total, torch.nextafter(total, zero))                 # (B, 1) < total
    b = torch.searchsorted(cdf, t, right=True).clamp_(max=cdf.shape[-1] - 1)              # (B, 1) block
    t = t - torch.where(b > 0, cdf.gather(-1, (b - 1).clamp_(min=0)), zero)               # offset in the block
    cols = b * K + torch.arange(K, device=w.device)                                      # (B, K)
    seg = w.gather(-1, cols.clamp(max=V - 1)).masked_fill_(cols >= V, 0.0)               # (B, K)
    seg_cdf = seg.to(torch.float64).cumsum(dim=-1)                                       # (B, K)
    t = torch.minimum(t, torch.nextafter(seg_cdf[:, -1:], zero))     # the two sums' rounding may differ
    j = torch.searchsorted(seg_cdf, t, right=True).clamp_(max=K - 1)
    return (b * K + j).squeeze(-1), total.squeeze(-1)


def sample_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                       generator: torch.Generator | None = None, *,
                       banned_ids: torch.Tensor | None = None,
                       greedy: bool = False, u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits (B, V) -> (tokens (B,) long, logp (B,) fp32).
    logp is the token's log-probability under process_logits(...), also when greedy. Sampling is
    by inverse CDF with one uniform per row (u (B,) in [0, 1), drawn from `generator` when not
    given; several times cheaper than torch.multinomial on CPU), done in two levels by
    `_inverse_cdf`; a token of zero probability (banned, outside the nucleus) can never be drawn.
    Greedy takes the argmax of the logits with banned ids removed, as generate(do_sample=False,
    suppress_tokens=..) does (not of the probabilities, whose rounding could create ties). The
    Sampler bans in place on its own logits and passes banned_ids=None, saving a (B, V) copy per
    step. Raises ValueError as process_logits."""
    if banned_ids is not None and banned_ids.numel():
        logits = logits.index_fill(-1, banned_ids.to(logits.device), float("-inf"))
    w = process_logits(logits, temperature, top_p, normalise=False)         # (B, V) p up to a factor
    if greedy:
        tok = logits.argmax(dim=-1)
        total = w.sum(dim=-1).double()                                        # (B,)
    else:
        if u is None:
            u = torch.rand(w.shape[0], generator=generator, device=w.device)
        tok, total = _inverse_cdf(w, u.reshape(-1, 1))
    logp = w.gather(-1, tok[:, None]).squeeze(-1).double().log() - total.log()
    return tok, logp.float()

"""ppo_loss's Triton path (CUDA; CPU only under TRITON_INTERPRET=1 with UIS1_FORCE_TRITON=1): the
kernel, its launcher and the autograd wrapper. The formulas and the torch reference are
kernels/ppo_loss.py's; that module imports this one only when kernels/_dispatch.py chooses Triton.

`_ppo_loss_fwd_kernel` computes the loss, the stats and d loss / d logp in one pass over the tokens
and saves the derivative; the backward is grad_out * dlogp (only logp gets a gradient).
"""

import torch
import triton
import triton.language as tl

from kernels._dispatch import check_runnable

# ---------------------------------------------------------------------------------------------------
# Triton kernel


@triton.jit
def _ppo_loss_fwd_kernel(
    logp_ptr,
    old_ptr,
    adv_ptr,
    mask_ptr,
    ref_ptr,
    loss_ptr,
    dlogp_ptr,
    ratio_ptr,
    clipped_ptr,
    dual_ptr,
    kl_ptr,
    N,
    clip_low,
    clip_high,
    clip_c,
    kl_coef,
    kl_clamp,
    log_ratio_clamp,
    HAS_REF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < N
    m = tl.load(mask_ptr + offs, mask=inb, other=0) != 0
    logp = tl.where(m, tl.load(logp_ptr + offs, mask=inb, other=0.0).to(tl.float32), 0.0)
    old = tl.where(m, tl.load(old_ptr + offs, mask=inb, other=0.0).to(tl.float32), 0.0)
    adv = tl.where(m, tl.load(adv_ptr + offs, mask=inb, other=0.0).to(tl.float32), 0.0)

    # clipped surrogate with dual clip
    lr_raw = logp - old
    lr = tl.minimum(tl.maximum(lr_raw, -log_ratio_clamp), log_ratio_clamp)
    r = tl.exp(lr)
    dr = tl.where(tl.abs(lr_raw) <= log_ratio_clamp, r, 0.0)  # d r / d logp
    pg1 = -adv * r
    pg2 = -adv * tl.minimum(tl.maximum(r, 1.0 - clip_low), 1.0 + clip_high)
    clip = pg2 > pg1
    pg = tl.maximum(pg1, pg2)
    pg3 = -adv * clip_c
    dual = (adv < 0) & (pg > pg3)
    pg = tl.where(dual, pg3, pg)
    d_pg = tl.where(clip | dual, 0.0, -adv * dr)

    loss = pg
    d_loss = d_pg
    kl = tl.zeros((BLOCK,), dtype=tl.float32)
    if HAS_REF:
        ref = tl.where(m, tl.load(ref_ptr + offs, mask=inb, other=0.0).to(tl.float32), 0.0)
        d_raw = ref - logp
        d = tl.minimum(tl.maximum(d_raw, -log_ratio_clamp), log_ratio_clamp)
        e = tl.exp(d)
        kl_raw = e - d - 1.0
        kl = tl.minimum(tl.maximum(kl_raw, -kl_clamp), kl_clamp)
        pass_grad = (tl.abs(d_raw) <= log_ratio_clamp) & (tl.abs(kl_raw) <= kl_clamp)
        d_kl = tl.where(pass_grad, 1.0 - e, 0.0)  # d kl / d logp = -(e - 1)
        loss += kl_coef * kl
        d_loss += kl_coef * d_kl

    tl.store(loss_ptr + offs, tl.where(m, loss, 0.0), mask=inb)
    tl.store(dlogp_ptr + offs, tl.where(m, d_loss, 0.0), mask=inb)
    tl.store(ratio_ptr + offs, tl.where(m, r, 0.0), mask=inb)
    tl.store(clipped_ptr + offs, tl.where(m & (clip | dual), 1.0, 0.0), mask=inb)
    tl.store(dual_ptr + offs, tl.where(m & dual, 1.0, 0.0), mask=inb)
    tl.store(kl_ptr + offs, tl.where(m, kl, 0.0), mask=inb)


# ---------------------------------------------------------------------------------------------------
# launcher and autograd wrapper


def _ppo_loss_fwd_triton(logp, old_logp, adv, mask, ref_logp, clip_low, clip_high, clip_c, kl_coef, kl_clamp,
                         log_ratio_clamp, block=1024):
    """-> loss, dlogp, ratio, clipped, dual_clipped, kl: all (N,) fp32. Shapes, devices and dtypes are
    ppo_loss's checks, before it dispatches here."""
    check_runnable(_ppo_loss_fwd_kernel, logp, "ppo_loss")
    num_warps = 4
    if not logp.is_cuda:  # interpreter: small blocks
        num_warps, block = 1, 64
    shape = logp.shape
    flat = [t.detach().contiguous().view(-1) for t in (logp, old_logp, adv)]
    m = (mask.detach() != 0).to(torch.int8).contiguous().view(-1)
    ref = ref_logp.detach().contiguous().view(-1) if ref_logp is not None else flat[0]  # dummy when absent
    N = flat[0].numel()
    outs = [torch.empty(N, dtype=torch.float32, device=logp.device) for _ in range(6)]
    if N > 0:
        _ppo_loss_fwd_kernel[(triton.cdiv(N, block),)](
            flat[0],
            flat[1],
            flat[2],
            m,
            ref,
            *outs,
            N,
            float(clip_low),
            float(clip_high),
            float(clip_c),
            float(kl_coef),
            float(kl_clamp),
            float(log_ratio_clamp),
            HAS_REF=ref_logp is not None,
            BLOCK=block,
            num_warps=num_warps,
        )
    return [o.view(shape) for o in outs]


class _PPOLoss(torch.autograd.Function):
    """The Triton path's autograd wrapper: the kernel saves d loss / d logp, the backward scales it."""

    @staticmethod
    def forward(ctx, logp, old_logp, adv, mask, ref_logp, clip_low, clip_high, clip_c, kl_coef, kl_clamp,
                log_ratio_clamp):
        loss, dlogp, ratio, clipped, dual, kl = _ppo_loss_fwd_triton(
            logp, old_logp, adv, mask, ref_logp, clip_low, clip_high, clip_c, kl_coef, kl_clamp, log_ratio_clamp
        )
        ctx.save_for_backward(dlogp)
        ctx.logp_dtype = logp.dtype
        ctx.mark_non_differentiable(ratio, clipped, dual, kl)
        return loss, ratio, clipped, dual, kl

    @staticmethod
    def backward(ctx, g_loss, *_):
        (dlogp,) = ctx.saved_tensors
        g = None if g_loss is None else (g_loss.float() * dlogp).to(ctx.logp_dtype)
        return (g,) + (None,) * 10

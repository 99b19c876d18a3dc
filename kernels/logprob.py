"""Fused lm_head log-prob and entropy: never materialise the (N, V) logits.

For final hidden states h (N, H), lm_head weight W (V, H) (bias-free; tied embeddings work),
targets y (N,) and temperature T:

    z     = h W^T / T                                   (N, V) -- only ever one tile / chunk of it
    lse_i = log sum_j exp(z_ij)
    logp_i = z_iy - lse_i
    ent_i  = -sum_j p_ij log p_ij,   p = softmax(z),  log p = z - lse

Backward, for upstream grads g_i = dL/dlogp_i and e_i = dL/dent_i:

    dL/dz_ij = g_i (1[j = y_i] - p_ij) - e_i p_ij (log p_ij + ent_i)      (dH/dz_j = -p_j (log p_j + H))
    dh = (dL/dz) W / T,        dW = (dL/dz)^T h / T

Numerics. Everything is relative to the row max m, so all-negative or huge logits are safe:
1. The normaliser is kept as the pair (m, log L), L = sum_j exp(z_ij - m), never as lse = m + log L in
   one fp32 number: at |z| ~ 1e4 that rounding alone (~5e-4) shifts every log p of the row and breaks
   sum_j p_ij = 1 in the backward, where dh, a difference of large W rows, then came out wrong by
   several times its size. log p = (z - m) - log L is accurate.
2. The entropy is accumulated as sum p (z - m) (not lse - E[z], which cancels catastrophically at
   |z| ~ 1e4), and the backward uses log p + ent, which is O(1) whatever the logit scale.

One autograd.Function (_LogProb), two paths. Triton (kernels/logprob_triton.py): an online
log-sum-exp over logit tiles on chip; the backward recomputes dL/dz per chunk of tokens for two
cuBLAS GEMMs. The reference (`fused_logprob_ref`, the CPU path): the same math in fp32 torch, chunked
over tokens with a hand-written backward that recomputes the logits, so peak memory is two
(chunk, V) fp32 blocks, never (N, V); on CPU each elementwise pass over them is counted.
"""

import functools
import math

import torch

from kernels._dispatch import use_triton

_REF_CHUNK_BYTES = 64 << 20  # fp32 logits per chunk on the reference path (110 tokens at V = 151,936)


# ---------------------------------------------------------------------------------------------------
# checks (both paths)


def _check(hidden, weight, targets, temperature, ignore_index):
    shapes = f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, targets {tuple(targets.shape)}"
    if hidden.dim() != 2 or weight.dim() != 2 or targets.dim() != 1:
        raise ValueError(f"fused_logprob: expected hidden (N, H), weight (V, H), targets (N,), got {shapes}")
    if hidden.shape[1] != weight.shape[1] or hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"fused_logprob: shape mismatch {shapes}")
    if not hidden.dtype.is_floating_point or not weight.dtype.is_floating_point:
        raise TypeError(f"fused_logprob: hidden/weight must be floating point, got {hidden.dtype}, {weight.dtype}")
    if targets.dtype != torch.int64:
        raise TypeError(f"fused_logprob: targets must be int64, got {targets.dtype}")
    if not (hidden.device == weight.device == targets.device):
        raise ValueError(f"fused_logprob: devices differ: {hidden.device}, {weight.device}, {targets.device}")
    if not (isinstance(temperature, (int, float)) and temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"fused_logprob: temperature must be a positive finite number, got {temperature!r}")
    V = weight.shape[0]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"fused_logprob: target {int(targets[i])} at position {i} is outside [0, {V}) and not ignore_index")


# ---------------------------------------------------------------------------------------------------
# pure-torch reference (the CPU path)


def _chunk(N, V, chunk_size):
    """Tokens per chunk: chunk_size, or as many as _REF_CHUNK_BYTES of fp32 logits hold."""
    return min(chunk_size or max(1, _REF_CHUNK_BYTES // (4 * V)), max(N, 1))


@torch.no_grad()
def _logprob_fwd_ref(hidden, weight, targets, temperature, ignore_index, compute_entropy, chunk_size=None):
    N, V = hidden.shape[0], weight.shape[0]
    valid = targets != ignore_index
    w32 = weight.float()  # no copy when already fp32
    inv_t = 1.0 / temperature
    y = torch.where(valid, targets, 0)
    logp = torch.zeros(N, dtype=torch.float32, device=hidden.device)
    ent = torch.zeros(N, dtype=torch.float32, device=hidden.device)
    norm = torch.zeros(2, N, dtype=torch.float32, device=hidden.device)  # (m, log L), see Numerics
    C = _chunk(N, V, chunk_size)
    # Per chunk, over the (C, V) block: the GEMM, max, subtract, exp (into a second buffer when the
    # entropy needs z - m after it), sum, and for the entropy one fused dot per row. log p of the
    # target comes from a gather, ent = log L - sum exp(z - m) (z - m) / L: no log-softmax block.
    z_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device)
    e_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device) if compute_entropy else z_buf
    for c0 in range(0, N, C):
        c1 = min(c0 + C, N)
        # (C, V) logits / T; scaling h by 1/T costs H/V of scaling the logits
        z = torch.mm(hidden[c0:c1].float() * inv_t, w32.t(), out=z_buf[: c1 - c0])
        m = z.amax(dim=1)  # (C,)
        z.sub_(m[:, None])  # z - m <= 0
        zy = z.gather(1, y[c0:c1, None]).squeeze(1)  # z_y - m
        e = torch.exp(z, out=e_buf[: c1 - c0])  # exp(z - m); in place on z without the entropy
        L = e.sum(dim=1)  # (C,)
        log_l = L.log()
        norm[0, c0:c1], norm[1, c0:c1] = m, log_l
        logp[c0:c1] = zy - log_l
        if compute_entropy:
            s = torch.bmm(e[:, None, :], z[:, :, None]).view(-1)  # sum exp(z - m) (z - m), one pass
            ent[c0:c1] = log_l - s / L
    zero = torch.zeros((), dtype=torch.float32, device=hidden.device)
    return torch.where(valid, logp, zero), torch.where(valid, ent, zero), norm


@torch.no_grad()
def _logprob_bwd_ref(hidden, weight, targets, norm, ent, g_logp, g_ent, temperature, need_dh, need_dw,
                     chunk_size=None):
    N, V = hidden.shape[0], weight.shape[0]
    w32 = weight.float()
    inv_t = 1.0 / temperature
    y = targets  # ignored rows arrive as 0 with g = 0 (see _LogProb.backward)
    dh = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_dh else None
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_dw else None
    C = _chunk(N, V, chunk_size)
    # dz = [g 1(j = y) - p (g + e (log p + ent))] / T with p = exp(z - m) / L, log p = (z - m) - log L:
    #    = g/T 1(j = y) + exp(z - m) (a + b (z - m)),  a = -(g + e (ent - log L)) / (T L),  b = -e / (T L)
    # so per chunk: the GEMM, subtract, exp, and with the entropy one addcmul and one multiply.
    z_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device)
    e_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device) if g_ent is not None else None
    for c0 in range(0, N, C):
        c1 = min(c0 + C, N)
        h_c = hidden[c0:c1].float()
        z = torch.mm(h_c * inv_t, w32.t(), out=z_buf[: c1 - c0])  # (C, V) recomputed logits / T
        z.sub_(norm[0, c0:c1, None])  # z - m
        inv_tl = torch.exp(-norm[1, c0:c1]) * inv_t  # 1 / (T L), (C,)
        g = g_logp[c0:c1]
        if g_ent is not None:
            e = g_ent[c0:c1]
            a = -(g + e * (ent[c0:c1] - norm[1, c0:c1])) * inv_tl
            p = torch.exp(z, out=e_buf[: c1 - c0])  # exp(z - m) = L p
            dz = torch.addcmul(a[:, None], z, (-e * inv_tl)[:, None], out=z).mul_(p)
        else:
            dz = z.exp_().mul_((-g * inv_tl)[:, None])  # -g p / T
        dz.scatter_add_(1, y[c0:c1, None], (g * inv_t)[:, None])  # + g/T 1[j = y]
        if need_dh:
            torch.mm(dz, w32, out=dh[c0:c1])
        if need_dw:
            dw.addmm_(dz.t(), h_c)
    return (dh.to(hidden.dtype) if need_dh else None), (dw.to(weight.dtype) if need_dw else None)


# ---------------------------------------------------------------------------------------------------
# autograd wrapper and dispatch


class _LogProb(torch.autograd.Function):
    """Both paths: `fwd`, `bwd` are _logprob_fwd_ref, _logprob_bwd_ref or the Triton launchers."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, ignore_index, compute_entropy, fwd, bwd):
        _check(hidden, weight, targets, temperature, ignore_index)
        logp, ent, norm = fwd(hidden, weight, targets, temperature, ignore_index, compute_entropy)
        ctx.save_for_backward(hidden, weight, targets, norm, ent)
        ctx.cfg = (temperature, ignore_index, compute_entropy, bwd)
        ctx.set_materialize_grads(False)
        if not compute_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, norm, ent = ctx.saved_tensors
        temperature, ignore_index, compute_entropy, bwd = ctx.cfg
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_logp is None and g_ent is None) or not (need_dh or need_dw):
            return (None,) * 8
        valid = targets != ignore_index
        zero = torch.zeros((), dtype=torch.float32, device=hidden.device)
        g_logp = zero.expand(targets.shape) if g_logp is None else g_logp.float()
        g_logp = torch.where(valid, g_logp, zero).contiguous()  # ignored rows get no gradient
        use_ent = g_ent is not None and compute_entropy
        g_ent = torch.where(valid, g_ent.float(), zero).contiguous() if use_ent else None
        targets = torch.where(valid, targets, 0)  # any in-range id will do: g = e = 0 there
        dh, dw = bwd(hidden, weight, targets, norm, ent, g_logp, g_ent, temperature, need_dh, need_dw)
        return dh, dw, None, None, None, None, None, None


def fused_logprob_ref(hidden, weight, targets, temperature=1.0, return_entropy=False, ignore_index=-100,
                      chunk_size=None):
    """Pure-torch chunked reference (the CPU path). Same contract and errors as fused_logprob, and a
    ValueError for chunk_size < 1; chunk_size = tokens per chunk (default: 64 MiB of fp32 logits).
    Computes in fp32 whatever the input dtypes (hidden and weight may differ); dh and dW come back
    in hidden's and weight's dtype."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"fused_logprob_ref: chunk_size must be >= 1, got {chunk_size}")
    fwd = functools.partial(_logprob_fwd_ref, chunk_size=chunk_size)
    bwd = functools.partial(_logprob_bwd_ref, chunk_size=chunk_size)
    logp, ent = _LogProb.apply(hidden, weight, targets, float(temperature), ignore_index, return_entropy, fwd, bwd)
    return (logp, ent) if return_entropy else logp


def fused_logprob(hidden, weight, targets, temperature=1.0, return_entropy=False, ignore_index=-100):
    """log softmax(hidden @ weight.T / temperature)[targets] without the (N, V) logits (the module
    docstring's math). hidden (N, H) any float dtype, weight (V, H) (lm_head or tied embedding),
    targets (N,) int64. Returns logp (N,) fp32, or (logp, entropy) with return_entropy; 0 and no
    gradient where target == ignore_index. Differentiable w.r.t. hidden and weight; dh and dW come
    back in the input dtypes. Triton on CUDA (or UIS1_FORCE_TRITON=1), the chunked torch reference
    (fused_logprob_ref) otherwise. Raises ValueError: shapes not (N, H), (V, H), (N,) or mismatched
    N or H; different devices; temperature not positive and finite; a target outside [0, V) other
    than ignore_index. TypeError: hidden or weight not floating point; targets not int64; (Triton)
    hidden and weight of different dtypes. RuntimeError: the Triton path forced on CPU without
    TRITON_INTERPRET=1, or another device.
    """
    if not use_triton(hidden):
        return fused_logprob_ref(hidden, weight, targets, temperature, return_entropy, ignore_index)
    from kernels import logprob_triton as lpt  # CUDA (or the interpreter) only: triton is imported here

    hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
    logp, ent = _LogProb.apply(hidden, weight, targets, float(temperature), ignore_index, return_entropy,
                               lpt._logprob_fwd_triton, lpt._logprob_bwd_triton)
    return (logp, ent) if return_entropy else logp

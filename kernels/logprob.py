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

Positions with y_i == ignore_index return logp = ent = 0 and get no gradient.

Numerics. Everything is relative to the row max m, so all-negative or huge logits are safe:
1. The normaliser is kept as the pair (m, log L), L = sum_j exp(z_ij - m), never as lse = m + log L in
   one fp32 number: at |z| ~ 1e4 that rounding alone is ~5e-4, shifts every log p of the row by as
   much and breaks sum_j p_ij = 1 in the backward (dh is a difference of large W rows, so the error
   came out several times larger than the gradient itself). log p = (z - m) - log L is accurate.
2. The entropy is accumulated as sum p (z - m) (not lse - E[z], which cancels catastrophically at
   |z| ~ 1e4), and the backward uses log p + ent, which is O(1) whatever the logit scale.

Triton path (CUDA; CPU under TRITON_INTERPRET=1 with UIS1_FORCE_TRITON=1):

1. `_logprob_fwd_kernel`, grid (row blocks, vocab splits). Each program computes BLOCK_N x BLOCK_V
   logit tiles with tl.dot over H and folds them into an online log-sum-exp (m, l), the entropy
   accumulator s and the target logit, walking the vocab blocks of its split. No logits leave the
   chip. Splitting V keeps all SMs busy when N is small (N = 4096 with BLOCK_N = 128 is only 32 row
   blocks); the (splits, N) partials are merged in torch (a few KB). Row blocks vary fastest in the
   grid, so programs running together stream the same W tiles and W is read from HBM about once a wave.
2. Backward recomputes the logits: `_logprob_bwd_kernel` recomputes each tile of a chunk of C tokens
   and writes dL/dz (already divided by T) into a (C, V) buffer in the input dtype; then two cuBLAS
   GEMMs give dh[chunk] = dz W and dW += dz^T h[chunk]. dW is accumulated by this separate GEMM
   pass over chunks rather than by atomics: a fully fused backward needs either a dh accumulator of
   H floats per row (3584 x 4 B x BLOCK_N does not fit on chip) or per-tile fp32 atomics into dh and
   dW, N V H (1/BLOCK_N + 1/BLOCK_V) of them (~3.5e10 at N=4096, H=3584, V=151936, more traffic than
   the GEMMs themselves, and non-deterministic). The GEMM pass is deterministic and runs at cuBLAS
   speed; the price is one (C, V) buffer, bounded by `chunk_bytes`.

Reference path (`fused_logprob_ref`, the CPU path): the same math in fp32 torch, chunked over tokens
(forward and a manual chunked backward that recomputes the logits), so peak memory is at most two
(chunk, V) fp32 blocks, never (N, V). On CPU the elementwise passes over those blocks, not the
GEMM, set the time, so each pass is counted: 1/T scales h (C x H) instead of the logits, log p of
the target is a gather (no log-softmax block), exp runs once per logit in each direction, the
entropy's sum p (z - m) is one fused dot per row, and the backward folds 1/L, 1/T and the entropy
term into per-row coefficients (dz = exp(z - m) (a + b (z - m)) + g/T 1[j = y]).
"""

import math

import torch
import triton
import triton.language as tl

from kernels._dispatch import check_runnable, use_triton

_REF_CHUNK_BYTES = 64 << 20  # fp32 logits per chunk on the reference path (110 tokens at V = 151,936)
_TRITON_CHUNK_BYTES = 512 << 20  # dz buffer per chunk on the Triton backward


# ---------------------------------------------------------------------------------------------------
# Triton kernels


@triton.jit
def _logits_tile(
    h_ptr,
    w_ptr,
    rows,
    cols,
    row_mask,
    col_mask,
    H,
    stride_hn,
    stride_wv,
    CAST_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """acc (BLOCK_N, BLOCK_V) fp32 = h[rows] @ W[cols]^T, zero outside the masks."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_mask = ks < H
        h_mask = row_mask[:, None] & k_mask[None, :]
        w_mask = col_mask[:, None] & k_mask[None, :]
        h = tl.load(h_ptr + rows[:, None] * stride_hn + ks[None, :], mask=h_mask, other=0.0)  # (BLOCK_N, BLOCK_H)
        w = tl.load(w_ptr + cols[:, None] * stride_wv + ks[None, :], mask=w_mask, other=0.0)  # (BLOCK_V, BLOCK_H)
        if CAST_FP32:  # interpreter: no bf16 arithmetic on CPU; on GPU bf16 goes to the tensor cores as is
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _logprob_fwd_kernel(
    h_ptr,
    w_ptr,
    y_ptr,
    m_ptr,
    l_ptr,
    s_ptr,
    zy_ptr,
    N,
    H,
    V,
    stride_hn,
    stride_wv,
    blocks_per_split,
    inv_temp,
    COMPUTE_ENTROPY: tl.constexpr,
    CAST_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # int64
    row_mask = rows < N
    y = tl.load(y_ptr + rows, mask=row_mask, other=-1)

    m_i = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)  # running max
    l_i = tl.zeros((BLOCK_N,), dtype=tl.float32)  # sum exp(z - m)
    s_i = tl.zeros((BLOCK_N,), dtype=tl.float32)  # sum exp(z - m) (z - m)
    zy = tl.zeros((BLOCK_N,), dtype=tl.float32)  # target logit (0 if not in this split)

    vb_lo = pid_s * blocks_per_split
    vb_hi = tl.minimum(vb_lo + blocks_per_split, tl.cdiv(V, BLOCK_V))
    for vb in range(vb_lo, vb_hi):
        cols = (vb * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)  # column ids fit int32; offsets below are int64
        col_mask = cols < V
        acc = _logits_tile(
            h_ptr, w_ptr, rows, cols, row_mask, col_mask, H, stride_hn, stride_wv,
            CAST_FP32, DOT_PRECISION, BLOCK_N, BLOCK_V, BLOCK_H,
        )
        z = tl.where(col_mask[None, :], acc * inv_temp, float("-inf"))  # vocab tail -> -inf
        m_new = tl.maximum(m_i, tl.max(z, axis=1))  # finite: every visited block has a valid column
        alpha = tl.exp(m_i - m_new)  # 0 on the first block (m_i = -inf)
        p = tl.exp(z - m_new[:, None])  # 0 on the tail
        if COMPUTE_ENTROPY:
            # re-base s from m_i to m_new: sum p (z - m_new) = sum p (z - m_i) + (m_i - m_new) sum p
            s_i = alpha * (s_i + tl.where(l_i > 0, m_i - m_new, 0.0) * l_i)
            s_i += tl.sum(p * tl.where(col_mask[None, :], z - m_new[:, None], 0.0), axis=1)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        zy += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), axis=1)
        m_i = m_new

    out = pid_s.to(tl.int64) * N + rows
    tl.store(m_ptr + out, m_i, mask=row_mask)
    tl.store(l_ptr + out, l_i, mask=row_mask)
    tl.store(zy_ptr + out, zy, mask=row_mask)
    if COMPUTE_ENTROPY:
        tl.store(s_ptr + out, s_i, mask=row_mask)


@triton.jit
def _logprob_bwd_kernel(
    h_ptr,
    w_ptr,
    y_ptr,
    m_ptr,
    logl_ptr,
    ent_ptr,
    g_logp_ptr,
    g_ent_ptr,
    dz_ptr,
    N,
    H,
    V,
    stride_hn,
    stride_wv,
    stride_dz,
    inv_temp,
    HAS_ENT_GRAD: tl.constexpr,
    CAST_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_v.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_mask = rows < N
    col_mask = cols < V

    acc = _logits_tile(
        h_ptr, w_ptr, rows, cols, row_mask, col_mask, H, stride_hn, stride_wv,
        CAST_FP32, DOT_PRECISION, BLOCK_N, BLOCK_V, BLOCK_H,
    )
    y = tl.load(y_ptr + rows, mask=row_mask, other=-1)
    m = tl.load(m_ptr + rows, mask=row_mask, other=0.0)
    log_l = tl.load(logl_ptr + rows, mask=row_mask, other=0.0)
    g = tl.load(g_logp_ptr + rows, mask=row_mask, other=0.0)  # 0 on ignored rows (launcher)

    logp = (acc * inv_temp - m[:, None]) - log_l[:, None]  # (BLOCK_N, BLOCK_V) log p
    logp = tl.where(col_mask[None, :], logp, float("-inf"))  # vocab tail: p = 0
    p = tl.exp(logp)
    dz = tl.where(cols[None, :] == y[:, None], g[:, None], 0.0) - g[:, None] * p
    if HAS_ENT_GRAD:
        ent = tl.load(ent_ptr + rows, mask=row_mask, other=0.0)
        e = tl.load(g_ent_ptr + rows, mask=row_mask, other=0.0)
        dz -= e[:, None] * p * tl.where(col_mask[None, :], logp + ent[:, None], 0.0)
    dz = dz * inv_temp  # chain rule for z = hW^T / T
    ptrs = dz_ptr + rows[:, None] * stride_dz + cols[None, :]
    tl.store(ptrs, dz.to(dz_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


# ---------------------------------------------------------------------------------------------------
# launchers


def _check_inputs(hidden, weight, targets, temperature, where):
    if hidden.dim() != 2 or weight.dim() != 2 or targets.dim() != 1:
        raise ValueError(
            f"{where}: expected hidden (N, H), weight (V, H), targets (N,), got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    if hidden.shape[1] != weight.shape[1] or hidden.shape[0] != targets.shape[0]:
        raise ValueError(
            f"{where}: shape mismatch hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, "
            f"targets {tuple(targets.shape)}"
        )
    if not hidden.dtype.is_floating_point or not weight.dtype.is_floating_point:
        raise TypeError(f"{where}: hidden/weight must be floating point, got {hidden.dtype}, {weight.dtype}")
    if targets.dtype != torch.int64:
        raise TypeError(f"{where}: targets must be int64, got {targets.dtype}")
    if not (hidden.device == weight.device == targets.device):
        raise ValueError(f"{where}: devices differ: {hidden.device}, {weight.device}, {targets.device}")
    if not (isinstance(temperature, (int, float)) and temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"{where}: temperature must be a positive finite number, got {temperature!r}")


def _check_targets(targets, valid, V, where):
    bad = valid & ((targets < 0) | (targets >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{where}: target {int(targets[i])} at position {i} is outside [0, {V}) and not ignore_index")


def _triton_config(hidden):
    """(BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages, cast_fp32, dot_precision)."""
    if hidden.is_cuda:
        # 128 tokens x 256 vocab rows per tile, BLOCK_H 64, 8 warps, 3 stages: the fastest tile that
        # bench/tune_logprob.py found at the 7B's shapes on an H200 (the sweep: results/LOG.md).
        fp32_prec = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"  # follow torch's matmul
        return 128, 256, 64, 8, 3, False, (fp32_prec if hidden.dtype == torch.float32 else "tf32")
    check_runnable(_logprob_fwd_kernel, hidden, "fused_logprob")
    return 16, 32, 16, 1, 1, True, "ieee"  # interpreter: tiny tiles, fp32 arithmetic


def _logprob_fwd_triton(hidden, weight, targets, temperature, ignore_index, compute_entropy, v_splits=None):
    """-> logp (N,) fp32, ent (N,) fp32 (zeros unless compute_entropy), norm (2, N) fp32 = (m, log L)."""
    _check_inputs(hidden, weight, targets, temperature, "fused_logprob")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"fused_logprob: hidden {hidden.dtype} and weight {weight.dtype} must share a dtype")
    if hidden.stride(1) != 1 or weight.stride(1) != 1 or not targets.is_contiguous():
        raise ValueError("fused_logprob: hidden and weight need a contiguous last dim, targets must be contiguous")
    N, H = hidden.shape
    V = weight.shape[0]
    valid = targets != ignore_index
    _check_targets(targets, valid, V, "fused_logprob")
    BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages, cast_fp32, dot_prec = _triton_config(hidden)

    n_row_blocks = triton.cdiv(N, BLOCK_N)
    n_vblocks = triton.cdiv(V, BLOCK_V)
    if v_splits is None:  # about two programs per SM; one split on the interpreter unless asked
        sms = torch.cuda.get_device_properties(hidden.device).multi_processor_count if hidden.is_cuda else 1
        v_splits = max(1, (2 * sms) // max(n_row_blocks, 1))
    v_splits = max(1, min(int(v_splits), n_vblocks))
    blocks_per_split = triton.cdiv(n_vblocks, v_splits)
    v_splits = triton.cdiv(n_vblocks, blocks_per_split)  # every split owns >= 1 vocab block

    dev = hidden.device
    m, l, s, zy = (torch.empty(v_splits, N, dtype=torch.float32, device=dev) for _ in range(4))
    if N > 0:
        _logprob_fwd_kernel[(n_row_blocks, v_splits)](
            hidden,
            weight,
            targets,
            m,
            l,
            s,
            zy,
            N,
            H,
            V,
            hidden.stride(0),
            weight.stride(0),
            blocks_per_split,
            1.0 / temperature,
            COMPUTE_ENTROPY=compute_entropy,
            CAST_FP32=cast_fp32,
            DOT_PRECISION=dot_prec,
            BLOCK_N=BLOCK_N,
            BLOCK_V=BLOCK_V,
            BLOCK_H=BLOCK_H,
            num_warps=num_warps,
            num_stages=num_stages,
        )
    # merge the per-split partials: (S, N) -> (N,)
    m_max = m.max(dim=0).values  # (N,)
    scale = torch.exp(m - m_max)  # (S, N)
    L = (l * scale).sum(dim=0)
    log_l = torch.log(L)
    zero = torch.zeros((), dtype=torch.float32, device=dev)
    logp = torch.where(valid, (zy.sum(dim=0) - m_max) - log_l, zero)  # the target is in one split, 0 elsewhere
    if compute_entropy:
        S = (scale * (s + (m - m_max) * l)).sum(dim=0)  # sum exp(z - m_max) (z - m_max)
        ent = torch.where(valid, log_l - S / L, zero)
    else:
        ent = torch.zeros(N, dtype=torch.float32, device=dev)
    return logp, ent, torch.stack([m_max, log_l])


def _logprob_bwd_triton(hidden, weight, targets, norm, ent, g_logp, g_ent, temperature, need_dh, need_dw,
                        chunk_bytes=None):
    """Chunked over tokens: Triton recomputes dL/dz for C tokens, two GEMMs give dh and dW."""
    chunk_bytes = _TRITON_CHUNK_BYTES if chunk_bytes is None else chunk_bytes  # module global: tests shrink it
    N, H = hidden.shape
    V = weight.shape[0]
    if N == 0:
        return (torch.zeros_like(hidden) if need_dh else None), (torch.zeros_like(weight) if need_dw else None)
    BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages, cast_fp32, dot_prec = _triton_config(hidden)
    C = max(BLOCK_N, (chunk_bytes // (V * hidden.element_size())) // BLOCK_N * BLOCK_N)
    C = min(C, N)
    has_ent = g_ent is not None
    dh = torch.empty_like(hidden) if need_dh else None
    dw = torch.zeros_like(weight) if need_dw else None
    dz = torch.empty(C, V, dtype=hidden.dtype, device=hidden.device)  # (C, V) the one logits-sized buffer
    for c0 in range(0, N, C):
        c1 = min(c0 + C, N)
        h_c = hidden[c0:c1]
        dz_c = dz[: c1 - c0]
        _logprob_bwd_kernel[(triton.cdiv(c1 - c0, BLOCK_N), triton.cdiv(V, BLOCK_V))](
            h_c,
            weight,
            targets[c0:c1],
            norm[0, c0:c1],
            norm[1, c0:c1],
            ent[c0:c1],
            g_logp[c0:c1],
            g_ent[c0:c1] if has_ent else g_logp[c0:c1],
            dz_c,
            c1 - c0,
            H,
            V,
            h_c.stride(0),
            weight.stride(0),
            dz_c.stride(0),
            1.0 / temperature,
            HAS_ENT_GRAD=has_ent,
            CAST_FP32=cast_fp32,
            DOT_PRECISION=dot_prec,
            BLOCK_N=BLOCK_N,
            BLOCK_V=BLOCK_V,
            BLOCK_H=BLOCK_H,
            num_warps=num_warps,
            num_stages=num_stages,
        )
        if need_dh:
            torch.matmul(dz_c, weight, out=dh[c0:c1])  # (C, H)
        if need_dw:
            dw.addmm_(dz_c.t(), h_c)  # (V, H) += (V, C) @ (C, H)
    return dh, dw


# ---------------------------------------------------------------------------------------------------
# pure-torch reference (the CPU path)


def _ref_chunk(V, chunk_size):
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"fused_logprob_ref: chunk_size must be >= 1, got {chunk_size}")
    return chunk_size if chunk_size is not None else max(1, _REF_CHUNK_BYTES // (4 * V))


def _scaled(h, inv_t):
    """h (C, H) in fp32, times 1/T when T != 1: scaling h costs H/V of scaling the (C, V) logits."""
    h = h.float()
    return h if inv_t == 1.0 else h * inv_t


@torch.no_grad()
def _logprob_fwd_ref(hidden, weight, targets, temperature, ignore_index, compute_entropy, chunk_size=None):
    _check_inputs(hidden, weight, targets, temperature, "fused_logprob_ref")
    N, V = hidden.shape[0], weight.shape[0]
    valid = targets != ignore_index
    _check_targets(targets, valid, V, "fused_logprob_ref")
    w32 = weight.float()  # no copy when already fp32
    inv_t = 1.0 / temperature
    y = torch.where(valid, targets, 0)
    logp = torch.zeros(N, dtype=torch.float32, device=hidden.device)
    ent = torch.zeros(N, dtype=torch.float32, device=hidden.device)
    norm = torch.zeros(2, N, dtype=torch.float32, device=hidden.device)  # (m, log L), see Numerics
    C = min(_ref_chunk(V, chunk_size), max(N, 1))
    # Per chunk, over the (C, V) block: the GEMM, max, subtract, exp (into a second buffer when the
    # entropy needs z - m after it), sum, and for the entropy one fused dot per row. log p of the
    # target comes from a gather, ent = log L - sum exp(z - m) (z - m) / L: no log-softmax block.
    z_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device)
    e_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device) if compute_entropy else z_buf
    for c0 in range(0, N, C):
        c1 = min(c0 + C, N)
        z = torch.mm(_scaled(hidden[c0:c1], inv_t), w32.t(), out=z_buf[: c1 - c0])  # (C, V) logits / T
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
    C = min(_ref_chunk(V, chunk_size), max(N, 1))
    # dz = [g 1(j = y) - p (g + e (log p + ent))] / T with p = exp(z - m) / L, log p = (z - m) - log L:
    #    = g/T 1(j = y) + exp(z - m) (a + b (z - m)),  a = -(g + e (ent - log L)) / (T L),  b = -e / (T L)
    # so per chunk: the GEMM, subtract, exp, and with the entropy one addcmul and one multiply.
    z_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device)
    e_buf = torch.empty(C, V, dtype=torch.float32, device=hidden.device) if g_ent is not None else None
    for c0 in range(0, N, C):
        c1 = min(c0 + C, N)
        h_c = hidden[c0:c1].float()
        z = torch.mm(_scaled(h_c, inv_t), w32.t(), out=z_buf[: c1 - c0])  # (C, V) recomputed logits / T
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
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, ignore_index, compute_entropy, use_triton, chunk_size):
        if use_triton:
            hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
            logp, ent, norm = _logprob_fwd_triton(hidden, weight, targets, temperature, ignore_index, compute_entropy)
        else:
            logp, ent, norm = _logprob_fwd_ref(
                hidden, weight, targets, temperature, ignore_index, compute_entropy, chunk_size
            )
        ctx.save_for_backward(hidden, weight, targets, norm, ent)
        ctx.cfg = (temperature, ignore_index, compute_entropy, use_triton, chunk_size)
        ctx.set_materialize_grads(False)
        if not compute_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, norm, ent = ctx.saved_tensors
        temperature, ignore_index, compute_entropy, use_triton, chunk_size = ctx.cfg
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_logp is None and g_ent is None) or not (need_dh or need_dw):
            return (None,) * 8
        valid = targets != ignore_index
        zero = torch.zeros((), dtype=torch.float32, device=hidden.device)
        g_logp = zero.expand(targets.shape) if g_logp is None else g_logp.float()
        g_logp = torch.where(valid, g_logp, zero).contiguous()  # ignored rows get no gradient
        if g_ent is not None and compute_entropy:
            g_ent = torch.where(valid, g_ent.float(), zero).contiguous()
        else:
            g_ent = None
        targets = torch.where(valid, targets, 0)  # any in-range id will do: g = e = 0 there
        if use_triton:
            dh, dw = _logprob_bwd_triton(
                hidden, weight, targets, norm, ent, g_logp, g_ent, temperature, need_dh, need_dw
            )
        else:
            dh, dw = _logprob_bwd_ref(
                hidden, weight, targets, norm, ent, g_logp, g_ent, temperature, need_dh, need_dw, chunk_size
            )
        return dh, dw, None, None, None, None, None, None


def fused_logprob_ref(hidden, weight, targets, temperature=1.0, return_entropy=False, ignore_index=-100,
                      chunk_size=None):
    """Pure-torch chunked reference (the CPU path). Same contract as fused_logprob; chunk_size = tokens
    per chunk (default: 64 MiB of fp32 logits). Computes in fp32 whatever the input dtypes (hidden and
    weight may differ); dh and dW come back in hidden's and weight's dtype.

    Raises:
        ValueError: hidden not (N, H), weight not (V, H) or targets not (N,); mismatched N or H;
            tensors on different devices; temperature not a positive finite number; a target
            outside [0, V) that is not ignore_index; chunk_size < 1.
        TypeError: hidden or weight not floating point; targets not int64.
    """
    logp, ent = _LogProb.apply(hidden, weight, targets, float(temperature), ignore_index, return_entropy,
                               False, chunk_size)
    return (logp, ent) if return_entropy else logp


def fused_logprob(hidden, weight, targets, temperature=1.0, return_entropy=False, ignore_index=-100):
    """log softmax(hidden @ weight.T / temperature)[targets] without the (N, V) logits.

    hidden (N, H) any float dtype, weight (V, H) (lm_head or tied embedding), targets (N,) int64.
    Returns logp (N,) fp32, or (logp, entropy) with return_entropy. Positions with
    target == ignore_index give 0 and no gradient. Differentiable w.r.t. hidden and weight; dh and dW
    come back in the input dtype. Triton on CUDA (or UIS1_FORCE_TRITON=1; see kernels/_dispatch.py),
    the chunked torch reference (fused_logprob_ref) otherwise. The math is the module docstring's.

    Raises:
        ValueError: hidden not (N, H), weight not (V, H) or targets not (N,); mismatched N or H;
            tensors on different devices; temperature not a positive finite number; a target
            outside [0, V) that is not ignore_index.
        TypeError: hidden or weight not floating point; targets not int64; (Triton) hidden and
            weight of different dtypes.
        RuntimeError: the Triton path forced on CPU without the interpreter (TRITON_INTERPRET=1),
            or on a device that is neither CUDA nor CPU.
    """
    if not use_triton(hidden):
        return fused_logprob_ref(hidden, weight, targets, temperature, return_entropy, ignore_index)
    logp, ent = _LogProb.apply(hidden, weight, targets, float(temperature), ignore_index, return_entropy, True, None)
    return (logp, ent) if return_entropy else logp

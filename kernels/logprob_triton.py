"""fused_logprob's Triton path (CUDA; CPU only under TRITON_INTERPRET=1 with UIS1_FORCE_TRITON=1):
the kernels and their launchers. The math, the numerics and the torch reference are kernels/logprob.py's;
that module imports this one only when kernels/_dispatch.py chooses Triton, so a CPU run never
imports triton.

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
"""

import torch
import triton
import triton.language as tl

from kernels._dispatch import check_runnable

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
    """-> logp (N,) fp32, ent (N,) fp32 (zeros unless compute_entropy), norm (2, N) fp32 = (m, log L).
    Shapes, devices, the temperature and the targets' range are fused_logprob's checks (before it
    dispatches here); this launcher raises on what only the kernel cannot handle."""
    if hidden.dtype != weight.dtype:
        raise TypeError(f"fused_logprob: hidden {hidden.dtype} and weight {weight.dtype} must share a dtype")
    if hidden.stride(1) != 1 or weight.stride(1) != 1 or not targets.is_contiguous():
        raise ValueError("fused_logprob: hidden and weight need a contiguous last dim, targets must be contiguous")
    N, H = hidden.shape
    V = weight.shape[0]
    valid = targets != ignore_index
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

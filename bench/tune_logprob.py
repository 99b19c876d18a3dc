"""Tile sweep for the fused log-prob kernel on one CUDA GPU: forward + backward time of
kernels.fused_logprob for each (BLOCK_N, BLOCK_V, BLOCK_H, num_warps, num_stages), beside the bare
lm_head GEMM forward + backward at the same shape. The forward and backward kernels share one tile
(kernels.logprob_triton._triton_config); the best row is what that function should return on this GPU.

    python bench/tune_logprob.py                    # H 3584, V 152,064, N 16,384, bf16
    python bench/tune_logprob.py --n 4096 --h 2048
    python bench/tune_logprob.py --dry-run          # CPU: Triton interpreter, fp32, N 40 H 32 V 300, 2 tiles

Last stdout line: one JSON object (configs sorted by time, the GEMM time, the best ratio).
"""
import itertools
import json
import os
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("UIS1_FORCE_TRITON", "1")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import kernels.logprob_triton as lpt  # noqa: E402  (the Triton path's tile choice)
from kernels import fused_logprob  # noqa: E402

parser = cli.make_parser(__doc__)
parser.add_argument("--n", type=cli.positive_int, default=16384, help="tokens")
parser.add_argument("--h", type=cli.positive_int, default=3584, help="hidden size")
parser.add_argument("--v", type=cli.positive_int, default=152064, help="vocabulary")
parser.add_argument("--repeats", type=cli.positive_int, default=5, help="timed repeats per config (after one warm-up)")
parser.add_argument("--dry-run", action="store_true",
                    help="CPU check of the sweep itself: Triton interpreter, fp32, tiny shapes, the first 2 tiles")


def timed(fn, repeats):
    if not torch.cuda.is_available():  # --dry-run: wall clock
        fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def main():
    a = parser.parse_args()
    if a.dry_run:  # no bf16 arithmetic in the interpreter
        dev, dtype, a.n, a.h, a.v, a.repeats = "cpu", torch.float32, 40, 32, 300, 1
    elif torch.cuda.is_available():
        dev, dtype = "cuda", torch.bfloat16
    else:
        raise SystemExit("tune_logprob.py: error: needs a CUDA GPU (the CPU path is the torch reference; "
                         "--dry-run checks the sweep on CPU)")
    g = torch.Generator(device=dev).manual_seed(0)
    h = (torch.randn(a.n, a.h, device=dev, generator=g) * 0.5).to(dtype).requires_grad_()
    W = (torch.randn(a.v, a.h, device=dev, generator=g) * a.h ** -0.5).to(dtype).requires_grad_()
    y = torch.randint(0, a.v, (a.n,), device=dev, generator=g)
    go = torch.randn(a.n, device=dev, generator=g)  # (N,) upstream gradient of logp

    def gemm():
        z = h @ W.T  # (N, V) bf16
        z.backward(torch.ones_like(z))

    def fused():
        logp, _ = fused_logprob(h, W, y, return_entropy=True)
        logp.backward(go)

    t_gemm = timed(gemm, a.repeats)
    default = lpt._triton_config
    rows = []
    grid = [(128, 128, 64, 4, 3)] + list(itertools.product((64, 128), (128, 256), (64, 128), (8,), (3, 4)))
    if a.dry_run:
        grid = [(16, 64, 16, 4, 3), (32, 128, 32, 8, 3)]
    for bn, bv, bh, warps, stages in grid:
        lpt._triton_config = lambda hidden, c=(bn, bv, bh, warps, stages): (*c, False, "tf32")
        try:
            t = timed(fused, a.repeats)
            rows.append({"block_n": bn, "block_v": bv, "block_h": bh, "num_warps": warps, "num_stages": stages,
                         "s": round(t, 5), "ratio_to_gemm": round(t / t_gemm, 3)})
        except Exception as e:  # noqa: BLE001  (out of shared memory / registers: skip the tile)
            rows.append({"block_n": bn, "block_v": bv, "block_h": bh, "num_warps": warps, "num_stages": stages,
                         "error": f"{type(e).__name__}: {str(e)[:120]}"})
        finally:
            lpt._triton_config = default
        h.grad = W.grad = None
    ok = sorted((r for r in rows if "s" in r), key=lambda r: r["s"])
    for r in ok[:10]:
        print(r)
    print(json.dumps({"mode": "dry-run" if a.dry_run else "gpu", "n": a.n, "h": a.h, "v": a.v, "gemm_fwd_bwd_s": round(t_gemm, 5), "configs": ok,
                      "failed": [r for r in rows if "error" in r], "best": ok[0] if ok else None}))


if __name__ == "__main__":
    main()

"""Benchmark: fused lm_head log-prob (kernels.fused_logprob) vs the naive path, forward + backward.

    naive: logp = log_softmax((h @ W.T).float() / T, -1).gather(1, y)      -- materialises (N, V)
    fused: logp = fused_logprob(h, W, y, T)    (Triton on CUDA, the chunked torch reference on CPU)

Both run forward and backward ((logp * g).sum().backward(), grads for h and W) on the same seeded
inputs. The last stdout line is one JSON object.

    python bench/bench_logprob.py                                  # CPU default: N=4096 H=256 V=151936
    python bench/bench_logprob.py --n 4096 --h 3584 --dtype bfloat16 # the issue's GPU case

Peak memory, honestly measured:
- CUDA: torch.cuda.max_memory_allocated() minus the allocation after the inputs were built, after
  reset_peak_memory_stats(); the bare lm_head matmul (forward, and forward + backward) is timed too.
- CPU: each path runs in its own fresh subprocess (`--worker naive|fused`). After building the inputs
  the worker writes "5" to /proc/self/clear_refs, which resets the kernel's resident-set high-water
  mark VmHWM to the current RSS, then runs the path and reads VmHWM from /proc/self/status.
  peak = VmHWM - RSS at the reset: every page torch's CPU allocator actually touched (big tensors are
  mmap'd and returned on free), which tracemalloc cannot see. Inputs are excluded, the weight gradient
  (V x H) is included for both paths. Linux only.
"""

import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `kernels`
import cli  # noqa: E402
import utils  # noqa: E402
from kernels import fused_logprob  # noqa: E402
from gpu_sections import lm_head_gemms  # noqa: E402  (bench/ is sys.path[0] when run as a script)

# ---------------------------------------------------------------------------------------------------
# config

parser = cli.make_parser(__doc__)
parser.add_argument("--n", type=cli.positive_int, default=4096, help="tokens N")
parser.add_argument("--h", type=cli.positive_int, default=256, help="hidden size H")
parser.add_argument("--v", type=cli.positive_int, default=151936, help="vocab size V (Qwen2.5: 151936)")
parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="h and W dtype")
parser.add_argument("--temperature", type=cli.temperature, default=1.0, help="softmax temperature")
parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
parser.add_argument("--repeats", type=cli.positive_int, default=None, help="timed runs per path (default: 1 on CPU, 10 on CUDA)")
parser.add_argument("--ref-chunk", type=cli.positive_int, default=None,
                    help="tokens per chunk of the CPU reference (default: 64 MiB of fp32 logits)")
parser.add_argument("--worker", default=None, choices=["naive", "fused"], help="internal: run one path (CPU)")
args = parser.parse_args()


# ---------------------------------------------------------------------------------------------------
# the two paths


def make_inputs(device):
    g = torch.Generator(device="cpu").manual_seed(0)
    dtype = getattr(torch, args.dtype)
    h = (torch.randn(args.n, args.h, generator=g) / args.h**0.25).to(device=device, dtype=dtype)
    W = (torch.randn(args.v, args.h, generator=g) / args.h**0.25).to(device=device, dtype=dtype)
    y = torch.randint(0, args.v, (args.n,), generator=g).to(device)
    gout = torch.randn(args.n, generator=g).to(device)  # upstream dL/dlogp
    return h.requires_grad_(), W.requires_grad_(), y, gout


def naive_logprob(h, W, y):
    logits = (h @ W.T).float() / args.temperature  # (N, V)
    return torch.log_softmax(logits, dim=-1).gather(1, y[:, None]).squeeze(1)


def fused(h, W, y):
    if h.is_cuda or args.ref_chunk is None:
        return fused_logprob(h, W, y, temperature=args.temperature)
    from kernels import fused_logprob_ref

    return fused_logprob_ref(h, W, y, temperature=args.temperature, chunk_size=args.ref_chunk)


PATHS = {"naive": naive_logprob, "fused": fused}


def fwd_bwd(fn, h, W, y, gout):
    h.grad = W.grad = None
    logp = fn(h, W, y)
    (logp * gout).sum().backward()
    return logp.detach()


def logp_error(h, W, y, rows=256):
    """max |logp_fused - logp_truth| on the first rows, truth = fp64 log_softmax of the same inputs."""
    with torch.no_grad():
        hs, ys = h[:rows], y[:rows]
        truth = torch.log_softmax((hs.double() @ W.double().T) / args.temperature, -1).gather(1, ys[:, None])[:, 0]
        got = fused_logprob(hs, W, ys, temperature=args.temperature).double()
    return (got - truth).abs().max().item()


# ---------------------------------------------------------------------------------------------------
# CPU: one subprocess per path, peak RSS via VmHWM


def proc_status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def cpu_worker(path):
    h, W, y, gout = make_inputs("cpu")
    fn = PATHS[path]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    rss0 = proc_status_kib("VmRSS")
    times = []
    for _ in range(args.repeats or 1):
        t0 = time.perf_counter()
        fwd_bwd(fn, h, W, y, gout)
        times.append(time.perf_counter() - t0)
    peak = (proc_status_kib("VmHWM") - rss0) * 1024
    out = {"path": path, "peak_bytes": peak, "time_s": min(times)}
    if path == "fused":
        out["logp_max_abs_err"] = logp_error(h, W, y)
    print(utils.dumps(out))


def cpu_main():
    res = {}
    for path in ("naive", "fused"):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", path] + sys.argv[1:]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{path} worker failed:\n{proc.stderr[-4000:]}")
        res[path] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{path}: peak {res[path]['peak_bytes'] / 2**20:.1f} MiB, {res[path]['time_s']:.2f} s", flush=True)
    return {
        "device": "cpu",
        "n": args.n, "h": args.h, "v": args.v, "dtype": args.dtype,
        "peak_mem_naive_bytes": res["naive"]["peak_bytes"],
        "peak_mem_fused_bytes": res["fused"]["peak_bytes"],
        "peak_mem_ratio": res["naive"]["peak_bytes"] / max(res["fused"]["peak_bytes"], 1),
        "time_naive_s": res["naive"]["time_s"],
        "time_fused_s": res["fused"]["time_s"],
        "time_ratio": res["fused"]["time_s"] / res["naive"]["time_s"],
        "logp_max_abs_err": res["fused"]["logp_max_abs_err"],
        "peak_mem_method": "VmHWM - RSS after /proc/self/clear_refs, fresh subprocess per path",
    }


# ---------------------------------------------------------------------------------------------------
# CUDA: one process, allocator statistics, CUDA-synchronised timing


def cuda_time(fn, repeats):
    for _ in range(2):  # warm-up: Triton compilation, cuBLAS heuristics
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def cuda_main():
    h, W, y, gout = make_inputs("cuda")
    repeats = args.repeats or 10
    peaks, times = {}, {}
    for path, fn in PATHS.items():
        fwd_bwd(fn, h, W, y, gout)  # warm-up (and leaves h.grad / W.grad allocated ...)
        h.grad = W.grad = None  # ... so free them: both paths measured from the same baseline
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_bwd(fn, h, W, y, gout)
        torch.cuda.synchronize()
        peaks[path] = torch.cuda.max_memory_allocated() - base
        times[path] = cuda_time(lambda: fwd_bwd(fn, h, W, y, gout), repeats)
        h.grad = W.grad = None
    gz = torch.randn(args.n, args.v, device="cuda", dtype=h.dtype)

    matmul_fwd, matmul_fwd_bwd = lm_head_gemms(torch, h, W, gz)
    t_mm = cuda_time(matmul_fwd, repeats)
    t_mm_fb = cuda_time(matmul_fwd_bwd, repeats)
    return {
        "device": torch.cuda.get_device_name(),
        "n": args.n, "h": args.h, "v": args.v, "dtype": args.dtype,
        "peak_mem_naive_bytes": peaks["naive"],
        "peak_mem_fused_bytes": peaks["fused"],
        "peak_mem_ratio": peaks["naive"] / max(peaks["fused"], 1),
        "time_naive_s": times["naive"],
        "time_fused_s": times["fused"],
        "time_ratio": times["fused"] / times["naive"],
        "time_matmul_fwd_s": t_mm,
        "time_matmul_fwd_bwd_s": t_mm_fb,
        "fused_over_matmul_fwd_bwd": times["fused"] / t_mm_fb,
        "logp_max_abs_err": logp_error(h, W, y),
        "peak_mem_method": "torch.cuda.max_memory_allocated - allocated after inputs",
    }


# ---------------------------------------------------------------------------------------------------
# main

if __name__ == "__main__":
    if args.worker is not None:
        cpu_worker(args.worker)
        sys.exit(0)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    result = cuda_main() if use_cuda else cpu_main()
    print(utils.dumps(result))

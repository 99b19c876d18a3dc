"""GPU readiness check: the whole CUDA path in one command, one JSON and one Markdown summary.

Sections, each check in its own try/except (a failure is recorded with its error and the rest runs):

  env      versions (python, torch, CUDA, NCCL, triton, transformers, flash-attn), the GPU.
  kernels  fused lm_head log-prob + entropy (kernels.fused_logprob) at the 7B shapes (H 3584,
           V 152,064, N 4,096 and 16,384, bf16): forward and backward error against an fp32 torch
           truth (full fp32 logits, autograd), time and peak memory against the bare lm_head GEMM
           forward + backward and against the naive path (bf16 logits materialised, log_softmax);
           kernels.ppo_loss and kernels.group_stats: error against their torch references, time.
  model    a randomly initialised Qwen2.5-VL built from the 7B config in assets/ (real hidden size,
           vocabulary and 32-block vision tower) with --layers decoder layers, bf16, saved with the
           real tokenizer to a temporary folder (nothing is downloaded).
  sampler  sampler.Sampler vs Hugging Face `generate` in bf16 on the group workload (8 tasks x 8
           rollouts), one real-size 1080x2400 screenshot per prompt: generated tokens per second.
  decode   the sampler's decode alone at 64 rollouts, 128 new tokens: eager vs CUDA graphs (tok/s,
           ids equal), and decode_roofline_frac = graph tok/s / roofline tok/s; roofline = the
           bandwidth of a 4 GiB device-to-device copy measured here / the bytes a step reads (the
           weights used per token + every row's KV at the mean context) * rows.
  full_depth the 7B config at its 28 layers (8.3 B parameters, random, bf16) doing ONE semi-online RL
           step under `torchrun --nproc_per_node=1` with --gradient-checkpointing and --kl-coef 0:
           step time and full_depth_peak_mem_bytes (the trainer's torch.cuda.max_memory_allocated).
           One step is what one GPU holds: fp32 weights, gradients and AdamW moments are 16 bytes
           per parameter (133 GB of the H200's 150 GB; FSDP2 shards them across GPUs); a second
           step's rollout would add the 16.6 GB bf16 copy the sampler decodes with, a reference
           model (KL) another 16.6 GB. Then the LoRA row (full_depth.lora): the same step with
           --lora-r 16 and --kl-coef 1e-4 (the reference: the policy with its adapters disabled),
           its time and peak_mem_bytes (fp32 base 33 GB + adapters and their AdamW state 0.65 GB).
  rl       two semi-online RL steps of the 4-layer model: `torchrun --nproc_per_node=1
           train_semionline.py` on AndroidControl episodes with blank 1080x2400 screens; from its
           metrics.jsonl: seconds per phase, finite loss, first_ratio_dev, sampler_logp_gap; peak
           GPU memory sampled while it runs.

    python bench/gpu_check.py                     # one GPU: 7B shapes, budget 480 s
    python bench/gpu_check.py --dry-run           # CPU: tiny shapes, Triton interpreter, ~1.5 minutes

Writes --out (default: results/gpu_check.json on a GPU, out/gpu_check_dry.json for a dry run, so a
dry run never replaces the committed GPU results; a dry run refuses results/gpu_check.json) and the
same name with .md after every check, so a run cut short still leaves what it measured; the last
stdout line is the JSON. A dry run writes
exactly the keys of a GPU run (values null where a figure does not exist on CPU, e.g. GPU memory).

Choices made to fit 8 minutes on one H200 (each has a flag; ESTIMATES_S, printed at the start):
- rl uses --rl-max-pixels 1003520 (the paper's training setting, 1280 * 28 * 28: 1080x2400 ->
  672x1484, 1,272 image tokens per screenshot), not the processor default 12800 * 28 * 28 (1092x2408,
  3,354 tokens) that the sampler section uses: at world size 1 the trainer keeps fp32 weights and
  Adam state (~44 GB for 2.7 B parameters) and stores the activations of all 32 vision blocks for the
  backward; two full-size screenshots per sequence would add an estimated ~70 GB more.
- the trainer writes a full fp32 checkpoint with optimizer state (~33 GB) after its last step; the
  check stops it once the last step's metrics row is written (--rl-wait-checkpoint waits instead).

The checks themselves are in bench/gpu_sections.py; this file holds the schema, the command line,
the harness, the Markdown summary and main.
"""
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: gpu_sections
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the repository root: cli
import cli  # noqa: E402
from gpu_sections import (  # noqa: E402
    PACKAGES,
    REPO,
    _fmt,
    _gib,
    build_model,
    check_decode,
    check_env,
    check_full_depth,
    check_group_norm,
    check_logprob,
    check_ppo,
    check_rl,
    check_sampler,
)

# Seconds per section on one H200 from a bare machine, estimated (the first run measured env to rl,
# 126 s; decode and full_depth are new and unmeasured); printed at the start against the budget.
ESTIMATES_S = {"env": 3, "kernels": 45, "model": 15, "sampler": 30, "decode": 30, "full_depth": 300, "rl": 70}

# Every key a run writes, GPU or dry: sections start from this and are filled in as checks pass
# (a kernels.logprob row: gpu_sections._LOGPROB_ROW).
SCHEMA = {
    "meta": {"mode": None, "argv": None, "started": None, "budget_s": None, "total_s": None,
             "estimates_s": {name: None for name in ESTIMATES_S},
             "sections_s": {"env": None, "kernels": None, "model": None, "sampler": None, "decode": None,
                            "full_depth": None, "rl": None}},
    "env": {"python": None, "platform": None, "torch": None, "torch_cuda": None, "cudnn": None, "nccl": None,
            "triton": None, "transformers": None, "transformers_pinned": None, "numpy": None, "flash_attn": None,
            "device": None, "device_capability": None, "device_memory_bytes": None, "device_count": None,
            "cpu_count": None, "triton_interpret": None, "packages": {m: None for m in PACKAGES}},
    "kernels": {"logprob": [], "ppo_loss": {"n": None, "err_loss_max_abs": None, "err_grad_max_abs": None,
                                            "err_kl_max_abs": None, "time_kernel_s": None, "time_ref_s": None},
                "group_norm": {"m": None, "groups": None, "err_max_abs": None, "time_kernel_s": None,
                               "time_ref_s": None}},
    "model": {"layers": None, "hidden_size": None, "vocab_size": None, "vision_depth": None, "params": None,
              "dtype": None, "attn_implementation": None, "build_s": None, "save_s": None},
    "sampler": {"tasks": None, "rollouts": None, "max_new_tokens": None, "max_pixels": None, "image_tokens": None,
                "prompt_tokens_mean": None, "tok_s_ours": None, "tok_s_hf": None, "ratio": None,
                "time_ours_s": None, "time_hf_s": None, "prefill_tokens_ours": None, "prefill_tokens_hf": None,
                "peak_mem_ours_bytes": None, "peak_mem_hf_bytes": None},
    "decode": {"rows": None, "max_new_tokens": None, "prompt_tokens_mean": None, "copy_bytes": None,
               "hbm_bandwidth_bytes_s": None, "decode_tok_s_eager": None, "decode_tok_s_graph": None,
               "graph_over_eager": None, "decode_path_graph": None, "graph_capture_s": None, "graph_error": None,
               "time_prefill_s": None, "ids_equal_frac": None, "logp_max_abs_diff": None,
               "weight_bytes_per_step": None, "kv_bytes_per_token": None, "context_mean": None,
               "bytes_per_step": None, "roofline_tok_s": None, "decode_roofline_frac": None},
    "full_depth": {"layers": None, "params": None, "build_s": None, "save_s": None, "command": None,
                   "max_pixels": None, "returncode": None, "stopped_by_check": None, "wall_s": None,
                   "launch_to_first_row_s": None, "time_step_s": None, "time_rollout_s": None, "time_logp_s": None,
                   "time_update_s": None, "tok_s": None, "loss": None, "loss_finite": None,
                   "decode_path": None, "full_depth_peak_mem_bytes": None, "peak_gpu_mem_sampled_bytes": None,
                   "lora": {"command": None, "lora_r": None, "returncode": None, "time_step_s": None,
                            "time_update_s": None, "loss": None, "loss_finite": None, "kl": None,
                            "peak_mem_bytes": None, "peak_gpu_mem_sampled_bytes": None}},
    "rl": {"command": None, "returncode": None, "stopped_by_check": None, "steps_done": None, "max_pixels": None,
           "launch_to_first_row_s": None, "wall_s": None, "time_rollout_s": [], "time_logp_s": [],
           "time_update_s": [], "time_step_s": [], "loss": [], "loss_finite": None, "first_ratio_dev": [],
           "sampler_logp_gap": [], "peak_gpu_mem_bytes": None, "fsdp_wraps_at_world_size_1": None, "rows": []},
    "failures": [],
}

# -------------------------------------------------------------------------------------------------
# config

GPU_OUT = "results/gpu_check.json"   # committed: only a real GPU run writes it
DRY_OUT = "out/gpu_check_dry.json"   # git-ignored

parser = cli.make_parser(__doc__)
parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes and model, Triton in the interpreter")
parser.add_argument("--out", default=None,
                    help=f"JSON path; the Markdown goes beside it (.md). Default: {GPU_OUT} (GPU), {DRY_OUT} (--dry-run)")
parser.add_argument("--sections", type=cli.name_list(ESTIMATES_S, "section"), default=",".join(ESTIMATES_S), help="comma list of sections to run")
parser.add_argument("--budget-s", type=cli.positive_float, default=None, help="total wall budget (default: 480 GPU, 300 dry)")
parser.add_argument("--kernel-n", type=cli.int_list(1), default=None, help="comma list of token counts N (default: 4096,16384; dry: 37)")
parser.add_argument("--layers", type=cli.positive_int, default=4, help="decoder layers of the 7B-config model")
parser.add_argument("--sampler-max-new-tokens", type=cli.positive_int, default=None, help="default: 64 (dry: 4)")
parser.add_argument("--sampler-max-pixels", type=cli.positive_int, default=None,
                    help="default: 12800*28*28, the processor's real default (dry: 50176)")
parser.add_argument("--rl-max-pixels", type=cli.positive_int, default=None, help="default: 1003520, the paper's (dry: 50176)")
parser.add_argument("--rl-max-new-tokens", type=cli.positive_int, default=None, help="default: 32 (dry: 4)")
parser.add_argument("--rl-wait-checkpoint", action="store_true", help="let the trainer write its final checkpoint")
parser.add_argument("--decode-max-new-tokens", type=cli.positive_int, default=None, help="decode section: default 128 (dry: 6)")
parser.add_argument("--full-depth-layers", type=cli.positive_int, default=None, help="default: 28, the 7B's depth (dry: 3)")
parser.add_argument("--work-dir", default=None, help="where the model folder and the RL run go (default: a temp dir)")


# -------------------------------------------------------------------------------------------------
# harness: results, failures, time


class Check:
    """Holds the result dict, records failures, writes JSON + Markdown after every check."""

    def __init__(self, out: Path, budget_s: float):
        self.out, self.t0, self.budget_s = out, time.time(), budget_s
        self.res = json.loads(json.dumps(SCHEMA))  # deep copy
        self.res["meta"]["budget_s"] = budget_s

    def left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{time.time() - self.t0:6.1f}s] {msg}", flush=True)

    def run(self, section: str, name: str, fn, *args, min_left_s: float = 0.0):
        """fn(*args) in a try/except: a failure (or too little time left) is recorded and None returned."""
        if self.left() < min_left_s:
            self.fail(section, name, f"skipped: {self.left():.0f} s of the budget left, needs {min_left_s:.0f} s")
            self.save()
            return None
        self.log(f"{section}/{name} ...")
        t = time.time()
        try:
            out = fn(*args)
            self.log(f"{section}/{name} done in {time.time() - t:.1f} s")
            return out
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the next check runs
            self.fail(section, name, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8))
            return None
        finally:
            self.save()

    def fail(self, section, name, error, tb=None):
        self.log(f"FAILED {section}/{name}: {error[:500]}")
        self.res["failures"].append({"section": section, "check": name, "error": error[:4000],
                                     "traceback": (tb or "")[-4000:]})

    def save(self) -> None:
        self.res["meta"]["total_s"] = round(time.time() - self.t0, 2)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for path, text in ((self.out, json.dumps(self.res, indent=1, default=_json_default)),
                           (self.out.with_suffix(".md"), markdown(self.res))):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)


def _json_default(x):
    return float(x) if hasattr(x, "__float__") else str(x)


# -------------------------------------------------------------------------------------------------
# Markdown summary


def _per_1e9(x):
    return None if x is None else x / 1e9


def markdown(res) -> str:
    e, k, m, s, r = res["env"], res["kernels"], res["model"], res["sampler"], res["rl"]
    dc, f = res["decode"], res["full_depth"]
    lines = [f"# GPU check ({res['meta']['mode']}, {res['meta']['started']}, {_fmt(res['meta']['total_s'])} s)", "",
             f"{e['device']} | torch {e['torch']} (CUDA {e['torch_cuda']}, NCCL {e['nccl']}) | triton {e['triton']} "
             f"| transformers {e['transformers']} (pinned: {e['transformers_pinned']}) | flash-attn {e['flash_attn']}", "",
             "## Fused log-prob + entropy, forward + backward", "",
             "| N | H | V | dtype | err logp | err entropy | rel err dh | rel err dW | naive rel err dh / dW "
             "| fused s | naive s | GEMM f+b s | fused / GEMM | fused / naive | peak fused | peak naive | peak GEMM |",
             "|" + "---|" * 17]
    for row in k["logprob"]:
        lines.append("| " + " | ".join([
            _fmt(row["n"]), _fmt(row["h"]), _fmt(row["v"]), _fmt(row["dtype"]), _fmt(row["err_logp_max_abs"]),
            _fmt(row["err_entropy_max_abs"]), _fmt(row["err_dh_rel"]), _fmt(row["err_dw_rel"]),
            f"{_fmt(row['naive_err_dh_rel'])} / {_fmt(row['naive_err_dw_rel'])}", _fmt(row["time_fused_s"]),
            _fmt(row["time_naive_s"]), _fmt(row["time_matmul_fwd_bwd_s"]), _fmt(row["fused_over_matmul_fwd_bwd"]),
            _fmt(row["fused_over_naive"]), _gib(row["peak_mem_fused_bytes"]), _gib(row["peak_mem_naive_bytes"]),
            _gib(row["peak_mem_matmul_bytes"])]) + " |")
    p, g = k["ppo_loss"], k["group_norm"]
    lines += ["", f"ppo_loss, N {_fmt(p['n'])}: max err loss {_fmt(p['err_loss_max_abs'])}, grad "
              f"{_fmt(p['err_grad_max_abs'])}, kl {_fmt(p['err_kl_max_abs'])}; kernel {_fmt(p['time_kernel_s'])} s "
              f"vs torch {_fmt(p['time_ref_s'])} s (forward + backward)",
              f"group_stats, M {_fmt(g['m'])} in {_fmt(g['groups'])} groups: max err {_fmt(g['err_max_abs'])}; "
              f"kernel {_fmt(g['time_kernel_s'])} s vs fp64 torch {_fmt(g['time_ref_s'])} s", "",
              "## Model", "",
              f"{_fmt(m['params'])} parameters: {_fmt(m['layers'])} decoder layers, hidden {_fmt(m['hidden_size'])}, "
              f"vocab {_fmt(m['vocab_size'])}, vision depth {_fmt(m['vision_depth'])}, {m['dtype']}, "
              f"{m['attn_implementation']}; built in {_fmt(m['build_s'])} s, saved in {_fmt(m['save_s'])} s", "",
              "## Sampler (group workload)", "",
              f"{_fmt(s['tasks'])} tasks x {_fmt(s['rollouts'])} rollouts, {_fmt(s['max_new_tokens'])} new tokens, "
              f"{_fmt(s['image_tokens'])} image tokens (max_pixels {_fmt(s['max_pixels'])}), prompt "
              f"{_fmt(s['prompt_tokens_mean'])} tokens", "",
              "| | tok/s | s | prefill tokens | peak memory |", "|---|---|---|---|---|",
              f"| ours | {_fmt(s['tok_s_ours'])} | {_fmt(s['time_ours_s'])} | {_fmt(s['prefill_tokens_ours'])} "
              f"| {_gib(s['peak_mem_ours_bytes'])} |",
              f"| HF generate | {_fmt(s['tok_s_hf'])} | {_fmt(s['time_hf_s'])} | {_fmt(s['prefill_tokens_hf'])} "
              f"| {_gib(s['peak_mem_hf_bytes'])} |", "", f"ours / HF: {_fmt(s['ratio'])}", "",
              "## Decode against the memory roofline", "",
              f"{_fmt(dc['rows'])} rows, {_fmt(dc['max_new_tokens'])} new tokens each, prompt {_fmt(dc['prompt_tokens_mean'])} "
              f"tokens; copy bandwidth {_fmt(_per_1e9(dc['hbm_bandwidth_bytes_s']))} GB/s; a step reads "
              f"{_fmt(_per_1e9(dc['bytes_per_step']))} GB (weights {_fmt(_per_1e9(dc['weight_bytes_per_step']))} GB, KV at "
              f"mean context {_fmt(dc['context_mean'])}) -> roofline {_fmt(dc['roofline_tok_s'])} tok/s", "",
              "| decode | tok/s | vs eager | decode_roofline_frac | capture s | ids equal | max logp diff |",
              "|---|---|---|---|---|---|---|",
              f"| eager | {_fmt(dc['decode_tok_s_eager'])} | 1 | - | - | - | - |",
              f"| {dc['decode_path_graph'] or 'graph'} | {_fmt(dc['decode_tok_s_graph'])} | {_fmt(dc['graph_over_eager'])} "
              f"| **{_fmt(dc['decode_roofline_frac'])}** | {_fmt(dc['graph_capture_s'])} | {_fmt(dc['ids_equal_frac'])} "
              f"| {_fmt(dc['logp_max_abs_diff'])} |", "",
              "## Full depth: one RL step, --gradient-checkpointing, torchrun --nproc_per_node=1", "",
              f"{_fmt(f['layers'])} decoder layers, {_fmt(f['params'])} parameters (built {_fmt(f['build_s'])} s, saved "
              f"{_fmt(f['save_s'])} s); step {_fmt(f['time_step_s'])} s (rollout {_fmt(f['time_rollout_s'])}, logp "
              f"{_fmt(f['time_logp_s'])}, update {_fmt(f['time_update_s'])}), launch to metrics "
              f"{_fmt(f['launch_to_first_row_s'])} s, loss finite {_fmt(f['loss_finite'])}, sampler decode "
              f"{_fmt(f['decode_path'])}; "
              f"**full_depth_peak_mem_bytes {_fmt(f['full_depth_peak_mem_bytes'])}** ({_gib(f['full_depth_peak_mem_bytes'])}; "
              f"device-wide sampled {_gib(f['peak_gpu_mem_sampled_bytes'])})", "",
              f"LoRA row (--lora-r {_fmt(f['lora']['lora_r'])}, the KL reference = adapters off): step "
              f"{_fmt(f['lora']['time_step_s'])} s (update {_fmt(f['lora']['time_update_s'])}), loss finite "
              f"{_fmt(f['lora']['loss_finite'])}, kl {_fmt(f['lora']['kl'])}, **peak_mem_bytes "
              f"{_fmt(f['lora']['peak_mem_bytes'])}** ({_gib(f['lora']['peak_mem_bytes'])})", "",
              "## Semi-online RL under torchrun", "",
              f"steps {_fmt(r['steps_done'])}, returncode {_fmt(r['returncode'])} (stopped by the check: "
              f"{_fmt(r['stopped_by_check'])}), launch to first metrics row {_fmt(r['launch_to_first_row_s'])} s, "
              f"peak GPU memory {_gib(r['peak_gpu_mem_bytes'])}, max_pixels {_fmt(r['max_pixels'])}, "
              f"FSDP wraps at world size 1: {_fmt(r['fsdp_wraps_at_world_size_1'])}", "",
              "| step | rollout s | logp s | update s | step s | loss | first_ratio_dev | sampler_logp_gap |",
              "|---|---|---|---|---|---|---|---|"]
    for i in range(len(r["rows"])):
        lines.append(f"| {i + 1} | " + " | ".join(_fmt(r[key][i]) for key in (
            "time_rollout_s", "time_logp_s", "time_update_s", "time_step_s", "loss", "first_ratio_dev",
            "sampler_logp_gap")) + " |")
    lines += ["", f"## Failures ({len(res['failures'])})", ""]
    lines += [f"- {f['section']}/{f['check']}: {f['error'][:300]}" for f in res["failures"]] or ["none"]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------
# main


def main(argv=None):
    a = parser.parse_args(argv)
    a.out = a.out or (DRY_OUT if a.dry_run else GPU_OUT)
    if a.dry_run and Path(a.out).resolve() == (REPO / GPU_OUT).resolve():
        parser.error(f"--out {a.out}: holds the committed GPU results; a dry run writes elsewhere (default {DRY_OUT})")
    if a.dry_run:  # the interpreter must be chosen before triton is first imported (kernels/*_triton.py)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(REPO))
    import torch

    sections = a.sections
    C = Check(Path(a.out), a.budget_s or (300.0 if a.dry_run else 480.0))  # dry: CI machines are slow
    estimates = {k: v for k, v in ESTIMATES_S.items() if k in sections}
    C.res["meta"].update(mode="dry-run" if a.dry_run else "gpu", argv=sys.argv[1:] if argv is None else argv,
                         started=time.strftime("%Y-%m-%d %H:%M:%S"))
    C.res["meta"]["estimates_s"].update(estimates)
    C.log(f"budget {C.budget_s:.0f} s; estimated on one H200: " + ", ".join(f"{k} {v}" for k, v in estimates.items())
          + f" = {sum(estimates.values())} s")
    device = torch.device("cpu" if a.dry_run else "cuda")
    if not a.dry_run and not torch.cuda.is_available():
        C.fail("env", "cuda", "torch.cuda.is_available() is False: run with --dry-run on a machine without a GPU")
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "model"

    def section(name, fn):
        if name not in sections:
            return
        t = time.time()
        fn()
        C.res["meta"]["sections_s"][name] = round(time.time() - t, 2)
        C.save()

    section("env", lambda: C.run("env", "versions", check_env, C, torch))

    def kernels():
        ns = a.kernel_n or ([37] if a.dry_run else [4096, 16384])
        H, V = (16, 150) if a.dry_run else (3584, 152064)  # dry: 150 = 4 vocab blocks of 32 + a tail of 22
        for n in ns:
            C.run("kernels", f"logprob_n{n}", check_logprob, C, torch, device, a.dry_run, n, H, V, torch.bfloat16,
                  min_left_s=0 if a.dry_run else 200)
            if device.type == "cuda":
                gc.collect()
                torch.cuda.empty_cache()
        C.run("kernels", "ppo_loss", check_ppo, C, torch, device, a.dry_run)
        C.run("kernels", "group_norm", check_group_norm, C, torch, device, a.dry_run)

    section("kernels", kernels)
    holder = {}
    if any(x in sections for x in ("model", "sampler", "decode", "rl")):  # they need the model either way
        t = time.time()
        holder["model"] = C.run("model", "build_and_save", build_model, C, torch, device, a.dry_run, a.layers, model_dir)
        C.res["meta"]["sections_s"]["model"] = round(time.time() - t, 2)
    if holder.get("model") is not None:
        section("sampler", lambda: C.run("sampler", "group_workload", check_sampler, C, torch, device, a.dry_run,
                                         holder["model"], a, min_left_s=0 if a.dry_run else 150))
        section("decode", lambda: C.run("decode", "roofline", check_decode, C, torch, device, a.dry_run,
                                        holder["model"], a, min_left_s=0 if a.dry_run else 60))
    holder.clear()  # free the sampler's model before the trainers need the GPU
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    section("full_depth", lambda: C.run("full_depth", "one_rl_step", check_full_depth, C, torch, device, a.dry_run,
                                        a, work, min_left_s=0 if a.dry_run else 150))
    if (model_dir / "config.json").exists():
        section("rl", lambda: C.run("rl", "torchrun", check_rl, C, torch, device, a.dry_run, a, model_dir, work,
                                    min_left_s=0 if a.dry_run else 60))
    elif "rl" in sections:
        C.fail("rl", "torchrun", "skipped: no model folder (the model check failed)")
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    C.save()
    C.log(f"{len(C.res['failures'])} failure(s); wrote {C.out} and {C.out.with_suffix('.md')}")
    print(json.dumps(C.res, default=_json_default))
    return C.res


if __name__ == "__main__":
    main()

"""The sections of bench/gpu_check.py: one `check_<section>(C, torch, ...)` per check, each filling
its part of gpu_check.SCHEMA in C.res (C is gpu_check.Check: it runs a check in its own try/except,
logs, and saves the JSON + Markdown after every check). What each section measures, the commands and
the choices made to fit the budget: bench/gpu_check.py's docstring.

Module level imports the standard library only: torch is handed in by gpu_check.main, and the
project's modules (kernels, utils, rollout, ...) are imported inside the checks, once main has put
the repository root on sys.path and chosen the Triton interpreter for a dry run.
"""
import gc
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANDROID_DATA = REPO / "data" / "android_control" / "android_control_train_example_uis1.jsonl"
CONFIG_7B = REPO / "assets" / "qwen2_5_vl_tokenizer" / "config.json"

PACKAGES = ("PIL", "safetensors", "tokenizers", "tqdm")  # what the stages import besides torch


def lm_head_gemms(torch, h, W, gz):
    """The bare GEMMs an lm_head costs, as two closures, the floor a fused log-prob is timed
    against: fwd() z = h W^T (no grad); fwd_bwd() the three of training (z = h W^T, dh = gz W,
    dW = gz^T h). h (N, H) and W (V, H) require grad; gz (N, V) is the logits' upstream gradient."""
    def fwd():
        with torch.no_grad():
            return h @ W.T

    def fwd_bwd():
        h.grad = W.grad = None
        (h @ W.T).backward(gz)

    return fwd, fwd_bwd


# Every key of one kernels.logprob row, GPU or dry (gpu_check.SCHEMA holds the rest of what a run writes):
# a row starts from this and is filled in as its check passes.
_LOGPROB_ROW = {
    "n": None, "h": None, "v": None, "dtype": None,
    "err_logp_max_abs": None, "err_entropy_max_abs": None, "err_dh_max_abs": None, "err_dh_rel": None,
    "err_dw_max_abs": None, "err_dw_rel": None,
    "naive_err_logp_max_abs": None, "naive_err_dh_rel": None, "naive_err_dw_rel": None,
    "time_fused_s": None, "time_naive_s": None, "time_matmul_fwd_s": None, "time_matmul_fwd_bwd_s": None,
    "fused_over_matmul_fwd_bwd": None, "fused_over_naive": None,
    "peak_mem_fused_bytes": None, "peak_mem_naive_bytes": None, "peak_mem_matmul_bytes": None,
}


# -------------------------------------------------------------------------------------------------
# env


def check_env(C, torch):
    import numpy
    import transformers
    import triton

    e = C.res["env"]
    e.update(python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
             torch_cuda=torch.version.cuda, triton=triton.__version__, transformers=transformers.__version__,
             numpy=numpy.__version__, cpu_count=os.cpu_count(), triton_interpret=os.environ.get("TRITON_INTERPRET"))
    for mod in PACKAGES:
        try:
            e["packages"][mod] = getattr(__import__(mod), "__version__", "installed")
        except ImportError:
            e["packages"][mod] = "missing"
    pins = [ln.strip() for ln in (REPO / "requirements.txt").read_text().splitlines() if ln.startswith("transformers")]
    e["transformers_pinned"] = pins[0] if pins else None  # a mismatch is reported, never fatal
    try:
        import flash_attn
        e["flash_attn"] = flash_attn.__version__
    except ImportError:
        e["flash_attn"] = "not installed (SDPA is used)"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        e.update(device=p.name, device_capability=list(torch.cuda.get_device_capability(0)),
                 device_memory_bytes=p.total_memory, device_count=torch.cuda.device_count(),
                 cudnn=torch.backends.cudnn.version())
        nccl = torch.cuda.nccl.version()
        e["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    else:
        e["device"] = "cpu"


# -------------------------------------------------------------------------------------------------
# kernels


class Timer:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def best(self, fn, repeats: int, warmup: int = 1) -> float:
        """Fastest of `repeats` timed calls after `warmup` untimed ones (compilation, cuBLAS heuristics)."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t)
        return min(times)

    def peak(self, fn):
        """Peak bytes allocated by fn above what was allocated before (CUDA); None on CPU."""
        if not self.cuda:
            fn()
            return None
        torch = self.torch
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base


class forced_triton:
    """On CPU the kernels' Triton path runs only when asked (UIS1_FORCE_TRITON=1, kernels/_dispatch.py)."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.prev = os.environ.get("UIS1_FORCE_TRITON")
        if self.on:
            os.environ["UIS1_FORCE_TRITON"] = "1"

    def __exit__(self, *exc):
        if self.prev is None:
            os.environ.pop("UIS1_FORCE_TRITON", None)
        else:
            os.environ["UIS1_FORCE_TRITON"] = self.prev


def logprob_truth(torch, h, W, y, g_logp, g_ent, chunk):
    """fp32 truth: full fp32 logits (chunked over tokens), log_softmax, autograd; TF32 off."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        W32 = W.detach().float().requires_grad_()
        logp, ent, dh = [], [], []
        for c0 in range(0, h.shape[0], chunk):
            hc = h[c0:c0 + chunk].detach().float().requires_grad_()
            yc = y[c0:c0 + chunk]
            valid = yc != -100
            lp = torch.log_softmax(hc @ W32.T, dim=-1)  # (C, V) fp32
            lpy = torch.where(valid, lp.gather(1, torch.where(valid, yc, 0)[:, None]).squeeze(1), 0.0)
            en = torch.where(valid, -(lp.exp() * lp).sum(-1), 0.0)
            ((lpy * g_logp[c0:c0 + chunk]).sum() + (en * g_ent[c0:c0 + chunk]).sum()).backward()
            logp.append(lpy.detach())
            ent.append(en.detach())
            dh.append(hc.grad)
            del lp, lpy, en, hc
        return torch.cat(logp), torch.cat(ent), torch.cat(dh), W32.grad
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def check_logprob(C, torch, device, dry, N, H, V, dtype):
    from kernels import fused_logprob

    timer = Timer(torch, device)
    g = torch.Generator(device=device).manual_seed(N)
    h = (torch.randn(N, H, generator=g, device=device) * 3).to(dtype)  # logits of std ~3: peaked softmax
    W = (torch.randn(V, H, generator=g, device=device) / H ** 0.5).to(dtype)
    y = torch.randint(0, V, (N,), generator=g, device=device)
    y[:8] = V - 1 - torch.arange(8, device=device)  # targets in the vocab tail block
    y[8:16] = -100  # ignored positions
    g_logp = torch.randn(N, generator=g, device=device)
    g_ent = torch.randn(N, generator=g, device=device)
    h.requires_grad_()
    W.requires_grad_()

    def naive():
        valid = y != -100
        lp = torch.log_softmax((h @ W.T).float(), dim=-1)  # (N, V) materialised
        logp = torch.where(valid, lp.gather(1, torch.where(valid, y, 0)[:, None]).squeeze(1), 0.0)
        return logp, torch.where(valid, -(lp.exp() * lp).sum(-1), 0.0)

    def fused():
        return fused_logprob(h, W, y, return_entropy=True)

    def fwd_bwd(fn):
        h.grad = W.grad = None
        logp, ent = fn()
        ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
        return logp.detach(), ent.detach()

    row = dict(_LOGPROB_ROW, n=N, h=H, v=V, dtype=str(dtype).removeprefix("torch."))
    C.res["kernels"]["logprob"].append(row)
    t_logp, t_ent, t_dh, t_dw = logprob_truth(torch, h, W, y, g_logp, g_ent, chunk=N if dry else 2048)

    def errs(prefix, logp, ent):
        out = {f"{prefix}err_logp_max_abs": (logp - t_logp).abs().max().item(),
               f"{prefix}err_dh_rel": (h.grad.float() - t_dh).abs().max().item() / t_dh.abs().max().item(),
               f"{prefix}err_dw_rel": (W.grad.float() - t_dw).abs().max().item() / t_dw.abs().max().item()}
        if not prefix:
            out.update(err_entropy_max_abs=(ent - t_ent).abs().max().item(),
                       err_dh_max_abs=(h.grad.float() - t_dh).abs().max().item(),
                       err_dw_max_abs=(W.grad.float() - t_dw).abs().max().item())
        return out

    repeats, warmup = (1, 0) if dry else (3, 1)  # dry: the interpreter is slow, and its time means nothing
    cuda = device.type == "cuda"
    with forced_triton(dry):
        row.update(errs("", *fwd_bwd(fused)))  # also the warm-up: Triton compiles here
        row["peak_mem_fused_bytes"] = timer.peak(lambda: fwd_bwd(fused)) if cuda else None
        row["time_fused_s"] = timer.best(lambda: fwd_bwd(fused), repeats, warmup)
    t_ent = None  # the naive pass below reads no entropy error
    C.save()
    row.update(errs("naive_", *fwd_bwd(naive)))
    t_logp = t_dh = t_dw = None  # free the fp32 truth before the next shape
    row["peak_mem_naive_bytes"] = timer.peak(lambda: fwd_bwd(naive)) if cuda else None
    row["time_naive_s"] = timer.best(lambda: fwd_bwd(naive), repeats, warmup)
    C.save()
    h.grad = W.grad = None
    gz = torch.randn(N, V, generator=g, device=device).to(dtype)  # upstream grad of the logits

    matmul_fwd, matmul_fwd_bwd = lm_head_gemms(torch, h, W, gz)
    row["peak_mem_matmul_bytes"] = timer.peak(matmul_fwd_bwd) if cuda else None
    row["time_matmul_fwd_s"] = timer.best(matmul_fwd, repeats)
    row["time_matmul_fwd_bwd_s"] = timer.best(matmul_fwd_bwd, repeats)
    row["fused_over_matmul_fwd_bwd"] = row["time_fused_s"] / row["time_matmul_fwd_bwd_s"]
    row["fused_over_naive"] = row["time_fused_s"] / row["time_naive_s"]


def check_ppo(C, torch, device, dry):
    from kernels import ppo_loss, ppo_loss_ref

    timer = Timer(torch, device)
    N = 1000 if dry else 1 << 24
    repeats, warmup = (1, 0) if dry else (5, 1)
    g = torch.Generator(device=device).manual_seed(1)
    old = -torch.rand(N, generator=g, device=device) * 5
    logp = (old + torch.randn(N, generator=g, device=device) * 0.3).requires_grad_()
    adv = torch.randn(N, generator=g, device=device)
    mask = torch.rand(N, generator=g, device=device) > 0.1
    ref = logp.detach() + torch.randn(N, generator=g, device=device) * 0.1
    gout = torch.randn(N, generator=g, device=device)

    def run(fn):
        logp.grad = None
        loss, st = fn(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1)
        (loss * gout).sum().backward()
        return loss.detach(), logp.grad.clone(), st["kl"]

    with forced_triton(dry):
        loss_k, grad_k, kl_k = run(ppo_loss)
        t_k = timer.best(lambda: run(ppo_loss), repeats, warmup)
    loss_r, grad_r, kl_r = run(ppo_loss_ref)
    t_r = timer.best(lambda: run(ppo_loss_ref), repeats, warmup)
    C.res["kernels"]["ppo_loss"].update(
        n=N, err_loss_max_abs=(loss_k - loss_r).abs().max().item(), err_grad_max_abs=(grad_k - grad_r).abs().max().item(),
        err_kl_max_abs=(kl_k - kl_r).abs().max().item(), time_kernel_s=t_k, time_ref_s=t_r)


def check_group_norm(C, torch, device, dry):
    from kernels import group_stats, group_stats_ref

    timer = Timer(torch, device)
    M, G = (200, 20) if dry else (1 << 22, 1 << 16)
    repeats, warmup = (1, 0) if dry else (5, 1)
    g = torch.Generator(device=device).manual_seed(2)
    scores = torch.randn(M, generator=g, device=device)
    ids = torch.randint(0, G, (M,), generator=g, device=device) * 7 - 1000  # arbitrary ids
    with forced_triton(dry):
        got = torch.stack(group_stats(scores, ids))  # (2, M): mean, std
        t_k = timer.best(lambda: group_stats(scores, ids), repeats, warmup)
    want = torch.stack(group_stats_ref(scores, ids))
    t_r = timer.best(lambda: group_stats_ref(scores, ids), repeats, warmup)
    C.res["kernels"]["group_norm"].update(m=M, groups=G, err_max_abs=(got.double() - want).abs().max().item(),
                                          time_kernel_s=t_k, time_ref_s=t_r)


# -------------------------------------------------------------------------------------------------
# model: 7B config with a few decoder layers (GPU) or the tiny model (dry), saved for the trainer


def make_model(torch, device, dry: bool, layers: int):
    """A randomly initialised Qwen2.5-VL from the 7B config in assets/ with `layers` decoder layers,
    bf16, on `device` (dry: utils' tiny model with that many layers, fp32, CPU)."""
    import vlm

    if dry:
        return vlm.load_model(f"tiny:64x{layers}", dtype=torch.float32, device=device, seed=0).eval()
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg_dict = json.loads(CONFIG_7B.read_text())
    cfg_dict["num_hidden_layers"] = layers  # before the config is built: layer_types follows it
    cfg = Qwen2_5_VLConfig(**cfg_dict)
    cfg._attn_implementation = vlm.attn_implementation(device)
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU: seconds, where CPU init takes minutes
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    return model.to(torch.bfloat16).eval()


def save_model(model, model_dir: Path, dry: bool) -> None:
    """Hugging Face layout with the model's own tokenizer (the tiny preset's on a dry run, the real
    Qwen2.5-VL one for the 7B config), as the trainers load a model folder."""
    import vlm

    model.save_pretrained(str(model_dir), safe_serialization=True)
    vlm.load_processor("tiny" if dry else None)[0].save_pretrained(str(model_dir))


def build_model(C, torch, device, dry, layers, model_dir):
    m = C.res["model"]
    t = time.time()
    model = make_model(torch, device, dry, 2 if dry else layers)
    tc = model.config.get_text_config()
    m.update(layers=tc.num_hidden_layers, hidden_size=tc.hidden_size, vocab_size=tc.vocab_size,
             vision_depth=model.config.vision_config.depth, params=sum(p.numel() for p in model.parameters()),
             dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
             attn_implementation=tc._attn_implementation, build_s=round(time.time() - t, 2))
    t = time.time()
    save_model(model, model_dir, dry)
    m["save_s"] = round(time.time() - t, 2)
    return model


# -------------------------------------------------------------------------------------------------
# sampler: ours vs HF generate, group workload


def group_prompts(tasks: int, max_pixels: int, dry: bool):
    """(tokenizer, prompts) of the group workload: step min(2, last) of the first `tasks`
    AndroidControl episodes (goal, expert history, one random 1080x2400 screenshot)."""
    import numpy as np
    from PIL import Image

    import chat
    import dataset
    import gui
    import vlm

    tokenizer, image_processor = vlm.load_processor("tiny" if dry else None, max_pixels=max_pixels)
    episodes = dataset.load_episodes(str(ANDROID_DATA))
    rng = np.random.default_rng(0)
    size = (1080, 2400)
    prompts = []
    for k in range(tasks):
        ep = episodes[k % len(episodes)]
        t = min(2, len(ep.steps) - 1)
        shot = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        resized = gui.resized_size(size, max_pixels=max_pixels)
        history = [gui.expert_response(st, size, resized) for st in ep.steps[:t]]
        prompts.append(chat.build_prompt(tokenizer, image_processor, chat.PromptSpec(num_images=1, max_pixels=max_pixels),
                                         goal=ep.goal, screenshots=[None] * t + [shot], history=history))
    return tokenizer, prompts


def check_sampler(C, torch, device, dry, model, a):
    import numpy as np

    import gui
    from hf_peer import generate_inputs  # bench/, beside this file
    from sampler import Sampler

    s = C.res["sampler"]
    tasks, rollouts = (2, 2) if dry else (8, 8)
    max_new = a.sampler_max_new_tokens or (4 if dry else 64)
    max_pixels = a.sampler_max_pixels or (50176 if dry else gui.MAX_PIXELS)
    s.update(tasks=tasks, rollouts=rollouts, max_new_tokens=max_new, max_pixels=max_pixels)
    tokenizer, prompts = group_prompts(tasks, max_pixels, dry)
    s["prompt_tokens_mean"] = round(float(np.mean([len(p.input_ids) for p in prompts])), 1)
    s["image_tokens"] = int(prompts[0].image_grid_thw.prod()) // 4
    dtype = next(model.parameters()).dtype
    timer = Timer(torch, device)
    banned = None

    def ours(batch, n, new):
        nonlocal banned
        sampler = Sampler(model, tokenizer, max_new_tokens=new, temperature=1.0, top_p=1.0, stop_token_ids=[], seed=0)
        banned = sampler.banned_ids.tolist()
        outs = sampler.generate(batch, n=n)
        return sum(len(o.ids) for row in outs for o in row), sampler.stats.get("prefill_tokens")

    def hf(batch, n, new):
        kw = generate_inputs(batch, tokenizer.pad_token_id, model.config.image_token_id, device, dtype)
        T = kw["input_ids"].shape[1]
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(**kw, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new,
                                 min_new_tokens=new, num_return_sequences=n, suppress_tokens=banned,
                                 pad_token_id=tokenizer.pad_token_id)
        return (out.shape[1] - T) * out.shape[0], len(batch) * n * T

    for name, fn in (("ours", ours), ("hf", hf)):
        fn(prompts[:2], 2, 4)  # warm-up: allocator, kernels' first launch
        res = {}

        def timed():
            timer.sync()
            t = time.perf_counter()
            res["tok"], res["prefill"] = fn(prompts, rollouts, max_new)
            timer.sync()
            res["dt"] = time.perf_counter() - t

        s[f"peak_mem_{name}_bytes"] = timer.peak(timed)
        s.update({f"tok_s_{name}": round(res["tok"] / res["dt"], 1), f"time_{name}_s": round(res["dt"], 3),
                  f"prefill_tokens_{name}": res["prefill"]})
        C.save()
    s["ratio"] = round(s["tok_s_ours"] / s["tok_s_hf"], 3)


# -------------------------------------------------------------------------------------------------
# decode: the sampler's decode against the memory roofline, CUDA graphs vs eager


def hbm_bandwidth(torch, device, n_bytes: int, repeats: int) -> float:
    """Measured memory bandwidth, bytes/s: the fastest of `repeats` copies of an n_bytes buffer into
    another (a device-to-device copy reads and writes every byte: 2 * n_bytes moved)."""
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = Timer(torch, device).best(lambda: dst.copy_(src), repeats, warmup=1)
    return 2 * n_bytes / t


def decode_bytes(model, rows: int, context_mean: float) -> tuple[int, int, float]:
    """Bytes one decode step must read at least: every weight used per token (the decoder layers,
    final norm and lm_head; not the embedding table, of which only `rows` rows are gathered, nor
    the vision tower) once, plus each row's KV cache at the mean context length. Returns
    (weight bytes, KV bytes per cached token of one row, bytes per step)."""
    lm = model.model.language_model
    weights = sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if not n.startswith("embed_tokens"))
    weights += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    tc = model.config.get_text_config()
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    kv_tok = 2 * tc.num_hidden_layers * tc.num_key_value_heads * head_dim * next(model.parameters()).element_size()
    return weights, kv_tok, weights + rows * kv_tok * context_mean


def check_decode(C, torch, device, dry, model, a):
    """The sampler's decode tok/s at 64 rollouts (8 tasks x 8), eager vs CUDA graphs (dry: the
    same static step uncaptured), and decode_roofline_frac = graph tok/s / roofline tok/s, where
    roofline tok/s = measured bandwidth / bytes a step reads (decode_bytes) * rows. Every row runs
    all max_new_tokens (no stop token); both runs share the seed, so their ids must agree."""
    import numpy as np

    import gui
    from sampler import Sampler

    r = C.res["decode"]
    cuda = device.type == "cuda"
    tasks, rollouts = (2, 2) if dry else (8, 8)
    max_new = a.decode_max_new_tokens or (6 if dry else 128)
    tokenizer, prompts = group_prompts(tasks, 50176 if dry else gui.MAX_PIXELS, dry)
    prompt_mean = float(np.mean([len(p.input_ids) for p in prompts]))
    copy_bytes = (256 << 20) if dry else (4 << 30)
    r.update(rows=tasks * rollouts, max_new_tokens=max_new, prompt_tokens_mean=round(prompt_mean, 1),
             copy_bytes=copy_bytes, hbm_bandwidth_bytes_s=hbm_bandwidth(torch, device, copy_bytes, 3 if dry else 10))
    fast = "graph" if cuda else "static"
    outs = {}
    for mode in ("eager", fast):
        sampler = Sampler(model, tokenizer, max_new_tokens=max_new, stop_token_ids=[], seed=0, decode=mode)
        sampler.generate(prompts[:2], n=2)                    # warm-up (allocator, first kernel launches)
        sampler.generator.manual_seed(0)
        outs[mode] = sampler.generate(prompts, n=rollouts)
        st = sampler.stats
        r[f"decode_tok_s_{'eager' if mode == 'eager' else 'graph'}"] = round(st["decode_tokens"] / st["time_decode"], 1)
        if mode == fast:
            r.update(decode_path_graph=st["decode"], graph_capture_s=round(st["time_graph_capture"], 4),
                     graph_error=st["graph_error"], time_prefill_s=round(st["time_prefill"], 3))
        del sampler
        C.save()
    pairs = [(x, y) for ra, rb in zip(outs["eager"], outs[fast]) for x, y in zip(ra, rb)]
    same = [(x, y) for x, y in pairs if x.ids == y.ids]
    r["ids_equal_frac"] = len(same) / len(pairs)
    r["logp_max_abs_diff"] = max(((x.logprobs - y.logprobs).abs().max().item() for x, y in same), default=None)
    context_mean = prompt_mean + (max_new - 1) / 2      # step t reads the prompt and t earlier tokens
    weights, kv_tok, per_step = decode_bytes(model, r["rows"], context_mean)
    roofline = r["hbm_bandwidth_bytes_s"] / per_step * r["rows"]
    r.update(weight_bytes_per_step=weights, kv_bytes_per_token=kv_tok, context_mean=round(context_mean, 1),
             bytes_per_step=round(per_step), roofline_tok_s=round(roofline, 1),
             graph_over_eager=round(r["decode_tok_s_graph"] / r["decode_tok_s_eager"], 3),
             decode_roofline_frac=round(r["decode_tok_s_graph"] / roofline, 4))
    C.log(f"decode: {r['rows']} rows, {fast} {r['decode_tok_s_graph']} tok/s vs eager {r['decode_tok_s_eager']} "
          f"({r['graph_over_eager']}x); bandwidth {r['hbm_bandwidth_bytes_s'] / 1e9:.1f} GB/s, {per_step / 1e9:.3g} GB "
          f"per step -> roofline {roofline:.0f} tok/s; decode_roofline_frac {r['decode_roofline_frac']}")


# -------------------------------------------------------------------------------------------------
# rl: two semi-online RL steps under torchrun


def run_trainer(C, torch, cmd: list, out: Path, log_path: Path, steps: int, wait_checkpoint: bool, env_extra=None):
    """Run a trainer command (torchrun) until `steps` rows are in out/metrics.jsonl (then stop it:
    the final checkpoint is not what is measured, unless wait_checkpoint), it exits, or the budget
    ends. Returns rows, returncode, stopped (by this check), timed_out, launch-to-first-row s, wall
    s and the device-wide GPU memory peak sampled every 0.5 s (None on CPU)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    env.pop("UIS1_FORCE_TRITON", None)
    cuda = torch.cuda.is_available() and "cuda" in cmd
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        free0 = torch.cuda.mem_get_info()[0]
    deadline = time.time() + max(C.left() - 5, 10)
    t0 = time.time()
    metrics = out / "metrics.jsonl"
    rows, peak, stopped, timed_out, first_row_t = [], None, False, False, None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                if cuda:  # device-wide, so the trainer's caching allocator and CUDA context count
                    used = free0 - torch.cuda.mem_get_info()[0]
                    peak = used if peak is None else max(peak, used)
                rows = _read_rows(metrics)
                if rows and first_row_t is None:
                    first_row_t = time.time() - t0
                if len(rows) >= steps and not wait_checkpoint:
                    stopped = True
                    break
                if time.time() > deadline:
                    stopped = timed_out = True
                    break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # torchrun and its worker: the group this check started
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    rows = _read_rows(metrics)
    if (not stopped and proc.returncode != 0) or len(rows) < steps:
        tail = log_path.read_text()[-3000:] if log_path.exists() else ""
        why = f"timeout after {time.time() - t0:.0f} s" if timed_out else f"trainer returncode {proc.returncode}"
        raise RuntimeError(f"{why}, {len(rows)} of {steps} steps; log tail:\n{tail}")
    return dict(rows=rows, returncode=proc.returncode, stopped=stopped, wall_s=round(time.time() - t0, 2),
                first_row_s=None if first_row_t is None else round(first_row_t, 2), peak=peak)


def trainer_command(model_dir: Path, work: Path, out: Path, dry: bool, *extra: str) -> list:
    """torchrun --nproc_per_node=1 train_semionline.py on AndroidControl episodes with blank
    1080x2400 screens (an empty image folder), every task kept (--filter-std -1), pi_old recomputed
    (--old-logp recompute, GPU's default; the CPU dry run too, so first_ratio_dev must be exactly 0)."""
    (work / "no_screenshots").mkdir(parents=True, exist_ok=True)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            str(REPO / "train_semionline.py"), "--model", str(model_dir), "--data", str(ANDROID_DATA),
            "--image-root", str(work / "no_screenshots"), "--blank-screens", "1080x2400", "--max-episodes", "4",
            "--filter-std", "-1", "--lr", "1e-6", "--old-logp", "recompute", "--device", "cpu" if dry else "cuda",
            "--out", str(out), *extra]


def check_rl(C, torch, device, dry, a, model_dir, work):
    r = C.res["rl"]
    max_pixels = a.rl_max_pixels or (50176 if dry else 1003520)
    max_new = a.rl_max_new_tokens or (4 if dry else 32)
    steps = 1 if dry else 2
    cmd = trainer_command(model_dir, work, work / "rl", dry, "--tasks-per-step", "1" if dry else "2",
                          "--n-rollouts", "2" if dry else "4", "--max-new-tokens", str(max_new),
                          "--max-pixels", str(max_pixels), "--micro-batch-size", "1",
                          "--ppo-mini-batches", "1" if dry else "2", "--kl-coef", "0" if dry else "1e-4",
                          "--max-steps", str(steps))
    r.update(command=" ".join(cmd), max_pixels=max_pixels)
    run = run_trainer(C, torch, cmd, work / "rl", work / "rl.log", steps, a.rl_wait_checkpoint)
    rows = run["rows"]
    r.update(returncode=run["returncode"], stopped_by_check=run["stopped"], steps_done=len(rows), wall_s=run["wall_s"],
             launch_to_first_row_s=run["first_row_s"], peak_gpu_mem_bytes=run["peak"])
    for key, name in (("time_rollout_s", "time_rollout_s"), ("time_logp_s", "time_logp_s"),
                      ("time_update_s", "time_update_s"), ("time_step_s", "time_s"), ("loss", "loss"),
                      ("first_ratio_dev", "first_ratio_dev"), ("sampler_logp_gap", "sampler_logp_gap")):
        r[key] = [row.get(name) for row in rows]  # read defensively: the trainer's fields may grow
    r["rows"] = rows
    # world size 1 under torchrun: did the trainer shard with FSDP2 (the path NCCL + bf16 take)?
    r["fsdp_wraps_at_world_size_1"] = rows[0].get("fsdp") if rows else None
    r["loss_finite"] = bool(rows) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in r["loss"])


# -------------------------------------------------------------------------------------------------
# full_depth: the 28-layer 7B doing one RL step on one GPU


def check_full_depth(C, torch, device, dry, a, work):
    """Build the 7B config at full depth (dry: a tiny model with --full-depth-layers layers), random
    weights, bf16, save it, run ONE semi-online RL step of it under torchrun --nproc_per_node=1
    with --gradient-checkpointing, and read the step's times and peak memory (the trainer's
    torch.cuda.max_memory_allocated; dry: the worker's peak RSS) from its metrics row; then the same
    step with LoRA (--lora-r 16, the KL on: its reference is the policy with the adapters disabled)."""
    f = C.res["full_depth"]
    layers = a.full_depth_layers or (3 if dry else 28)
    model_dir = work / "model_full_depth"
    t = time.time()
    model = make_model(torch, device, dry, layers)
    f.update(layers=layers, params=sum(p.numel() for p in model.parameters()), build_s=round(time.time() - t, 2))
    t = time.time()
    save_model(model, model_dir, dry)
    f["save_s"] = round(time.time() - t, 2)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    max_pixels = 50176 if dry else 1003520
    step = ("--gradient-checkpointing", "--tasks-per-step", "1", "--n-rollouts", "2" if dry else "4",
            "--max-new-tokens", "4" if dry else "32", "--max-pixels", str(max_pixels),
            "--micro-batch-size", "2" if dry else "4", "--ppo-mini-batches", "1", "--max-steps", "1")
    cmd = trainer_command(model_dir, work, work / "full_depth", dry, *step, "--kl-coef", "0")
    # the LoRA row: the same step with rank-16 adapters and the KL on (its reference: the adapters disabled)
    lcmd = trainer_command(model_dir, work, work / "full_depth_lora", dry, *step, "--lora-r", "16", "--kl-coef", "1e-4")
    f.update(command=" ".join(cmd), max_pixels=max_pixels)
    alloc = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    try:  # expandable segments: Adam's first step allocates ~66 GB in a heap the update left fragmented
        run = run_trainer(C, torch, cmd, work / "full_depth", work / "full_depth.log", 1, False, env_extra=alloc)
        lrun = run_trainer(C, torch, lcmd, work / "full_depth_lora", work / "full_depth_lora.log", 1, False,
                           env_extra=alloc)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)  # 16.6 GB of disk
    lrow = lrun["rows"][0]
    f["lora"].update(command=" ".join(lcmd), lora_r=16, returncode=lrun["returncode"], time_step_s=lrow.get("time_s"),
                     time_update_s=lrow.get("time_update_s"), loss=lrow.get("loss"), kl=lrow.get("kl"),
                     loss_finite=isinstance(lrow.get("loss"), (int, float)) and math.isfinite(lrow["loss"]),
                     peak_mem_bytes=lrow.get("peak_mem_bytes"), peak_gpu_mem_sampled_bytes=lrun["peak"])
    row = run["rows"][0]
    f.update(returncode=run["returncode"], stopped_by_check=run["stopped"], wall_s=run["wall_s"],
             launch_to_first_row_s=run["first_row_s"], peak_gpu_mem_sampled_bytes=run["peak"],
             time_step_s=row.get("time_s"), time_rollout_s=row.get("time_rollout_s"), time_logp_s=row.get("time_logp_s"),
             time_update_s=row.get("time_update_s"), tok_s=row.get("tok_s"), loss=row.get("loss"),
             loss_finite=isinstance(row.get("loss"), (int, float)) and math.isfinite(row["loss"]),
             decode_path=row.get("decode"), full_depth_peak_mem_bytes=row.get("peak_mem_bytes"))
    C.log(f"full_depth: {layers} layers, {f['params'] / 1e9:.3g} B parameters, one RL step {_fmt(f['time_step_s'])} s "
          f"(launch to metrics {_fmt(f['launch_to_first_row_s'])} s), full_depth_peak_mem_bytes "
          f"{f['full_depth_peak_mem_bytes']} ({_gib(f['full_depth_peak_mem_bytes'])})")


def _read_rows(path: Path) -> list:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(row, dict) and "step" in row:
                rows.append({k: v for k, v in row.items() if isinstance(v, (int, float, str, bool)) or v is None})
    return rows


# -------------------------------------------------------------------------------------------------
# number formats (the log lines here and gpu_check's Markdown summary)


def _fmt(x, unit=""):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}{unit}"
    return f"{x}{unit}"


def _gib(x):
    return "-" if x is None else f"{x / 2**30:.2f} GiB"


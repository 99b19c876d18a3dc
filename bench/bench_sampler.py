"""Benchmark: sampler.Sampler vs Hugging Face `generate` on semi-online rollout workloads.

Both run in one process on the same model and the same prompts, sampling with the same settings
(temperature 1, top-p 1, no top-k, vision tokens suppressed in both), with stopping disabled so
every row generates exactly --max-new-tokens tokens and tokens/s compare like for like:

    group:    --tasks tasks x --samples samples (release: 8 x 8): `tasks` distinct prompts, n each
              (HF: generate(..., num_return_sequences=samples) on the `tasks` prompts)
    distinct: tasks * samples distinct prompts, one sample each

Prompts are what training sees: chat.build_prompt on AndroidControl training episodes (goal,
the expert's earlier actions as thought-free history, one screenshot of the current step:
a seeded noise image of the phone's 1080x2400, resized under --max-pixels).
tok/s = generated tokens / wall time of the whole call (prefill + decode), best of --repeats.
prefill_tokens_* = token positions run through the model before the first sampled token,
padding included (HF: rows x longest prompt; ours: the prefix tree's padded segments).

    python bench/bench_sampler.py                                  # CPU: tiny model, fp32
    python bench/bench_sampler.py --device cuda --dtype bf16 --model small --max-new-tokens 256
The last stdout line is one JSON object.
"""
import os
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root
import chat
import cli  # noqa: E402
import utils  # noqa: E402
import dataset
import gui  # noqa: E402
import vlm
from sampler import Sampler  # noqa: E402
from hf_peer import generate_inputs  # noqa: E402  (bench/, the script's folder)

# ---------------------------------------------------------------------------------------------------
# config

parser = cli.make_parser(__doc__)
parser.add_argument("--model", default="tiny", help="'tiny' (extras/tiny.py), 'small' (a ~0.2B random "
                    "Qwen2.5-VL for GPUs) or a Hugging Face directory")
parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="model dtype")
parser.add_argument("--episodes", default="data/android_control/android_control_train_example_uis1.jsonl",
                    help="UI-S1 jsonl the prompts come from")
parser.add_argument("--tasks", type=cli.positive_int, default=8, help="tasks per step (release: 8)")
parser.add_argument("--samples", type=cli.positive_int, default=8, help="rollouts per task (release: 8)")
parser.add_argument("--step", type=cli.non_negative_int, default=3, help="prompt of step min(step, last): that many history turns (0: none)")
parser.add_argument("--max-pixels", type=cli.positive_int, default=256 * 28 * 28, help="screenshot budget (release: 12800*28*28)")
parser.add_argument("--max-new-tokens", type=cli.positive_int, default=96, help="tokens generated per row (stop disabled)")
parser.add_argument("--workloads", type=cli.name_list(["group", "distinct"], "workload"), default=["group", "distinct"], help="comma list of group, distinct")
parser.add_argument("--repeats", type=cli.positive_int, default=3, help="timed runs per sampler and workload, alternating "
                    "ours/hf; the fastest counts (other processes on the machine only ever slow a run down)")
parser.add_argument("--seed", type=cli.non_negative_int, default=0, help="model init, images and sampling seed")
args = parser.parse_args()

device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                      "cpu" if args.device == "auto" else args.device)
dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------
# model and prompts

# 'small' is built on the real Qwen2.5-VL vocabulary; a tiny preset on its own small one
tokenizer, image_processor = vlm.load_processor(None if args.model == "small" else args.model, max_pixels=args.max_pixels)
if args.model == "small":        # ~0.25B: hidden 1024, 8 layers, GQA 16/4, a 4-block vision tower
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from extras.tiny import tiny_config
    tiny = tiny_config(tokenizer=tokenizer, vocab_size=151936)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=151936, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1e6},
                         tie_word_embeddings=True),
        vision_config=dict(depth=4, hidden_size=256, intermediate_size=1024, num_heads=4, out_hidden_size=1024,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[1, 3]),
        **{k: getattr(tiny, k) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                         "vision_end_token_id", "bos_token_id", "eos_token_id", "pad_token_id")},
        tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    model = Qwen2_5_VLForConditionalGeneration(cfg).to(device=device, dtype=dtype)
else:
    model = vlm.load_model(args.model, dtype=dtype, device=device, seed=args.seed)
model.eval()

episodes = dataset.load_episodes(args.episodes)
rng = np.random.default_rng(args.seed)


def task_prompt(k: int):
    """Prompt of task k at step t: goal, the expert's earlier actions as history, one screenshot."""
    ep = episodes[k % len(episodes)]
    t = min(args.step, len(ep.steps) - 1)
    shots = [None] * t + [Image.fromarray(rng.integers(0, 256, (2400, 1080, 3), dtype=np.uint8))]
    size = dataset.ANDROID_CONTROL_SIZE
    resized = gui.resized_size(size, max_pixels=args.max_pixels)
    history = [gui.expert_response(s, size, resized) for s in ep.steps[:t]]
    return chat.build_prompt(tokenizer, image_processor, chat.PromptSpec(num_images=1, max_pixels=args.max_pixels),
                             goal=ep.goal, screenshots=shots, history=history)


n_rows = args.tasks * args.samples
prompts = [task_prompt(k) for k in range(n_rows)]    # the first `tasks` serve the group workload
banned = Sampler(model, tokenizer).banned_ids.tolist()  # vision tokens: suppressed in HF's run as in ours


# ---------------------------------------------------------------------------------------------------
# the two samplers

def run_ours(batch, n):
    sampler = Sampler(model, tokenizer, max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0,
                      stop_token_ids=[], seed=args.seed)
    sync()
    t0 = time.perf_counter()
    outs = sampler.generate(batch, n=n)
    sync()
    dt = time.perf_counter() - t0
    n_tok = sum(len(o.ids) for row in outs for o in row)
    return n_tok / dt, dt, sampler.stats["prefill_tokens"], sampler.stats["prefill_tokens_real"]


def run_hf(batch, n):
    kw = generate_inputs(batch, tokenizer.pad_token_id, model.config.image_token_id, device, dtype)
    T = kw["input_ids"].shape[1]
    torch.manual_seed(args.seed)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**kw, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                             num_return_sequences=n, suppress_tokens=banned, pad_token_id=tokenizer.pad_token_id)
    sync()
    dt = time.perf_counter() - t0
    n_tok = (out.shape[1] - T) * out.shape[0]
    return n_tok / dt, dt, len(batch) * n * T, int(kw["attention_mask"].sum()) * n


# ---------------------------------------------------------------------------------------------------
# run

prompt_lens = [len(p.input_ids) for p in prompts]
image_tokens = int(prompts[0].image_grid_thw.prod()) // 4
print(f"device {device} dtype {args.dtype} model {args.model} threads {torch.get_num_threads()} | "
      f"prompt tokens mean {np.mean(prompt_lens):.0f} (min {min(prompt_lens)}, max {max(prompt_lens)}), "
      f"image tokens {image_tokens}, {args.max_new_tokens} new tokens per row", flush=True)
run_ours(prompts[:2], 2)                         # warm-up (allocator, lazy init) for both
run_hf(prompts[:2], 2)

load_before = os.getloadavg()[0]                # other processes on the machine skew CPU timings
result = dict(device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
              dtype=args.dtype, model=args.model, threads=torch.get_num_threads(), tasks=args.tasks,
              samples=args.samples, max_new_tokens=args.max_new_tokens,
              prompt_tokens_mean=round(float(np.mean(prompt_lens)), 1), image_tokens=image_tokens)
workloads = {"group": (prompts[:args.tasks], args.samples), "distinct": (prompts, 1)}
for name in args.workloads:
    batch, n = workloads[name]
    runs = {"ours": [], "hf": []}
    for _ in range(args.repeats):
        for who, fn in (("ours", run_ours), ("hf", run_hf)):
            runs[who].append(fn(batch, n))
            tok_s, dt, pf, _ = runs[who][-1]
            print(f"{name:9s} {who:4s} {tok_s:8.1f} tok/s ({dt:.1f} s, prefill {pf} tokens)", flush=True)
    best = {who: max(r, key=lambda x: x[0]) for who, r in runs.items()}
    for who in ("ours", "hf"):
        tok_s, dt, pf, pfr = best[who]
        result.update({f"tok_s_{who}_{name}": round(tok_s, 1), f"time_s_{who}_{name}": round(dt, 2),
                       f"times_s_{who}_{name}": [round(r[1], 2) for r in runs[who]],
                       f"prefill_tokens_{who}_{name}": pf, f"prefill_tokens_real_{who}_{name}": pfr})
    result[f"ratio_{name}"] = round(best["ours"][0] / best["hf"][0], 2)
result.update(loadavg_1m_before=round(load_before, 2), loadavg_1m_after=round(os.getloadavg()[0], 2))
print(utils.dumps(result))

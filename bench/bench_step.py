"""Benchmark: one semi-online RL step on a tiny model (default: the quick start's tiny:128x4), phase by phase, each beside its floor,
and beside the same work done the Hugging Face / TRL way.

Workload (fixed, so runs compare): the first --tasks MiniWob training episodes, their first
--steps steps, prompts as train_semionline builds them for --model (a tiny preset: the short
system prompt, chat.fresh_defaults; --system-prompt full for the 7B's), --rollouts rollouts per
task, expert history (`history_mode="expert"`: no rollout ends early, every step is trained) and stopping disabled, so every response is exactly
--max-new-tokens tokens. One step = rollout (semi_online_rollout with the Sampler) -> old and
reference log-probs (no grad) -> one update pass (forward + ppo_loss + backward + AdamW step per
mini-batch), as in train_semionline.py. The model's weights are restored before each repeat.

Phases and floors. A phase's floor is the time its GEMMs alone take: its lm_head FLOPs
(2 H V per position that needs logits) and body FLOPs (2 x decoder weights per token, attention
4 H per (query, key) pair, 2 x vision weights per patch), each divided by the GEMM rate this
script measures in the same run at that phase's shape (a bare `h @ W.T`). The update's floor is
3x the forward's (forward, grad of h, grad of W). ratio_to_floor = seconds / floor.

Peer. TRL's GRPOTrainer cannot drive Qwen2.5-VL with images here (see `trl_grpo_error` in the
JSON: transformers builds Qwen2_5_VLProcessor only with a video processor, which needs
torchvision), so the peer is phase by phase on the same prompts and batch: the rollout through
HF `generate` (same prompts, num_return_sequences = rollouts, same length, vision tokens
suppressed), log-probs and update the TRL way (full logits through
`trl.trainer.utils.selective_log_softmax`, the clipped GRPO loss written as TRL's `_compute_loss`
computes it, AdamW). ratio_vs_trl = peer step seconds / ours.

Shared prompts. In each repeat the log-probs and the update also run on the same micro-batches
collated with shared prompt heads (each once: extras/shared_prompt.py), from the same
weights: share_speedup = seconds plain / shared, per phase (--no-share-prompts skips it). Expert
history makes every rollout of a task share each step's prompt: the most this can give (in a
semi-online run the n rollouts always share step 0's prompt, and later ones while their histories
agree). `step` is the step as train_semionline.py runs it on CPU (--share-prompts auto: on), the
log-probs and update shared; `step_unshared` runs every row's prompt whole; ratio_vs_trl and
ratio_vs_trl_unshared divide the peer's step by each.

Vocabulary. The tiny preset runs on a small tokenizer of its own (assets/tiny_tokenizer, 8,192
tokens). With --vocab both (the default) the same step also runs on the real Qwen2.5-VL vocabulary
(152,064 rows, the 7B config's lm_head) with the same body (every weight but the embedding / lm_head copied from the small
model), prompts tokenised by each model's own tokenizer: vocab_speedup = step seconds real / small,
with each variant's phases and floors (`seconds_real`, `floor_s_real`, `ratio_to_floor_real`).

    pip install --no-deps -r bench/requirements-bench.txt   # TRL 1.16 and its deps (bench only)
    python bench/bench_step.py                           # ~10 min on 2 loaded CPU cores
    python bench/bench_step.py --no-peer                 # ours only, small and real vocabulary: vocab_speedup
Decode on uneven groups (`decode_groups`): after step 0 a semi-online step's rollouts split into groups
by history; the Sampler's decode beside the per-row decode on uniform groups and on one prompt of 8
(16) samples beside seven of 1: decode_groups_ratio = cascade / per-row seconds.
The last stdout line is one JSON object (medians over --repeats; *_runs lists every run).
"""
import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root
import chat
import cli
import dataset
import utils
import vlm
from kernels import ppo_loss  # noqa: E402
from rollout import RolloutSpec, semi_online_rollout  # noqa: E402
from sampler import Sampler
from hf_peer import generate_inputs  # noqa: E402  (bench/, the script's folder)
from vlm import PolicyLogProb, collate_sequences, pad_token_id, sampling_mode, to_device  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# config

parser = cli.make_parser(__doc__)
parser.add_argument("--data", default="data/miniwob/train.jsonl", help="episodes the prompts come from")
parser.add_argument("--tasks", type=cli.positive_int, default=4, help="tasks per step (train_semionline default)")
parser.add_argument("--rollouts", type=cli.positive_int, default=4, help="rollouts per task (train_semionline default)")
parser.add_argument("--steps", type=cli.positive_int, default=2, help="episode steps per task (first K; 2 images from step 1 on)")
parser.add_argument("--max-new-tokens", type=cli.positive_int, default=96, help="response length (stop disabled)")
parser.add_argument("--micro-batch-size", type=cli.positive_int, default=8, help="sequences per forward/backward")
parser.add_argument("--mini-batches", type=cli.positive_int, default=4, help="optimizer steps per rollout batch")
parser.add_argument("--repeats", type=cli.positive_int, default=3, help="timed steps (weights restored before each)")
parser.add_argument("--peer-repeats", type=cli.positive_int, default=1, help="timed peer steps (HF generate is slow: one is ~5 min)")
parser.add_argument("--no-peer", action="store_true", help="skip the HF generate / TRL side")
parser.add_argument("--seed", type=cli.non_negative_int, default=0, help="model init and sampling seed")
parser.add_argument("--model", default="tiny:128x4", help="tiny preset (tiny:HxL) whose step is timed (the quick start's)")
parser.add_argument("--system-prompt", choices=["model", "full", "short"], default="model",
                    help="model: the one the stages give --model (short for a tiny preset, chat.fresh_defaults)")
parser.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the log-probs and the update with shared prompt heads (collate share_prompts): share_speedup")
parser.add_argument("--vocab", choices=["both", "small", "real"], default="both",
                    help="the tiny preset's small vocabulary, Qwen2.5-VL's real one (same body), or both (vocab_speedup)")
args = parser.parse_args()

torch.manual_seed(args.seed)
eps = [e for e in dataset.load_episodes(args.data) if len(e.steps) >= args.steps][:args.tasks]
eps = [dataclasses.replace(e, steps=e.steps[:args.steps]) for e in eps]
SPEC = chat.PromptSpec(**(chat.fresh_defaults(args.model) if args.system_prompt == "model"
                          else {"system_prompt": args.system_prompt}))   # the prompts train_semionline builds
QWEN_VOCAB = json.load(open(vlm.TOKENIZER_DIR / "config.json"))["vocab_size"]  # 152,064 rows: the 7B's lm_head


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def variant(name: str, body_from=None) -> dataclasses.dataclass:
    """One vocabulary's model, reference, tokenizer and shapes. 'small': vlm.load_model(--model) (its
    own tokenizer); 'real': tiny_config on the Qwen2.5-VL tokenizer and the 7B's 152,064 rows, every
    weight but the embedding / lm_head copied from body_from (the same body)."""
    if name == "small":
        tok, ip = vlm.load_processor("tiny")
        make = lambda: vlm.load_model(args.model, seed=args.seed)  # noqa: E731
    else:
        from transformers import Qwen2_5_VLForConditionalGeneration
        tok, ip = vlm.load_processor(None)
        from extras.tiny import parse_tiny, tiny_config
        cfg = tiny_config(*parse_tiny(args.model), tokenizer=tok, vocab_size=QWEN_VOCAB)
        cfg._attn_implementation = "sdpa"

        def make():
            torch.manual_seed(args.seed)
            m = Qwen2_5_VLForConditionalGeneration(cfg).float()
            if body_from is not None:
                same = {k: v for k, v in body_from.state_dict().items() if m.state_dict()[k].shape == v.shape}
                m.load_state_dict(same, strict=False)
            return m
    m, ref = make(), make().requires_grad_(False).eval()
    tc = m.config.get_text_config()
    return dataclasses.make_dataclass("Variant", ["name", "tokenizer", "image_processor", "model", "ref_model",
                                                  "init_state", "H", "V", "pad_id", "body_w", "vis_w", "n_layers"])(
        name, tok, ip, m, ref, {k: v.clone() for k, v in m.state_dict().items()}, tc.hidden_size, tc.vocab_size,
        pad_token_id(tok), n_params(m.model.language_model.layers), n_params(m.model.visual), tc.num_hidden_layers)

# ---------------------------------------------------------------------------------------------------
# GEMM rates at the phases' shapes (measured in this run)

_rates: dict = {}


def gemm_rate(M: int, K: int, N: int) -> float:
    """FLOP/s of a bare (M, K) @ (K, N)^T as F.linear: the best of 7 rounds, each timing enough
    calls to last ~20 ms (other processes on the machine only ever slow a round down)."""
    key = (max(M, 1), K, N)
    if key not in _rates:
        a, w = torch.randn(key[0], K), torch.randn(N, K)
        reps = max(1, int(0.02 / max(_timed(lambda: F.linear(a, w))[1], 1e-6)))
        best = min(_timed(lambda: [F.linear(a, w) for _ in range(reps)])[1] / reps for _ in range(7))
        _rates[key] = 2 * key[0] * K * N / best
    return _rates[key]


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def floor_s(v, lm_rows: int, body_tokens: int, attn_pairs: int = 0, patches: int = 0, rows_shape: int | None = None):
    """Seconds of the GEMMs alone of variant v: lm_head on lm_rows positions, the decoder on body_tokens
    tokens (+ attention over attn_pairs (query, key) pairs per layer), the vision tower on patches."""
    M = rows_shape or max(lm_rows, 1)
    H = v.H
    t = 2 * lm_rows * H * v.V / gemm_rate(M, H, v.V)
    body = 2 * v.body_w * body_tokens + 4 * H * attn_pairs * v.n_layers
    t += body / gemm_rate(max(body_tokens, 1), H, v.model.config.get_text_config().intermediate_size)
    if patches:
        vc = v.model.config.vision_config
        t += 2 * v.vis_w * patches / gemm_rate(patches, vc.hidden_size, vc.intermediate_size)
    return t


# ---------------------------------------------------------------------------------------------------
# our step

class CountingSampler(Sampler):
    """The Sampler, recording each generate call's prompts, n and stats (for floors and the peer)."""
    calls: list

    def generate(self, prompts, n=1, **kw):
        out = super().generate(prompts, n=n, **kw)
        self.calls.append((list(prompts), n, dict(self.stats)))
        return out


def our_step(v):
    v.model.load_state_dict(v.init_state)
    policy, ref = PolicyLogProb(v.model), PolicyLogProb(v.ref_model)
    sampler = CountingSampler(v.model, v.tokenizer, max_new_tokens=args.max_new_tokens, stop_token_ids=[])
    sampler.calls = []
    with sampling_mode(policy):
        recs, t_roll = _timed(lambda: semi_online_rollout(sampler, eps, v.tokenizer, v.image_processor,
                                                          RolloutSpec(n_rollouts=args.rollouts, history_mode="expert"),
                                                          spec=SPEC, seed=0))
    t_prefill = sum(s["time_prefill"] for _, _, s in sampler.calls)
    t_decode = sum(s["time_decode"] for _, _, s in sampler.calls)
    for r in recs:
        r.adv = float(r.reward) - 0.5
    chunks = [recs[i:i + args.micro_batch_size] for i in range(0, len(recs), args.micro_batch_size)]

    def batches_of(share):
        if share:
            from extras.shared_prompt import collate_shared
            return [to_device(collate_shared([r.prompt for r in c], [r.response_ids for r in c], v.pad_id,
                                             v.model.config.image_token_id), "cpu") for c in chunks]
        return [to_device(collate_sequences([r.prompt for r in c], [r.response_ids for r in c], v.pad_id), "cpu")
                for c in chunks]
    batches = batches_of(False)
    t_logp, t_update = logprob_and_update(v, policy, ref, batches, chunks)
    times = dict(prefill=t_prefill, decode=t_decode, rollout=t_roll, logprob=t_logp, update=t_update,
                 step=t_roll + t_logp + t_update, step_unshared=t_roll + t_logp + t_update)
    if args.share_prompts:  # the same work with each micro-batch's shared prompt heads run once, same weights
        v.model.load_state_dict(v.init_state)
        times["logprob_shared"], times["update_shared"] = logprob_and_update(v, policy, ref, batches_of(True), chunks)
        times["step"] = t_roll + times["logprob_shared"] + times["update_shared"]   # as the trainer runs on CPU
    return times, sampler.calls, recs, batches


def logprob_and_update(v, policy, ref, batches, chunks):
    """Seconds of the old + reference log-probs (no grad) and of one update pass (forward + ppo_loss +
    backward + AdamW step per mini-batch) on these micro-batches."""
    opt = utils.adamw(policy.parameters(), lr=1e-4)   # the trainers' optimizer
    t0 = time.perf_counter()
    with torch.no_grad():
        old = [policy(b)[0] for b in batches]
        refl = [ref(b)[0] for b in batches]
    t_logp = time.perf_counter() - t0
    t0 = time.perf_counter()
    policy.train()
    per_mini = max(1, len(batches) // args.mini_batches)
    for m in range(0, len(batches), per_mini):
        opt.zero_grad(set_to_none=True)
        for b, c, o, rl in list(zip(batches, chunks, old, refl))[m:m + per_mini]:
            logp, ent = policy(b, return_entropy=True)
            adv = torch.cat([torch.full((len(r.response_ids),), r.adv) for r in c])
            loss, _ = ppo_loss(logp, o, adv, torch.ones_like(logp), ref_logp=rl)
            loss.mean().backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
    return t_logp, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------
# peer: HF generate for the rollout, TRL's log-prob and loss for the rest

try:
    from trl.trainer.utils import selective_log_softmax
    trl_version = __import__("trl").__version__
except ImportError as e:                                  # bench requirements not installed
    selective_log_softmax, trl_version = None, f"not installed ({e})"


def trl_grpo_error(v) -> str:
    """Why TRL's GRPOTrainer cannot run this model: it needs a ProcessorMixin for image prompts."""
    try:
        from transformers import Qwen2_5_VLProcessor
        Qwen2_5_VLProcessor(image_processor=v.image_processor, tokenizer=v.tokenizer, video_processor=None)
        return ""
    except Exception as e:  # noqa: BLE001 - reported verbatim
        return f"{type(e).__name__}: {e}"


def hf_rollout(v, calls, banned):
    t = 0.0
    for prompts, n, _ in calls:  # n: one sample count per prompt (HF takes one for the batch: repeat prompts)
        prompts = [p for p, k in zip(prompts, [n] * len(prompts) if isinstance(n, int) else n) for _ in range(k)]
        kw = generate_inputs(prompts, v.pad_id, v.model.config.image_token_id)
        with torch.no_grad():
            _, dt = _timed(lambda: v.model.generate(
                **kw, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens, num_return_sequences=1, suppress_tokens=banned,
                pad_token_id=v.pad_id))
        t += dt
    return t


def trl_logps(m, b):
    """TRL's per-token log-probs: left-padded prompts + right-padded completions, logits of the
    last `logits_to_keep` positions, selective_log_softmax (GRPOTrainer._get_per_token_logps...)."""
    logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], pixel_values=b["pixel_values"],
               image_grid_thw=b["image_grid_thw"], mm_token_type_ids=(b["input_ids"] == m.config.image_token_id).int(),
               logits_to_keep=b["keep"] + 1).logits[:, :-1]
    return selective_log_softmax(logits, b["completion"])


def trl_batch(v, recs):
    """The same sequences laid out as TRL does: prompts left-padded, completions right-padded."""
    P = max(len(r.prompt.input_ids) for r in recs)
    L = max(len(r.response_ids) for r in recs)
    ids = torch.full((len(recs), P + L), v.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(recs):
        p = r.prompt.input_ids
        ids[i, P - len(p):P], mask[i, P - len(p):P] = p, 1
        ids[i, P:P + len(r.response_ids)], mask[i, P:P + len(r.response_ids)] = torch.tensor(r.response_ids), 1
    return dict(input_ids=ids, attention_mask=mask, keep=L, completion=ids[:, P:], cmask=mask[:, P:].float(),
                pixel_values=torch.cat([r.prompt.pixel_values for r in recs]),
                image_grid_thw=torch.cat([r.prompt.image_grid_thw for r in recs]))


def peer_step(v, calls, recs, banned):
    model, ref_model = v.model, v.ref_model
    model.load_state_dict(v.init_state)
    t_roll = hf_rollout(v, calls, banned)
    chunks = [recs[i:i + args.micro_batch_size] for i in range(0, len(recs), args.micro_batch_size)]
    batches = [trl_batch(v, c) for c in chunks]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)    # transformers' default for torch >= 2.8
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        old = [trl_logps(model, b) for b in batches]
        refl = [trl_logps(ref_model, b) for b in batches]
    t_logp = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.train()
    per_mini = max(1, len(batches) // args.mini_batches)
    for m in range(0, len(batches), per_mini):
        opt.zero_grad(set_to_none=True)
        for b, c, o, rl in list(zip(batches, chunks, old, refl))[m:m + per_mini]:
            logp = trl_logps(model, b)
            adv = torch.tensor([r.adv for r in c])[:, None]
            # TRL GRPO loss ("bnpo"): clipped ratio, k3 KL, mean over completion tokens
            ratio = torch.exp(logp - o)
            per_tok = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
            per_tok = per_tok + 1e-4 * (torch.exp(rl - logp) - (rl - logp) - 1)
            ((per_tok * b["cmask"]).sum() / b["cmask"].sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    t_update = time.perf_counter() - t0
    model.eval()
    return dict(rollout=t_roll, logprob=t_logp, update=t_update, step=t_roll + t_logp + t_update)


# ---------------------------------------------------------------------------------------------------
# floors of our phases

def sample_counts(prompts, n) -> list[int]:
    """One sample count per prompt, as `Sampler.generate` takes `n` (an int for all, or a list)."""
    return [n] * len(prompts) if isinstance(n, int) else list(n)


def floors(v, calls, batches):
    pf = dc = 0.0
    for prompts, n, st in calls:
        counts = sample_counts(prompts, n)
        R = sum(counts)
        T = st["prefill_tokens_real"]
        patches = sum(int(p.pixel_values.shape[0]) for p in prompts)
        pf += floor_s(v, len(prompts), T, attn_pairs=sum(len(p.input_ids) ** 2 // 2 for p in prompts), patches=patches)
        ctx = sum(c * (len(p.input_ids) + args.max_new_tokens / 2) for p, c in zip(prompts, counts))  # keys read per decode step
        dc += args.max_new_tokens * floor_s(v, R, R, attn_pairs=int(ctx))
    lp = 0.0
    for b in batches:
        N = int((b["targets"] != -100).sum())
        lens = b["attention_mask"].sum(1)
        lp += floor_s(v, N, int(lens.sum()), attn_pairs=int((lens ** 2 // 2).sum()), patches=int(b["pixel_values"].shape[0]))
    return dict(prefill=pf, decode=dc, logprob=2 * lp, update=3 * lp)    # logprob: old + ref passes


# ---------------------------------------------------------------------------------------------------
# the decode on groups of uneven size: after step 0 a semi-online step's rollouts split by history

GROUPS = {"uniform": None, "uneven_8+7x1": [8] + [1] * 7, "uneven_16+7x1": [16] + [1] * 7}  # None: tasks x rollouts


def decode_groups(v) -> dict:
    """Decode seconds of the lean eager decode as the Sampler runs it (cascade="auto": the shared-KV grid
    when the rows fill more than half of its slots, else per-row caches) and of the per-row decode
    (cascade="rows"), alternating, median of --repeats, on distinct step-0 prompts of the data file:
    uniform groups (--tasks x --rollouts, the step's shape) and one prompt of 8 (16) samples beside
    seven of 1. ratio = cascade / per-row (<= 1: the cascade is no slower)."""
    eps8 = dataset.load_episodes(args.data)[:8]
    prompts = [chat.step_prompt(v.tokenizer, v.image_processor, SPEC, goal=e.goal, step=e.steps[0],
                                screenshots=[dataset.load_screenshot(e.steps[0])], history=[]) for e in eps8]
    out = {}
    for name, counts in GROUPS.items():
        counts = counts or [args.rollouts] * min(len(eps), len(prompts))
        times = {"auto": [], "rows": []}
        for _ in range(args.repeats):
            for layout in times:
                s = Sampler(v.model, v.tokenizer, max_new_tokens=args.max_new_tokens, stop_token_ids=[], seed=args.seed,
                            cascade=layout)
                with sampling_mode(v.model):
                    s.generate(prompts[:len(counts)], n=counts)
                times[layout].append(s.stats["time_decode"])
        c, r = statistics.median(times["auto"]), statistics.median(times["rows"])
        label = name if name != "uniform" else f"uniform_{len(counts)}x{counts[0]}"
        out[label] = {"cascade_s": round(c, 3), "per_row_s": round(r, 3), "ratio": round(c / r, 2),
                      "cascade_s_runs": [round(x, 3) for x in times["auto"]], "per_row_s_runs": [round(x, 3) for x in times["rows"]]}
        print(f"decode {label}: cascade {c:.3f} s, per-row {r:.3f} s, ratio {c / r:.2f}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------------
# run

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
print(f"commit {commit} | {args.model} | {SPEC.system_prompt} system prompt | threads {torch.get_num_threads()} | {len(eps)} tasks x {args.rollouts} rollouts x "
      f"{args.steps} steps, {args.max_new_tokens} new tokens | vocab {args.vocab} | trl {trl_version}", flush=True)
load_before = os.getloadavg()[0]
small = variant("small") if args.vocab in ("both", "small") else None
variants = [x for x in (small, variant("real", body_from=small.model if small else None)
                        if args.vocab in ("both", "real") else None) if x is not None]
main_v = variants[0]
runs = {v.name: [] for v in variants}
peer = []
banned = Sampler(main_v.model, main_v.tokenizer).banned_ids.tolist()
last = {}
for rep in range(args.repeats):
    for v in variants:  # side by side, alternating: the load of the machine hits both alike
        t, calls, recs, batches = our_step(v)
        runs[v.name].append(t)
        last[v.name] = (calls, recs, batches)
        print(f"ours ({v.name} vocab, V={v.V})", {k: round(x, 2) for k, x in t.items()}, flush=True)
    if not args.no_peer and selective_log_softmax is not None and rep < args.peer_repeats:
        calls, recs, _ = last[main_v.name]
        peer.append(peer_step(main_v, calls, recs, banned))
        print("peer", {k: round(x, 2) for k, x in peer[-1].items()}, flush=True)


def summary(v) -> dict:
    calls, recs, batches = last[v.name]
    fl = floors(v, calls, batches)
    ours = runs[v.name]
    med = {k: statistics.median(r[k] for r in ours) for k in ours[0]}
    decode_tokens = sum(sum(sample_counts(p, n)) * args.max_new_tokens for p, n, _ in calls)
    return dict(vocab_size=v.V, sequences=len(recs), decode_tokens=decode_tokens,
                seconds={k: round(x, 3) for k, x in med.items()},
                seconds_runs={k: [round(r[k], 3) for r in ours] for k in ours[0]},
                floor_s={k: round(x, 3) for k, x in fl.items()},
                ratio_to_floor={k: round(med[k] / fl[k], 2) for k in ("prefill", "decode", "logprob", "update")},
                rollout_tok_s=round(decode_tokens / med["rollout"], 1), decode_tok_s=round(decode_tokens / med["decode"], 1))


main_sum = summary(main_v)
med = main_sum["seconds"]
result = dict(commit=commit, model=args.model, system_prompt=SPEC.system_prompt, threads=torch.get_num_threads(), tasks=len(eps), rollouts=args.rollouts, steps=args.steps,
              max_new_tokens=args.max_new_tokens, **main_sum)
if len(variants) == 2:
    real = summary(variants[1])
    result.update({f"{k}_real": real[k] for k in ("vocab_size", "seconds", "seconds_runs", "floor_s", "ratio_to_floor",
                                                  "rollout_tok_s", "decode_tok_s")})
    result["vocab_speedup_phases"] = {k: round(real["seconds"][k] / med[k], 2) for k in med}
    result["vocab_speedup"] = round(real["seconds"]["step"] / med["step"], 2)
    result["vocab_speedup_unshared"] = round(real["seconds"]["step_unshared"] / med["step_unshared"], 2)
if args.share_prompts:  # side by side in each repeat: the micro-batches' shared prompt heads run once
    result["share_speedup"] = {k: round(med[k] / med[f"{k}_shared"], 2) for k in ("logprob", "update")}
result.update(gemm_gflops={f"{m}x{k}x{n}": round(r / 1e9, 1) for (m, k, n), r in _rates.items()},
              trl_version=trl_version, trl_grpo_error=trl_grpo_error(main_v))
if peer:
    pmed = {k: statistics.median(r[k] for r in peer) for k in peer[0]}
    result.update(peer_seconds={k: round(x, 3) for k, x in pmed.items()},
                  peer_seconds_runs={k: [round(r[k], 3) for r in peer] for k in peer[0]},
                  ratio_vs_trl=round(pmed["step"] / med["step"], 2),
                  ratio_vs_trl_unshared=round(pmed["step"] / med["step_unshared"], 2),
                  ratio_vs_peer={k: round(pmed[k] / med[k], 2) for k in ("rollout", "logprob", "update")},
                  ratio_vs_peer_shared={k: round(pmed[k] / med[f"{k}_shared"], 2) for k in ("logprob", "update")
                                        if f"{k}_shared" in med})
v_groups = variants[0]
v_groups.model.load_state_dict(v_groups.init_state)
result["decode_groups"] = decode_groups(v_groups)
result["decode_groups_ratio"] = {k: x["ratio"] for k, x in result["decode_groups"].items()}
result.update(loadavg_1m_before=round(load_before, 2), loadavg_1m_after=round(os.getloadavg()[0], 2))
print(json.dumps(result))

"""Semi-online RL for GUI agents (UI-S1, SPEC sections 5-7): one top-down training script.

Each step:
  1. rollout  - `rollout.semi_online_rollout`: N rollouts per task walk through the
                expert episode with their OWN history; wrong steps are patched
                (patch.py) up to --patch-threshold times, else the rollout ends.
  2. advantages - `advantage.compute_advantages`: discounted returns, step-level group
                advantages + episode-level advantages (SPEC 6); dynamic sampling
                drops tasks whose step-0 returns do not vary (DAPO).
  3. old/ref log-probs - one no-grad forward of the policy (and of the frozen reference).
  4. update   - PPO clipped objective with dual clip + k3 KL (kernels.ppo_loss) on the
                fused lm_head log-prob (kernels.fused_logprob), token-mean over the
                mini-batch across micro-batches and ranks, AdamW, grad clip.

Single process (CPU or one GPU):
    python train_semionline.py --max-steps 4
Several processes (FSDP2; gloo on CPU, nccl on GPU):
    torchrun --nproc_per_node=2 train_semionline.py
The paper's setting (8 GPUs, Qwen2.5-VL-7B-Instruct, AndroidControl with screenshots):
    torchrun --nproc_per_node=8 train_semionline.py --model /models/Qwen2.5-VL-7B-Instruct \
        --data data/android_control/android_control_train_example_uis1.jsonl --image-root /data/ac \
        --tasks-per-step 8 --n-rollouts 8 --max-new-tokens 512 --lr 1e-6 --gamma 0.5 \
        --patch-threshold 2 --filter-std 0.3 --max-pixels 1003520
Offline-RL baseline on the same code: add --history expert.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import gui
import utils
from advantage import compute_advantages, dynamic_sampling_tasks
from kernels import ppo_loss
from kernels.policy_logprob import PolicyLogProb, apply_fsdp, collate_sequences, to_device
from rollout import Sampler, sampling_mode, semi_online_rollout

# -----------------------------------------------------------------------------
# config

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
# data
parser.add_argument("--data", default="data/miniwob/train.jsonl", help="episodes (UI-S1 JSONL or AndroidControl native JSON)")
parser.add_argument("--image-root", default=None, help="folder screenshots are resolved against (default: the data file's folder)")
parser.add_argument("--blank-screens", default=None, help="WxH: use blank screenshots of this size when files are missing")
parser.add_argument("--max-episodes", type=int, default=None, help="use only the first N episodes")
# model
parser.add_argument("--model", default="auto", help="'tiny', a Hugging Face folder, or 'auto' (latest out/sft checkpoint, else tiny)")
parser.add_argument("--sft-dir", default="out/sft/ckpt", help="where --model auto looks for an SFT checkpoint")
parser.add_argument("--min-pixels", type=int, default=utils.MIN_PIXELS, help="smart_resize lower bound (pixels)")
parser.add_argument("--max-pixels", type=int, default=utils.MAX_PIXELS, help="smart_resize upper bound (pixels)")
parser.add_argument("--num-images", type=int, default=2, help="screenshots kept as images in the prompt (the last K)")
parser.add_argument("--max-prompt-tokens", type=int, default=None, help="prompt budget; oldest history turns are summarised past it")
# rollout (SPEC 5)
parser.add_argument("--tasks-per-step", type=int, default=4, help="tasks per training step, all ranks together (release: 8)")
parser.add_argument("--n-rollouts", type=int, default=4, help="rollouts per task N (release: 8)")
parser.add_argument("--max-new-tokens", type=int, default=96, help="response length limit (release: 512)")
parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (release: 1.0)")
parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (release: 1.0)")
parser.add_argument("--history", choices=["own", "expert"], default="own", help="own = semi-online RL; expert = offline-RL baseline")
parser.add_argument("--patch", dest="patch_mode", default="thought-free",
                    choices=["thought-free", "empty-thought", "off-policy", "on-policy"], help="patch mode (SPEC 5)")
parser.add_argument("--patch-threshold", type=int, default=2, help="patches per rollout: 0 none, k at most k, -1 unlimited (release: 2)")
# returns and advantages (SPEC 6)
parser.add_argument("--gamma", type=float, default=0.5, help="discount of step returns (paper: 0.5)")
parser.add_argument("--returns-form", choices=["paper", "release"], default="paper", help="release: reset the return chain at a wrong step")
parser.add_argument("--episode-adv", choices=["paper", "release"], default="paper", help="episode-level advantage form")
parser.add_argument("--w-episode", type=float, default=1.0, help="weight of the episode-level advantage")
parser.add_argument("--omega", type=float, default=1.0, help="weight of the step-level advantage")
parser.add_argument("--filter-std", type=float, default=0.0,
                    help="dynamic sampling: drop tasks whose step-0 return std <= this; <0 disables (release: 0.3; "
                         "0 keeps every task whose rollouts differ at all, which a tiny CPU model needs)")
parser.add_argument("--max-resample", type=int, default=2, help="extra rollout rounds to refill the batch after dynamic sampling")
# loss (SPEC 7)
parser.add_argument("--clip-low", type=float, default=0.2, help="PPO clip epsilon below 1")
parser.add_argument("--clip-high", type=float, default=0.2, help="PPO clip epsilon above 1")
parser.add_argument("--clip-c", type=float, default=3.0, help="dual-clip constant for negative advantages")
parser.add_argument("--kl-coef", type=float, default=1e-4, help="k3 KL to the frozen reference; 0 disables the reference model")
parser.add_argument("--ref-model", default=None, help="reference model: 'tiny' or a folder (default: the policy's initialisation)")
parser.add_argument("--ref-seed", type=int, default=None, help="init seed of a 'tiny' reference (default: --seed)")
parser.add_argument("--loss-agg", choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"], default="token-mean",
                    help="how per-token losses become the mini-batch loss")
# optimisation
parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate, constant (tiny-model default; paper, 7B: 1e-6)")
parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
parser.add_argument("--grad-clip", type=float, default=1.0, help="global grad-norm clip")
parser.add_argument("--ppo-mini-batches", type=int, default=4, help="optimizer steps per rollout batch (1 PPO epoch)")
parser.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward/backward")
# run
parser.add_argument("--max-steps", type=int, default=12, help="training steps")
parser.add_argument("--out", default="out/semionline", help="output folder (checkpoints, metrics.jsonl, args.json)")
parser.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: at the end only)")
parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
parser.add_argument("--seed", type=int, default=0, help="seed of task order, sampling and the tiny model's init")
parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to run")
parser.add_argument("--stop-after", type=int, default=None, help="exit after this many steps without a final checkpoint (tests resume)")


def main(argv=None):
    args = parser.parse_args(argv)

    # -------------------------------------------------------------------------
    # setup
    d = utils.init_distributed(args.device)
    utils.seed_everything(args.seed)
    if args.tasks_per_step % d.world_size:
        raise SystemExit(f"--tasks-per-step {args.tasks_per_step} must be a multiple of the world size {d.world_size}")
    out = Path(args.out)
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(json.dumps(vars(args), indent=2))
    metrics = utils.MetricsLogger(out / "metrics.jsonl", append=args.resume)
    gpu = d.device.type == "cuda"

    # -------------------------------------------------------------------------
    # data
    blank = gui.parse_size(args.blank_screens) if args.blank_screens else None
    episodes = gui.load_episodes(args.data, limit=args.max_episodes)
    if not episodes:
        raise SystemExit(f"{args.data}: no episodes")
    tokenizer, image_processor = utils.load_processor(min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    utils.print0(f"{len(episodes)} episodes, {sum(len(e.steps) for e in episodes)} steps from {args.data}")

    # -------------------------------------------------------------------------
    # model: policy (FSDP2), frozen reference
    init = args.model
    if init == "auto":
        sft = utils.latest_checkpoint(args.sft_dir)
        init = str(sft) if sft is not None else "tiny"
    utils.print0(f"policy initialised from: {init}")
    dtype = torch.float32  # master weights; bf16 compute comes from FSDP's mixed precision on GPU
    model = utils.load_model(init, dtype=dtype, device=d.device, seed=args.seed)
    policy = apply_fsdp(model, PolicyLogProb(model), d, mixed_precision=gpu)
    ref = None
    if args.kl_coef > 0:
        ref_model = utils.load_model(args.ref_model or init, dtype=torch.bfloat16 if gpu else dtype, device=d.device,
                                     seed=args.seed if args.ref_seed is None else args.ref_seed)
        ref_model.requires_grad_(False).eval()
        ref = apply_fsdp(ref_model, PolicyLogProb(ref_model), d, mixed_precision=False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.999))
    sampler = Sampler(model, tokenizer, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_p=args.top_p)
    start_step = 0
    if args.resume:
        ckpt = utils.latest_checkpoint(out / "ckpt")
        if ckpt is not None:
            start_step = int(utils.load_checkpoint_state(ckpt, policy, optimizer).get("step", 0))
            utils.print0(f"resumed from {ckpt} at step {start_step}")

    # task order: one seeded permutation per epoch, the same on every rank; rank r takes
    # every world_size-th task of each step's slice
    def task_stream():
        epoch = 0
        while True:
            perm = np.random.default_rng(args.seed + epoch).permutation(len(episodes))
            yield from perm.tolist()
            epoch += 1

    stream = task_stream()
    per_rank = args.tasks_per_step // d.world_size
    for _ in range(start_step * args.tasks_per_step):  # a resumed run sees the tasks it would have seen
        next(stream)

    def next_tasks(n_global):
        ids = [next(stream) for _ in range(n_global)]
        return ids[d.rank::d.world_size]

    # -------------------------------------------------------------------------
    # training loop
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    last = {}
    bar = tqdm(range(start_step, args.max_steps), desc="semi-online RL", disable=not d.is_main)
    for step in bar:
        t0 = time.time()
        # --- 1. rollout, with dynamic sampling refills (SPEC 6, last paragraph)
        kept_records, all_records, n_tried, n_kept = [], [], 0, 0
        with sampling_mode(policy):
            for round_ in range(args.max_resample + 1):
                need = per_rank - n_kept
                if need <= 0:
                    break
                eps = [episodes[i] for i in next_tasks(need * d.world_size)]
                records = semi_online_rollout(
                    sampler, eps, tokenizer, image_processor, n_rollouts=args.n_rollouts,
                    patch_mode=args.patch_mode, patch_threshold=args.patch_threshold,
                    history_mode=args.history, image_root=args.image_root, blank_screens=blank,
                    num_images=args.num_images, min_pixels=args.min_pixels, max_pixels=args.max_pixels,
                    max_prompt_tokens=args.max_prompt_tokens, seed=args.seed * 1_000_003 + step,
                    progress=d.is_main)
                for r in records:  # task index unique across refill rounds
                    r.task_idx += n_tried
                n_tried += len(eps)
                adv = compute_advantages(records, gamma=args.gamma, returns_form=args.returns_form,
                                         episode_form=args.episode_adv, w_episode=args.w_episode, omega=args.omega)
                for r, a, R in zip(records, adv.adv.tolist(), adv.returns.tolist()):
                    r.adv, r.ret = a, R
                if args.filter_std >= 0:
                    keep = dynamic_sampling_tasks(records, adv.returns, threshold=args.filter_std)
                else:
                    keep = {r.task_idx for r in records}
                kept_records += [r for r in records if r.task_idx in keep]
                n_kept += len(keep)
                all_records += records
        t_rollout = time.time() - t0

        # rollout statistics over every sampled response (kept or not), summed over ranks
        stats = torch.tensor([
            sum(r.reward for r in all_records), sum(r.match for r in all_records), len(all_records),
            sum(r.patched for r in all_records), sum(len(r.response_ids) for r in all_records),
            _progress_sum(all_records), _n_rollouts(all_records), n_tried, n_kept,
        ], dtype=torch.float64)
        utils.all_reduce_sum(stats)
        reward_sum, match_sum, n_resp, n_patched, resp_tok, prog_sum, n_roll, tried, kept = stats.tolist()

        # --- 2./3. old and reference log-probs (no grad), on exactly the sampled ids
        t1 = time.time()
        records = kept_records
        n_local = torch.tensor([len(records)], dtype=torch.long)
        utils.all_reduce_sum(n_local)
        if n_local.item() == 0:
            utils.print0(f"step {step}: dynamic sampling kept no task (all step-0 returns equal); no update")
            last = {"step": step + 1, "reward_mean": reward_sum / max(n_resp, 1), "match_rate": match_sum / max(n_resp, 1),
                    "loss": float("nan"), "tasks_kept": 0}
            metrics.log(last)
            continue
        micro = _micro_batches(records, args.ppo_mini_batches, args.micro_batch_size, d)
        fallback = (records or all_records)[:1]  # what a dummy micro-batch runs (FSDP collectives must match)

        def collate(chunk):
            rs = chunk if chunk is not None else fallback
            return to_device(collate_sequences([r.prompt for r in rs], [r.response_ids for r in rs], pad_id), d.device)

        sampler_gap = []
        with torch.no_grad():
            for mb in micro:
                for chunk in mb:
                    batch = collate(chunk)
                    old, _ = policy(batch, temperature=args.temperature)
                    refl = ref(batch, temperature=args.temperature)[0] if ref is not None else None
                    if chunk is None:
                        continue
                    _split_to_records(chunk, "old_logp", old)
                    if refl is not None:
                        _split_to_records(chunk, "ref_logp", refl)
                    for r in chunk:
                        if len(r.response_ids):
                            sampler_gap.append((r.old_logp - r.sampler_logp.to(r.old_logp)).abs().max().item())
        t_logp = time.time() - t1

        # --- 4. update: ppo_mini_batches optimizer steps over one pass of the data (1 PPO epoch)
        t2 = time.time()
        policy.train()
        loss_sum, kl_sum, ent_sum, clip_sum, tok_sum, gnorm = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        first_ratio_dev = None
        for mb in micro:
            denom = _loss_denominator(mb, args.loss_agg)  # global over micro-batches and ranks
            optimizer.zero_grad(set_to_none=True)
            for chunk in mb:
                logp, ent = policy(collate(chunk), temperature=args.temperature, return_entropy=True)
                if chunk is None:  # dummy: same collectives, zero gradient
                    (logp.sum() * 0.0).backward()
                    continue
                old = torch.cat([r.old_logp for r in chunk]).to(logp)
                refl = torch.cat([r.ref_logp for r in chunk]).to(logp) if ref is not None else None
                adv = torch.cat([torch.full((len(r.response_ids),), r.adv) for r in chunk]).to(logp)
                mask = torch.ones_like(logp)
                per_tok, st = ppo_loss(logp, old, adv, mask, ref_logp=refl, clip_low=args.clip_low,
                                       clip_high=args.clip_high, clip_c=args.clip_c, kl_coef=args.kl_coef)
                w = _token_weights(chunk, args.loss_agg).to(logp)  # (N,) per-token weight before the denominator
                # FSDP averages gradients over ranks; * world_size turns that back into a global sum
                loss = (per_tok * w).sum() / denom * d.world_size
                loss.backward()
                if first_ratio_dev is None:  # first on-policy micro-batch: ratio must be exactly 1
                    first_ratio_dev = (st["ratio"] - 1).abs().max().item()
                loss_sum += (per_tok * w).sum().item() / denom
                kl_sum += st["kl"].sum().item()
                ent_sum += ent.detach().sum().item()
                clip_sum += st["clipped"].float().sum().item()
                tok_sum += logp.numel()
            gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.grad_clip)
            gnorm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
            optimizer.step()
        t_update = time.time() - t2

        # --- logging (rank 0) and checkpoints
        red = torch.tensor([loss_sum, kl_sum, ent_sum, clip_sum, tok_sum], dtype=torch.float64)
        utils.all_reduce_sum(red)
        loss_all, kl_all, ent_all, clip_all, tok_all = red.tolist()
        gap, ratio_dev = max(sampler_gap, default=0.0), first_ratio_dev or 0.0  # rank 0's own, numerics checks
        dt = time.time() - t0
        last = {
            "step": step + 1, "loss": loss_all / len(micro), "reward_mean": reward_sum / max(n_resp, 1),
            "match_rate": match_sum / max(n_resp, 1), "progress": prog_sum / max(n_roll, 1),
            "patch_rate": n_patched / max(n_resp, 1), "tasks_kept": int(kept), "tasks_tried": int(tried),
            "kl": kl_all / max(tok_all, 1), "entropy": ent_all / max(tok_all, 1), "clipfrac": clip_all / max(tok_all, 1),
            "grad_norm": gnorm, "response_len": resp_tok / max(n_resp, 1), "train_tokens": int(tok_all),
            "tok_s": resp_tok / max(t_rollout, 1e-9), "time_rollout_s": t_rollout, "time_logp_s": t_logp,
            "time_update_s": t_update, "time_s": dt, "sampler_logp_gap": gap, "first_ratio_dev": ratio_dev,
        }
        metrics.log(last)
        utils.print0(
            f"step {step + 1:4d} | loss {last['loss']:+.4f} | reward {last['reward_mean']:.3f} | match {last['match_rate']:.3f} "
            f"| prog {last['progress']:.3f} | patch {last['patch_rate']:.2f} | kept {int(kept)}/{int(tried)} | kl {last['kl']:.2e} "
            f"| ent {last['entropy']:.2f} | clip {last['clipfrac']:.3f} | len {last['response_len']:.0f} "
            f"| {last['tok_s']:.0f} tok/s | rollout {t_rollout:.1f}s update {t_logp + t_update:.1f}s")
        done = step + 1 == args.max_steps
        if args.stop_after is not None and step + 1 - start_step >= args.stop_after:
            utils.save_checkpoint(out / "ckpt", policy, tokenizer, vars(args), optimizer=optimizer, extra={"step": step + 1})
            break
        if done or (args.save_every and (step + 1) % args.save_every == 0):
            utils.save_checkpoint(out / "ckpt", policy, tokenizer, vars(args), optimizer=optimizer, extra={"step": step + 1})

    # -------------------------------------------------------------------------
    # cleanup
    utils.cleanup_distributed()
    if d.is_main:
        print(json.dumps(last), flush=True)
    return last


# -----------------------------------------------------------------------------
# helpers of the loop (bookkeeping only; the method is in rollout/patch/advantage/kernels)


def _progress_sum(records) -> float:
    """Sum over rollouts of (matched steps before its first error) / (episode steps)."""
    first_err: dict[tuple, int] = {}
    length: dict[tuple, int] = {}
    for r in records:
        key = (r.task_idx, r.rollout_idx)
        length[key] = max(length.get(key, 0), r.step_idx + 1)
        if not r.match:
            first_err[key] = min(first_err.get(key, 10**9), r.step_idx)
    n_steps = {}
    for r in records:
        n_steps[r.task_idx] = max(n_steps.get(r.task_idx, 0), r.step_idx + 1)
    return sum(first_err.get(k, n_steps[k[0]]) / n_steps[k[0]] for k in length)


def _n_rollouts(records) -> int:
    return len({(r.task_idx, r.rollout_idx) for r in records})


def _micro_batches(records, n_mini, micro_size, d):
    """Split records into n_mini mini-batches, each a list of micro-batches.

    Record j of a task (in record order) goes to mini-batch j % n_mini, so the union of a
    mini-batch over ranks does not depend on the world size (the 1- vs 2-process test).
    Every rank runs the same number of micro-batches (None = a zero-weight dummy).
    """
    minis = [[] for _ in range(n_mini)]
    seen: dict[int, int] = {}
    for r in records:
        j = seen.get(r.task_idx, 0)
        seen[r.task_idx] = j + 1
        minis[j % n_mini].append(r)
    out = []
    for m in minis:
        chunks = [m[i:i + micro_size] for i in range(0, len(m), micro_size)]
        n = torch.tensor([len(chunks)], dtype=torch.long)
        if d.world_size > 1:
            torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MAX)
        chunks += [None] * (int(n.item()) - len(chunks))
        if chunks:
            out.append(chunks)
    return out


def _token_weights(chunk, agg):
    """Per-token weights: 1 for token-mean; 1/len (seq-mean-token-mean) or 1 (seq-mean-token-sum)
    per sequence, whose sum is then divided by the global sequence count."""
    if agg == "seq-mean-token-mean":
        return torch.cat([torch.full((len(r.response_ids),), 1.0 / max(len(r.response_ids), 1)) for r in chunk])
    return torch.cat([torch.ones(len(r.response_ids)) for r in chunk])


def _loss_denominator(mb, agg) -> float:
    """Global (all ranks, all micro-batches) token or sequence count of a mini-batch."""
    real = [r for chunk in mb if chunk is not None for r in chunk]
    n = torch.tensor([sum(len(r.response_ids) for r in real) if agg == "token-mean" else len(real)], dtype=torch.float64)
    utils.all_reduce_sum(n)
    return max(n.item(), 1.0)


def _split_to_records(chunk, name, values):
    """Hand the flat (N,) per-token tensor back to each record, in order."""
    sizes = [len(r.response_ids) for r in chunk]
    for r, v in zip(chunk, values.detach().float().cpu().split(sizes)):
        setattr(r, name, v)


if __name__ == "__main__":
    main()

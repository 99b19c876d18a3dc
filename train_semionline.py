"""Semi-online RL for GUI agents (UI-S1): one top-down training script of docs/method.md §5-§7.

main runs each step's phases, each a function above it (the update's pieces, TrainItem, ppo_step and
_micro_batches, follow main): 1. rollout (rollout.py: own history, wrong steps patched by patch.py)
-> 2. rewards (reward.py) -> 3. returns and advantages (advantage.py; dynamic sampling refills:
draw_batch) -> 4. old/ref log-probs -> 5. PPO update (kernels.ppo_loss) -> 6. log. A step's tasks
are a pure function of (--seed, step, slot: a task's place in the step's draw, schedule.py): a run
does not depend on the world size and --resume needs only the step number.

Single process (CPU or one GPU), after `python train_sft.py --max-steps 150` (--model auto starts
from its checkpoint; `--model tiny`: an untrained model, which earns no reward):
    python train_semionline.py --max-steps 4
Several processes (FSDP2; gloo on CPU, nccl on GPU); the README's main job, `--preset quickstart`:
    torchrun --nproc_per_node=2 train_semionline.py
The paper's scale (8 GPUs, Qwen2.5-VL-7B-Instruct, AndroidControl) with the release's returns and
filter; `--preset paper` for the paper's returns (docs/method.md §6):
    torchrun --nproc_per_node=8 train_semionline.py --preset release \\
        --model /models/Qwen2.5-VL-7B-Instruct --max-pixels 1003520 --image-root /data/ac \\
        --data data/android_control/android_control_train_example_uis1.jsonl
Offline-RL baseline: --history expert. Short of memory: --gradient-checkpointing or --lora-r 16.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

import chat
import cli
import dataset
import reward
import utils
import vlm
from advantage import compute_advantages, dynamic_sampling_tasks
from configs.common import check_lora_args, metrics_logger
from configs.flags import config_parser, parse_config
from configs.semionline import GROUPS, PRESETS, RLConfig
from kernels import aggregate_loss, loss_denominator, ppo_loss
from rollout import RolloutSpec, StepRecord, semi_online_rollout, sop_progress
from sampler import Sampler
from schedule import TaskDraw, task_seed
from vlm import (PolicyLogProb, apply_fsdp, checkpoint_activations, collate_sequences, pad_token_id,
                 sampling_mode, to_device)

# -----------------------------------------------------------------------------
# config: the flags made from configs.semionline.RLConfig (typed fields) and its PRESETS

MAX_TASKS_LOGGED = 32  # reward_by_task is logged when the data has at most this many tasks
SUMS = ("loss", "kl", "entropy", "clipped", "tokens")  # the per-rank sums ppo_step returns
parser = config_parser(__doc__, RLConfig, GROUPS, PRESETS)
chat.add_prompt_args(parser)  # the prompt contract: from the starting checkpoint unless given


def parse(argv=None) -> tuple[RLConfig, argparse.Namespace]:
    """argv -> (the typed config, --preset applied; the prompt's flags, for chat.resolve_spec)."""
    return parse_config(parser, RLConfig, PRESETS, argv)


def check_args(cfg: RLConfig) -> None:
    """The rules between flags (a flag's own range is its parser type's): a breach raises
    utils.UsageError before any model loads or any file is written."""
    rules = [
        (cfg.model != "auto" or utils.latest_checkpoint(cfg.sft_dir) is not None,
         f"--model auto: no SFT checkpoint in {cfg.sft_dir} (run train_sft.py, point --sft-dir at "
         "its ckpt/, give --model PATH or --model tiny)"),
        (cfg.old_logp != "sampler" or cfg.top_p == 1.0,
         f"--old-logp sampler needs --top-p 1 (its log-probs are checked against the trainer's "
         f"there: sampler_logp_gap); at --top-p {cfg.top_p:g} use --old-logp recompute"),
        (cfg.share_prompts != "on" or not cfg.gradient_checkpointing,
         "--share-prompts on needs the KV cache, which --gradient-checkpointing drops: use "
         "--share-prompts off"),
        (0 <= cfg.overlong_buffer <= cfg.max_new_tokens,
         f"--overlong-buffer {cfg.overlong_buffer}: must be in [0, --max-new-tokens "
         f"{cfg.max_new_tokens}]"),
        (check_lora_args(cfg) is None, check_lora_args(cfg))]
    for ok, message in rules:
        if not ok:
            raise utils.UsageError(message)
    if cfg.resume:  # a LoRA checkpoint's flags must be this run's
        from extras.resume import check_flags
        check_flags(cfg)


# -----------------------------------------------------------------------------
# reward by task (data of few tasks: MiniWob's)


def rewards_by_task(run, draw: TaskDraw, rolled: list[StepRecord]) -> dict[str, dict] | None:
    """reward_by_task: {task: {"reward": mean reward, "responses": count}} over every rank's
    responses, of the tasks that have some; None when the data has over MAX_TASKS_LOGGED tasks."""
    tasks, n = run.task_names, len(run.task_names)  # the same on every rank
    if n > MAX_TASKS_LOGGED:
        return None
    ix = {t: i for i, t in enumerate(tasks)}
    sums = [0.0] * (2 * n)  # per task: the reward sums, then the response counts
    for r in rolled:
        k = ix[run.episodes[draw.slot_episode[r.task_idx]].task]
        sums[k] += r.reward
        sums[n + k] += 1
    sums = utils.all_sum(sums, run.proc)
    return {t: {"reward": sums[k] / sums[n + k], "responses": int(sums[n + k])}
            for k, t in enumerate(tasks) if sums[n + k] > 0}


# -----------------------------------------------------------------------------
# the run: processes, data, models, a resume (main, at the bottom, runs the phases below in order)


def setup(cfg: RLConfig, other: argparse.Namespace) -> SimpleNamespace:
    """The starting model and its prompt contract, processes, seeds, the data, the models
    (build_models), a resume (resume). other: parse's second value. Returns the run's state."""
    start = str(utils.latest_checkpoint(cfg.sft_dir)) if cfg.model == "auto" else cfg.model
    spec = chat.resolve_spec(other, start, say=utils.print0)  # the prompt it was trained on
    proc = utils.init_distributed(cfg.device)
    utils.seed_everything(cfg.seed)
    gpu = proc.device.type == "cuda"
    if cfg.old_logp == "auto":  # recorded resolved in args.json
        cfg.old_logp = "recompute" if gpu or cfg.top_p < 1.0 else "sampler"
    if cfg.share_prompts == "auto":
        cfg.share_prompts = "off" if gpu or cfg.gradient_checkpointing else "on"
    if cfg.tasks_per_step % proc.world_size:
        raise utils.UsageError(f"--tasks-per-step {cfg.tasks_per_step} must be a multiple of the "
                               f"world size {proc.world_size}")
    episodes = dataset.load_episodes(cfg.data, limit=cfg.max_episodes)
    if not episodes:
        raise utils.UsageError(f"{cfg.data}: no episodes")
    tokenizer, image_processor = vlm.load_processor(start, min_pixels=spec.min_pixels,
                                                    max_pixels=spec.max_pixels)
    utils.print0(f"{len(episodes)} episodes, {sum(len(e.steps) for e in episodes)} steps from "
                 f"{cfg.data}")
    run = SimpleNamespace(
        cfg=cfg, other=other, proc=proc, gpu=gpu, spec=spec, episodes=episodes,
        tokenizer=tokenizer, image_processor=image_processor, pad_id=pad_token_id(tokenizer),
        out=Path(cfg.out),  # written only once the flags, the data and a checkpoint are checked
        task_names=sorted({e.task for e in episodes}),  # the same on every rank
        heldout=dataset.load_episodes(cfg.eval_data, limit=cfg.eval_episodes)
        if cfg.eval_data else [])
    build_models(run, init=start)  # --model auto: the latest SFT checkpoint
    resume(run)
    return run


def build_models(run, init: str) -> None:
    """The policy (FSDP2; LoRA adapters with --lora-r), its frozen reference (KL term on), the
    optimizer and the sampler, into `run`. The sampler holds --temperature and --max-new-tokens: the
    trainer reads them from it (one route each)."""
    cfg, proc = run.cfg, run.proc
    utils.print0(f"policy initialised from: {init}")
    dtype = torch.float32  # master weights; bf16 compute comes from FSDP's mixed precision on GPU
    run.model = model = vlm.load_model(init, dtype=dtype, device=proc.device, seed=cfg.seed)
    run.adapter = run.ref = None  # LoRA's PeftModel (lora.py, imported only with --lora-r)
    if cfg.lora_r:
        import lora
        run.adapter = lora.apply_lora(model, cfg, base=init, seed=cfg.seed)
    if cfg.gradient_checkpointing:
        checkpoint_activations(model)
    run.policy = apply_fsdp(model, PolicyLogProb(model), proc, mixed_precision=run.gpu)
    if cfg.kl_coef > 0 and run.adapter and cfg.ref_model is None:  # LoRA: no second model, the
        run.ref = lora.AdaptersOff(run.policy, run.adapter)  # reference is the adapters off
    elif cfg.kl_coef > 0:
        ref_model = vlm.load_model(cfg.ref_model or init, device=proc.device,
                                   dtype=torch.bfloat16 if run.gpu else dtype,
                                   seed=cfg.seed if cfg.ref_seed is None else cfg.ref_seed)
        ref_model.requires_grad_(False).eval()
        run.ref = apply_fsdp(ref_model, PolicyLogProb(ref_model), proc, mixed_precision=False)
    run.optimizer = utils.adamw(run.policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    run.sampler = Sampler(model, run.tokenizer, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_p=cfg.top_p, decode=cfg.decode)


def run_record(cfg: RLConfig, other: argparse.Namespace) -> dict:
    """args.json: every flag as the run used it (--preset applied, auto resolved, "prompt")."""
    return {**dataclasses.asdict(cfg), **vars(other)}


def resume(run) -> None:
    """With --resume, the latest checkpoint in --out (extras/resume.py); then args.json and the
    metrics file (the steps after the checkpoint are redone and logged once)."""
    cfg, out = run.cfg, run.out
    # what the task schedule depends on: a resume must continue the same schedule
    run.schedule = {"seed": cfg.seed, "tasks_per_step": cfg.tasks_per_step,
                    "n_episodes": len(run.episodes)}
    run.start_step = 0
    if cfg.resume:
        from extras.resume import resume_rl
        run.start_step = resume_rl(run)
    run.record = run_record(cfg, run.other)
    if run.proc.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(utils.dumps(run.record, indent=2))
    run.metrics = metrics_logger(out / "metrics.jsonl", report_to=cfg.report_to, config=run.record,
                                 resume_step=run.start_step if cfg.resume else None)


# -----------------------------------------------------------------------------
# one training step: rollout -> rewards -> advantages (round by round: dynamic sampling refills) ->
# old/ref log-probs -> update -> log


def rollout(run, step: int, slots: list[int], episode_ids: list[int]) -> list[StepRecord]:
    """1. rollout (docs/method.md §5): N rollouts of each drawn episode (this rank's share), seeded
    by (seed, step, slot); task_idx = the global slot, the same on every world size."""
    cfg = run.cfg
    return semi_online_rollout(
        run.sampler, [run.episodes[i] for i in episode_ids], run.tokenizer, run.image_processor,
        RolloutSpec(n_rollouts=cfg.n_rollouts, patch_mode=cfg.patch_mode,
                    patch_threshold=cfg.patch_threshold, history_mode=cfg.history,
                    match_rules=cfg.match_rules, image_root=cfg.image_root,
                    blank_screens=cfg.blank_screens),
        spec=run.spec, seed=[task_seed(cfg.seed, step, s) for s in slots],
        progress=run.proc.is_main, task_ids=slots)


def rewards(records: list[StepRecord], *, max_new_tokens: int, overlong_buffer: int) -> list[float]:
    """2. rewards: each response's rule reward (the rollout's), shaped by the overlong penalty
    (DAPO; max_new_tokens: the sampler's length limit)."""
    return [reward.shaped_reward(r.reward, len(r.response_ids), max_new_tokens=max_new_tokens,
                                 overlong_buffer=overlong_buffer) for r in records]


def advantages(cfg: RLConfig, records: list[StepRecord], shaped: list[float],
               slots: list[int]) -> tuple[list[float], set[int]]:
    """3. returns and advantages (docs/method.md §6; groups never cross tasks, so per round), and
    the slots dynamic sampling keeps (step-0 returns that vary; all at a negative --filter-std)."""
    adv = compute_advantages(records, rewards=shaped, gamma=cfg.gamma,
                             returns_form=cfg.returns_form, episode_form=cfg.episode_adv,
                             w_episode=cfg.w_episode, omega=cfg.omega, norm=cfg.adv_norm)
    keep = set(slots) if cfg.filter_std < 0 else dynamic_sampling_tasks(records, adv.returns,
                                                                        threshold=cfg.filter_std)
    return adv.adv.tolist(), keep


def draw_batch(run, step: int) -> tuple[TaskDraw, list, list[StepRecord]]:
    """Phases 1-3 round by round: draw tasks, roll them out, reward them, keep those whose rollouts
    differ (dynamic sampling), draw the missing number again (refills; docs/method.md §6). Returns
    the draw, the kept responses (TrainItems) and every record this rank rolled out."""
    cfg = run.cfg
    draw = TaskDraw(cfg.seed, step, len(run.episodes), cfg.tasks_per_step, 1 + cfg.max_resample,
                    run.proc)
    batch, rolled = [], []
    with sampling_mode(run.policy):
        while (drawn := draw.next_round()) is not None:
            slots, episode_ids = drawn  # this rank's share: every world_size-th slot of the round
            records = rollout(run, step, slots, episode_ids)
            shaped = rewards(records, max_new_tokens=run.sampler.max_new_tokens,
                             overlong_buffer=cfg.overlong_buffer)
            adv, keep = advantages(cfg, records, shaped, slots)
            kept = draw.keep(keep)  # the global decision: every rank draws the same next round
            batch += [TrainItem(r, a) for r, a in zip(records, adv) if r.task_idx in kept]
            rolled += records
    return draw, batch, rolled


def rollout_stats(run, draw: TaskDraw, batch: list, rolled: list[StepRecord]) -> dict:
    """Rollout statistics over every sampled response (kept or not), summed over ranks."""
    ep_len = {s: len(run.episodes[e].steps) for s, e in draw.slot_episode.items()}
    names = ("reward_sum", "match_sum", "n_resp", "n_patched", "resp_tok", "prog_sum", "n_roll",
             "n_train", "n_cut")
    stats = dict(zip(names, utils.all_sum([
        sum(r.reward for r in rolled), sum(r.match for r in rolled), len(rolled),
        sum(r.patched for r in rolled), sum(len(r.response_ids) for r in rolled),
        sum(c / n for c, n in sop_progress(rolled, ep_len).values()),  # SOP progress, as eval's PG
        len({(r.task_idx, r.rollout_idx) for r in rolled}),
        len(batch), sum(r.finish_reason != "stop" for r in rolled)], run.proc)))
    return {**stats, "by_task": rewards_by_task(run, draw, rolled)}


def micro_batches(run, batch: list, rolled: list[StepRecord]):
    """The step's mini-batches of micro-batches (_micro_batches), and collate(chunk) -> the model's
    batch on the device (a dummy micro-batch, None, runs the first item: the FSDP collectives)."""
    cfg = run.cfg
    micro = _micro_batches(batch, cfg.ppo_mini_batches, cfg.micro_batch_size, run.proc,
                           length=lambda it: len(it.prompt.input_ids) + len(it.response_ids))
    filler = batch[:1] or [TrainItem(rolled[0], 0.0)]

    def collate(chunk):
        items = chunk if chunk is not None else filler
        rows = [it.prompt for it in items], [it.response_ids for it in items], run.pad_id
        if cfg.share_prompts != "on":
            return to_device(collate_sequences(*rows), run.proc.device)
        from extras.shared_prompt import collate_shared  # plus the prompt heads the rows share
        return to_device(collate_shared(*rows, run.model.config.image_token_id), run.proc.device)
    return micro, collate


def old_ref_logprobs(run, batch: list, micro: list, collate) -> list[float]:
    """4. old (unless --old-logp sampler: the sampler's) and reference log-probs, no grad, of the
    sampled ids, into each TrainItem. Returns each recomputed item's max |trainer - sampler|
    log-prob gap at --top-p 1 (where both score the whole vocabulary)."""
    ref, t = run.ref, run.sampler.temperature  # the log-probs of pi at the temperature sampled at
    recompute, gap = run.cfg.old_logp == "recompute", []
    for it in batch if not recompute else ():
        it.old_logp = it.record.sampler_logp.float()  # (L,)
    if not recompute and ref is None:
        return gap
    with torch.no_grad():
        for chunk in (chunk for mini in micro for chunk in mini):
            inputs = collate(chunk)
            old = run.policy(inputs, temperature=t)[0] if recompute else None  # (N,) fp32
            ref_lp = ref(inputs, temperature=t)[0] if ref is not None else None  # (N,)
            if chunk is None:
                continue
            for it, lp in zip(chunk, _per_item(chunk, old) if recompute else ()):
                it.old_logp = lp  # (L,)
            for it, lp in zip(chunk, _per_item(chunk, ref_lp) if ref is not None else ()):
                it.ref_logp = lp  # (L,)
            for it in chunk if recompute and run.cfg.top_p == 1.0 else ():
                if len(it.response_ids):
                    diff = it.old_logp - it.record.sampler_logp.to(it.old_logp)
                    gap.append(diff.abs().max().item())
    return gap


def update(run, micro: list, collate) -> dict:
    """5. update (docs/method.md §7): --ppo-mini-batches optimizer steps over one pass of the data
    (1 PPO epoch, ppo_step; none when micro is empty). Returns this rank's sums over them (SUMS,
    skipped), the last grad_norm and the first real micro-batch's ratio_dev and logp_gap."""
    totals = {**dict.fromkeys(SUMS, 0.0), "skipped": 0, "grad_norm": None, "ratio_dev": None,
              "logp_gap": None}
    for mini in micro:
        sums = ppo_step(run.policy, run.optimizer, mini, collate, run.proc,
                        **loss_config(run.cfg, run.sampler))
        for k in (*SUMS, "skipped"):
            totals[k] += sums[k]
        totals["grad_norm"] = sums["grad_norm"]  # the last optimizer step's
        if totals["ratio_dev"] is None:  # the first real micro-batch's
            totals["ratio_dev"], totals["logp_gap"] = sums["ratio_dev"], sums["logp_gap"]
    return totals


# the step's line on stdout: (label, the metrics row's key, format)
LINE = [("loss", "loss", "+.4f"), ("reward", "reward_mean", ".3f"), ("match", "match_rate", ".3f"),
        ("prog", "progress", ".3f"), ("patch", "patch_rate", ".2f"),
        ("cut", "truncated_rate", ".2f"), ("kl", "kl", ".2e"), ("ent", "entropy", ".2f"),
        ("clip", "clipfrac", ".3f"), ("skipped", "updates_skipped", "d"),
        ("len", "response_len", ".0f"), ("tok/s", "tok_s", ".0f"),
        ("rollout s", "time_rollout_s", ".1f"), ("logp s", "time_logp_s", ".1f"),
        ("update s", "time_update_s", ".1f")]


def log_step(run, step: int, draw: TaskDraw, st: dict, totals: dict, gap: list[float], n_micro: int,
             times: dict, t0: float) -> dict:
    """6. log: the step's metrics row (metrics.jsonl and --report-to; rank 0), with the held-out
    evaluation when one is due, and its line on stdout (LINE). times: the phases' time_*_s fields;
    t0: time.time() at the step's start (time_s: the whole step). Returns the row."""
    cfg, proc = run.cfg, run.proc
    loss_all, kl_all, ent_all, clip_all, tok_all = utils.all_sum([totals[k] for k in SUMS], proc)
    per_tok = (lambda x: x / tok_all) if tok_all > 0 else (lambda x: None)  # noqa: E731
    n_resp = max(st["n_resp"], 1)
    last = {
        "step": step + 1, "loss": loss_all / n_micro if st["n_train"] > 0 else None,
        "reward_mean": st["reward_sum"] / n_resp, "match_rate": st["match_sum"] / n_resp,
        "reward_by_task": st["by_task"],  # {task: {reward, responses}}; None: > 32 tasks
        "truncated_rate": st["n_cut"] / n_resp,  # cut at --max-new-tokens (strict rules: reward 0)
        "progress": st["prog_sum"] / max(st["n_roll"], 1), "patch_rate": st["n_patched"] / n_resp,
        **draw.info(), "updates_skipped": totals["skipped"],
        "kl": per_tok(kl_all), "entropy": per_tok(ent_all), "clipfrac": per_tok(clip_all),
        "grad_norm": totals["grad_norm"], "response_len": st["resp_tok"] / n_resp,
        "train_tokens": int(tok_all), "tok_s": st["resp_tok"] / max(times["time_rollout_s"], 1e-9),
        **times, "time_s": time.time() - t0,
        # max |trainer - sampler| log-prob over rank 0's tokens (--old-logp sampler: the first
        # micro-batch's); null at --top-p < 1, where --old-logp sampler is not offered
        "sampler_logp_gap": None if cfg.top_p < 1.0 else max(gap, default=0.0)
        if cfg.old_logp == "recompute" else totals["logp_gap"],
        "first_ratio_dev": totals["ratio_dev"],  # first (on-policy) micro-batch's: 0 recomputed
        "old_logp": cfg.old_logp, "fsdp": torch.distributed.is_initialized(),
        "decode": run.sampler.decode,  # "static" if a CUDA graph capture failed
        "peak_mem_bytes": utils.peak_memory_bytes(proc.device),  # the step's (CUDA), run's (CPU)
    }
    if run.heldout:  # --eval-data
        from extras.heldout import evaluate_heldout
        last.update(evaluate_heldout(run, step + 1))
    run.metrics.log(last)
    kept = f"kept {last['tasks_kept']}/{last['tasks_tried']} in {last['rounds']} rounds"
    kept += " (PARTIAL)" if last["partial"] else ""
    shown = [f"{label} {_fmt(last[key], spec)}" for label, key, spec in LINE]
    utils.print0(" | ".join([f"step {step + 1:4d}", kept, *shown]))
    return last


def finish(run, last: dict) -> None:
    """Close the metrics and the process group; rank 0 merges LoRA adapters (--merge) and prints
    where the checkpoint is, the commands to plot and evaluate it, and the last row as JSON."""
    cfg, out = run.cfg, run.out
    run.metrics.close()
    utils.cleanup_distributed()
    if run.proc.is_main:
        if cfg.merge:  # the adapted model as a plain Hugging Face folder
            from extras.merge import merge_checkpoint
            merged = merge_checkpoint(utils.latest_checkpoint(out / "ckpt"), out / "merged")
            print(f"merged: {merged}", flush=True)
        utils.print_next_steps(out, cfg.data, "out/eval/semionline")
        print(utils.dumps(last), flush=True)


def main(argv=None):
    cfg, other = parse(argv)  # the typed config (--preset applied); the prompt's flags
    check_args(cfg)
    run = setup(cfg, other)
    last = {}
    if run.heldout and run.start_step == 0:  # the starting point (the SFT model), as row "step 0"
        from extras.heldout import evaluate_heldout
        run.metrics.log({"step": 0, **evaluate_heldout(run, 0)})
    for step in tqdm(range(run.start_step, cfg.max_steps), desc="semi-online RL",
                     disable=not run.proc.is_main):
        t0 = time.time()
        if run.gpu:
            torch.cuda.reset_peak_memory_stats(run.proc.device)
        draw, batch, rolled = draw_batch(run, step)  # 1-3. rollout -> rewards -> advantages
        t_rollout = time.time() - t0
        stats = rollout_stats(run, draw, batch, rolled)
        t1 = time.time()
        micro, collate = micro_batches(run, batch, rolled) if stats["n_train"] > 0 else ([], None)
        gap = old_ref_logprobs(run, batch, micro, collate)  # 4. old / ref log-probs
        t2 = time.time()
        totals = update(run, micro, collate)  # 5. the PPO update
        times = {"time_rollout_s": t_rollout, "time_logp_s": t2 - t1,
                 "time_update_s": time.time() - t2}
        last = log_step(run, step, draw, stats, totals, gap, len(micro), times, t0)  # 6. log
        stop = cfg.stop_after is not None and step + 1 - run.start_step >= cfg.stop_after
        every = cfg.save_every and (step + 1) % cfg.save_every == 0
        if stop or step + 1 == cfg.max_steps or every:
            vlm.save_checkpoint(run.out / "ckpt", run.policy, run.tokenizer, run.record,
                                optimizer=run.optimizer, adapter=run.adapter,
                                extra={"step": step + 1, "schedule": run.schedule},
                                keep=cfg.keep_checkpoints)
        if stop:
            break
    finish(run, last)
    return last


@dataclasses.dataclass
class TrainItem:
    """A kept response (its StepRecord as the rollout left it) and what the trainer computes for it:
    adv, its advantage A (one float for all its tokens, docs/method.md §6); old_logp and ref_logp,
    (L,) fp32 log-probs of its ids under the policy before the update and the frozen reference."""
    record: StepRecord
    adv: float
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    prompt = property(lambda self: self.record.prompt)
    response_ids = property(lambda self: self.record.response_ids)
    task_idx = property(lambda self: self.record.task_idx)
    step_idx = property(lambda self: self.record.step_idx)


# -----------------------------------------------------------------------------
# the update (docs/method.md §7)


def loss_config(cfg: RLConfig, sampler) -> dict:
    """ppo_step's keywords: cfg's loss flags and the sampler's temperature and length limit (the
    responses were drawn at them). sampler: sampler.Sampler, or anything with those two fields."""
    return dict(temperature=sampler.temperature, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                clip_c=cfg.clip_c, kl_coef=cfg.kl_coef, loss_agg=cfg.loss_agg,
                max_len=sampler.max_new_tokens, grad_clip=cfg.grad_clip)


def ppo_step(policy, optimizer, mb, collate, proc, *, temperature: float, clip_low: float,
             clip_high: float, clip_c: float, kl_coef: float, loss_agg: str, max_len: int,
             grad_clip: float) -> dict:
    """One optimizer step on the mini-batch `mb` (docs/method.md §7, eq. 7.1-7.4): kernels.ppo_loss
    of the log-probs at `temperature` (the sampler's), aggregated by loss_agg over the WHOLE
    mini-batch (kernels.loss_denominator over its micro-batches and the ranks; max_len: Dr.GRPO's
    constant), backward per micro-batch, global grad-norm clip, optimizer.step(); a non-finite norm
    skips the step and drops the gradients. mb: micro-batches, each a list of TrainItems or None (a
    dummy: the same FSDP collectives, zero gradient); collate(chunk) -> the model's batch; proc:
    utils.Dist. Returns this rank's SUMS, grad_norm (global), skipped (0/1), and of the first real
    micro-batch ratio_dev (max |ratio - 1|) and logp_gap (max |logp - old_logp|), else None."""
    real = [len(r.response_ids) for chunk in mb if chunk is not None for r in chunk]
    denom = max(utils.all_sum([loss_denominator(real, loss_agg, max_len)], proc)[0], 1.0)  # global
    out = {**dict.fromkeys(SUMS, 0.0), "ratio_dev": None, "logp_gap": None}
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    for chunk in mb:
        logp, ent = policy(collate(chunk), temperature=temperature, return_entropy=True)  # (N,)
        if chunk is None:  # dummy: same collectives, zero gradient
            (logp.sum() * 0.0).backward()
            continue
        old = torch.cat([r.old_logp for r in chunk]).to(logp)  # (N,)
        ref_lp = torch.cat([r.ref_logp for r in chunk]).to(logp) if kl_coef > 0 else None  # (N,)
        adv = torch.cat([torch.full((len(r.response_ids),), float(r.adv)) for r in chunk]).to(logp)
        mask = torch.ones_like(logp)  # (N,): every target is a response token
        per_tok, parts = ppo_loss(logp, old, adv, mask, ref_logp=ref_lp, clip_low=clip_low,
                                  clip_high=clip_high, clip_c=clip_c, kl_coef=kl_coef)  # (N,)
        share = aggregate_loss(per_tok, [len(r.response_ids) for r in chunk], loss_agg, denom)
        # FSDP averages gradients over ranks; * world_size turns that back into a global sum
        (share * proc.world_size).backward()
        # on the first mini-batch this is on-policy: ratio 1 (recomputed: exactly)
        if out["ratio_dev"] is None:
            out["ratio_dev"] = (parts["ratio"] - 1).abs().max().item()
            out["logp_gap"] = (logp.detach() - old).abs().max().item() if logp.numel() else 0.0
        out["loss"] += share.item()
        out["kl"] += parts["kl"].sum().item()
        out["entropy"] += ent.detach().sum().item()
        out["clipped"] += parts["clipped"].float().sum().item()
        out["tokens"] += logp.numel()
    gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)  # global norm (collective)
    out["grad_norm"] = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
    out["skipped"] = int(not np.isfinite(out["grad_norm"]))  # the same on every rank: a global norm
    if out["skipped"]:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    return out


def _micro_batches(records, n_mini, micro_size, proc, length=None):
    """Split records (TrainItems, or anything with task_idx and step_idx) into n_mini mini-batches
    of micro-batches of <= micro_size. A group (one task's records at one step, docs/method.md §6)
    goes whole to mini-batch (task_idx + step_idx) % n_mini: a mini-batch's union over the ranks
    does not depend on the world size, and a micro-batch runs its group's shared prompt once
    (--share-prompts, docs/method.md §7). length(record) ->
    tokens: a mini-batch is sorted (stable) by its groups' longest, then within a group, so
    micro-batches pad less. Every rank runs the same number of micro-batches (None: a zero-weight
    dummy); a mini-batch empty on every rank is dropped."""
    minis = [[] for _ in range(n_mini)]
    for r in records:
        minis[(r.task_idx + r.step_idx) % n_mini].append(r)
    out = []
    for m in minis:
        if length is not None:
            longest: dict[tuple[int, int], int] = {}
            for r in m:
                g = (r.task_idx, r.step_idx)
                longest[g] = max(longest.get(g, 0), length(r))
            m = sorted(m, key=lambda r: (longest[(r.task_idx, r.step_idx)], r.task_idx, r.step_idx,
                                         length(r)))
        chunks = [m[i:i + micro_size] for i in range(0, len(m), micro_size)]
        n = torch.tensor([len(chunks)], dtype=torch.long, device=proc.device)
        if proc.world_size > 1:
            torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MAX)
        chunks += [None] * (int(n.item()) - len(chunks))
        if chunks:
            out.append(chunks)
    return out


def _per_item(chunk, values: torch.Tensor) -> list[torch.Tensor]:
    """Split a flat (N,) per-token tensor of a micro-batch into one (L_i,) fp32 CPU tensor per
    item, in order (N = sum of the items' response lengths L_i)."""
    return list(values.detach().float().cpu().split([len(r.response_ids) for r in chunk]))


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    cli.run_script(main)

"""Semi-online RL for GUI agents (UI-S1, docs/method.md §5-§7): one top-down training script.

Each step (main, at the bottom; each phase a function above it):
  1. rollout  - `rollout.semi_online_rollout`: N rollouts per task walk through the
                expert episode with their OWN history; wrong steps are patched
                (patch.py) up to --patch-threshold times, else the rollout ends.
  2-3. rewards, advantages - the rule reward with the overlong penalty; `advantage.compute_advantages`:
                discounted returns, step-level group + episode-level advantages (docs/method.md §6);
                dynamic sampling drops tasks whose step-0 returns do not vary (DAPO) and refills (draw_batch).
  4. old/ref log-probs - one no-grad forward of the policy (on CPU its sampler's own log-probs
                serve: --old-logp) and of the frozen reference. A step's rollouts of one task
                share a mini-batch, and rows with a common prompt run it once (--share-prompts).
  5. update   - PPO clipped objective with dual clip + k3 KL (kernels.ppo_loss) on the
                fused lm_head log-prob (kernels.fused_logprob), token-mean over the
                mini-batch across micro-batches and ranks, AdamW, grad clip; a
                non-finite gradient norm skips the optimizer step (counted in metrics). 6. log.

Task schedule (docs/method.md §6, last paragraph): the tasks of a step are a pure function of
(--seed, step, slot) (step_tasks; slots count every task drawn in the step, refills included), each
task's rollouts are seeded by (seed, step, slot) (task_seed), and the keep decision of dynamic
sampling is global (TaskDraw): so a run does not depend on the world size and --resume needs only
the step number. At most 1 + --max-resample rounds; a batch still short is trained on as it is and
flagged `partial`. The release (verl's DAPO loop) draws a full batch per round, up to 10 batches,
then stops with an error; --max-resample 9 gives the same number of rounds.

Single process (CPU or one GPU), after `python train_sft.py --max-steps 150` (--model auto starts
from its checkpoint and is an error without one; `--model tiny` trains a random tiny model on purpose,
which earns no reward, so dynamic sampling keeps no task and its steps log and checkpoint without an update):
    python train_semionline.py --max-steps 4
Several processes (FSDP2; gloo on CPU, nccl on GPU):
    torchrun --nproc_per_node=2 train_semionline.py
The paper's setting (8 GPUs, Qwen2.5-VL-7B-Instruct, AndroidControl with screenshots):
    torchrun --nproc_per_node=8 train_semionline.py --model /models/Qwen2.5-VL-7B-Instruct \\
        --data data/android_control/android_control_train_example_uis1.jsonl --image-root /data/ac \\
        --tasks-per-step 8 --n-rollouts 8 --max-new-tokens 512 --lr 1e-6 --gamma 0.5 \\
        --patch-threshold 2 --filter-std 0.3 --max-pixels 1003520
Offline-RL baseline on the same code: add --history expert. Short of memory: add
--gradient-checkpointing (bench/gpu_check.py's full_depth runs the 28-layer 7B on one GPU with it),
or --lora-r 16: adapters only, the KL reference is the policy with them disabled (lora.py).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

import chat
import dataset
import gui
import lora
import reward
import utils
import vlm
from advantage import EPISODE_FORMS, NORMS, RETURNS_FORMS, TaskDraw, compute_advantages, dynamic_sampling_tasks, task_seed
from kernels import LOSS_AGGS, aggregate_loss, loss_denominator, ppo_loss
from patch import PATCH_MODES
from rollout import HISTORY_MODES, StepRecord, semi_online_rollout, sop_progress
from sampler import DECODE_MODES, Sampler
from vlm import PolicyLogProb, apply_fsdp, checkpoint_activations, collate_sequences, pad_token_id, sampling_mode, to_device

# -----------------------------------------------------------------------------
# config

MAX_TASKS_LOGGED = 32  # reward_by_task is logged when the data has at most this many tasks

parser = utils.make_parser(__doc__)
perf = parser.add_argument_group("performance (not the method: same results, different speed/memory)")
# data
parser.add_argument("--data", default="data/miniwob_click/train.jsonl", type=utils.arg_type(utils.input_file), help="episodes (UI-S1 JSONL or AndroidControl native JSON)")
parser.add_argument("--image-root", default=None, type=utils.arg_type(utils.input_dir), help="folder screenshots are resolved against (default: the data file's folder)")
parser.add_argument("--blank-screens", default=None, type=utils.arg_type(gui.parse_size), help="WxH: use blank screenshots of this size when files are missing")
parser.add_argument("--max-episodes", type=utils.positive_int, default=None, help="use only the first N episodes")
# model
parser.add_argument("--model", default="auto", type=utils.arg_type(vlm.model_path),
                    help="'tiny', a Hugging Face or checkpoint folder, or 'auto' (the latest --sft-dir checkpoint; an error without one); "
                    "prompt options not given (--num-images, --min/max-pixels, --max-prompt-tokens) come from its args.json")
parser.add_argument("--sft-dir", default="out/sft/ckpt", help="where --model auto looks for an SFT checkpoint")
lora.add_lora_args(parser)  # --lora-r (0: full fine-tuning; else the KL reference is the policy with adapters off), ...
# rollout (docs/method.md §5)
parser.add_argument("--tasks-per-step", type=utils.positive_int, default=4, help="tasks per training step, all ranks together (release: 8)")
parser.add_argument("--n-rollouts", type=utils.positive_int, default=4, help="rollouts per task N (release: 8)")
parser.add_argument("--max-new-tokens", type=utils.positive_int, default=48, help="response length limit (release: 512)")
parser.add_argument("--temperature", type=utils.temperature, default=1.0, help="sampling temperature (release: 1.0)")
parser.add_argument("--top-p", type=utils.finite_float(0.0, 1.0, low_open=True), default=1.0, help="nucleus sampling (release: 1.0)")
parser.add_argument("--history", choices=HISTORY_MODES, default="own", help="own = semi-online RL; expert = offline-RL baseline")
parser.add_argument("--patch", dest="patch_mode", default="thought-free",
                    choices=PATCH_MODES, help="patch mode (docs/method.md §5)")
parser.add_argument("--patch-threshold", type=utils.int_at_least(-1), default=2, help="patches per rollout: k at most k (0: none; -1: unlimited; release: 2)")
perf.add_argument("--decode", choices=DECODE_MODES, default="auto",
                  help="sampler decode: auto (graph on CUDA, else eager), eager (the reference), static, graph (CUDA graphs)")
# returns and advantages (docs/method.md §6)
parser.add_argument("--gamma", type=utils.fraction, default=0.5, help="discount of step returns in [0, 1] (0: each step's own reward; paper: 0.5)")
parser.add_argument("--returns-form", choices=RETURNS_FORMS, default="paper", help="release: reset the return chain at a wrong step")
parser.add_argument("--episode-adv", choices=EPISODE_FORMS, default="paper", help="episode-level advantage form")
parser.add_argument("--w-episode", type=utils.non_negative_float, default=1.0, help="weight of the episode-level advantage (0: off)")
parser.add_argument("--omega", type=utils.non_negative_float, default=1.0, help="weight of the step-level advantage (0: off)")
parser.add_argument("--adv-norm", choices=NORMS, default="mean_std",
                    help="group normalisation of both advantage levels: mean_std (paper) or mean (Dr.GRPO: no std division)")
parser.add_argument("--filter-std", type=utils.finite_float(), default=0.0,
                    help="dynamic sampling: drop tasks whose step-0 return std <= this; <0 disables (release: 0.3; "
                         "0 keeps every task whose rollouts differ at all, which a tiny CPU model needs)")
parser.add_argument("--overlong-buffer", type=utils.non_negative_int, default=0,
                    help="DAPO's soft overlong penalty: a response within this many tokens of --max-new-tokens loses up to "
                         "1 of reward, linearly (reward.shaped_reward); 0 disables it. Off by default: under the strict rules "
                         "a response cut at the cap already scores 0")
parser.add_argument("--max-resample", type=utils.non_negative_int, default=2,
                    help="refill rounds after the first (0: none) when dynamic sampling dropped tasks; a batch still short "
                         "is trained on as it is and flagged 'partial' (release: up to 10 batches, then an error)")
parser.add_argument("--match-rules", choices=reward.MATCH_RULES, default="strict",
                    help="the match of the reward, patching and returns (reward.action_match): strict, or the release's")
# loss (docs/method.md §7)
perf.add_argument("--old-logp", choices=["auto", "recompute", "sampler"], default="auto",
                  help="pi_old of the ratio: a no-grad policy forward (recompute, the release's) or the sampler's log-probs "
                       "(same weights and temperature; needs --top-p 1); auto: sampler on CPU (fp32: gap ~1e-5), else recompute")
parser.add_argument("--clip-low", type=utils.finite_float(0.0, 1.0, low_open=True, high_open=True), default=0.2, help="PPO clip epsilon below 1, in (0, 1)")
parser.add_argument("--clip-high", type=utils.positive_float, default=0.2, help="PPO clip epsilon above 1")
parser.add_argument("--clip-c", type=utils.finite_float(1.0, low_open=True), default=3.0, help="dual-clip constant for negative advantages (> 1)")
parser.add_argument("--kl-coef", type=utils.non_negative_float, default=1e-4, help="k3 KL to the frozen reference; 0 disables the reference model")
parser.add_argument("--ref-model", default=None, type=utils.arg_type(vlm.model_path), help="reference model: 'tiny' or a folder (default: the policy's initialisation)")
parser.add_argument("--ref-seed", type=utils.non_negative_int, default=None, help="init seed of a 'tiny' reference (default: --seed)")
parser.add_argument("--loss-agg", choices=LOSS_AGGS, default="token-mean",
                    help="how per-token losses become the mini-batch loss (kernels.aggregate_loss; dr-grpo divides by "
                         "sequences x --max-new-tokens)")
# optimisation
parser.add_argument("--lr", type=utils.positive_float, default=2e-5, help="AdamW learning rate, constant (the default suits the tiny model; the paper's, 7B: 1e-6)")
parser.add_argument("--weight-decay", type=utils.non_negative_float, default=0.01, help="AdamW weight decay (0: none)")
parser.add_argument("--grad-clip", type=utils.positive_float, default=1.0, help="global grad-norm clip")
parser.add_argument("--ppo-mini-batches", type=utils.positive_int, default=4, help="optimizer steps per rollout batch (1 PPO epoch)")
parser.add_argument("--micro-batch-size", type=utils.positive_int, default=8, help="sequences per forward/backward")
perf.add_argument("--share-prompts", choices=["auto", "on", "off"], default="auto",
                  help="run the prompt head a micro-batch's rows share once in the log-prob forwards (vlm.PolicyLogProb; "
                       "same log-probs to ~1e-5); auto: on on CPU without --gradient-checkpointing (GPU: not measured, off)")
perf.add_argument("--gradient-checkpointing", action="store_true",
                  help="recompute each decoder layer's and vision block's activations in the backward (less memory, ~1/3 more update compute)")
# run
parser.add_argument("--max-steps", type=utils.positive_int, default=12, help="training steps")
parser.add_argument("--out", default="out/semionline", help="output folder (checkpoints, metrics.jsonl, args.json)")
utils.add_report_to_arg(parser)  # --report-to none | tensorboard wandb trackio (utils.MetricsLogger)
parser.add_argument("--save-every", type=utils.non_negative_int, default=0, help="checkpoint every N steps (0: at the end only)")
parser.add_argument("--keep-checkpoints", type=utils.non_negative_int, default=2,
                    help="keep the newest N checkpoints (0: every one, e.g. for a dose-response over the steps)")
parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
parser.add_argument("--seed", type=utils.non_negative_int, default=0, help="seed of task order, sampling and the tiny model's init")
parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to run")
# a test hook, kept out of --help: exit after this many steps without a final checkpoint, as a killed run
# would (the resume test compares such a run resumed with an uninterrupted one)
parser.add_argument("--stop-after", type=utils.positive_int, default=None, help=argparse.SUPPRESS)
# held-out diagnostic: does the greedy policy (what evaluation runs) follow the sampled one (what the reward sees)?
parser.add_argument("--eval-data", default=None, type=utils.arg_type(utils.input_file),
                    help="held-out episodes for heldout_* metrics (greedy and sampled static step accuracy, greedy SOP) "
                         "every --eval-every steps and at the start; default: none")
parser.add_argument("--eval-every", type=utils.non_negative_int, default=0, help="steps between held-out evaluations (0: only with --eval-data, at the start and end)")
parser.add_argument("--eval-episodes", type=utils.positive_int, default=32, help="held-out episodes used (the first N of --eval-data)")
parser.add_argument("--eval-samples", type=utils.positive_int, default=4, help="sampled responses per held-out step (at --temperature, --top-p)")
chat.add_prompt_args(parser)  # the prompt contract: adopted from the starting checkpoint unless given


def check_args(args) -> None:
    """Flag values that parse but cannot run raise utils.UsageError (one line, exit 2), before any
    model loads and before args.json or metrics.jsonl is written."""
    # each flag's own range (the temperature: utils.check_temperature) is its parser type's; here the rules
    # between flags
    rules = [
        (args.old_logp != "sampler" or args.top_p == 1.0,
         f"--old-logp sampler needs --top-p 1: its log-probs (the whole vocabulary's, as recompute's) are checked against "
         f"the trainer's forward at --top-p 1 only (sampler_logp_gap); at --top-p {args.top_p:g} use --old-logp recompute"),
        (args.share_prompts != "on" or not args.gradient_checkpointing,
         "--share-prompts on needs the KV cache, which --gradient-checkpointing drops: use --share-prompts off"),
        (0 <= args.overlong_buffer <= args.max_new_tokens,
         f"--overlong-buffer {args.overlong_buffer}: must be in [0, --max-new-tokens {args.max_new_tokens}]"),
    ]
    rules.append((lora.check_lora_args(args) is None, lora.check_lora_args(args)))
    for ok, message in rules:
        if not ok:
            raise utils.UsageError(message)
    lora.check_resume(args, utils.latest_checkpoint(Path(args.out) / "ckpt") if args.resume else None)  # its adapters


# -----------------------------------------------------------------------------
# diagnostics: greedy vs sampled on held-out episodes, reward by task


def greedy_vs_sampled(sampler, episodes, tokenizer, image_processor, spec: chat.PromptSpec = chat.PromptSpec(), *,
                      samples: int = 4, seed: int = 0, image_root=None, blank_screens=None) -> dict:
    """The RL run's held-out diagnostic: the reward sees sampled responses (the sampler's
    temperature and top-p), evaluation runs the greedy policy, and the two can move apart (RL that
    sharpens the sampled policy towards the greedy one without moving the greedy one). Walks
    `episodes` three times with the driver, patch threshold 0: static (the expert's history)
    greedily, static with `samples` samples per step, and SOP (own history, greedy). Returns counts
    (floats, to be summed over ranks): greedy_match / greedy_steps, sampled_match / sampled_steps,
    sop_pg_sum (sum of per-episode progress), sop_solved, episodes."""
    def walk(**kw):
        return semi_online_rollout(sampler, episodes, tokenizer, image_processor, spec=spec, patch_threshold=0,
                                   image_root=image_root, blank_screens=blank_screens, **kw) if episodes else []
    greedy = walk(n_rollouts=1, greedy=True, history_mode="expert")
    sampled = walk(n_rollouts=samples, greedy=False, history_mode="expert", seed=seed)
    sop = sop_progress(walk(n_rollouts=1, greedy=True, history_mode="own"), {k: len(e.steps) for k, e in enumerate(episodes)})
    return {"greedy_match": float(sum(r.match for r in greedy)), "greedy_steps": float(len(greedy)),
            "sampled_match": float(sum(r.match for r in sampled)), "sampled_steps": float(len(sampled)),
            "sop_pg_sum": float(sum(c / n for c, n in sop.values())), "sop_solved": float(sum(c == n for c, n in sop.values())),
            "episodes": float(len(sop))}


def task_reward_sums(records: list[StepRecord], slot_task: dict[int, str], tasks: list[str]) -> list[float]:
    """Per task of `tasks`, the reward sum of `records` (a record's task: slot_task[record.task_idx]),
    then per task the response count: 2 * len(tasks) floats, to be summed over ranks and read by
    task_rewards (the trainer's reward_by_task)."""
    ix, n = {t: i for i, t in enumerate(tasks)}, len(tasks)
    sums = [0.0] * (2 * n)
    for r in records:
        k = ix[slot_task[r.task_idx]]
        sums[k] += r.reward
        sums[n + k] += 1
    return sums


def task_rewards(tasks: list[str], sums: list[float]) -> dict[str, dict]:
    """{task: {"reward": mean reward, "responses": count}} from task_reward_sums (tasks with responses)."""
    n = len(tasks)
    return {t: {"reward": sums[k] / sums[n + k], "responses": int(sums[n + k])} for k, t in enumerate(tasks) if sums[n + k] > 0}



# -----------------------------------------------------------------------------
# the run: processes, data, models, a resume (main, at the bottom, runs the phases below in order)


def setup(args, start: str, spec: chat.PromptSpec) -> SimpleNamespace:
    """Processes, seeds, the data and the prompt's processor, then the models (build_models) and a resumed
    run's checkpoint and metrics file (resume). Returns the run's state, which the phases below read."""
    proc = utils.init_distributed(args.device)
    utils.seed_everything(args.seed)
    gpu = proc.device.type == "cuda"
    if args.old_logp == "auto":  # recorded resolved in args.json
        args.old_logp = "recompute" if gpu or args.top_p < 1.0 else "sampler"
    if args.share_prompts == "auto":
        args.share_prompts = "off" if gpu or args.gradient_checkpointing else "on"
    if args.tasks_per_step % proc.world_size:
        raise utils.UsageError(f"--tasks-per-step {args.tasks_per_step} must be a multiple of the world size {proc.world_size}")
    # data
    blank = gui.parse_size(args.blank_screens) if args.blank_screens else None
    episodes = dataset.load_episodes(args.data, limit=args.max_episodes)
    if not episodes:
        raise utils.UsageError(f"{args.data}: no episodes")
    tokenizer, image_processor = vlm.load_processor(start, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
    utils.print0(f"{len(episodes)} episodes, {sum(len(e.steps) for e in episodes)} steps from {args.data}")
    run = SimpleNamespace(
        args=args, proc=proc, gpu=gpu, spec=spec, blank=blank, episodes=episodes, tokenizer=tokenizer,
        image_processor=image_processor, pad_id=pad_token_id(tokenizer),
        out=Path(args.out),  # written only once the flags, the data and a resume's checkpoint are checked
        task_names=sorted({e.task for e in episodes}),  # the same on every rank
        heldout=dataset.load_episodes(args.eval_data, limit=args.eval_episodes) if args.eval_data else [])
    build_models(run, init=start)  # --model auto: the latest SFT checkpoint
    resume(run)
    return run


def build_models(run, init: str) -> None:
    """The policy (FSDP2; LoRA adapters with --lora-r), its frozen reference (KL term on), the optimizer and
    the sampler, into `run`."""
    args, proc = run.args, run.proc
    utils.print0(f"policy initialised from: {init}")
    dtype = torch.float32  # master weights; bf16 compute comes from FSDP's mixed precision on GPU
    run.model = model = vlm.load_model(init, dtype=dtype, device=proc.device, seed=args.seed)
    run.adapter = lora.apply_lora(model, args, base=init, seed=args.seed)  # None without --lora-r
    if args.gradient_checkpointing:
        checkpoint_activations(model)
    run.policy = apply_fsdp(model, PolicyLogProb(model), proc, mixed_precision=run.gpu)
    # under LoRA the reference is the policy with its adapters disabled (no second model), unless --ref-model
    run.ref = lora.AdaptersOff(run.policy, run.adapter) if args.kl_coef > 0 and run.adapter and args.ref_model is None else None
    if args.kl_coef > 0 and run.ref is None:
        ref_model = vlm.load_model(args.ref_model or init, dtype=torch.bfloat16 if run.gpu else dtype, device=proc.device,
                                   seed=args.seed if args.ref_seed is None else args.ref_seed)
        ref_model.requires_grad_(False).eval()
        run.ref = apply_fsdp(ref_model, PolicyLogProb(ref_model), proc, mixed_precision=False)
    run.optimizer = utils.adamw(lora.trainable(run.policy), lr=args.lr, weight_decay=args.weight_decay)
    run.sampler = Sampler(model, run.tokenizer, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_p=args.top_p, decode=args.decode)


def resume(run) -> None:
    """With --resume, the latest checkpoint in --out (model, optimizer, every RNG; its task schedule must be
    this run's); then args.json and the metrics file (a resumed run's steps after the checkpoint logged once)."""
    args, out = run.args, run.out
    run.start_step = 0
    # what the task schedule depends on: a resume must continue the same schedule
    run.schedule = {"seed": args.seed, "tasks_per_step": args.tasks_per_step, "n_episodes": len(run.episodes)}
    if args.resume:
        ckpt = utils.latest_checkpoint(out / "ckpt")
        if ckpt is not None:
            state = vlm.load_checkpoint_state(ckpt, run.policy, run.optimizer)  # model, optimizer, every RNG
            run.start_step = int(state.get("step", 0))
            if state.get("schedule", run.schedule) != run.schedule:
                raise utils.UsageError(f"{ckpt}/trainer_state.json: field 'schedule' {state['schedule']} differs from this "
                                       f"run's {run.schedule}; resume with the same --seed, --tasks-per-step and data")
            utils.print0(f"resumed from {ckpt} at step {run.start_step}")
    if run.proc.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(utils.dumps(vars(args), indent=2))
    # a resume keeps the rows up to its checkpoint: the steps it redoes are logged once (trackers too)
    run.metrics = utils.MetricsLogger(out / "metrics.jsonl", report_to=args.report_to, config=vars(args),
                                      resume_step=run.start_step if args.resume else None)


def evaluate_heldout(run, step: int) -> dict:
    """Greedy vs sampled accuracy on this rank's share of the held-out episodes, summed over ranks."""
    args, proc = run.args, run.proc
    with sampling_mode(run.policy):
        counts = greedy_vs_sampled(run.sampler, run.heldout[proc.rank::proc.world_size], run.tokenizer,
                                   run.image_processor, run.spec, samples=args.eval_samples, seed=args.seed + step,
                                   image_root=args.image_root, blank_screens=run.blank)
    total = dict(zip(counts, utils.all_sum(list(counts.values()), proc)))
    return {"heldout_greedy_step_acc": total["greedy_match"] / max(total["greedy_steps"], 1),
            "heldout_sampled_step_acc": total["sampled_match"] / max(total["sampled_steps"], 1),
            "heldout_sop_pg": total["sop_pg_sum"] / max(total["episodes"], 1),
            "heldout_sop_tsr": total["sop_solved"] / max(total["episodes"], 1), "heldout_episodes": int(total["episodes"])}


# -----------------------------------------------------------------------------
# one training step: rollout -> rewards -> advantages (round by round: dynamic sampling refills) ->
# old/ref log-probs -> update -> log


def rollout(run, step: int, slots: list[int], episode_ids: list[int]) -> list[StepRecord]:
    """1. rollout (docs/method.md §5): N rollouts of each drawn task (this rank's share of a round), each
    seeded by (seed, step, slot); task_idx = the global slot, the same on every world size."""
    args = run.args
    return semi_online_rollout(
        run.sampler, [run.episodes[i] for i in episode_ids], run.tokenizer, run.image_processor, spec=run.spec,
        n_rollouts=args.n_rollouts, patch_mode=args.patch_mode, patch_threshold=args.patch_threshold,
        history_mode=args.history, image_root=args.image_root, blank_screens=run.blank,
        match_rules=args.match_rules, seed=[task_seed(args.seed, step, s) for s in slots], progress=run.proc.is_main,
        task_ids=slots)


def rewards(args, records: list[StepRecord]) -> list[float]:
    """2. rewards: each response's rule reward (the rollout's), shaped by the overlong penalty (DAPO)."""
    return [reward.shaped_reward(r.reward, len(r.response_ids), max_new_tokens=args.max_new_tokens,
                                 overlong_buffer=args.overlong_buffer) for r in records]


def advantages(args, records: list[StepRecord], shaped: list[float], slots: list[int]) -> tuple[list[float], set[int]]:
    """3. returns and advantages (docs/method.md §6; groups never cross tasks, so per round), and the slots
    dynamic sampling keeps (step-0 returns that vary; all with a negative --filter-std)."""
    adv = compute_advantages(records, rewards=shaped, gamma=args.gamma, returns_form=args.returns_form,
                             episode_form=args.episode_adv, w_episode=args.w_episode, omega=args.omega,
                             norm=args.adv_norm)
    keep = set(slots) if args.filter_std < 0 else dynamic_sampling_tasks(records, adv.returns, threshold=args.filter_std)
    return adv.adv.tolist(), keep


def draw_batch(run, step: int) -> tuple[TaskDraw, list, list[StepRecord]]:
    """Phases 1-3 round by round: draw tasks, roll them out, reward them, keep those whose rollouts differ
    (dynamic sampling), draw the missing number again (refills; docs/method.md §6, last paragraph).
    Returns the draw, the kept responses (TrainItems) and every record this rank rolled out, kept or not."""
    args = run.args
    draw = TaskDraw(args.seed, step, len(run.episodes), args.tasks_per_step, 1 + args.max_resample, run.proc)
    batch, rolled = [], []
    with sampling_mode(run.policy):
        while (drawn := draw.next_round()) is not None:
            slots, episode_ids = drawn  # this rank's share: every world_size-th slot of the round
            records = rollout(run, step, slots, episode_ids)
            adv, keep = advantages(args, records, rewards(args, records), slots)
            kept = draw.keep(keep)  # the global decision: every rank draws the same next round
            batch += [TrainItem(r, a) for r, a in zip(records, adv) if r.task_idx in kept]
            rolled += records
    return draw, batch, rolled


def rollout_stats(run, draw: TaskDraw, batch: list, rolled: list[StepRecord]) -> dict:
    """Rollout statistics over every sampled response (kept or not), summed over ranks; by_task: the
    per-task reward, for data of few tasks (MiniWob's), not per-goal data."""
    ep_len = {s: len(run.episodes[e].steps) for s, e in draw.slot_episode.items()}
    names = ("reward_sum", "match_sum", "n_resp", "n_patched", "resp_tok", "prog_sum", "n_roll", "n_train", "n_cut")
    stats = dict(zip(names, utils.all_sum([
        sum(r.reward for r in rolled), sum(r.match for r in rolled), len(rolled),
        sum(r.patched for r in rolled), sum(len(r.response_ids) for r in rolled),
        sum(c / n for c, n in sop_progress(rolled, ep_len).values()),  # SOP progress, as eval's PG
        len({(r.task_idx, r.rollout_idx) for r in rolled}),
        len(batch), sum(r.finish_reason != "stop" for r in rolled)], run.proc)))
    stats["by_task"] = None
    if len(run.task_names) <= MAX_TASKS_LOGGED:
        slot_task = {s: run.episodes[e].task for s, e in draw.slot_episode.items()}
        stats["by_task"] = task_rewards(run.task_names, utils.all_sum(task_reward_sums(rolled, slot_task, run.task_names),
                                                                      run.proc))
    return stats


def micro_batches(run, batch: list, rolled: list[StepRecord]):
    """The step's mini-batches of micro-batches (_micro_batches), and collate(chunk) -> the model's batch on
    the device (a dummy micro-batch, None, runs the first item: the FSDP collectives)."""
    args = run.args
    micro = _micro_batches(batch, args.ppo_mini_batches, args.micro_batch_size, run.proc,
                           length=lambda it: len(it.prompt.input_ids) + len(it.response_ids))
    filler = batch[:1] or [TrainItem(rolled[0], 0.0)]

    def collate(chunk):
        items = chunk if chunk is not None else filler
        return to_device(collate_sequences([it.prompt for it in items], [it.response_ids for it in items], run.pad_id,
                                           share_prompts=args.share_prompts == "on",
                                           image_token_id=run.model.config.image_token_id), run.proc.device)
    return micro, collate


def old_ref_logprobs(run, batch: list, micro: list, collate, n_train: float) -> list[float]:
    """4. old (unless the sampler's: --old-logp) and reference log-probs (no grad), on exactly the sampled
    ids, into each TrainItem. Returns the max |trainer - sampler| log-prob gap of each recomputed item
    (at --top-p 1, the setting where --old-logp sampler may stand in for this forward)."""
    args, ref = run.args, run.ref
    gap = []
    recompute = args.old_logp == "recompute"
    for it in batch if not recompute else ():
        it.old_logp = it.record.sampler_logp.float()  # (L,)
    if n_train > 0 and (recompute or ref is not None):  # global: every rank takes the same branch
        with torch.no_grad():
            for mini in micro:
                for chunk in mini:
                    inputs = collate(chunk)
                    old = run.policy(inputs, temperature=args.temperature)[0] if recompute else None  # (N,) fp32
                    ref_lp = ref(inputs, temperature=args.temperature)[0] if ref is not None else None  # (N,)
                    if chunk is None:
                        continue
                    for it, lp in zip(chunk, _per_item(chunk, old) if recompute else ()):
                        it.old_logp = lp  # (L,)
                    for it, lp in zip(chunk, _per_item(chunk, ref_lp) if ref_lp is not None else ()):
                        it.ref_logp = lp  # (L,)
                    for it in chunk if recompute and args.top_p == 1.0 else ():  # both score the whole vocabulary
                        if len(it.response_ids):
                            gap.append((it.old_logp - it.record.sampler_logp.to(it.old_logp)).abs().max().item())
    return gap


def update(run, micro: list, collate, n_train: float) -> dict:
    """5. update (docs/method.md §7): --ppo-mini-batches optimizer steps over one pass of the data (1 PPO
    epoch, ppo_step). Returns this rank's sums over them (loss, kl, entropy, clipped, tokens, skipped), the
    last grad_norm and the first micro-batch's ratio_dev and logp_gap."""
    totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0, "tokens": 0.0, "grad_norm": None,
              "skipped": 0, "ratio_dev": None, "logp_gap": None}
    for mini in micro if n_train > 0 else ():
        sums = ppo_step(run.policy, run.optimizer, mini, collate, run.proc, **loss_config(run.args))
        for k in ("loss", "kl", "entropy", "clipped", "tokens", "skipped"):
            totals[k] += sums[k]
        totals["grad_norm"] = sums["grad_norm"]
        if totals["ratio_dev"] is None:
            totals["ratio_dev"], totals["logp_gap"] = sums["ratio_dev"], sums["logp_gap"]
    return totals


def log_step(run, step: int, draw: TaskDraw, st: dict, totals: dict, gap: list[float], n_micro: int,
             times: dict) -> dict:
    """6. log: the step's metrics row (metrics.jsonl and --report-to; rank 0), after this step's held-out
    evaluation when one is due, and its line on stdout. Returns the row."""
    args, proc = run.args, run.proc
    loss_all, kl_all, ent_all, clip_all, tok_all = utils.all_sum(
        [totals["loss"], totals["kl"], totals["entropy"], totals["clipped"], totals["tokens"]], proc)
    per_tok = (lambda x: x / tok_all) if tok_all > 0 else (lambda x: None)  # noqa: E731
    n_resp, t_rollout = max(st["n_resp"], 1), times["rollout"]
    last = {
        "step": step + 1, "loss": loss_all / n_micro if st["n_train"] > 0 else None,
        "reward_mean": st["reward_sum"] / n_resp, "match_rate": st["match_sum"] / n_resp,
        "reward_by_task": st["by_task"],  # {task: {reward (mean), responses}} of the tasks drawn; None: > 32 tasks
        "truncated_rate": st["n_cut"] / n_resp,  # responses cut at --max-new-tokens (strict rules: reward 0)
        "progress": st["prog_sum"] / max(st["n_roll"], 1), "patch_rate": st["n_patched"] / n_resp,
        **draw.info(), "updates_skipped": totals["skipped"],
        "kl": per_tok(kl_all), "entropy": per_tok(ent_all), "clipfrac": per_tok(clip_all),
        "grad_norm": totals["grad_norm"], "response_len": st["resp_tok"] / n_resp, "train_tokens": int(tok_all),
        "tok_s": st["resp_tok"] / max(t_rollout, 1e-9), "time_rollout_s": t_rollout, "time_logp_s": times["logp"],
        "time_update_s": times["update"], "time_s": time.time() - times["t0"],
        # max |trainer - sampler| log-prob over rank 0's tokens (--old-logp sampler: the first micro-batch's), a
        # numerics check; null at --top-p < 1, where --old-logp sampler is not offered
        "sampler_logp_gap": None if args.top_p < 1.0 else max(gap, default=0.0) if args.old_logp == "recompute"
        else totals["logp_gap"],
        "first_ratio_dev": totals["ratio_dev"],  # the first (on-policy) micro-batch's: 0 exactly under recompute
        "old_logp": args.old_logp,
        "fsdp": torch.distributed.is_initialized(),  # sharded by FSDP2 (always under torchrun)
        "decode": run.sampler.decode,  # the sampler's decode path ("static" if a CUDA graph capture failed)
        "peak_mem_bytes": utils.peak_memory_bytes(proc.device),  # this rank: the step's (CUDA) or the run's (CPU)
    }
    if run.heldout and ((args.eval_every and (step + 1) % args.eval_every == 0) or step + 1 == args.max_steps):
        last.update(evaluate_heldout(run, step + 1))  # after this step's update
    run.metrics.log(last)
    utils.print0(
        f"step {step + 1:4d} | loss {_fmt(last['loss'], '+.4f')} | reward {last['reward_mean']:.3f} "
        f"| match {last['match_rate']:.3f} | prog {last['progress']:.3f} | patch {last['patch_rate']:.2f} "
        f"| cut {last['truncated_rate']:.2f} "
        f"| kept {last['tasks_kept']}/{last['tasks_tried']} in {last['rounds']} rounds"
        f"{' (PARTIAL)' if last['partial'] else ''} | kl {_fmt(last['kl'], '.2e')} "
        f"| ent {_fmt(last['entropy'], '.2f')} | clip {_fmt(last['clipfrac'], '.3f')} "
        f"| skipped {totals['skipped']} | len {last['response_len']:.0f} | {last['tok_s']:.0f} tok/s "
        f"| rollout {t_rollout:.1f}s update {times['logp'] + times['update']:.1f}s")
    return last


def finish(run, last: dict) -> None:
    """Close the metrics and the process group; rank 0 merges LoRA adapters (--merge) and prints where the
    checkpoint is, the commands to plot and evaluate it, and the last row as JSON."""
    args, out = run.args, run.out
    run.metrics.close()
    utils.cleanup_distributed()
    if run.proc.is_main and args.merge:  # the adapted model as a plain Hugging Face folder
        utils.print0(f"merged: {vlm.merge_checkpoint(utils.latest_checkpoint(out / 'ckpt'), out / 'merged')}")
    if run.proc.is_main:
        utils.print_next_steps(out, args.data, "out/eval/semionline")
        print(utils.dumps(last), flush=True)


def main(argv=None):
    args = parser.parse_args(argv)
    if args.model == "auto" and utils.latest_checkpoint(args.sft_dir) is None:
        raise utils.UsageError(f"--model auto: no SFT checkpoint in {args.sft_dir} (run train_sft.py first, point --sft-dir at "
                               "its ckpt/, give one step's folder as --model PATH, or --model tiny to train the untrained model)")
    start = str(utils.latest_checkpoint(args.sft_dir)) if args.model == "auto" else args.model
    spec = chat.resolve_spec(args, start, say=utils.print0)  # the prompt the checkpoint was trained on
    check_args(args)
    run = setup(args, start, spec)
    last = {}
    if run.heldout and run.start_step == 0:  # the starting point (the SFT model), as row "step 0"
        run.metrics.log({"step": 0, **evaluate_heldout(run, 0)})
    for step in tqdm(range(run.start_step, args.max_steps), desc="semi-online RL", disable=not run.proc.is_main):
        t0 = time.time()
        if run.gpu:
            torch.cuda.reset_peak_memory_stats(run.proc.device)
        draw, batch, rolled = draw_batch(run, step)  # 1-3. rollout -> rewards -> advantages, refilled
        t_rollout = time.time() - t0
        stats = rollout_stats(run, draw, batch, rolled)
        t1 = time.time()
        micro, collate = micro_batches(run, batch, rolled) if stats["n_train"] > 0 else ([], None)
        gap = old_ref_logprobs(run, batch, micro, collate, stats["n_train"])  # 4. old / ref log-probs
        t2 = time.time()
        totals = update(run, micro, collate, stats["n_train"])  # 5. the PPO update
        if stats["n_train"] == 0:
            utils.print0(f"step {step + 1}: dynamic sampling kept no task in {draw.rounds} rounds; no update")
        times = {"t0": t0, "rollout": t_rollout, "logp": t2 - t1, "update": time.time() - t2}
        last = log_step(run, step, draw, stats, totals, gap, len(micro), times)  # 6. log
        stop = args.stop_after is not None and step + 1 - run.start_step >= args.stop_after
        if stop or step + 1 == args.max_steps or (args.save_every and (step + 1) % args.save_every == 0):
            vlm.save_checkpoint(run.out / "ckpt", run.policy, run.tokenizer, vars(args), optimizer=run.optimizer,
                                extra={"step": step + 1, "schedule": run.schedule}, adapter=run.adapter,
                                keep=args.keep_checkpoints)
        if stop:
            break
    finish(run, last)
    return last


@dataclass
class TrainItem:
    """A kept response and what the trainer computes for it (the rollout's StepRecord stays as the
    rollout left it): adv, its advantage A (one float for all its tokens, docs/method.md §6);
    old_logp and ref_logp, (L,) fp32 log-probs of its ids under the policy before the update and
    under the frozen reference (when the KL term is on)."""
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


def loss_config(args) -> dict:
    """The values ppo_step reads, from the trainer's flags (the generation budget is Dr.GRPO's max_len)."""
    return dict(temperature=args.temperature, clip_low=args.clip_low, clip_high=args.clip_high, clip_c=args.clip_c,
                kl_coef=args.kl_coef, loss_agg=args.loss_agg, max_len=args.max_new_tokens, grad_clip=args.grad_clip)


def ppo_step(policy, optimizer, mb, collate, proc, *, temperature: float, clip_low: float, clip_high: float,
             clip_c: float, kl_coef: float, loss_agg: str, max_len: int, grad_clip: float) -> dict:
    """One optimizer step on one mini-batch: per-token PPO clip + dual clip + k3 KL
    (kernels.ppo_loss), aggregated by loss_agg over the WHOLE mini-batch (kernels.aggregate_loss;
    its denominator kernels.loss_denominator summed over all micro-batches on all ranks; max_len:
    the generation budget, Dr.GRPO's constant), backward per micro-batch, global grad-norm clip
    (grad_clip), optimizer.step(). temperature: the sampler's (the log-probs are of pi at T).

    mb: list of micro-batches, each a list of TrainItems (response_ids, adv, old_logp, and ref_logp
    when kl_coef > 0) or None: a dummy that runs the same FSDP collectives with zero gradient.
    collate(chunk) -> model batch. proc: utils.Dist. A non-finite global gradient norm skips
    optimizer.step() and drops the gradients ("skipped": 1). Returns this rank's sums: loss (its
    share of the mini-batch loss), kl, entropy, clipped, tokens; and grad_norm (global, float),
    skipped (0/1), ratio_dev (max |ratio - 1| of the first real micro-batch, None if none) and
    logp_gap (its max |logp - old_logp|: the trainer-sampler gap when old_logp is the sampler's).
    """
    real = [len(r.response_ids) for chunk in mb if chunk is not None for r in chunk]
    denom = max(utils.all_sum([loss_denominator(real, loss_agg, max_len)], proc)[0], 1.0)  # global
    out = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0, "tokens": 0.0, "ratio_dev": None, "logp_gap": None}
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    for chunk in mb:
        logp, ent = policy(collate(chunk), temperature=temperature, return_entropy=True)  # (N,), (N,) fp32
        if chunk is None:  # dummy: same collectives, zero gradient
            (logp.sum() * 0.0).backward()
            continue
        old = torch.cat([r.old_logp for r in chunk]).to(logp)  # (N,)
        ref_lp = torch.cat([r.ref_logp for r in chunk]).to(logp) if kl_coef > 0 else None  # (N,)
        adv = torch.cat([torch.full((len(r.response_ids),), float(r.adv)) for r in chunk]).to(logp)  # (N,)
        mask = torch.ones_like(logp)  # (N,): every target is a response token
        per_tok, parts = ppo_loss(logp, old, adv, mask, ref_logp=ref_lp, clip_low=clip_low,
                                  clip_high=clip_high, clip_c=clip_c, kl_coef=kl_coef)  # (N,)
        share = aggregate_loss(per_tok, [len(r.response_ids) for r in chunk], loss_agg, denom)  # scalar
        # FSDP averages gradients over ranks; * world_size turns that back into a global sum
        (share * proc.world_size).backward()
        if out["ratio_dev"] is None:  # on the first mini-batch this is on-policy: ratio 1 (recomputed: exactly)
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
    """Split records (TrainItems, or anything with task_idx and step_idx) into n_mini mini-batches,
    each a list of micro-batches.

    The records of one task at one step (its rollouts there: one group of docs/method.md §6, with
    identical prompts wherever their histories agree) go together to mini-batch
    (task_idx + step_idx) % n_mini, in record order. So the union of a mini-batch over ranks does not
    depend on the world size (the 1- vs 2-process test), and a micro-batch can run the prompt its
    rows share once (--share-prompts); verl keeps a prompt's responses in one mini-batch the same way.
    length(record) -> tokens: each mini-batch is sorted (stable) by its groups' longest length, then
    by length within a group, before it is cut, so a micro-batch pads less; only the summation order
    changes. Every rank runs the same number of micro-batches (None = a zero-weight dummy); a
    mini-batch empty on every rank is dropped.
    """
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
            m = sorted(m, key=lambda r: (longest[(r.task_idx, r.step_idx)], r.task_idx, r.step_idx, length(r)))
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
    utils.run_script(main)

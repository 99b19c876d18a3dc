r"""Evaluation of a GUI policy: SOP (docs/method.md §8), static AndroidControl-style metrics, online
MiniWob++ success, and offline scoring of recorded responses.

Protocols (one run may combine them). SOP and static walk the episodes with
rollout.semi_online_rollout, the driver that training uses, as ONE greedy rollout per episode with
patch_threshold 0: evaluation walks exactly as training does (prompts by chat.build_prompt, each
step judged by reward.score_response, the one match function of rollout, training and evaluation).
- sop (default): own history, greedy, no patching; an episode stops at its first wrong step. PG and
  TSR as in docs/method.md §8 (sop_progress, the one definition, which training logs too).
- static (AndroidControl-High; with --step-instruction -Low): the EXPERT's earlier actions as
  history (the driver's history "expert", offline RL's); type_acc, grounding_acc, step_sr as in §8.
- online (--online; MiniWob++ only): the policy plays live episodes through
  miniwob_env.evaluate_online on held-out seeds, with its own responses as history; malformed
  output is a no-op that still costs a step. Success = MiniWob raw reward >= 1. --online-batch
  episodes run at once, one browser each, their prompts answered in one generate call.
  --samples K --temperature T (a model): each online episode is also played K times sampled at T on
  its seed (its page), play j seeded by play_seed (--sample-seed; a rerun at the same --online-batch
  repeats every response): `online_sampled` has, per task and pooled, greedy success, pass@K (a
  sample succeeds), flippable (greedy fails, a sample succeeds), each {successes, n, rate, lo, hi}
  (Wilson 95%).
- sop + static: `history_gap` (evaluation.metrics.history_gap), step accuracy under own vs expert
  history on the steps SOP reached (every earlier step right), per task and pooled.

Policies (each a sampler of the driver: .generate(prompts, n, greedy, seeds)):
- expert: ExpertSampler answers each step with the expert action, written as a model response in
  pixels of the resized screenshot; it never reads a prompt, so none is built (no tokens, no
  pixels: the 1,262 AndroidControl test episodes replay in seconds). What it checks: data
  loading, response format, parse, coordinate mapping and match must give PG = TSR = 1.0 on every
  real file; anything less is a bug there. Online it is miniwob_env's scripted DOM expert.
- model: greedy decoding of --model ('tiny', a Hugging Face folder, or a checkpoint folder or run
  folder with a `latest` pointer) through sampler.Sampler. The driver walks --batch-size episodes
  at a time and sends the current step of every live one in ONE generate call (greedy ids do not
  depend on the batch's make-up).
- openai: a model served behind any OpenAI-compatible endpoint (evaluation.served.ServedSampler:
  --base-url, --served-model, $OPENAI_API_KEY), sent the same prompts as `model`, its answers
  translated from its family's format (--action-format); a request that fails after --retries is a
  wrong step whose episode records why (server_error; online: the episode ends with cause
  server_error), and OUT/responses.jsonl keeps the raw answers. Such steps are the server's failure,
  never the model's: they are counted apart from malformed answers (result.json's server_failures, a
  line above the figures on stdout and in the report), and the exit code is 3 when more than
  --max-server-error-share of the requests failed.
- recorded responses: the `score` subcommand scores them step by step with reward.score_response
  (--action-format: another family's raw answers).

Commands (stdout: what was run and the headline metrics, report.summary_text; --json adds the full
summary as one JSON line, last; progress bars go to stderr):
    # expert replay on the AndroidControl test episodes, blank 1080x2400 screens (none ship)
    python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl --policy expert \
        --blank-screens 1080x2400
    # a checkpoint on MiniWob++: SOP, static, and online on 5 held-out seeds per task, with a report
    # (--model out/sft/ckpt follows its `latest` pointer; the prompt options come from its
    # args.json)
    python eval_sop.py --data data/miniwob/test.jsonl --policy model --model out/sft/ckpt \
        --protocol sop static --online --online-seeds 5 --out out/eval/sft
    # the untrained tiny model, 2 episodes per task, short responses (a CPU smoke run, ~1 min)
    python eval_sop.py --data data/miniwob/test.jsonl --per-task-limit 2 --policy model \
        --model tiny --max-new-tokens 32 --protocol sop static --out /tmp/eval_tiny
    # flippability: greedy success, pass@4 and the flippable fraction at temperature 1 (online only)
    python eval_sop.py --policy model --model out/sft/ckpt --online --online-seeds 4 --samples 4 \
        --temperature 1.0
    # online only, the scripted DOM expert (must give online_sr = 1.0)
    python eval_sop.py --online --online-tasks click-test enter-text --online-seeds 3
    # AndroidControl-Low static metrics of a model
    python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl --policy model \
        --model /models/Qwen2.5-VL-7B-Instruct --protocol static --step-instruction \
        --blank-screens 1080x2400
    # Qwen2.5-VL-7B behind `vllm serve ... --served-model-name q7b`, AndroidControl-Low step rules
    python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl \
        --image-root /data/ac --policy openai --base-url http://127.0.0.1:8000/v1 \
        --served-model q7b --action-format qwen25vl --protocol androidcontrol-low
    # score recorded responses (coordinates in resized pixels) of any model
    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \
        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400

--out DIR writes result.json (the full summary and the run's args; "complete": false until the end),
episodes.jsonl (SOP, one line per episode), static_steps.jsonl, online_episodes.jsonl (each episode
appended as it ends: evaluation/outputs.py) and report.html (HTML: a summary card of the
metrics with their intervals and a per-task table, then screenshots with the predicted and expert
points and the target boxes, thoughts, actions, the first wrong step). Two or more such folders side
by side, with paired differences: python report.py out/eval/sft out/eval/semionline.
Ctrl-C or SIGTERM saves a partial result.json (and report) and exits 130; `--resume` (same flags)
continues it without playing the finished episodes again. A folder holding files is refused (exit 2)
unless --resume or --overwrite. Single process only (no torchrun).
"""

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from types import SimpleNamespace

import torch
from tqdm import tqdm

import chat
import cli
import dataset
import gui
import policies
import report
import reward
import utils
import vlm
from rollout import RolloutSpec, semi_online_rollout, sop_progress
# PG, TSR, step accuracy, own vs expert
from evaluation.metrics import history_gap, sop_metrics, static_metrics
from evaluation.views import shown_indices, sop_outcome, step_view  # what the HTML report shows
from evaluation.online import (OnlineModelPolicy, flip_counts, lent_to_sampler,  # noqa: F401
                               play_seed, run_online, wilson_rate)  # online MiniWob++ (--online)
# the run folder: written as the run goes, resumed, refused when another run's
from evaluation import outputs
from evaluation import protocols  # the published step protocols' rules (--match-rules)
# the served model's contract (--prompt-from)
from evaluation.served import prompt_spec as served_prompt_spec
from evaluation.stats import wilson  # the 95% interval of every rate reported
from configs import evaluate as eval_config
from sampler import SampleOutput, Sampler

# -----------------------------------------------------------------------------
# Config


def sop_parser() -> argparse.ArgumentParser:
    """The flags (configs/eval.py), with this module's docstring as --help's description."""
    return eval_config.sop_parser(__doc__)


def expert_policy(prompt: policies.StepPrompt) -> str:
    """The expert action of prompt.step as a response, in pixels of the resized screenshot."""
    return gui.expert_response(prompt.step, prompt.orig_size, prompt.resized_size)


class ExpertSampler:
    """The expert replay as a sampler (the module docstring's `expert` policy): every prompt is
    answered with expert_policy; its prompt_builder builds no prompt (no tokens, no pixels)."""

    prompt_builder = policies.StepPrompts

    def generate(self, prompts: list[policies.StepPrompt], n: int | list[int] = 1,
                 greedy: bool = True, seeds=None):
        # expert_policy looked up at call time: tests replace it with a scripted policy
        ns = [n] * len(prompts) if isinstance(n, int) else n
        return [[SampleOutput([], expert_policy(p), torch.zeros(0), "stop", i)] * k
                for i, (p, k) in enumerate(zip(prompts, ns))]


def load_sampler(args, tokenizer):
    """The model of --model on --device (bf16 on CUDA, fp32 on CPU) inside a sampler.Sampler."""
    device = (args.device if args.device != "auto"
              else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = vlm.load_model(args.model, dtype=dtype, device=device, seed=args.seed)
    model.eval()
    return Sampler(model, tokenizer, max_new_tokens=args.max_new_tokens, decode=args.decode)


# -----------------------------------------------------------------------------
# Metrics


# -----------------------------------------------------------------------------
# Protocols (module docstring): SOP and static walk with rollout.semi_online_rollout; online


def greedy_rollouts(episodes: list[dataset.Episode], sampler, args, tokenizer, image_processor,
                    spec: chat.PromptSpec, history: str, stats: dict,
                    done=None) -> tuple[list[list[dict]], list[tuple[int, int]]]:
    """Play `episodes` with rollout.semi_online_rollout, --batch-size episodes per call (so at most
    that many prompts, with their pixels, are alive at once): one greedy rollout per episode,
    patch_threshold 0 (a wrong step ends it), history "own" (SOP) or "expert" (static: every step
    is run). Returns, per episode, its walked steps in order ({t, response, reward, match,
    type_match, error, truncated, resized_size}) and its SOP progress (sop_progress: correct steps
    before the first wrong one, length; under --match-rules release 0 for an episode with a response
    on which the release's code raised). stats gains the prompt and response counts of the summary.
    done(k, rows, progress), when given, is called for each episode k as its chunk finishes (the run
    folder's incremental write)."""
    rows, progress = [[] for _ in episodes], [None] * len(episodes)
    bar = tqdm(total=len(episodes), desc=f"{'SOP' if history == 'own' else 'static'} {args.policy}",
               unit="ep", file=sys.stderr)
    with lent_to_sampler(sampler):
        for lo in range(0, len(episodes), args.batch_size):
            chunk = episodes[lo:lo + args.batch_size]
            how = RolloutSpec(n_rollouts=1, patch_threshold=0, history_mode=history, greedy=True,
                              match_rules=protocols.rules_of(args.match_rules),
                              image_root=args.image_root, blank_screens=args.blank_screens)
            records = semi_online_rollout(sampler, chunk, tokenizer, image_processor, how,
                                          spec=spec)
            lens = {k: len(ep.steps) for k, ep in enumerate(chunk)}
            walked = sop_progress(records, lens)
            if args.match_rules == "release":  # a raise of the release's code zeroes its episode
                from extras.release import release_progress
                walked = release_progress(walked, records)
            for (k, _), p in walked.items():
                progress[lo + k] = p
            for r in records:  # in (step, episode) order; the prompt (tokens, pixels) is not kept
                # a served model's request failed after its retries
                served = r.finish_reason.startswith("error")
                rows[lo + r.task_idx].append({
                    "t": r.step_idx, "response": r.response, "reward": r.reward,
                    "match": r.match, "type_match": r.type_match,
                    "error": f"server {r.finish_reason}" if served else r.error,
                    "server_error": served, "truncated": r.finish_reason == "length",
                    "resized_size": r.prompt.resized_size,
                    **policies.raw_answer(sampler, r.prompt)})
                # None: a StepPrompt, no prompt was built
                ids = getattr(r.prompt, "input_ids", None)
                if ids is not None:
                    stats["max_tokens"] = max(stats["max_tokens"], len(ids))
                    stats["budgeted"] += r.prompt.n_dropped_turns > 0
                    budget = spec.max_prompt_tokens
                    # the current turn alone is too long
                    stats["over"] += budget is not None and len(ids) > budget
                stats["responses"] += 1
                stats["truncated"] += r.finish_reason == "length"
                stats["server_errors"] += served
                stats["tokens"] += len(r.response_ids)
            for k in range(lo, lo + len(chunk)) if done is not None else ():
                done(k, rows[k], progress[k])
            bar.update(len(chunk))
    bar.close()
    return rows, progress


def episode_views(ep: dataset.Episode, rows: list[dict], args) -> list[dict]:
    """step_view of each played step of `ep` (rows of greedy_rollouts), the predicted action mapped
    back to original pixels by reward.score_response, as the rollout scored it."""
    views = []
    for row in rows:
        step = ep.steps[row["t"]]
        orig = dataset.original_size(step, image_root=args.image_root,
                                     blank_screens=args.blank_screens)
        image = dataset.load_screenshot(step, image_root=args.image_root,
                                        blank_screens=args.blank_screens)
        pred = reward.score_response(row["response"], step, resized_size=row["resized_size"],
                                     orig_size=orig,
                                     rules=protocols.rules_of(args.match_rules)).action
        view = step_view(row["t"], image, orig, step, row["response"], pred, row["match"],
                         row["reward"])
        # no answer: the server's failure, drawn apart from the model's wrong steps
        if row["server_error"]:
            view.update(pred=f"(no answer: {row['error']})",
                        verdict="no answer from the server (not the model's)", cls="neutral")
        views.append(view)
    return views


def sop_record(i: int, ep: dataset.Episode, steps: list[dict], progress: tuple[int, int]) -> dict:
    """The episodes.jsonl line of SOP episode i (its walked steps, rows of greedy_rollouts).
    malformed: responses scored 0 as malformed (truncated included); server_errors: steps whose
    request got no answer (a served model's; never counted as malformed)."""
    correct, n = progress
    return {"episode": i, "source": ep.source, "task": ep.task, "episode_id": ep.episode_id,
            "steps": n, "correct": correct, "success": correct == n,
            "rewards": [s["reward"] for s in steps],
            "matches": [bool(s["match"]) for s in steps],
            "malformed": sum(s["error"] is not None and not s["server_error"] for s in steps),
            "truncated": sum(s["truncated"] for s in steps),
            "server_errors": sum(s["server_error"] for s in steps),
            "errors": [s["error"] for s in steps], "responses": [s["response"] for s in steps],
            "server_error": next((s["error"] for s in steps if s["server_error"]), None),
            **({"raw_responses": [s["raw"] for s in steps],
                "raw_messages": [s["message"] for s in steps]}
               if steps and "raw" in steps[0] else {})}


def run_sop(episodes: list[dataset.Episode], run_rollouts, args, show: set[int],
            folder: outputs.RunFolder | None = None) -> tuple[list[dict], list[dict]]:
    """SOP (docs/method.md §8): own history, greedy, each episode ends at its first wrong step.
    run_rollouts(history, episodes, done) is `greedy_rollouts` bound to the run's sampler and prompt
    options. With a run folder each record is appended as its chunk ends, and the episodes it
    already holds (--resume) are kept, not played. Returns (one record per episode, in order; report
    episodes: those played now)."""
    records = {r["episode"]: r for r in folder.done["sop"]} if folder else {}
    todo = [i for i in range(len(episodes)) if i not in records]
    shown = []

    def done(k, steps, progress):
        i, ep = todo[k], episodes[todo[k]]
        records[i] = sop_record(i, ep, steps, progress)
        if folder:
            folder.append("sop", [records[i]])
        if i in show:
            correct, n = progress
            wrong = next((s["t"] for s in steps if not s["match"]), None)
            outcome = sop_outcome(
                correct, n, steps[-1]["error"] is not None if steps else False,
                steps[-1]["error"] if steps and steps[-1]["server_error"] else None)
            # the release's exception rule zeroed the progress
            if wrong is not None and wrong != correct:
                outcome = (
                    f"the release's code raised at step {wrong} ({steps[-1]['error']}): progress 0 "
                    "(--match-rules release)")
            shown.append({"title": f"{ep.episode_id} ({ep.task})", "goal": ep.goal,
                          "success": correct == n, "outcome": outcome,
                          "steps": episode_views(ep, steps, args), "first_wrong": wrong})

    run_rollouts("own", [episodes[i] for i in todo], done)
    return [records[i] for i in range(len(episodes))], shown


def run_static(episodes: list[dataset.Episode], run_rollouts, args, show: set[int],
               folder: outputs.RunFolder | None = None) -> tuple[list[dict], list[dict]]:
    """Static (AndroidControl-High/-Low): every step with the expert's earlier actions as history
    (run_rollouts' history "expert", as offline RL trains). With a run folder an episode's steps are
    appended in one write as its chunk ends; an episode the folder holds whole (--resume) is kept.
    Returns (one record per step, in order; report episodes)."""
    held = defaultdict(list)
    for r in folder.done["static"] if folder else ():
        held[r["episode"]].append(r)
    # a cut episode is played again
    per_ep = {i: rs for i, rs in held.items() if len(rs) == len(episodes[i].steps)}
    todo = [i for i in range(len(episodes)) if i not in per_ep]
    shown = []

    def done(k, steps, _progress):
        i, ep = todo[k], episodes[todo[k]]
        per_ep[i] = [{"episode": i, "episode_id": ep.episode_id, "task": ep.task, "t": s["t"],
                      "expert_type": ep.steps[s["t"]].action["action"],
                      "type_match": s["type_match"], "match": s["match"], "reward": s["reward"],
                      "malformed": s["error"] is not None and not s["server_error"],
                      "truncated": s["truncated"], "error": s["error"], "response": s["response"],
                      "server_error": s["server_error"],
                      **{k: s[k] for k in ("raw", "message") if k in s}} for s in steps]
        if folder:
            folder.append("static", per_ep[i])
        if i in show:
            wrong = [s["t"] for s in steps if not s["match"]]
            shown.append({"title": f"{ep.episode_id} ({ep.task})", "goal": ep.goal,
                          "success": not wrong,
                          "outcome": f"all {len(steps)} steps right" if not wrong else
                          f"{len(steps) - len(wrong)}/{len(steps)} steps right, "
                          f"first wrong action at step {wrong[0]}",
                          "steps": episode_views(ep, steps, args),
                          "first_wrong": wrong[0] if wrong else None})

    run_rollouts("expert", [episodes[i] for i in todo], done)
    return [r for i in range(len(episodes)) for r in per_ep[i]], shown


# -----------------------------------------------------------------------------
# main: the checks, the policy, the data, then each protocol's section of the summary, then the
# outputs


def check_flags(parser, args, argv: list[str]) -> None:
    """Flag combinations that parse but cannot run raise utils.UsageError (one line, exit 2)."""
    if args.policy == "expert" and "model" in cli.explicit_flags(parser, argv):
        raise utils.UsageError(f"--model {args.model} is given but --policy is expert "
                               "(the default): add --policy model")
    # served flags; a named protocol -> static + its rules
    policies.check_args(args, cli.explicit_flags(parser, argv))
    for flag, value, low in (("--max-new-tokens", args.max_new_tokens, 1),
                             ("--batch-size", args.batch_size, 1),
                             ("--online-seeds", args.online_seeds, 1),
                             ("--online-batch", args.online_batch, 1)):
        if value < low:
            raise utils.UsageError(f"{flag} {value}: must be >= {low}")
    if (args.resume or args.overwrite) and not (args.out and not args.out.endswith(".jsonl")):
        raise utils.UsageError("--resume / --overwrite: need --out DIR (a run folder)")
    if args.resume and args.overwrite:
        raise utils.UsageError("--resume and --overwrite: one or the other (continue the run, or "
                               "replace it)")
    if not args.data and not args.online:
        raise utils.UsageError("nothing to evaluate: give --data and/or --online")
    if args.samples < 0 or (args.samples
                            and not (args.online and args.policy in ("model", "openai"))):
        raise utils.UsageError(f"--samples {args.samples}: must be >= 0, and > 0 only with "
                               "--online --policy model|openai")


def setup(args) -> SimpleNamespace:
    """The policy as a sampler of greedy_rollouts (for a model, its tokenizer and image processor;
    the expert reads no prompt: none is built), the prompt contract it was trained on, capped by the
    model's context (docs/method.md §10: a long history is summarised, never overflows), and the
    episodes."""
    ev = SimpleNamespace(args=args, tokenizer=None, image_processor=None, sampler=ExpertSampler(),
                         # prompts: max_tokens, budgeted, over; responses: responses, truncated,
                         # tokens
                         stats=Counter())
    spec = served_prompt_spec(args, say=utils.print0) if args.policy == "openai" else \
        chat.resolve_spec(args, args.model if args.policy == "model" else "none", say=utils.print0)
    ev.budget = spec.max_prompt_tokens
    if args.policy == "model":
        # a model meets its own vocabulary (vlm.tokenizer_dir)
        tok_dir = args.tokenizer or args.model
        ev.tokenizer, ev.image_processor = vlm.load_processor(tok_dir, min_pixels=spec.min_pixels,
                                                              max_pixels=spec.max_pixels)
        ev.sampler = load_sampler(args, ev.tokenizer)
        cfg = getattr(ev.sampler.model, "config", None)
        ctx = (getattr(cfg.get_text_config(), "max_position_embeddings", None)
               if cfg is not None else None)
        if ctx:
            ev.budget = min(ev.budget or ctx, ctx - args.max_new_tokens)
    # a served model: the prompt is built here (the server's tokenizer by default)
    if args.policy == "openai":
        ev.tokenizer, ev.image_processor = vlm.load_processor(args.tokenizer,
                                                              min_pixels=spec.min_pixels,
                                                              max_pixels=spec.max_pixels)
        ev.sampler = policies.served_sampler(args)
    ev.spec = dataclasses.replace(spec, max_prompt_tokens=ev.budget)
    ev.episodes = []
    for path in args.data:
        ev.episodes += dataset.load_episodes(path, limit=args.limit,
                                             swipe_convention=args.swipe_convention)
    # -Low without step instructions
    protocols.check_protocol_data(args.named_protocol, ev.episodes, args.data)
    if args.per_task_limit is not None:
        seen, keep = defaultdict(int), []
        for ep in ev.episodes:
            seen[ep.task] += 1
            if seen[ep.task] <= args.per_task_limit:
                keep.append(ep)
        ev.episodes = keep
    ev.show = shown_indices(len(ev.episodes), max(args.report_episodes, 0))
    ev.per_task, ev.sections, ev.malformed = defaultdict(dict), [], 0
    ev.sop_records = ev.static_records = ev.online_res = ev.floor = None
    return ev


def run_rollouts(ev, history: str, episodes: list, done) -> list:
    return greedy_rollouts(episodes, ev.sampler, ev.args, ev.tokenizer, ev.image_processor, ev.spec,
                           history, ev.stats, done)


def make_prompt_online(ev, obs, shots, history):
    """The prompt of an online step (the page's elements too when the contract shows them),
    counted."""
    prompt = chat.build_prompt(ev.tokenizer, ev.image_processor, ev.spec, goal=obs["goal"],
                               screenshots=shots, history=history,
                               elements=obs["elements"] if ev.spec.elements else None)
    ev.stats["max_tokens"] = max(ev.stats["max_tokens"], len(prompt.input_ids))
    ev.stats["budgeted"] += prompt.n_dropped_turns > 0
    ev.stats["over"] += ev.budget is not None and len(prompt.input_ids) > ev.budget
    return prompt


def sop_section(ev, summary: dict) -> None:
    """SOP (own history, greedy, stops at the first wrong step): PG, TSR, per source and per
    task."""
    args, floor = ev.args, ev.floor
    ev.sop_records, shown = run_sop(ev.episodes, lambda *a: run_rollouts(ev, *a), args, ev.show,
                                    ev.folder)
    recs = ev.sop_records
    m = sop_metrics([(r["correct"], r["steps"]) for r in recs])
    steps_run = sum(len(r["rewards"]) for r in recs)
    ev.malformed += sum(r["malformed"] for r in recs)
    summary.update(m)  # pg, tsr, episodes, steps (pg/tsr also as sop_pg/sop_tsr)
    summary.update({"sop_pg": m["pg"], "sop_tsr": m["tsr"], "steps_run": steps_run,
                    "sop_truncated_rate": sum(r["truncated"] for r in recs) / max(steps_run, 1),
                    # --match-rules release: episodes whose progress the release's exception rule
                    # set to 0
                    "sop_episodes_raised": sum(any(e is not None for e in r["errors"])
                                               for r in recs)
                    if args.match_rules == "release" else None,
                    "step_reward_mean": sum(sum(r["rewards"]) for r in recs) / max(steps_run, 1),
                    "sources": {path: sop_metrics([(r["correct"], r["steps"]) for r in recs
                                                   if r["source"] == path]) for path in args.data}})
    for task in dict.fromkeys(r["task"] for r in recs):
        tm = sop_metrics([(r["correct"], r["steps"]) for r in recs if r["task"] == task])
        ev.per_task[task].update(sop_pg=tm["pg"], sop_tsr=tm["tsr"], episodes=tm["episodes"],
                                 steps=tm["steps"])
    ev.sections.append(("SOP: own history, greedy, the episode stops at its first wrong step",
                        f"PG {m['pg']:.3f}, TSR {m['tsr']:.3f} over {m['episodes']} episodes "
                        f"(trivial-policy floor: PG {floor['sop_pg']:.3f}, "
                        f"TSR {floor['sop_tsr']:.3f}); {len(shown)} shown.", shown))


def static_section(ev, summary: dict) -> None:
    """Static (the expert's history, every step evaluated): step SR, type and grounding accuracy,
    per task."""
    args, floor = ev.args, ev.floor
    ev.static_records, shown = run_static(ev.episodes, lambda *a: run_rollouts(ev, *a), args,
                                          ev.show, ev.folder)
    recs = ev.static_records
    m = static_metrics(recs)
    ev.malformed += sum(r["malformed"] for r in recs)
    summary.update({"static_type_acc": m["type_acc"], "static_grounding_acc": m["grounding_acc"],
                    "static_truncated_rate": sum(r["truncated"] for r in recs) / max(m["steps"], 1),
                    "static_step_sr": m["step_sr"], "static_steps": m["steps"],
                    "static_grounding_steps": m["grounding_steps"],
                    "static_variant": "low" if args.step_instruction else "high"})
    for task in dict.fromkeys(r["task"] for r in recs):
        tm = static_metrics([r for r in recs if r["task"] == task])
        ev.per_task[task].update(static_type_acc=tm["type_acc"],
                                 static_grounding_acc=tm["grounding_acc"],
                                 static_step_sr=tm["step_sr"], static_steps=tm["steps"])
    ev.sections.append((
        f"Static ("
        f"{'-Low: with step instructions' if args.step_instruction else '-High: goal only'}):"
        " expert history, every step evaluated",
        f"step SR {m['step_sr']:.3f}, type acc {m['type_acc']:.3f} over {m['steps']} steps "
        f"(floor: step SR {floor['step_sr']:.3f}, type acc {floor['type_acc']:.3f}); "
        f"{len(shown)} episodes shown.", shown))


def online_section(ev, summary: dict) -> None:
    """Online MiniWob++ (own history, live pages, held-out seeds): success with its Wilson interval,
    per task; with --samples, the sampled plays' pass@K and flippable episodes."""
    from envs import miniwob_env, miniwob_experts
    args = ev.args
    tasks = (args.online_tasks
             or [t for t in dict.fromkeys(e.task for e in ev.episodes)
                 if t in miniwob_experts.EXPERTS]
             or sorted(miniwob_experts.EXPERTS))
    base = miniwob_env.ONLINE_SEED_BASE if args.online_seed_base is None else args.online_seed_base
    seeds = list(range(base, base + args.online_seeds))
    ev.online_res, shown = run_online(ev.sampler if args.policy != "expert" else None,
                                      lambda *a: make_prompt_online(ev, *a), tasks, seeds, args,
                                      ev.stats, ev.folder)
    o = ev.online_res["overall"]
    ev.malformed += ev.online_res["malformed"]
    ci = lambda r: list(wilson(round(r["success_rate"] * r["episodes"]),  # noqa: E731
                               r["episodes"]))
    summary.update({"online_sr": o["success_rate"], "online_sr_ci95": ci(o),
                    "n_online_episodes": o["episodes"],
                    "online_failures": o["failures"], "online_mean_steps": o["mean_steps"],
                    "online_tasks": tasks, "online_seeds": seeds})
    for task, r in ev.online_res["per_task"].items():
        ev.per_task[task].update(online_sr=r["success_rate"], online_sr_ci95=ci(r),
                                 n_online_episodes=r["episodes"])
    lo, hi = summary["online_sr_ci95"]
    ev.sections.append(("Online MiniWob++: own history, live pages",
                        f"success {o['success_rate']:.3f} "
                        f"(95% Wilson interval {lo:.3f}-{hi:.3f}) over "
                        f"{o['episodes']} episodes (held-out seeds {seeds[0]}..{seeds[-1]}); "
                        f"{len(shown)} shown.", shown))
    if "sampled" in ev.online_res:
        sm = summary["online_sampled"] = ev.online_res["sampled"]
        for task, c in sm["per_task"].items():  # the report's per-task table
            ev.per_task[task].update(online_pass_at_k=c["pass_at_k"]["rate"],
                                     online_flippable=c["flippable"]["rate"])
        fmt = lambda c: (f"greedy {c['greedy']['successes']}/{c['greedy']['n']}, "  # noqa: E731
                         f"pass@{args.samples} "
                         f"{c['pass_at_k']['successes']}, flippable {c['flippable']['successes']} "
                         f"({c['flippable']['rate']:.3f}, 95% {c['flippable']['lo']:.3f}-"
                         f"{c['flippable']['hi']:.3f})")
        note = "; ".join([f"pooled: {fmt(sm['pooled'])}"]
                         + [f"{t}: {fmt(c)}" for t, c in sm["per_task"].items()])
        ev.sections.append((f"Online, {args.samples} sampled plays per episode at temperature "
                            f"{args.temperature}", note, []))
        print(f"online sampled (K {args.samples}, T {args.temperature}): {note}", file=sys.stderr)


def write_outputs(ev, summary: dict, out_dir: str | None, report_path: str | None,
                  complete: bool = True) -> None:
    """The run folder's files in the episodes' order and result.json (--out; complete False: a
    partial run's), the raw answers of a served model, the HTML report; stdout the readable part
    (report.summary_text), and with --json the summary."""
    args = ev.args
    if args.out and out_dir is None and ev.sop_records is not None:  # the per-episode JSONL alone
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(utils.dumps(r) + "\n" for r in ev.sop_records)
    if ev.folder is not None:
        for protocol, rows in (("sop", ev.sop_records), ("static", ev.static_records),
                               ("online", ev.online_res["episodes"] if ev.online_res else None)):
            if rows is not None:
                ev.folder.finish_stream(protocol, rows)
        # the raw answers, for `eval_sop.py score --action-format` offline
        if args.policy == "openai":
            policies.write_responses(os.path.join(out_dir, "responses.jsonl"), ev.sop_records,
                                     ev.static_records)
        ev.folder.write_result(summary, complete)
    if report_path:
        title = f"eval_sop: {args.policy} " + {
            "model": args.model, "openai": f"{args.served_model} ({args.action_format})"
        }.get(args.policy, "")
        # the headline first
        online_first = sorted(ev.sections, key=lambda sec: not sec[0].startswith("Online"))
        report.write_report(report_path, title, {"complete": complete, **summary}, online_first)
    paths = ""
    if out_dir or report_path:  # where the outputs are
        paths = (f"results: {os.path.join(out_dir, 'result.json') if out_dir else args.out}"
                 + (f"  report: {report_path} (open it in a browser)" if report_path else ""))
    print(report.summary_text({"complete": complete, **summary}, paths), flush=True)
    if args.json:
        print(utils.dumps(summary))


def run_protocols(ev, summary: dict) -> None:
    """The floor of the episodes, then each protocol asked for, each adding its section to the
    summary."""
    args, episodes = ev.args, ev.episodes
    if episodes:  # the trivial-policy floor of these episodes, printed beside every figure
        sizes = policies.step_sizes(episodes, args.image_root, args.blank_screens)
        ev.floor = floor = policies.run_baselines(episodes, sizes, args.match_rules)["floor"]
        summary.update({"floor_sop_pg": floor["sop_pg"], "floor_sop_tsr": floor["sop_tsr"],
                        "floor_step_sr": floor["step_sr"], "floor_type_acc": floor["type_acc"]})
    if episodes and "sop" in args.protocol:
        sop_section(ev, summary)
    if episodes and "static" in args.protocol:
        static_section(ev, summary)
    # own vs expert history on the steps SOP reached
    if ev.sop_records is not None and ev.static_records is not None:
        expert = {(r["episode"], r["t"]): bool(r["match"]) for r in ev.static_records}
        summary["history_gap"] = history_gap([(r["task"], t, m, expert[(i, t)])
                                              for i, r in enumerate(ev.sop_records)
                                              for t, m in enumerate(r["matches"])])
    if args.online:
        online_section(ev, summary)


def finish_summary(ev, summary: dict, t0: float, report_path: str | None) -> None:
    """The counts of the run: prompts, responses, malformed ones, the server's failures (never the
    model's: outputs.server_failures), per task, time."""
    args, stats = ev.args, ev.stats
    built = args.policy != "expert"  # the expert reads no prompt: none was built, nothing to count
    summary.update({"max_prompt_tokens_seen": stats["max_tokens"] if built else None,
                    "prompts_budgeted": stats["budgeted"] if built else None,
                    "prompts_over_budget": stats["over"] if built else None,
                    "prompt_budget": ev.budget,
                    "malformed_responses": ev.malformed, "max_new_tokens": args.max_new_tokens,
                    "responses_at_cap": stats["truncated"] if built else 0,
                    # responses cut at the token cap (strict rules: malformed, reward 0), of all
                    # responses
                    "truncated_rate": stats["truncated"] / max(stats["responses"], 1)})
    if built:
        summary.update({"responses": stats["responses"], "truncated_responses": stats["truncated"],
                        "response_tokens_mean": stats["tokens"] / max(stats["responses"], 1)})
    # requests, retries, failures, the SOP episodes a failure ended (said on stderr)
    if args.policy == "openai":
        summary["served"] = policies.served_summary(args, ev.sampler, stats["server_errors"],
                                                    ev.sop_records)
    summary["server_failures"] = outputs.server_failures(ev.sop_records, ev.static_records,
                                                         ev.online_res, args.max_server_error_share)
    summary["per_task"] = dict(ev.per_task)
    summary["seconds"] = round(time.time() - t0, 1)
    if report_path:
        summary["report"] = report_path


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "baselines":  # the trivial-policy floors: report.baselines_main
        return report.baselines_main(argv[1:])  # prints its own table and JSON line
    if argv and argv[0] == "score":  # recorded responses: report.score_main
        return report.score_main(argv[1:])
    parser = sop_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    check_flags(parser, args, argv)
    t0 = time.time()
    out_dir = args.out if args.out and not args.out.endswith(".jsonl") else None
    report_path = args.report or (os.path.join(out_dir, "report.html") if out_dir else None)
    # refused: exit 2
    folder = outputs.RunFolder(out_dir, args, args.resume, args.overwrite) if out_dir else None
    summary = {"policy": args.policy, "model": args.model if args.policy == "model" else None,
               "match_rules": args.match_rules, "named_protocol": args.named_protocol,
               "protocols": (list(args.protocol) if args.data else [])
               + (["online"] if args.online else [])}
    if folder is not None:  # the flags of a run that may be stopped and resumed
        folder.start()
    ev = None
    try:
        with outputs.stop_signals():  # SIGTERM as Ctrl-C: both save what is done
            ev = setup(args)
            ev.folder = folder
            summary.update({"episodes": len(ev.episodes),
                            "steps": sum(len(e.steps) for e in ev.episodes)})
            run_protocols(ev, summary)
    except KeyboardInterrupt as e:
        with outputs.no_interrupts():  # a second Ctrl-C must not cut the partial result
            why = str(e) or "SIGINT"
            if ev is None:
                if folder is not None:
                    folder.write_result(summary, complete=False, interrupted=why)
            else:
                finish_summary(ev, summary, t0, report_path)
                summary.update(interrupted=why, finished=folder.finished if folder else None)
                write_outputs(ev, summary, out_dir, report_path, complete=False)
            print(f"eval_sop: interrupted ({why}); "
                  + (f"what finished is in {out_dir}: --resume continues the run"
                     if folder else "nothing was saved (no --out)"),
                  file=sys.stderr, flush=True)
        raise SystemExit(outputs.EXIT_INTERRUPTED) from None
    finish_summary(ev, summary, t0, report_path)
    write_outputs(ev, summary, out_dir, report_path)
    return summary


def exit_status(summary) -> int:
    """The process's exit code: EXIT_SERVER_FAILED (3) when more than --max-server-error-share of
    the requests got no answer (the figures are then the server's as much as the model's), else
    0."""
    failures = summary.get("server_failures") if isinstance(summary, dict) else None
    return outputs.EXIT_SERVER_FAILED if failures and failures["exceeded"] else 0


if __name__ == "__main__":
    sys.exit(exit_status(cli.run_script(main)))

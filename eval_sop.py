"""SOP (Semi-Online Performance) evaluation, SPEC section 8, and offline scoring of recorded responses.

SOP: the policy acts on each expert episode with its OWN earlier responses as history; an episode
stops at its first wrong step (gui.score_response decides "wrong", the same function rollout and
training use). PG = mean over episodes of (correct steps before the first error) / (episode
length); TSR = share of episodes with every step correct. No patching.

Policies:
- expert: the expert actions, written as model responses in pixels of the resized screenshot,
  replayed through the full path (prompt building with the real tokenizer and image processor,
  token budget, parse, coordinate mapping, match). Must give PG = TSR = 1.0 on every real file;
  anything less is a bug in that path.

Commands (the last stdout line is one JSON object; progress bars go to stderr):
    # expert replay on the AndroidControl test episodes, blank 1080x2400 screens (none ship);
    # --max-pixels 50176 keeps the blank images small so the replay takes minutes, not an hour
    python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl --policy expert \\
        --blank-screens 1080x2400 --max-pixels 50176
    # every real file at once, real screenshot size (slow: ~0.7 s per step on a CPU)
    python eval_sop.py --data data/android_control/*.json* --policy expert --blank-screens 1080x2400
    # score recorded responses (coordinates in resized pixels) of any model
    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \\
        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400

Single process only for now (no torchrun): the expert policy needs no model.
"""

import argparse
import json
import logging
import os
import sys
import time

from tqdm import tqdm

import gui

# -----------------------------------------------------------------------------
# Config


def size_arg(text: str) -> tuple[int, int]:
    """argparse type for 'WxH' -> (W, H)."""
    try:
        return gui.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def sop_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="SOP evaluation (PG, TSR) of a policy on expert episodes. "
                                "Subcommand: `eval_sop.py score ...` scores recorded responses.")
    # data
    p.add_argument("--data", nargs="+", required=True, help="episode files (UI-S1 JSONL or AndroidControl native JSON)")
    p.add_argument("--limit", type=int, default=None, help="first N episodes of each file (default: all)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--image-root", default=None, help="folder holding the screenshots (default: paths as recorded)")
    g.add_argument("--blank-screens", type=size_arg, default=None,
                   help="WxH: blank images stand in for missing screenshots "
                   "(dry runs; AndroidControl phones are 1080x2400)")
    # prompt
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the shipped Qwen2.5-VL tokenizer)")
    p.add_argument("--num-images", type=int, default=2, help="screenshots kept as images (the last K steps; release 2)")
    p.add_argument("--min-pixels", type=int, default=gui.MIN_PIXELS, help="smart_resize min pixels (release 4*28*28)")
    p.add_argument("--max-pixels", type=int, default=gui.MAX_PIXELS,
                   help="smart_resize max pixels (release 12800*28*28)")
    p.add_argument("--max-prompt-tokens", type=int, default=32768,
                   help="prompt budget: oldest turns are summarised beyond it (0: no budget)")
    p.add_argument("--step-instruction", action="store_true",
                   help="add the step instruction (AndroidControl-Low style)")
    p.add_argument("--elements", action="store_true", help="add the recorded element list, where there is one")
    # policy
    p.add_argument("--policy", choices=["expert"], default="expert",
                   help="who acts: expert = replay the expert actions")
    # output
    p.add_argument("--out", default=None, help="optional JSONL with one line per episode")
    p.add_argument("--log-level", default="WARNING", help="logging level (budget warnings are WARNING)")
    return p


def score_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eval_sop.py score", description="Score recorded responses with the rule reward "
                                "(SPEC section 4). Input lines: {episode_id, step (0-based), response}, coordinates in "
                                "pixels of the resized screenshot.")
    p.add_argument("--data", nargs="+", required=True, help="episode files the responses refer to")
    p.add_argument("--responses", required=True, help="JSONL of responses")
    p.add_argument("--out", required=True, help="JSONL of scores, one line per response")
    p.add_argument("--image-size", type=size_arg, default=None,
                   help="WxH of the original screenshots, for steps that record no size")
    p.add_argument("--image-root", default=None, help="else read the size from the screenshot files here")
    p.add_argument("--min-pixels", type=int, default=gui.MIN_PIXELS, help="smart_resize min pixels the model saw")
    p.add_argument("--max-pixels", type=int, default=gui.MAX_PIXELS, help="smart_resize max pixels the model saw")
    return p


# -----------------------------------------------------------------------------
# Policies: (prompt, episode, t, orig_size) -> response text


def expert_policy(prompt: gui.Prompt, episode: gui.Episode, t: int, orig_size: tuple[int, int]) -> str:
    """The expert action, in pixels of the screenshot the prompt shows."""
    return gui.expert_response(episode.steps[t], orig_size, prompt.resized_size)


def sop_metrics(progress: list[tuple[int, int]]) -> dict:
    """progress: (correct steps before the first error, episode length) per episode -> PG, TSR."""
    if not progress:
        return {"pg": 0.0, "tsr": 0.0, "episodes": 0, "steps": 0}
    return {"pg": sum(c / n for c, n in progress) / len(progress),
            "tsr": sum(c == n for c, n in progress) / len(progress),
            "episodes": len(progress), "steps": sum(n for _, n in progress)}


# -----------------------------------------------------------------------------
# score subcommand


def score_main(argv: list[str]) -> dict:
    args = score_parser().parse_args(argv)
    index: dict[str, tuple[gui.Episode, str]] = {}
    for path in args.data:
        for ep in gui.load_episodes(path):
            if ep.episode_id in index:
                raise ValueError(f"episode id {ep.episode_id!r} is in both {index[ep.episode_id][1]} and {path}; "
                                 "score one file at a time")
            index[ep.episode_id] = (ep, path)
    n = reward = match = type_match = 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.responses, encoding="utf-8") as fin, open(args.out, "w", encoding="utf-8") as fout:
        for lineno, line in enumerate(fin, start=1):
            if not line.strip():
                continue
            where = f"{args.responses}: line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON: {e.msg}") from None
            if not isinstance(rec, dict) or not {"episode_id", "step", "response"} <= rec.keys():
                raise ValueError(f"{where}: expected an object with episode_id, step, response")
            ep_id, t = str(rec["episode_id"]), rec["step"]
            if ep_id not in index:
                raise ValueError(f"{where}: field 'episode_id': unknown episode {ep_id!r}")
            ep = index[ep_id][0]
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < len(ep.steps):
                raise ValueError(f"{where}: field 'step': expected 0..{len(ep.steps) - 1}, got {t!r}")
            step = ep.steps[t]
            orig = step.image_size or args.image_size
            if orig is None and args.image_root is not None:
                orig = gui.load_screenshot(step, image_root=args.image_root).size
            if orig is None:
                raise ValueError(f"{where}: episode {ep_id} step {t} records no screenshot size; pass --image-size WxH "
                                 "or --image-root DIR")
            resized = gui.resized_size(orig, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
            s = gui.score_response(rec["response"] if isinstance(rec["response"], str) else "", step,
                                   resized_size=resized, orig_size=orig)
            fout.write(json.dumps({"episode_id": rec["episode_id"], "step": t, "reward": s.reward, "match": s.match,
                                   "type_match": s.type_match, "format_ok": s.format_ok, "action": s.action},
                                  ensure_ascii=False) + "\n")
            n += 1
            reward += s.reward
            match += s.match
            type_match += s.type_match
    return {"responses": n, "reward_mean": reward / max(n, 1), "match_rate": match / max(n, 1),
            "type_match_rate": type_match / max(n, 1), "out": args.out}


# -----------------------------------------------------------------------------
# SOP


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "score":
        summary = score_main(argv[1:])
        print(json.dumps(summary))
        return summary

    args = sop_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    t0 = time.time()

    # --- setup: tokenizer and image processor (the model comes with --policy model)
    from utils import load_processor
    tokenizer, image_processor = load_processor(args.tokenizer, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    policy = {"expert": expert_policy}[args.policy]
    budget = args.max_prompt_tokens or None

    # --- data
    sources = [(path, gui.load_episodes(path, limit=args.limit)) for path in args.data]
    n_total = sum(len(eps) for _, eps in sources)

    # --- loop: SOP over every episode
    results = []
    max_tokens = n_budgeted = n_over = steps_run = 0
    reward_sum = 0.0
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    bar = tqdm(total=n_total, desc=f"SOP {args.policy}", unit="ep", file=sys.stderr)
    for path, episodes in sources:
        for ep in episodes:
            history, shots, n_correct, rewards = [], [], 0, []
            for t, step in enumerate(ep.steps):
                image = gui.load_screenshot(step, image_root=args.image_root, blank_screens=args.blank_screens)
                shots.append(image)
                if len(shots) > args.num_images:  # build_prompt reads only the last num_images; free the rest
                    shots[-args.num_images - 1] = None
                orig = step.image_size or image.size  # the pixel space of the expert's coordinates
                prompt = gui.build_prompt(
                    tokenizer, image_processor, goal=ep.goal, screenshots=shots, history=history,
                    step_instruction=step.step_instruction if args.step_instruction else None,
                    elements=step.elements if args.elements else None, num_images=args.num_images,
                    min_pixels=args.min_pixels, max_pixels=args.max_pixels, max_prompt_tokens=budget)
                max_tokens = max(max_tokens, len(prompt.input_ids))
                n_budgeted += prompt.n_dropped_turns > 0
                n_over += budget is not None and len(prompt.input_ids) > budget  # the current turn alone is too long
                response = policy(prompt, ep, t, orig)
                score = gui.score_response(response, step, resized_size=prompt.resized_size, orig_size=orig)
                rewards.append(score.reward)
                steps_run += 1
                if not score.match:  # SOP: the episode ends at its first wrong step
                    break
                history.append(response)
                n_correct += 1
            reward_sum += sum(rewards)
            rec = {"source": path, "episode_id": ep.episode_id, "steps": len(ep.steps), "correct": n_correct,
                   "success": n_correct == len(ep.steps), "rewards": rewards}
            results.append(rec)
            if out:
                out.write(json.dumps(rec) + "\n")
            bar.update(1)
    bar.close()
    if out:
        out.close()

    # --- summary: last stdout line
    summary = sop_metrics([(r["correct"], r["steps"]) for r in results])
    summary.update({
        "policy": args.policy, "steps_run": steps_run, "step_reward_mean": reward_sum / max(steps_run, 1),
        "max_prompt_tokens_seen": max_tokens, "prompts_budgeted": n_budgeted,
        "prompts_over_budget": n_over, "seconds": round(time.time() - t0, 1),
        "sources": {path: sop_metrics([(r["correct"], r["steps"]) for r in results if r["source"] == path])
                    for path, _ in sources},
    })
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

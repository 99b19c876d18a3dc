"""Score recorded responses of any model with the rule reward (docs/method.md §4), step by step,
beside the trivial-policy floor of the same steps. Input lines: {episode_id, step (0-based),
response}, coordinates in pixels of the resized screenshot; output: one JSON line per response and
a summary (the last stdout line). Also reachable as `python eval_sop.py score ...`.

    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \\
        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import baselines
import cli
import dataset
import gui
import policies
import reward

input_file = cli.arg_type(cli.input_file)
size_arg = cli.arg_type(gui.parse_size)


def parser(prog: str = "score.py") -> argparse.ArgumentParser:
    p = cli.make_parser("Score recorded responses with the rule reward (docs/method.md §4). Input lines: "
                          "{episode_id, step (0-based), response}, coordinates in pixels of the resized screenshot.\n\n"
                          "    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \\\n"
                          "        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400",
                          prog=prog)
    p.add_argument("--data", nargs="+", required=True, type=input_file, help="episode files the responses refer to")
    p.add_argument("--responses", required=True, type=input_file, help="JSONL of responses; an optional field finish_reason ('length' "
                   "= cut at the token cap) or truncated (bool) makes the response malformed under the strict rules and is "
                   "counted into responses_at_cap; without it, text after </action> is what marks a malformed response")
    p.add_argument("--subset", action="store_true",
                   help="allow responses that cover only some steps (default: every step of --data must be scored)")
    p.add_argument("--match-rules", choices=reward.MATCH_RULES, default="strict",
                   help="strict (ours), release, or a published step protocol's (androidcontrol, aitw)")
    p.add_argument("--action-format", choices=list(policies.ADAPTERS), default="uis1",
                   help="the responses' model family (policies.py): each is translated into the evaluator's "
                   "format first (eval_sop.py --policy openai records them raw in OUT/responses.jsonl)")
    p.add_argument("--swipe-convention", choices=dataset.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared, or known for shipped files)")
    p.add_argument("--out", required=True, help="JSONL of scores, one line per response")
    p.add_argument("--image-size", type=size_arg, default=None,
                   help="WxH of the original screenshots, for steps that record no size")
    p.add_argument("--image-root", default=None, help="else read the size from the screenshot files here")
    p.add_argument("--min-pixels", type=cli.positive_int, default=gui.MIN_PIXELS, help="smart_resize min pixels the model saw")
    p.add_argument("--max-pixels", type=cli.positive_int, default=gui.MAX_PIXELS, help="smart_resize max pixels the model saw")
    return p


# -----------------------------------------------------------------------------
# scoring


def score(argv: list[str], prog: str = "score.py") -> dict:
    """Score recorded responses. Every response must name a step of --data; unless --subset, every
    step of --data must have at least one response (several per step are allowed). Raises
    dataset.DataError (a ValueError) naming the responses file, line and field, or the unscored steps."""
    args = parser(prog).parse_args(argv)
    index: dict[str, tuple[dataset.Episode, str]] = {}
    for path in args.data:
        for ep in dataset.load_episodes(path, swipe_convention=args.swipe_convention):
            if ep.episode_id in index:
                raise dataset.DataError(f"episode id {ep.episode_id!r} is in both {index[ep.episode_id][1]} and {path}; "
                                 "score one file at a time")
            index[ep.episode_id] = (ep, path)
    n = reward_sum = match = type_match = at_cap = malformed = 0
    per_step = Counter()
    rows = []
    with open(args.responses, encoding="utf-8") as fin:
        for lineno, line in enumerate(fin, start=1):
            if not line.strip():
                continue
            where = f"{args.responses}: line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise dataset.DataError(f"{where}: invalid JSON: {e.msg}") from None
            if not isinstance(rec, dict) or not {"episode_id", "step", "response"} <= rec.keys():
                raise dataset.DataError(f"{where}: expected an object with episode_id, step, response")
            ep_id, t = str(rec["episode_id"]), rec["step"]
            if ep_id not in index:
                raise dataset.DataError(f"{where}: field 'episode_id': unknown episode {ep_id!r} (not in {', '.join(args.data)})")
            ep = index[ep_id][0]
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < len(ep.steps):
                raise dataset.DataError(f"{where}: field 'step': episode {ep_id} has steps 0..{len(ep.steps) - 1}, got {t!r}")
            if not isinstance(rec["response"], str):
                raise dataset.DataError(f"{where}: field 'response': expected a string, got {type(rec['response']).__name__}")
            step = ep.steps[t]
            try:
                orig = dataset.original_size(step, image_root=args.image_root, blank_screens=args.image_size)
            except FileNotFoundError:
                raise dataset.DataError(f"{where}: episode {ep_id} step {t} records no screenshot size; pass --image-size WxH "
                                 "or --image-root DIR") from None
            resized = gui.resized_size(orig, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
            # a recorded finish reason, where the file has one; without it, trailing text after the
            # action is what marks a looping or overlong response (strict rules: malformed)
            cut = rec.get("finish_reason") == "length" or rec.get("truncated") is True
            text = policies.ADAPTERS[args.action_format].to_response(rec["response"], resized)
            s = reward.score_response(text, step, resized_size=resized, orig_size=orig, rules=args.match_rules,
                                   truncated=cut)
            rows.append({"episode_id": rec["episode_id"], "step": t, "reward": s.reward, "match": s.match,
                         "type_match": s.type_match, "format_ok": s.format_ok, "action": s.action, "error": s.error})
            n += 1
            reward_sum += s.reward
            match += s.match
            type_match += s.type_match
            at_cap += cut
            malformed += s.error is not None
            per_step[ep_id, t] += 1
    if n == 0:
        raise dataset.DataError(f"{args.responses}: no responses to score")
    total = sum(len(ep.steps) for ep, _ in index.values())
    missing = [(i, t) for i, (ep, _) in index.items() for t in range(len(ep.steps)) if (i, t) not in per_step]
    if missing and not args.subset:
        shown = ", ".join(f"{i}:{t}" for i, t in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise dataset.DataError(f"{args.responses}: {len(missing)} of {total} steps of {', '.join(args.data)} have no response "
                         f"(episode:step {shown}); pass --subset to score only the steps given")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fout:
        fout.writelines(cli.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    # the floor on the same steps, for the figure above
    eps = [ep for ep, _ in index.values()]
    sizes = baselines.step_sizes(eps, args.image_root, args.image_size)
    base = baselines.run_baselines(eps, sizes, args.match_rules)
    return {"responses": n, "reward_mean": reward_sum / n, "match_rate": match / n, "type_match_rate": type_match / n,
            "match_rules": args.match_rules, "steps_total": total, "steps_scored": len(per_step),
            "steps_unscored": len(missing), "responses_per_step_mean": n / len(per_step),
            "responses_per_step_max": max(per_step.values()), "responses_at_cap": at_cap,
            "truncated_rate": at_cap / n, "malformed_responses": malformed,
            "floor_step_sr": base["floor"]["step_sr"], "floor_type_acc": base["floor"]["type_acc"], "out": args.out}


def main(argv: list[str] | None = None, prog: str = "score.py") -> dict:
    summary = score(sys.argv[1:] if argv is None else list(argv), prog)
    print(cli.dumps(summary))
    return summary


if __name__ == "__main__":
    cli.run_script(main)

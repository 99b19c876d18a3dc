"""Trivial-policy floors: what a policy that never looks at the screen scores under the match rules
(docs/method.md §4). Every figure of eval_sop.py is printed beside the floor of its episodes: a
score is only as good as its distance from here.

    python eval_sop.py baselines --data data/android_control/android_control_test_uis1.jsonl
    python eval_sop.py baselines --data data/android_control/android_control_test_uis1.jsonl --match-rules release

The last stdout line is the JSON result (rates per policy and action type, and the floor).
"""

import argparse
import os
from collections import Counter

import cli
import dataset
import gui
import reward
from rollout import GROUNDING_TYPES, sop_metrics


def baselines_parser() -> argparse.ArgumentParser:
    p = cli.make_parser("Match rates of trivial policies per action type (the floor to put next to every score). "
                          "Last stdout line: JSON.\n\n"
                          "    python eval_sop.py baselines --data data/android_control/android_control_test_uis1.jsonl",
                          prog="eval_sop.py baselines")
    p.add_argument("--data", nargs="+", required=True, type=cli.arg_type(cli.input_file), help="episode files")
    p.add_argument("--match-rules", choices=reward.MATCH_RULES, default="strict", help="strict (ours) or release")
    p.add_argument("--swipe-convention", choices=dataset.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared, or known for shipped files)")
    p.add_argument("--image-root", default=None, help="screenshots folder (sizes are read from file headers)")
    p.add_argument("--image-size", type=cli.arg_type(gui.parse_size), default=dataset.ANDROID_CONTROL_SIZE,
                   help="WxH for steps with neither a recorded size nor a file (default 1080x2400, AndroidControl)")
    p.add_argument("--seed", type=cli.non_negative_int, default=0, help="seed of the random-click policy")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p


def trivial_policies(steps: list[tuple[dataset.Step, tuple[int, int]]], seed: int = 0) -> dict:
    """Trivial policies as {name: (action types it answers, fn(step, size) -> action in original
    pixels)}. Each answers with the step's own action type (an oracle for the type, so its rate
    isolates the arguments): clicks at the centre, uniformly at random, at the most frequent expert
    point (0.04 grid, read off the data); the constant texts "", "a", "e", "the", and each text
    type's most frequent content token (reward.content_tokens: stop words, which match nothing under
    the strict rules, left out) and text; each swipe direction; each system button. "most frequent
    type" answers every step with the data's most frequent action type and trivial arguments."""
    import random

    rng = random.Random(seed)
    by_rule = lambda rule: tuple(k for k, a in gui.ACTIONS.items() if a.rule == rule)  # noqa: E731 -- types a floor answers
    kinds = Counter(s.action["action"] for s, _ in steps)
    pts = Counter((round(s.action["coordinate"][0] / w / 0.04), round(s.action["coordinate"][1] / h / 0.04))
                  for s, (w, h) in steps if s.action["action"] in GROUNDING_TYPES)
    mode = pts.most_common(1)[0][0] if pts else (12, 12)
    pol = {
        "click centre": (GROUNDING_TYPES, lambda s, z: {"action": s.action["action"], "coordinate": [z[0] / 2, z[1] / 2]}),
        "click uniform random": (GROUNDING_TYPES, lambda s, z: {"action": s.action["action"],
                                                                 "coordinate": [rng.uniform(0, z[0]), rng.uniform(0, z[1])]}),
        "click most frequent point": (GROUNDING_TYPES, lambda s, z: {"action": s.action["action"], "coordinate":
                                                                      [mode[0] * 0.04 * z[0], mode[1] * 0.04 * z[1]]}),
    }
    texts = {}
    for kind in gui.TEXT_ACTIONS:
        vals = [s.action["text"] for s, _ in steps if s.action["action"] == kind]
        if vals:
            tok = Counter(t for v in vals for t in set(reward.content_tokens(v))).most_common(1)  # a stop word scores 0
            full = Counter(reward.normalize_text(v) for v in vals).most_common(1)
            texts[kind] = [c for c in (tok[0][0] if tok else None, full[0][0]) if c]
    for c in ("", "a", "e", "the"):
        pol[f"text {c!r}"] = (gui.TEXT_ACTIONS, lambda s, z, c=c: {"action": s.action["action"], "text": c})
    for kind, cands in texts.items():
        for label, c in zip(("most frequent token", "most frequent text"), cands):
            pol[f"{kind} {label} {c!r}"] = ((kind,), lambda s, z, c=c: {"action": kind, "text": c})
    for d, (a, b) in {"up": ((0.5, 0.75), (0.5, 0.25)), "down": ((0.5, 0.25), (0.5, 0.75)),
                      "left": ((0.75, 0.5), (0.25, 0.5)), "right": ((0.25, 0.5), (0.75, 0.5))}.items():
        pol[f"swipe {d}"] = (by_rule("direction"), lambda s, z, a=a, b=b: {"action": s.action["action"], "coordinate":
                             [a[0] * z[0], a[1] * z[1]], "coordinate2": [b[0] * z[0], b[1] * z[1]]})
    pol["type alone (wait, terminate)"] = (by_rule("type"), lambda s, z: {"action": s.action["action"]})
    for btn in gui.SYSTEM_BUTTONS:
        pol[f"button {btn}"] = (by_rule("button"), lambda s, z, btn=btn: {"action": s.action["action"], "button": btn})
    top = kinds.most_common(1)[0][0] if kinds else "click"
    trivial_args = {"click": {"coordinate": None}, "long_press": {"coordinate": None}, "type": {"text": "the"},
                    "answer": {"text": "the"}, "key": {"text": "the"}, "open": {"text": "the"},
                    "system_button": {"button": "Back"}, "swipe": {"coordinate": None, "coordinate2": None}}

    def most_frequent(s, z):
        a = {"action": top, **trivial_args.get(top, {})}
        if "coordinate" in a:
            a["coordinate"] = [z[0] / 2, z[1] * (0.75 if top == "swipe" else 0.5)]
        if "coordinate2" in a:
            a["coordinate2"] = [z[0] / 2, z[1] * 0.25]
        return a
    pol[f"most frequent type ({top})"] = (gui.ACTION_TYPES, most_frequent)
    return pol


def run_baselines(episodes: list[dataset.Episode], sizes: dict, rules: str = "strict", seed: int = 0) -> dict:
    """Match rates of trivial_policies on `episodes` (sizes: id(step) -> original (W, H)).
    Returns {"counts": steps per type, "rates": {policy: {type: rate}}, "floor": {...}} where floor
    is the best trivial policy per action type ("floor_by_type", with its name), the step success
    rate and SOP PG/TSR of the policy that uses that best one for every step of its type (a floor
    tuned on the data itself: an upper bound on what ignoring the screen can get), and the type
    accuracy of always answering the most frequent type."""
    steps = [(s, sizes[id(s)]) for ep in episodes for s in ep.steps]
    counts = Counter(s.action["action"] for s, _ in steps)
    pol = trivial_policies(steps, seed)
    hits = {name: Counter() for name in pol}
    per_step = {}  # (policy, id(step)) -> match, only for the types a policy answers
    for name, (types, fn) in pol.items():
        for s, z in steps:
            if s.action["action"] in types:
                ok = reward.action_match(fn(s, z), s.action, s.candidate_bbox, z, rules=rules)[0]
                hits[name][s.action["action"]] += ok
                per_step[name, id(s)] = ok
    rates = {name: {k: hits[name][k] / counts[k] for k in counts if k in types}
             for name, (types, _) in pol.items()}
    best = {}
    for k in counts:
        cands = [(r[k], name) for name, r in rates.items() if k in r and not name.startswith("most frequent type")]
        best[k] = max(cands) if cands else (0.0, None)
    best_ok = {id(s): per_step.get((best[s.action["action"]][1], id(s)), False) for s, _ in steps}
    progress = []
    for ep in episodes:
        c = 0
        while c < len(ep.steps) and best_ok[id(ep.steps[c])]:
            c += 1
        progress.append((c, len(ep.steps)))
    sop = sop_metrics(progress)
    top = next(name for name in pol if name.startswith("most frequent type"))
    floor = {"floor_by_type": {k: {"rate": v[0], "policy": v[1]} for k, v in best.items()},
             "step_sr": sum(best_ok.values()) / max(len(steps), 1), "sop_pg": sop["pg"], "sop_tsr": sop["tsr"],
             "type_acc": counts.most_common(1)[0][1] / len(steps) if steps else 0.0,
             "most_frequent_type_step_sr": sum(hits[top].values()) / max(len(steps), 1)}
    return {"rules": rules, "steps": len(steps), "episodes": len(episodes), "counts": dict(counts),
            "rates": rates, "floor": floor}


def format_baselines(res: dict) -> str:
    """The rates of run_baselines as a plain-text table (percent), one row per policy."""
    kinds = list(res["counts"])
    head = f"{'policy':<44}" + "".join(f"{k:>14}" for k in kinds)
    lines = [f"trivial-policy match rates (%), rules={res['rules']}, {res['steps']} steps", head,
             f"{'(steps)':<44}" + "".join(f"{res['counts'][k]:>14}" for k in kinds)]
    for name, r in res["rates"].items():
        lines.append(f"{name[:44]:<44}" + "".join(f"{100 * r[k]:>14.1f}" if k in r else f"{'':>14}" for k in kinds))
    f = res["floor"]
    lines.append(f"floor (best trivial per type): step SR {100 * f['step_sr']:.1f}%, SOP PG {100 * f['sop_pg']:.1f}%, "
                 f"TSR {100 * f['sop_tsr']:.1f}%; most frequent type: type acc {100 * f['type_acc']:.1f}%")
    return "\n".join(lines)


def step_sizes(episodes: list[dataset.Episode], image_root=None, blank_screens=None) -> dict:
    """id(step) -> original (W, H) by dataset.original_size (headers only)."""
    return {id(s): dataset.original_size(s, image_root=image_root, blank_screens=blank_screens)
            for ep in episodes for s in ep.steps}


def main(argv: list[str] | None = None) -> dict:
    """The `baselines` command: prints the rates table, then the JSON result; returns the result."""
    args = baselines_parser().parse_args(argv)
    episodes = [ep for path in args.data for ep in dataset.load_episodes(path, swipe_convention=args.swipe_convention)]
    res = run_baselines(episodes, step_sizes(episodes, args.image_root, args.image_size), args.match_rules, args.seed)
    res["data"] = list(args.data)
    print(format_baselines(res))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(cli.dumps(res, indent=1))
    print(cli.dumps(res))
    return res


if __name__ == "__main__":
    cli.run_script(main)

"""Dose-response of RL on the greedy policy: online success on the same test episodes at several RL
steps of several arms, against the starting (SFT) checkpoint, and the *conversion* of the episodes
the start could be flipped on.

Input: eval_sop.py --online result folders (their online_episodes.jsonl: one row per (task, seed)).
The start (`--start DIR`) should have been evaluated with `--samples K --temperature T`: its
flippable episodes (greedy fails, one of the K samples succeeds) are the ceiling of what RL can do to
the greedy policy (Yue et al. 2025, arXiv 2504.13837: RLVR raises pass@1 towards the start's pass@k).
For every checkpoint (`--point ARM STEP DIR`, repeatable) it reports, on the episodes every folder
played:
  - greedy success k/n with its 95% Wilson interval;
  - the paired difference to the start; when the keys' tasks carry a training-seed prefix ("s0:task",
    as runs/repro_main.py pools its seeds) the primary test is the paired t-test across those seeds
    (stats.seed_paired_t: diff_ci95, p_value, n_seeds); secondary, labelled so: the pooled bootstrap
    interval, exact McNemar p and discordant pairs (they ignore the seed spread);
  - conversion: of the start's flippable episodes, the fraction this checkpoint solves greedily;
    lost: of the start's greedy successes, the fraction it fails.
Writes OUT.json, OUT.md and OUT.png (success against RL step per arm, intervals as bars); prints the
JSON summary as its last line.

    python runs/dose_response.py --start out/eval/sft_test --point semionline 24 out/eval/semi_24 \\
        --point semionline 72 out/eval/semi_72 --point offline 72 out/eval/off_72 --out results/dose_response
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli  # noqa: E402
import utils  # noqa: E402
from evaluation.stats import paired_binary, seed_paired_t, wilson  # noqa: E402


def read_episodes(folder: str) -> dict[tuple[str, int], dict]:
    """{(task, seed): row} of an eval_sop.py --online folder's online_episodes.jsonl. Raises
    utils.UsageError (one line, exit 2) naming the file and line of a missing file, bad JSON or a row
    that is not {task: str, seed: int, success: bool[, sampled_success: [bool, ...]]}."""
    path = Path(folder) / "online_episodes.jsonl"
    if not path.is_file():
        raise utils.UsageError(f"{path}: no such file (run eval_sop.py --online --out {folder})")
    out = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise utils.UsageError(f"{path}: line {i}: invalid JSON ({e})") from None
        bad = ("not an object" if not isinstance(row, dict) else
               next((f"missing {k!r}" for k in ("task", "seed", "success") if k not in row), None))
        if bad is None:
            seed, sampled = row["seed"], row.get("sampled_success")
            if not isinstance(row["task"], str):
                bad = f"task {row['task']!r} is not a string"
            elif isinstance(seed, bool) or not isinstance(seed, int):
                bad = f"seed {seed!r} is not an integer"
            elif not isinstance(row["success"], bool):
                bad = f"success {row['success']!r} is not true/false"
            elif sampled is not None and not (isinstance(sampled, list) and all(isinstance(x, bool) for x in sampled)):
                bad = f"sampled_success {sampled!r} is not a list of true/false"
        if bad:
            raise utils.UsageError(f"{path}: line {i}: {bad} (expected task, seed, success)")
        out[(row["task"], row["seed"])] = row
    return out


def summarize(start: dict, points: list[tuple[str, int, dict]]) -> dict:
    """The dose-response table (module docstring) on the (task, seed) keys every folder holds.
    start: read_episodes of the start; points: (arm, step, read_episodes) per checkpoint. The start is
    each arm's step 0. Raises utils.UsageError when the folders share no episode."""
    keys = sorted(set(start).intersection(*(set(p[2]) for p in points)))
    if not keys:
        raise utils.UsageError("the folders share no (task, seed) episode")
    g0 = [int(bool(start[k]["success"])) for k in keys]
    samples = [start[k].get("sampled_success") for k in keys]
    flippable = [i for i, k in enumerate(keys) if not g0[i] and any(samples[i] or [])]
    solved = [i for i in range(len(keys)) if g0[i]]
    seed_of = np.array([k[0].split(":", 1)[0] if ":" in k[0] else "" for k in keys])  # the training seed, if pooled

    def row(arm, step, g):
        k = sum(g)
        lo, hi = wilson(k, len(g))
        out = {"arm": arm, "step": step, "successes": k, "episodes": len(g), "success": k / len(g), "ci95": [lo, hi]}
        if step > 0:
            cmp = paired_binary(g, g0, groups=seed_of)
            prim = seed_paired_t([np.mean(np.subtract(g, g0)[seed_of == sd]) for sd in np.unique(seed_of)])
            out.update(diff=cmp["diff"], diff_ci95=prim["diff_ci95"], p_value=prim["p_value"], n_seeds=prim["n_seeds"],
                       diff_ci95_bootstrap=cmp["diff_ci95"], p_bootstrap=cmp["p_value"], p_mcnemar=cmp["p_mcnemar"],
                       discordant=cmp["discordant"])
        out["converted"] = sum(g[i] for i in flippable)
        out["lost"] = sum(1 - g[i] for i in solved)
        return out

    rows = []
    for arm in dict.fromkeys(p[0] for p in points):
        rows.append(row(arm, 0, g0))
        for a, step, eps in sorted((p for p in points if p[0] == arm), key=lambda p: p[1]):
            rows.append(row(a, step, [int(bool(eps[k]["success"])) for k in keys]))
    per_task = {t: sum(g0[i] for i, k in enumerate(keys) if k[0] == t) for t in dict.fromkeys(k[0] for k in keys)}
    return {"episodes": len(keys), "tasks": sorted({k[0] for k in keys}), "start_successes_per_task": per_task,
            "start_sampled": any(s is not None for s in samples), "flippable": len(flippable),
            "start_successes": len(solved), "rows": rows}


def markdown(summary: dict) -> str:
    lines = [f"Dose-response on {summary['episodes']} test episodes ({', '.join(summary['tasks'])}); the start's "
             f"greedy successes {summary['start_successes']}, flippable {summary['flippable']}"
             + ("" if summary["start_sampled"] else " (the start was not evaluated with --samples)") + ".", "",
             "| arm | RL step | greedy success [95%] | vs start [95% t], p (t across seeds) | secondary: McNemar p "
             "| converted (of flippable) | lost (of start's successes) |",
             "|---|---|---|---|---|---|---|"]
    num = lambda v, spec: "n/a" if v is None or v != v else format(v, spec)  # noqa: E731 (None/nan: one seed)
    for r in summary["rows"]:
        vs = (f"{r['diff']:+.3f} [{num(r['diff_ci95'][0], '+.3f')}, {num(r['diff_ci95'][1], '+.3f')}], "
              f"p {num(r.get('p_value'), '.2g')} | {num(r.get('p_mcnemar'), '.2g')}" if r["step"] else " |")
        lines.append(f"| {r['arm']} | {r['step']} | {r['successes']}/{r['episodes']} = {r['success']:.3f} "
                     f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {vs} | {r['converted']}/{summary['flippable']} | "
                     f"{r['lost']}/{summary['start_successes']} |")
    return "\n".join(lines) + "\n"


def plot(path: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for j, arm in enumerate(dict.fromkeys(r["arm"] for r in summary["rows"])):
        rs = [r for r in summary["rows"] if r["arm"] == arm]
        x = [r["step"] + 0.6 * j for r in rs]  # a small offset: the arms' bars do not hide each other
        y = [r["success"] for r in rs]
        # bars from the interval (eval_sop.wilson keeps lo <= k/n <= hi; max() guards a figure from an older JSON)
        err = [[max(0.0, r["success"] - r["ci95"][0]) for r in rs], [max(0.0, r["ci95"][1] - r["success"]) for r in rs]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=arm)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"greedy online success ({summary['episodes']} test episodes)")
    ax.set_title("dose-response (95% Wilson intervals)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def point_step(text: str) -> int:
    """An RL step of --point: an integer >= 1 (the start is every arm's step 0)."""
    try:
        v = int(text)
    except ValueError:
        raise utils.UsageError(f"STEP {text!r} is not an integer") from None
    if v < 1:
        raise utils.UsageError(f"STEP {v}: must be >= 1 (the start, --start, is step 0)")
    return v


def main(argv=None) -> dict:
    p = cli.make_parser(__doc__)
    p.add_argument("--start", required=True, type=cli.arg_type(cli.input_dir),
                   help="eval_sop.py --online folder of the starting checkpoint (with --samples)")
    p.add_argument("--point", nargs=3, action="append", required=True, metavar=("ARM", "STEP", "DIR"),
                   help="an RL checkpoint's eval_sop.py --online folder, its arm name and RL step >= 1 (repeatable)")
    p.add_argument("--out", required=True, help="output path without suffix (.json, .md, .png are written)")
    args = p.parse_args(argv)
    # every input is read and checked, and --out's folder found writable, before a file is written
    points = []
    for arm, step, folder in args.point:
        try:
            points.append((arm, point_step(step), read_episodes(folder)))
        except utils.UsageError as e:
            p.error(f"--point {arm} {step} {folder}: {e}")
    summary = summarize(read_episodes(args.start), points)
    out = Path(args.out)
    parent = next((d for d in [out.parent, *out.parent.parents] if d.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise utils.UsageError(f"--out {args.out}: {parent} is not a writable folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(out.with_suffix(".png"), summary)  # first: a figure that cannot be drawn leaves no half-written result
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    out.with_suffix(".md").write_text(markdown(summary))
    print(markdown(summary))
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    cli.run_script(main)

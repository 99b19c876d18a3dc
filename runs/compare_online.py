"""Paired comparison of two arms' greedy online episodes, task by task.

Two checkpoints that played the same MiniWob++ episodes (same tasks, same seeds: eval_sop.py
--online with the same --online-tasks/--online-seeds/--online-seed-base) can be compared episode by
episode: only the pairs where one succeeded and the other failed carry information (exact McNemar
test, evaluation/stats.py). Arms with several training seeds pair run i of A with run i of B and pool the
pairs; the interval of the pooled difference resamples seeds, then episodes (stats.paired_bootstrap).

    python runs/compare_online.py --a out/eval/rl_s0 out/eval/rl_s1 --b out/eval/sft_s0 out/eval/sft_s1 \
        --names semionline sft --out results/compare.json

Each folder is an eval_sop.py --out folder (its online_episodes.jsonl is read). Prints a Markdown table
(per task and pooled: successes of A and B, pairs where only A / only B succeeded, McNemar p, the
difference with its 95% interval) and writes it with the inputs to --out (JSON) when given.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # runs/, the repo
from evaluation.stats import paired_binary  # noqa: E402
import cli  # noqa: E402
from envs import miniwob_tasks  # noqa: E402


def load_online(folder: Path) -> dict[tuple[str, int], bool]:
    """{(task, seed): success} from folder/online_episodes.jsonl (written by eval_sop.py --online).
    Raises FileNotFoundError when the file is missing, ValueError (file:line) on a record without
    task, seed or success, or a (task, seed) seen twice."""
    path = Path(folder) / "online_episodes.jsonl"
    out: dict[tuple[str, int], bool] = {}
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        missing = [k for k in ("task", "seed", "success") if k not in rec]
        if missing:
            raise ValueError(f"{path}:{i + 1}: online episode has no field(s) {missing}")
        key = (rec["task"], int(rec["seed"]))
        if key in out:
            raise ValueError(f"{path}:{i + 1}: episode {key} appears twice")
        out[key] = bool(rec["success"])
    return out


def compare(a_runs: list[dict], b_runs: list[dict], tasks: list[str] | None = None) -> dict:
    """Pair a_runs[i] with b_runs[i] ({(task, seed): success} each, the same keys within a pair) and
    compare per task and pooled. Returns {"tasks": {task: row}, "pooled": row}, a row being
    {n, a, b, only_a, only_b, mcnemar_p, diff, diff_ci95}: n paired episodes, a/b successes, diff =
    (a - b) / n with its 95% interval (seeds then episodes resampled when there are >= 2 pairs of runs).
    tasks: compare only these (None: all); a run may then hold other tasks the other run did not play.
    Raises ValueError when the lists differ in length or a pair did not play the same episodes."""
    if len(a_runs) != len(b_runs) or not a_runs:
        raise ValueError(f"compare: {len(a_runs)} runs of A against {len(b_runs)} of B (need the same number, >= 1)")
    pairs = []  # (task, run index, a, b)
    for r, (ra, rb) in enumerate(zip(a_runs, b_runs)):
        if tasks is not None:
            ra, rb = ({k: v for k, v in run.items() if k[0] in tasks} for run in (ra, rb))
        if set(ra) != set(rb) or not ra:
            diff = sorted(set(ra) ^ set(rb))[:3]
            raise ValueError(f"compare: run pair {r} did not play the same episodes (e.g. {diff})")
        pairs += [(task, r, int(ra[(task, s)]), int(rb[(task, s)])) for task, s in sorted(ra)]

    def row(sel):
        a, b = np.array([p[2] for p in sel]), np.array([p[3] for p in sel])
        c = paired_binary(a, b, groups=np.array([p[1] for p in sel]))
        return {"n": len(sel), "a": int(a.sum()), "b": int(b.sum()), "only_a": c["discordant"][0],
                "only_b": c["discordant"][1], "mcnemar_p": c["p_mcnemar"], "diff": c["diff"], "diff_ci95": c["diff_ci95"]}

    names = sorted({p[0] for p in pairs})
    return {"tasks": {t: row([p for p in pairs if p[0] == t]) for t in names}, "pooled": row(pairs)}


def markdown(res: dict, name_a: str, name_b: str) -> str:
    head = (f"| task | n | {name_a} | {name_b} | only {name_a} | only {name_b} | McNemar p | diff [95% CI] |\n"
            "|---|---|---|---|---|---|---|---|\n")
    fmt = lambda t, r: (f"| {t} | {r['n']} | {r['a']} | {r['b']} | {r['only_a']} | {r['only_b']} | "  # noqa: E731
                        f"{r['mcnemar_p']:.3g} | {r['diff']:+.3f} [{r['diff_ci95'][0]:+.3f}, {r['diff_ci95'][1]:+.3f}] |")
    rows = [fmt(t, r) for t, r in res["tasks"].items()] + [fmt("**pooled**", res["pooled"])]
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> dict:
    ap = cli.make_parser(__doc__)
    ap.add_argument("--a", nargs="+", required=True, help="eval_sop.py --out folders of arm A (one per training seed)")
    ap.add_argument("--b", nargs="+", required=True, help="the same for arm B, in the same seed order")
    ap.add_argument("--names", nargs=2, default=["A", "B"], help="the two arms' names in the table")
    ap.add_argument("--tasks", nargs="+", type=miniwob_tasks.miniwob_task, default=None, help="compare only these tasks (default: every task played)")
    ap.add_argument("--out", default=None, help="write the result (JSON) here")
    args = ap.parse_args(argv)
    res = compare([load_online(Path(f)) for f in args.a], [load_online(Path(f)) for f in args.b], tasks=args.tasks)
    print(markdown(res, *args.names))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"a": args.a, "b": args.b, "names": args.names, "only_tasks": args.tasks, **res},
                                             indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()

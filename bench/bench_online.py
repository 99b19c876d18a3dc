"""Benchmark: online MiniWob++ evaluation, episodes one at a time against --online-batch at a time.

With --online-batch K, eval_sop.py keeps K live episodes in flight (one headless Chromium each) and
answers their K prompts in one generate call of the sampler; episodes one at a time make one call
per step of each. This script runs eval_sop.py's main() on the same model and the same online
episodes once per batch size, alternating, and prints per episode: wall seconds, the policy's share
(prompt building + generate) and the environment's (the rest: browser starts, resets, steps and
screenshots, the browsers of a batch in threads), the speedup of every batch size against the
first, and whether every episode ended the same way.

    python bench/bench_online.py --model out/repro/sft/<run>/ckpt/step_000300   # the reproduction's selection episodes
    python bench/bench_online.py --model out/sft/ckpt --tasks click-test click-button --seeds 8
The last stdout line is one JSON object.
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
from envs import miniwob_tasks  # noqa: E402

# runs/repro_main.py's selection episodes: its 8 tasks, 13 seeds each from 200000, 10 steps at most
TASKS = ["enter-text", "enter-password", "login-user", "click-checkboxes", "click-tab-2", "click-option",
         "click-button-sequence", "click-collapsible"]


def main(argv=None) -> dict:
    ap = cli.make_parser(__doc__)
    ap.add_argument("--model", required=True, help="a checkpoint folder (or a folder with a `latest` pointer)")
    ap.add_argument("--tasks", nargs="+", type=miniwob_tasks.miniwob_task, default=TASKS, help="MiniWob++ tasks")
    ap.add_argument("--seeds", type=cli.positive_int, default=13, help="episodes per task, from seed 200000")
    ap.add_argument("--max-steps", type=cli.positive_int, default=10)
    ap.add_argument("--max-new-tokens", type=cli.positive_int, default=80)
    ap.add_argument("--batches", type=cli.positive_int, nargs="+", default=[1, 8], help="batch sizes, the first is the baseline")
    ap.add_argument("--repeats", type=cli.positive_int, default=1, help="runs per batch size, alternating")
    args = ap.parse_args(argv)

    import eval_sop

    runs = {b: [] for b in args.batches}
    for _ in range(args.repeats):
        for b in args.batches:
            with tempfile.TemporaryDirectory() as out:
                s = eval_sop.main(["--policy", "model", "--model", args.model, "--online", "--online-tasks", *args.tasks,
                                   "--online-seeds", str(args.seeds), "--online-max-steps", str(args.max_steps),
                                   "--max-new-tokens", str(args.max_new_tokens), "--online-batch", str(b),
                                   "--report-episodes", "0", "--out", out])
                eps = [json.loads(line) for line in open(Path(out) / "online_episodes.jsonl", encoding="utf-8")]
            wall = sum(e["seconds"] for e in eps)
            pol = sum(e["policy_seconds"] for e in eps)
            runs[b].append({"s_per_episode": wall / len(eps), "policy_s_per_episode": pol / len(eps),
                            "env_s_per_episode": (wall - pol) / len(eps), "online_sr": s["online_sr"],
                            "steps": sum(e["steps"] for e in eps),
                            "ends": [(e["task"], e["seed"], e["cause"], e["steps"]) for e in eps]})
    base = args.batches[0]
    best = {b: min(rs, key=lambda r: r["s_per_episode"]) for b, rs in runs.items()}
    result = {"model": args.model, "episodes": len(args.tasks) * args.seeds,
              "same_outcomes": all(r["ends"] == runs[base][0]["ends"] for rs in runs.values() for r in rs)}
    print(f"{'batch':>5} {'s/episode':>10} {'policy s':>9} {'env s':>7} {'speedup':>8} {'online SR':>9}")
    for b, r in best.items():
        speedup = best[base]["s_per_episode"] / r["s_per_episode"]
        print(f"{b:>5} {r['s_per_episode']:>10.3f} {r['policy_s_per_episode']:>9.3f} {r['env_s_per_episode']:>7.3f} "
              f"{speedup:>7.2f}x {r['online_sr']:>9.3f}")
        result[f"batch_{b}"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k != "ends"}
        result[f"batch_{b}"]["speedup"] = round(speedup, 3)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

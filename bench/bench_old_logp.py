"""Benchmark: what --old-logp sampler saves in a semi-online RL step on CPU.

pi_old, the denominator of the PPO ratio, is either recomputed by one no-grad forward of the policy
over the step's batch (the release's way) or taken from the log-probs the sampler already computed
for the sampled tokens (same weights, same temperature; fp32 on CPU). This script runs
train_semionline.py's main() with each, alternating, from the same checkpoint and seed (so each pair
of runs rolls out the same tasks), and prints the per-step phase seconds (medians over the steps
after the first of each run) and the ratio recompute / sampler of the logp phase and of the step.

    python bench/bench_old_logp.py --model out/repro/sft/<run>/ckpt/step_000300 \\
        --data out/repro/data/rl_8t.jsonl --image-root data/miniwob     # the reproduction's setting
Any further flag goes to train_semionline.py (default: the reproduction's RL flags below).
The last stdout line is one JSON object.
"""
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402

# runs/repro_main.py's RL setting (semi-online arm)
RL = ["--tasks-per-step", "4", "--n-rollouts", "4", "--max-new-tokens", "80", "--temperature", "0.5",
      "--filter-std", "0", "--kl-coef", "0.05", "--lr", "6e-5", "--history", "own"]
PHASES = ("time_rollout_s", "time_logp_s", "time_update_s", "time_s")


def main(argv=None) -> dict:
    ap = cli.make_parser(__doc__)
    ap.add_argument("--model", required=True, help="an RL starting checkpoint (an SFT checkpoint folder)")
    ap.add_argument("--data", required=True, help="RL episodes")
    ap.add_argument("--image-root", default=None)
    ap.add_argument("--steps", type=cli.positive_int, default=3, help="RL steps per run (the first is not timed)")
    ap.add_argument("--repeats", type=cli.positive_int, default=1, help="runs per mode, alternating")
    args, extra = ap.parse_known_args(argv)
    import torch

    import train_semionline

    torch.set_num_threads(1)
    base = ["--model", args.model, "--data", args.data, "--max-steps", str(args.steps), "--seed", "0"] + \
        (["--image-root", args.image_root] if args.image_root else []) + (extra or RL)
    runs = {"recompute": [], "sampler": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode in runs:
                out = Path(tmp) / f"{mode}_{r}"
                train_semionline.main(base + ["--old-logp", mode, "--out", str(out)])
                rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
                runs[mode] += rows[1:]  # step 1 pays first-call costs
    med = {m: {p: statistics.median(r[p] for r in rows) for p in PHASES} for m, rows in runs.items()}
    res = {"seconds": med, "steps_timed": {m: len(r) for m, r in runs.items()},
           "logp_ratio": med["recompute"]["time_logp_s"] / med["sampler"]["time_logp_s"],
           "step_ratio": med["recompute"]["time_s"] / med["sampler"]["time_s"],
           "reward_mean": {m: statistics.mean(r["reward_mean"] for r in rows) for m, rows in runs.items()},
           "sampler_logp_gap_max": max(r["sampler_logp_gap"] or 0.0 for rows in runs.values() for r in rows),
           "argv": base}
    for m in runs:
        print(f"{m:9s} " + "  ".join(f"{p[5:-2]} {med[m][p]:5.2f} s" for p in PHASES))
    print(f"recompute / sampler: logp phase {res['logp_ratio']:.2f}x, step {res['step_ratio']:.2f}x")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()

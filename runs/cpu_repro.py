"""CPU-scale reproduction of the UI-S1 pipeline on MiniWob++: a tiny Qwen2.5-VL
learns MiniWob++ tasks by SFT, then semi-online RL (and, for comparison, offline RL with
expert history), and every checkpoint is measured by SOP, static step success and online
success in the live environment. Writes results/cpu_repro.{json,md} and the plots.

    python runs/cpu_repro.py                 # the whole pipeline, ~35 minutes on 2 CPU cores
    python runs/cpu_repro.py --stages eval   # re-run only the evaluation of existing checkpoints

Every stage is a plain call of the stage scripts (printed before it runs), so each line of
the table can be reproduced by hand. A stage whose output exists is skipped (--force redoes it).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import cli  # noqa: E402
import utils  # noqa: E402

STAGES = ("data", "sft", "rl", "eval", "report")
parser = cli.make_parser(__doc__)
parser.add_argument("--out", default="out/repro", help="where checkpoints and eval outputs go")
parser.add_argument("--results", default="results", help="where the committed results land")
parser.add_argument("--stages", default="data,sft,rl,eval,report", help="comma list of stages to run")
parser.add_argument("--force", action="store_true", help="redo stages whose outputs exist")
parser.add_argument("--nproc", type=int, default=2, help="torchrun processes for RL")
parser.add_argument("--sft-steps", type=int, default=400, help="SFT optimizer steps")
parser.add_argument("--sft-lr", type=float, default=5e-3, help="SFT peak learning rate (tiny model)")
parser.add_argument("--rl-steps", type=int, default=16, help="RL steps for each RL run")
parser.add_argument("--rl-lr", type=float, default=1e-4, help="RL learning rate (tiny model)")
parser.add_argument("--eval-per-task", type=int, default=3, help="held-out test episodes per task for SOP and static metrics")
parser.add_argument("--eval-jobs", type=int, default=2, help="evaluations run at once")
parser.add_argument("--online-seeds", type=int, default=1, help="held-out online seeds per MiniWob++ task")
parser.add_argument("--seed", type=int, default=0, help="seed of every stage")
args = parser.parse_args()
if set(args.stages.split(",")) - set(STAGES):
    parser.error(f"--stages {args.stages}: unknown stage(s) {sorted(set(args.stages.split(',')) - set(STAGES))}; "
                 f"known: {','.join(STAGES)}")

out = REPO / args.out
results = REPO / args.results
stages = set(args.stages.split(","))
py = sys.executable
log = []


def run(cmd: list[str], done: Path | None = None) -> None:
    """Run one stage command from the repo root, unless `done` already exists."""
    if done is not None and done.exists() and not args.force:
        print(f"[skip] {' '.join(cmd)}  ({done} exists)", flush=True)
        return
    print(f"[run] {' '.join(cmd)}", flush=True)
    t = time.time()
    subprocess.run(cmd, cwd=REPO, check=True)
    log.append({"cmd": " ".join(cmd), "wall_s": round(time.time() - t, 1)})


def ckpt(run_dir: Path) -> str:
    from utils import latest_checkpoint
    c = latest_checkpoint(run_dir / "ckpt")
    if c is None:
        raise SystemExit(f"no checkpoint in {run_dir}/ckpt")
    return str(c.relative_to(REPO))


t0 = time.time()
test = "data/miniwob/test.jsonl"
rl_common = ["--max-steps", str(args.rl_steps), "--lr", str(args.rl_lr), "--seed", str(args.seed),
             "--tasks-per-step", "4", "--n-rollouts", "4", "--max-new-tokens", "80",
             # a tiny model's step-0 returns rarely differ by the release's 0.3: keep every task that varies at all
             "--filter-std", "0"]
torchrun = [py, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}"]

# --- data: the committed MiniWob++ demonstrations, or regenerate them
if "data" in stages:
    run([py, "make_miniwob_data.py"], done=REPO / "data/miniwob/manifest.json")

# --- SFT on expert demonstrations
if "sft" in stages:
    run([py, "train_sft.py", "--out", f"{args.out}/sft", "--max-steps", str(args.sft_steps), "--lr", str(args.sft_lr),
         "--eval-every", "100", "--seed", str(args.seed)], done=out / "sft/ckpt/latest")

# --- RL from the SFT checkpoint: semi-online (own history) and offline (expert history)
if "rl" in stages:
    sft = ckpt(out / "sft")
    run(torchrun + ["train_semionline.py", "--model", sft, "--out", f"{args.out}/semionline"] + rl_common,
        done=out / "semionline/ckpt/latest")
    run(torchrun + ["train_semionline.py", "--model", sft, "--history", "expert", "--out", f"{args.out}/offline"] + rl_common,
        done=out / "offline/ckpt/latest")

# --- evaluate every checkpoint: SOP, static, online
CHECKPOINTS = [("base (untrained)", "tiny"), ("SFT", "sft"), ("SFT + offline RL", "offline"),
               ("SFT + semi-online RL", "semionline")]
if "eval" in stages:
    # the four evaluations are independent: run them --eval-jobs at a time (1 thread each)
    pending = []
    for name, key in CHECKPOINTS:
        model = "tiny" if key == "tiny" else ckpt(out / key)
        res_dir = out / "eval" / (key if key != "tiny" else "base")
        cmd = [py, "eval_sop.py", "--policy", "model", "--model", model, "--data", test,
               "--per-task-limit", str(args.eval_per_task), "--elements", "--protocol", "sop", "static",
               "--online", "--online-seeds", str(args.online_seeds), "--online-max-steps", "8",
               "--max-new-tokens", "80", "--out", str(res_dir.relative_to(REPO))]
        if (res_dir / "result.json").exists() and not args.force:
            print(f"[skip] {' '.join(cmd)}", flush=True)
        else:
            pending.append((cmd, res_dir))
    running = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < args.eval_jobs:
            cmd, res_dir = pending.pop(0)
            res_dir.mkdir(parents=True, exist_ok=True)
            print(f"[run] {' '.join(cmd)}", flush=True)
            running.append((cmd, time.time(), subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(res_dir / "log.txt", "w"),
                                                                stderr=subprocess.STDOUT)))
        time.sleep(2)
        for item in list(running):
            cmd, t, p = item
            if p.poll() is not None:
                running.remove(item)
                if p.returncode != 0:
                    raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
                log.append({"cmd": " ".join(cmd), "wall_s": round(time.time() - t, 1)})


# --- report: table, R^2, plots
def r2(xs, ys):
    """Squared Pearson correlation = R^2 of the least-squares line of ys on xs."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return float("nan") if sxx == 0 or syy == 0 else sxy * sxy / (sxx * syy)


def se(p, n):
    """Binomial standard error of a rate p over n trials."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def scatter(path, series, xlabel, ylabel):
    """A small scatter plot drawn with PIL (no plotting library needed). series: [(label, colour, [(x, y, name)])]."""
    from PIL import Image, ImageDraw
    W, H, m = 640, 480, 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([m, m // 2, W - m // 2, H - m], outline="black")
    for i in range(6):
        v = i / 5
        x = m + v * (W - 1.5 * m)
        y = H - m - v * (H - 1.5 * m)
        d.text((x - 8, H - m + 6), f"{v:.1f}", fill="black")
        d.text((m - 30, y - 6), f"{v:.1f}", fill="black")
    d.text((W // 2 - 60, H - 25), xlabel, fill="black")
    d.text((5, 5), ylabel, fill="black")
    for k, (label, colour, pts) in enumerate(series):
        d.text((W - 260, 40 + 16 * k), f"o {label}", fill=colour)
        for x, y, name in pts:
            px, pyy = m + x * (W - 1.5 * m), H - m - y * (H - 1.5 * m)
            d.ellipse([px - 5, pyy - 5, px + 5, pyy + 5], outline=colour, width=2)
            d.text((px + 7, pyy - 7), name, fill=colour)
    img.save(path)


def curve(path, ys, label):
    from PIL import Image, ImageDraw
    W, H, m = 640, 320, 50
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([m, 20, W - 20, H - m], outline="black")
    if ys:
        lo, hi = min(ys), max(ys)
        hi = hi if hi > lo else lo + 1e-6
        pts = [(m + i * (W - m - 20) / max(len(ys) - 1, 1), H - m - (y - lo) / (hi - lo) * (H - m - 20)) for i, y in enumerate(ys)]
        d.line(pts, fill="blue", width=2)
        d.text((5, 20), f"{hi:.3f}", fill="black")
        d.text((5, H - m - 10), f"{lo:.3f}", fill="black")
    d.text((W // 2 - 80, H - 30), label, fill="black")
    img.save(path)


def stage_seconds() -> float:
    """Wall time of the pipeline as the sum of its stages' own clocks: the last `t` of each
    training metrics.jsonl and each evaluation's `seconds` (evaluations run --eval-jobs at a
    time, so this is an upper bound), plus the data stage when it ran here."""
    total = sum(e["wall_s"] for e in log if "make_miniwob_data" in e["cmd"])
    for key in ("sft", "semionline", "offline"):
        mf = out / key / "metrics.jsonl"
        if mf.exists() and mf.read_text().strip():
            total += json.loads(mf.read_text().strip().splitlines()[-1])["t"]
    for f in (out / "eval").glob("*/result.json"):
        total += json.loads(f.read_text()).get("seconds", 0.0)
    return round(total, 1)


if "report" in stages:
    results.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, key in CHECKPOINTS:
        f = out / "eval" / (key if key != "tiny" else "base") / "result.json"
        if not f.exists():
            print(f"[report] missing {f}; skipped", flush=True)
            continue
        r = json.loads(f.read_text())
        rows.append({"name": name, "sop_pg": r["sop_pg"], "sop_tsr": r["sop_tsr"],
                     "static_step_sr": r["static_step_sr"], "online_sr": r["online_sr"],
                     "n_online_episodes": r["n_online_episodes"], "n_sop_episodes": r.get("episodes"),
                     "n_static_steps": r.get("static_steps", r.get("steps"))})
    xs_sop = [r["sop_pg"] for r in rows]
    xs_static = [r["static_step_sr"] for r in rows]
    ys = [r["online_sr"] for r in rows]
    import subprocess as sp
    commit = sp.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    summary = {
        "command": "python runs/cpu_repro.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "checkpoints": rows,
        "r2_sop_online": r2(xs_sop, ys),
        "r2_static_online": r2(xs_static, ys),
        "wall_s": stage_seconds(),  # summed over stages from their own logs (the run may be split)
        "stages": log,
        "config": vars(args),
    }
    (results / "cpu_repro.json").write_text(utils.dumps(summary, indent=2))
    # RL reward curves
    for key in ("semionline", "offline"):
        mf = out / key / "metrics.jsonl"
        if mf.exists():
            rew = [json.loads(l)["reward_mean"] for l in mf.read_text().splitlines() if l.strip()]
            curve(results / f"cpu_repro_reward_{key}.png", rew, f"{key}: mean step reward per RL step")
    scatter(results / "cpu_repro_scatter.png",
            [("SOP-PG vs online", "blue", [(x, y, r["name"].split(" ")[-2] if len(r["name"].split()) > 1 else r["name"]) for x, y, r in zip(xs_sop, ys, rows)]),
             ("static step SR vs online", "red", [(x, y, "") for x, y in zip(xs_static, ys)])],
            "metric (SOP-PG blue, static step SR red)", "online success rate")
    lines = ["| checkpoint | SOP-PG | SOP-TSR | static step SR | online SR (± s.e.) | online episodes |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['sop_pg']:.3f} | {r['sop_tsr']:.3f} | {r['static_step_sr']:.3f} | "
                     f"{r['online_sr']:.3f} ± {se(r['online_sr'], r['n_online_episodes']):.3f} | {r['n_online_episodes']} |")
    lines.append("")
    lines.append(f"R^2 (SOP-PG vs online) = {summary['r2_sop_online']:.3f}; "
                 f"R^2 (static step SR vs online) = {summary['r2_static_online']:.3f}; wall {summary['wall_s']:.0f} s")
    (results / "cpu_repro.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    print(utils.dumps({k: summary[k] for k in ("r2_sop_online", "r2_static_online", "wall_s")}), flush=True)

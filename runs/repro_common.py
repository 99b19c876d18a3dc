"""Shared machinery of the MiniWob++ reproduction scripts (runs/repro_main.py, runs/repro_ablations.py).

Five parts, top to bottom:
1. statistics, in evaluation/stats.py (numpy only): Wilson intervals, the exact McNemar test, a paired
   (two-level) bootstrap of a difference, R^2 of a least-squares line with a bootstrap interval over
   checkpoints, and the data-scaling law y = A - B * N^k fitted by profile least squares, with a
   bootstrap interval on k;
2. stages: every stage is a printed command of a stage script (train_sft.py, train_semionline.py,
   eval_sop.py), logged to a file, run in a small pool of one-thread processes, skipped when its
   output exists (a run folder's name carries a hash of its command, so a changed setting never
   reuses a stale run);
3. checkpoint rows: one evaluated checkpoint -> the metrics of the results schema plus its
   per-episode online outcomes on the shared (task, seed) list, so every comparison is paired;
4. report (runs/repro_report.py: comparisons, verdicts, results JSON + Markdown twin, figures, schema
   check) and the wall-time estimate from measured unit costs;
5. the pipeline both scripts share: the SETTING-driven CLI, task-subset data files, and the
   SFT / RL / eval stage commands.

The results schema (both scripts; `validate_results` checks it):
    command, commit, seeds, wall_s, config, online_episodes [[task, seed], ...],
    checkpoints [{name, arm, seed, step, final, run, sop_pg, sop_tsr, static_step_sr, online_sr,
                  online_sr_ci95 [lo, hi], n_online_episodes, online_outcomes "0110..."}],
    r2_sop_online, r2_sop_online_ci95, r2_static_online, r2_static_online_ci95,
    comparisons [{a, b, metric, diff, diff_ci95, p_value, test, ...}], claims [{claim, verdict, ...}]
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# -----------------------------------------------------------------------------
# 1. statistics (evaluation/stats.py; the repository root and runs/ are on sys.path: see the scripts)

from evaluation.stats import wilson  # noqa: E402
# the report half; its names are also the scripts' rc.* (rc.verdict, rc.write_results, ...)
from repro_report import (ALPHA, _nan_to_none, arm_summaries, compare_curves, compare_online, final_rows,  # noqa: E402,F401
                          markdown, plot_bars, plot_curves, plot_r2, plot_scaling, primary_test_fpr, r2_summary,
                          rl_diagnostics, validate_results, verdict, write_results)

# -----------------------------------------------------------------------------
# 2. stages


def command_line(script: str, argv: list[str] | None) -> str:
    """The command a results file records, copy-pasteable in a shell: `python runs/SCRIPT` and the
    arguments (sys.argv[1:] when argv is None), each quoted as the shell needs (an --rl-extra value
    with spaces stays one argument)."""
    return f"python runs/{script} " + shlex.join(sys.argv[1:] if argv is None else argv)


def git_commit() -> str:
    """HEAD's hash, with "-dirty" when a tracked file outside results/ differs from it (the run's own
    results files, written as it goes, do not make the code that produced them dirty)."""
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                           cwd=REPO, capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("-dirty" if dirty else "")


def read_previous(path: Path) -> dict | None:
    """The results file a run is about to overwrite (None if absent), read before its first write."""
    return json.loads(path.read_text()) if path.exists() else None


def reused_stages(skipped: list[str], old: dict | None) -> list[dict]:
    """Provenance of the stages this run reused: the stage-log entries ({name, cmd, wall_s}, plus the
    commit that ran them) of the previous results `old` (read_previous), and of the runs it reused in
    turn, whose command (the interpreter's path aside) is one of the `skipped` commands of this run."""
    if not old:
        return []
    strip = lambda cmd: cmd.split(" ", 1)[-1]  # noqa: E731  (the python path differs between clones)
    want = {strip(c) for c in skipped}
    entries = [{**e, "commit": old.get("commit")} for e in old.get("stages") or []] + list(old.get("reused_stages") or [])
    return [e for e in entries if strip(e["cmd"]) in want]


def run_dir(root: Path, name: str, cmd: list[str]) -> Path:
    """root/name_<hash of cmd>: a run folder named by what produced it, so a changed setting (steps,
    lr, data, model) gets a new folder and identical commands from either script share one."""
    h = hashlib.sha1(" ".join(cmd[1:]).encode()).hexdigest()[:8]  # not the interpreter path
    return root / f"{name}_{h}"


class Stages:
    """Runs stage commands from the repo root in a pool of `jobs` processes (OMP_NUM_THREADS =
    `threads` each), skipping a job whose `done` file exists (unless force) and adding `--resume` to
    a training job interrupted after a checkpoint (its `resume` file exists). Every job prints its
    command, logs stdout+stderr to its folder's log.txt and records its wall and CPU seconds in self.log
    (CPU: user + system of the process and the children it waited for; a one-thread training stage's CPU
    seconds are its wall time on an idle core, whatever else shared the machine).
    The cores are `jobs` x `threads`, and a call of run() keeps them busy: fewer jobs than `jobs` get the
    spare cores as threads (the shared base alone: 2 threads, ~1.5x faster on 2 cores, bit-identical
    weights), and more jobs than `jobs` but fewer than twice as many start together and share the
    cores (3 SFT runs on 2 cores: 1.5 run-lengths, not 2 with one core idle in the second).
    A failed job raises SystemExit naming its command and log."""

    def __init__(self, jobs: int = 2, threads: int = 1, force: bool = False, dry_run: bool = False):
        self.jobs, self.threads, self.force, self.dry_run = jobs, threads, force, dry_run
        self.log: list[dict] = []
        self.skipped: list[str] = []  # commands of the jobs skipped as done (outputs reused)

    def slots(self, n: int) -> tuple[int, int]:
        """(processes at once, threads each) for a call of run() with n jobs to run (class docstring)."""
        if 0 < n < self.jobs:
            return n, self.threads * self.jobs // n
        if self.jobs < n < 2 * self.jobs:
            return n, self.threads
        return self.jobs, self.threads

    def run(self, todo: list[dict], on_done=None) -> None:
        """todo: [{"name", "cmd" (list), "dir" (Path), "done" (Path), optional "resume" (Path)}];
        on_done(job) after each."""
        pending = []
        for job in todo:
            if job["done"].exists() and not self.force:
                print(f"[skip] {job['name']}: {_rel(job['done'])} exists", flush=True)
                if " ".join(job["cmd"]) not in {e["cmd"] for e in self.log}:  # not run earlier by this run
                    self.skipped.append(" ".join(job["cmd"]))
                if on_done:
                    on_done(job)
            else:
                pending.append(job)
        if self.dry_run:
            for job in pending:
                print(f"[dry-run] {' '.join(job['cmd'])}", flush=True)
            return
        slots, threads = self.slots(len(pending))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        running = []
        while pending or running:
            while pending and len(running) < slots:
                job = pending.pop(0)
                job["dir"].mkdir(parents=True, exist_ok=True)
                (job["dir"] / "cmd.txt").write_text(" ".join(job["cmd"]) + "\n")
                resume = not self.force and job.get("resume") is not None and job["resume"].exists()
                cmd = job["cmd"] + (["--resume"] if resume else [])
                print(f"[{'resume' if resume else 'run'}] {job['name']}: {' '.join(cmd)}  "
                      f"(log: {_rel(job['dir'])}/log.txt)", flush=True)
                f = open(job["dir"] / "log.txt", "a" if resume else "w")
                running.append((job, time.time(), f, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f,
                                                                     stderr=subprocess.STDOUT)))
            time.sleep(1.0)
            for item in list(running):
                job, t0, f, p = item
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)  # the child's CPU seconds, with its own children's
                if pid == 0:
                    continue
                p.returncode = os.waitstatus_to_exitcode(status)
                running.remove(item)
                f.close()
                if p.returncode != 0:
                    for _, _, _, other in running:
                        other.terminate()
                    raise SystemExit(f"failed ({p.returncode}): {' '.join(job['cmd'])}\n"
                                     f"see {job['dir'] / 'log.txt'}")
                wall = round(time.time() - t0, 1)
                self.log.append({"name": job["name"], "cmd": " ".join(job["cmd"]), "wall_s": wall,
                                 "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "threads": threads,
                                 "together": slots})
                print(f"[done] {job['name']} in {wall:.0f} s", flush=True)
                if on_done:
                    on_done(job)


def checkpoint_at(train_dir: Path, step: int | None = None) -> Path:
    """train_dir/ckpt/step_XXXXXX (step None: the folder `latest` points to)."""
    from utils import latest_checkpoint
    if step is None:
        c = latest_checkpoint(train_dir / "ckpt")
        if c is None:
            raise SystemExit(f"no checkpoint in {train_dir}/ckpt")
        return c
    return train_dir / "ckpt" / f"step_{step:06d}"


def episode_tasks(path: Path):
    """Yield (line, task) for each episode of a UI-S1 JSONL file (blank lines skipped). Raises
    ValueError naming the file and line of an episode without a "task" field."""
    for i, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            task = json.loads(line).get("task")
            if task is None:
                raise ValueError(f"{path}:{i + 1}: episode has no 'task' field")
            yield line, task


def episodes_per_task(path: Path) -> dict[str, int]:
    """{task: number of episodes} of a UI-S1 JSONL file, tasks in order of first appearance."""
    counts: dict[str, int] = {}
    for _, task in episode_tasks(path):
        counts[task] = counts.get(task, 0) + 1
    return counts


def write_subset(src: Path | list[Path], dst: Path, tasks: list[str] | None, per_task: int | None) -> Path:
    """Write the episodes of `tasks` (None: all), the first `per_task` of each (None: all), from
    JSONL `src` (or several files, read in turn: a mix) to `dst` (skipped when dst exists with the
    same content). Screenshots stay where they are: stages given this file need --image-root src's folder."""
    seen: dict[str, int] = {}
    lines = []
    for line, task in (pair for one in (src if isinstance(src, list) else [src]) for pair in episode_tasks(one)):
        if tasks is not None and task not in tasks:
            continue
        seen[task] = seen.get(task, 0) + 1
        if per_task is None or seen[task] <= per_task:
            lines.append(line)
    if tasks is not None and set(tasks) - set(seen):
        raise ValueError(f"{' + '.join(map(str, src)) if isinstance(src, list) else src}: no episodes of task(s) "
                         f"{sorted(set(tasks) - set(seen))}")
    text = "\n".join(lines) + "\n"
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.read_text() != text:
        dst.write_text(text)
    return dst


# -----------------------------------------------------------------------------
# 3. checkpoint rows


def read_eval(res_dir: Path, episode_keys: list[tuple[str, int]]) -> dict:
    """Metrics of one eval_sop.py --out folder: result.json plus online_episodes.jsonl, the latter
    as a 0/1 string in the order of `episode_keys` ([(task, seed)], the same list for every
    checkpoint: paired). An evaluation with --samples K adds flip_per_task {task: {greedy, pass_at_k,
    flippable, n}} (episode counts; flippable: greedy failed, a sample succeeded), else None.
    Raises SystemExit if an episode of the list is missing."""
    r = json.loads((res_dir / "result.json").read_text())
    outcome, sampled = {}, {}
    for line in (res_dir / "online_episodes.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            outcome[(e["task"], int(e["seed"]))] = int(bool(e["success"]))
            if e.get("sampled_success") is not None:
                sampled[(e["task"], int(e["seed"]))] = any(e["sampled_success"])
    missing = [k for k in episode_keys if k not in outcome]
    if missing:
        raise SystemExit(f"{res_dir}/online_episodes.jsonl: {len(missing)} episodes missing, e.g. {missing[0]}")
    bits = "".join(str(outcome[k]) for k in episode_keys)
    k = bits.count("1")
    flips = None
    if sampled and all(key in sampled for key in episode_keys):  # eval_sop.py --samples K: per task, of n episodes
        flips = {}
        for key in episode_keys:
            f = flips.setdefault(key[0], {"greedy": 0, "pass_at_k": 0, "flippable": 0, "n": 0})
            f["greedy"] += outcome[key]
            f["pass_at_k"] += int(sampled[key])
            f["flippable"] += int(sampled[key] and not outcome[key])
            f["n"] += 1
    return {"flip_per_task": flips, "history_gap": r.get("history_gap"), "sop_pg": r.get("sop_pg"), "sop_tsr": r.get("sop_tsr"), "static_step_sr": r.get("static_step_sr"),
            "online_sr": k / len(bits), "online_sr_ci95": list(wilson(k, len(bits))),
            "n_online_episodes": len(bits), "online_outcomes": bits, "n_sop_episodes": r.get("episodes"),
            "online_per_task": {t: v.get("online_sr") for t, v in r.get("per_task", {}).items()},
            "malformed_responses": r.get("malformed_responses"), "eval_seconds": r.get("seconds"),
            "sampled_seconds": (r.get("online_sampled") or {}).get("seconds"),
            "sampled_plays": (r.get("online_sampled") or {}).get("samples", 0) * len(outcome) if r.get("online_sampled") else 0,
            "online_seconds": sum(float(json.loads(l).get("seconds", 0.0))
                                  for l in (res_dir / "online_episodes.jsonl").read_text().splitlines() if l.strip())}


def read_metrics(train_dir: Path) -> list[dict]:
    """The per-step lines of a training run's metrics.jsonl, one per step in step order, the last
    written winning (a resumed run appends the steps after its checkpoint again); [] if absent."""
    f = train_dir / "metrics.jsonl"
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()] if f.exists() else []
    return sorted({r.get("step", i): r for i, r in enumerate(rows)}.values(), key=lambda r: r.get("step", 0))


# -----------------------------------------------------------------------------
# 4. report: runs/repro_report.py (comparisons, verdicts, results JSON + Markdown, figures); wall-time estimate

def estimate(counts: dict, costs: dict, jobs: int) -> float:
    """Estimated wall seconds of the stages as Stages.run schedules them: the base alone, on every core
    (its cost: wall seconds per step); the SFT runs, then the RL runs, `jobs` at a time in waves (n runs
    last ceil(n / jobs) run-lengths), except that between `jobs` and 2 x `jobs` runs share the cores
    at once (n / jobs run-lengths: 3 SFT runs on 2 cores take 1.5); the evaluations, many and short,
    packed (units x cost / jobs). counts (pending_counts): base_steps, sft_steps, rl_steps (training
    stages, start-up included), sft_runs, rl_runs, online_episodes, sampled_plays (eval_sop.py --samples:
    one sampled play of one episode), sop_episodes, stages (an evaluation process's fixed cost: imports,
    model load); costs: seconds per unit of each."""
    j = max(jobs, 1)
    wall = counts.get("base_steps", 0) * costs.get("base_steps", 0.0)
    for kind in ("sft", "rl"):
        steps, runs = counts.get(f"{kind}_steps", 0), counts.get(f"{kind}_runs", 0)
        if steps and runs:
            lengths = runs / j if j < runs < 2 * j else math.ceil(runs / j)
            wall += lengths * steps / runs * costs.get(f"{kind}_steps", 0.0)
    return wall + sum(counts.get(k, 0) * costs.get(k, 0.0)
                      for k in ("online_episodes", "sampled_plays", "sop_episodes", "stages")) / j


def pending_counts(args, n_tasks: int, n_online: int, base: dict | None, train: dict, evals: list[dict],
                   everything: bool = False) -> dict:
    """The units still to run, for estimate(): a stage whose `done` file exists is skipped (unless
    --force), so an SFT or RL run shared with the other script, or a resumed run's finished stages, cost
    nothing; everything=True counts every stage (the run from scratch). train: {"sft": [jobs], "rl":
    [jobs]}; evals: eval_job dicts of every checkpoint to score."""
    left = lambda jobs: [j for j in jobs if everything or args.force or not j["done"].exists()]  # noqa: E731
    n_eval, n_sft, n_rl = len(left(evals)), len(left(train["sft"])), len(left(train["rl"]))
    return {"base_steps": args.base_steps * len(left([base])) if base is not None and args.base_steps else 0,
            "sft_steps": n_sft * args.sft_steps, "rl_steps": n_rl * args.rl_steps, "sft_runs": n_sft, "rl_runs": n_rl,
            "online_episodes": n_eval * n_online, "sop_episodes": n_eval * args.eval_per_task * n_tasks,
            "stages": n_eval}  # evaluation processes (training stages: start-up is in their per-step cost)


def unit_costs(stage_log: list[dict], evals: list[dict], sft_steps: int, rl_steps: int, base_steps: int = 0) -> dict:
    """Measured seconds per unit from this run's stage log and eval rows, for the next run's estimate:
    per base warm-up step, SFT step and RL step (a training stage's CPU seconds over its steps, process
    start and model load included: its wall time on an idle core, however loaded the machine was; its
    wall time when the log has no CPU seconds), per online episode and per offline (SOP + static) episode
    (an evaluation's own timings, wall: the browser runs beside it; its process start is "stages")."""
    def per(match, units, wall=False):
        w = [e["wall_s"] if wall else e.get("cpu_s") or e["wall_s"] for e in stage_log if match(e["cmd"])]
        return float(np.mean(w)) / units if w and units else None
    is_base = lambda c: "train_sft.py" in c and "--max-steps 0 " in c + " "  # noqa: E731
    on = [c["online_seconds"] / c["n_online_episodes"] for c in evals if c.get("online_seconds")]
    off = [(c["eval_seconds"] - c["online_seconds"]) / max(c.get("n_sop_episodes") or 1, 1)
           for c in evals if c.get("eval_seconds") and c.get("online_seconds") is not None and not c.get("sampled_plays")]
    sampled = [c["sampled_seconds"] / c["sampled_plays"] for c in evals if c.get("sampled_plays") and c.get("sampled_seconds")]
    evals_wall = [e["wall_s"] - c["eval_seconds"] for e in stage_log for c in evals
                  if "eval_sop.py" in e["cmd"] and c.get("eval") and c["eval"] in e["cmd"] and c.get("eval_seconds")]
    return {"base_steps": per(is_base, base_steps, wall=True),  # alone, on every core (Stages)
            "sft_steps": per(lambda c: "train_sft.py" in c and not is_base(c), sft_steps),
            "rl_steps": per(lambda c: "train_semionline.py" in c, rl_steps),
            "online_episodes": float(np.mean(on)) if on else None, "sop_episodes": float(np.mean(off)) if off else None,
            "sampled_plays": float(np.mean(sampled)) if sampled else None,
            "stages": float(np.mean(evals_wall)) if evals_wall else None}


TRAINING_COSTS = ("base_steps", "sft_steps", "rl_steps")
EVAL_COSTS = ("online_episodes", "sampled_plays", "stages")  # depend on --online-batch (browsers per process, batched answers)


def _usable_costs(unit_costs: dict | None, online_batch: int | None = None) -> dict:
    """The numeric unit costs of a results file; its training costs only if measured as CPU seconds
    (basis "cpu"): older files hold wall seconds of stages that shared the machine (RL 27.8 s a step
    against 19 s alone), which would inflate every later estimate; its evaluation costs (online
    episode, evaluation process) only if its episodes ran `online_batch` at a time (a file without
    the key ran them one at a time; None: any)."""
    uc = unit_costs or {}
    same_batch = online_batch is None or uc.get("online_batch", 1) == online_batch
    return {k: v for k, v in uc.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v
            and k != "online_batch" and (k not in TRAINING_COSTS or uc.get("basis") == "cpu")
            and (k not in EVAL_COSTS or same_batch)}


def merged_costs(measured: dict, previous: dict | None, online_batch: int | None = None) -> dict:
    """This run's unit costs (unit_costs: training costs in CPU seconds, basis "cpu"), a kind it did not
    measure (its stages were skipped as done) kept from the previous results (read_previous, read once
    before the run's first write) if still usable (_usable_costs), so a resumed or report-only run keeps
    what was measured. online_batch: the evaluations' --online-batch, recorded beside the costs."""
    old = _usable_costs((previous or {}).get("unit_costs"), online_batch)
    return {**{k: measured.get(k) if measured.get(k) is not None else old.get(k) for k in {*old, *measured}},
            "basis": "cpu", **({"online_batch": online_batch} if online_batch is not None else {})}


def load_costs(defaults: dict, *paths: Path, online_batch: int | None = None) -> dict:
    """Cost constants: `defaults`, overridden by the usable unit_costs of earlier results files that
    exist (_usable_costs)."""
    costs = dict(defaults)
    for p in paths:
        if p.exists():
            costs.update(_usable_costs(json.loads(p.read_text()).get("unit_costs"), online_batch))
    return costs


def python() -> str:
    return sys.executable


# -----------------------------------------------------------------------------
# 5. the pipeline shared by both scripts: CLI, data subsets, SFT, RL and eval jobs


# semi-online RL as the main table runs it, spelled out so the ablations' reference arm is the same
# run (same command hash): gamma 0.5, patch threshold 2, thought-free patches (docs/method.md §5-§6)
SEMIONLINE_REF = ["--history", "own", "--gamma", "0.5", "--patch-threshold", "2", "--patch", "thought-free"]


def compare_scaling(fa: dict | None, fb: dict | None, a: str, b: str) -> dict | None:
    """k of law a minus k of law b, interval and shifted-null p from their bootstrap k values
    (independent resamples of independent runs, paired by index)."""
    if not fa or not fb or not fa.get("k_boot") or not fb.get("k_boot"):
        return None
    m = min(len(fa["k_boot"]), len(fb["k_boot"]))
    d = np.asarray(fa["k_boot"][:m]) - np.asarray(fb["k_boot"][:m])
    diff = fa["k"] - fb["k"]
    p = (1 + np.sum(np.abs(d - diff) >= abs(diff) - 1e-12)) / (1 + m)
    return {"a": a, "b": b, "metric": "scaling_k", "diff": diff,
            "diff_ci95": [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))], "p_value": float(min(1.0, p)),
            "test": "bootstrap of each law's k over its points"}


def make_parser(doc: str, setting: dict, quick: dict):
    """argparse over a script's SETTING dict (every key a flag, its value the default); --quick
    swaps in the QUICK overrides. Lists are given as space-separated values."""
    import cli
    from envs import miniwob_tasks
    p = cli.make_parser(doc)  # one-line errors, defaults and the docstring's examples in --help
    p.add_argument("--quick", action="store_true", help=f"the small setting for a user check: {quick}".replace("%", "%%"))
    p.add_argument("--out", default="out/repro", help="root folder of runs (shared by both scripts: identical stages are reused)")
    p.add_argument("--results", default="results", help="where the results JSON/MD/PNGs land")
    p.add_argument("--jobs", type=cli.positive_int, default=2, help="stage processes at once (one thread each)")
    p.add_argument("--force", action="store_true", help="redo stages whose outputs exist")
    p.add_argument("--dry-run", action="store_true", help="print the commands and the estimate, run nothing")
    p.add_argument("--report-only", action="store_true",
                   help="no training or evaluation: report what exists (the results file's command, commit, stage log "
                        "and wall time are kept; report_commit names the code that wrote the report)")
    for k, v in setting.items():
        flag = "--" + k.lower().replace("_", "-")
        if k.endswith(("_EXTRA", "_ARGS")):  # flags passed through to a stage: one quoted string
            p.add_argument(flag, type=shlex.split, default=list(v), help=k + " (one quoted string, e.g. \"--a 1 --b\")")
        elif isinstance(v, list):  # items typed like the default's, or QUICK's when the default is empty
            sample = v or quick.get(k) or [""]
            p.add_argument(flag, nargs="*", type=miniwob_tasks.miniwob_task if k.endswith("TASKS") else setting_type(k, sample[0]), default=v,
                           help=k + SETTING_HELP.get(k, ""))
        elif isinstance(v, bool):
            p.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=v, help=k)
        elif v is None:
            p.add_argument(flag, nargs="*", default=None, help=k + " (None: all)",
                           type=miniwob_tasks.miniwob_task if k == "TASKS" else None)
        else:
            p.add_argument(flag, type=setting_type(k, v), default=v, help=k + SETTING_HELP.get(k, ""))
    return p


SETTING_HELP = {"SCALING_THRESHOLDS": " (patches per rollout: 0: none; -1: unlimited)",
                "HEADROOM": " (the [lo, hi] band of SFT success in [0, 1]; 0: no lower bound)",
                "FLIP_MIN": " (0: every task)"}


def setting_type(key: str, value):
    """The argparse type of a SETTING key from its name and its default's type: a temperature the
    sampler's rule (cli.temperature); a seed or seed base any integer >= 0; a share (HEADROOM, *_MIN)
    in [0, 1]; a patch threshold >= -1; every other count, step and size an integer >= 1, every other float finite and > 0."""
    import cli
    if isinstance(value, str):
        return str
    if "TEMPERATURE" in key:
        return cli.temperature
    if isinstance(value, int):
        if "THRESHOLD" in key:
            return cli.int_at_least(-1)
        return cli.non_negative_int if "SEED" in key else cli.positive_int
    if key == "HEADROOM" or key.endswith("_MIN"):
        return cli.fraction
    return cli.positive_float


def parse(doc: str, setting: dict, quick: dict, argv=None):
    """Parse the command line; with --quick, QUICK overrides the defaults (explicit flags still win)."""
    p = make_parser(doc, setting, quick)
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**{k.lower(): v for k, v in quick.items()})
        args = p.parse_args(argv)
    args.out_root = REPO / args.out
    args.results_dir = REPO / args.results
    args.results_dir.mkdir(parents=True, exist_ok=True)
    return args


def data_files(value: str | list[str]) -> list[Path]:
    """A SETTING data value (one file, or a list of files that mix under one image folder) as paths."""
    return [REPO / v for v in (value if isinstance(value, list) else [value]) if v]


def all_tasks(test_data: str | list[str]) -> list[str]:
    return list(dict.fromkeys(t for f in data_files(test_data) for t in episodes_per_task(f)))


def prepare_data(args) -> dict:
    """The task subset's train/RL/test files under OUT/data (all tasks: the files as they are) and
    the selection episode list [(task, seed)] (episode_keys: >= args.online_episodes in all). A data
    setting may list several files (e.g. the memory tasks' and the MiniWob++ tasks'): they are mixed
    into one file under OUT/data, and must share one folder (the stages' --image-root)."""
    tasks = args.tasks or all_tasks(args.test_data)
    root = args.out_root / "data"
    src_train, src_test = data_files(args.train_data), data_files(args.test_data)

    def subset(src: list[Path], role: str) -> Path:  # named after the source files too: another file, another run hash
        stem = "+".join(p.stem for p in src)
        name = f"{role}_{len(tasks)}t.jsonl" if stem == role else f"{role}_{stem}_{len(tasks)}t.jsonl"
        return write_subset(src if len(src) > 1 else src[0], root / name, tasks if args.tasks else None, None) \
            if args.tasks or len(src) > 1 else src[0]
    folders = {p.parent for p in src_train + src_test}
    if len(folders) > 1:
        raise SystemExit(f"data files {[_rel(p) for p in src_train + src_test]}: must sit in one folder "
                         "(the stages share one --image-root)")
    train, test = subset(src_train, "train"), subset(src_test, "test")
    rl = train
    if args.rl_data:  # RL on demonstrations SFT never saw (their own seeds), in the same image folder
        src_rl = data_files(args.rl_data)
        if {p.parent for p in src_rl} != {src_train[0].parent}:
            raise SystemExit(f"--rl-data {args.rl_data}: must sit beside --train-data {args.train_data} "
                             "(the stages share one --image-root)")
        rl = subset(src_rl, "rl")
    keys = episode_keys(tasks, args.online_episodes, args.online_seed_base)
    return {"tasks": tasks, "train": train, "rl": rl, "test": test,
            "image_root": str(src_train[0].parent.relative_to(REPO)), "online_episodes": keys}


def _rel(p: Path | str) -> str:
    p = Path(p)
    return str(p.relative_to(REPO)) if p.is_absolute() and REPO in p.parents else str(p)


class EvalResult(type(Path())):
    """An eval_sop.py result.json that `exists()` only once the evaluation finished: a stopped one writes
    it with "complete": false (evaluation/outputs.py), which is no finished job to skip or read."""

    def exists(self, **kw) -> bool:
        if not super().exists(**kw):
            return False
        try:
            return json.loads(self.read_text()).get("complete") is not False
        except (ValueError, AttributeError):  # cut or not an object: not a finished evaluation
            return False


def job(root: Path, name: str, cmd: list[str], done: str, resume: str | None = None) -> dict:
    """A stage job: its folder is root/name_<hash of cmd>, `--out` that folder, done = folder/done;
    resume: a file whose presence (without `done`) means an interrupted run to continue with --resume
    (an evaluation, done result.json: its run.json, written when it starts)."""
    d = run_dir(root, name, cmd)
    if done == "result.json":
        return {"name": name, "cmd": cmd + ["--out", _rel(d)], "dir": d, "done": EvalResult(d / done),
                "resume": d / (resume or "run.json")}
    return {"name": name, "cmd": cmd + ["--out", _rel(d)], "dir": d, "done": d / done,
            "resume": d / resume if resume else None}


def base_job(args, data: dict) -> dict:
    """The shared base: what a model trained from scratch needs before GUI tasks (the copy warm-up of
    train_sft.py on synthetic pages, --base-steps steps, seed 0), trained ONCE and the starting point
    of every arm and seed, as the paper's arms share a pretrained Qwen2.5-VL. Not part of any arm's
    training. base_steps 0: the base is the untrained --model itself (a pretrained model folder)."""
    cmd = [python(), "train_sft.py", "--data", _rel(data["train"]), "--image-root", data["image_root"],
           "--model", args.model, *args.model_args, "--max-steps", "0", "--copy-warmup-steps", str(args.base_steps),
           "--seed", "0", *args.base_extra]
    return job(args.out_root / "base", "base", cmd, "ckpt/step_000000")


def base_model(args, base: dict) -> str:
    """The model every SFT run starts from (and the base row of the tables evaluates)."""
    return _rel(checkpoint_at(base["dir"], 0)) if args.base_steps > 0 else args.model


def _saves(steps: int, points: int) -> list[str]:
    """Checkpoint flags of a training job that keeps `points` evenly spaced checkpoints (the last at
    `steps`): every steps // points steps, and every one kept when there are more than the trainers'
    default two (the midpoint is kept either way: points 2 is the same command from both scripts)."""
    return ["--save-every", str(max(steps // points, 1))] + (["--keep-checkpoints", "0"] if points > 2 else [])


def checkpoint_steps(steps: int, points: int) -> list[int]:
    """The steps of the checkpoints _saves(steps, points) keeps: every steps // points, and `steps`."""
    every = max(steps // points, 1)
    return sorted({*range(every, steps, every), steps}) if points > 1 else [steps]


def sft_job(args, data: dict, seed: int, base: dict, points: int = 2) -> dict:
    """SFT of seed `seed` from the shared base (base_job), no warm-up of its own, keeping `points`
    checkpoints (checkpoint_steps)."""
    cmd = [python(), "train_sft.py", "--data", _rel(data["train"]), "--image-root", data["image_root"],
           "--model", base_model(args, base), *(args.model_args if args.base_steps == 0 else []),
           "--copy-warmup-steps", "0", "--max-steps", str(args.sft_steps), "--lr", str(args.sft_lr),
           "--seed", str(seed), *_saves(args.sft_steps, points),
           "--eval-every", str(max(args.sft_steps // 4, 1)), *args.sft_extra]
    return job(args.out_root / "sft", f"sft_s{seed}", cmd, f"ckpt/step_{args.sft_steps:06d}", resume="ckpt/latest")


def rl_job(args, data: dict, sft: dict, seed: int, name: str, flags: list[str], train: Path | None = None,
           points: int = 2) -> dict:
    """Semi-online (or, with --history expert, offline) RL from seed `seed`'s SFT checkpoint, on the RL
    demonstrations (data["rl"]: --rl-data, or SFT's own --train-data when that is empty), or on `train`,
    keeping `points` checkpoints (checkpoint_steps)."""
    cmd = [python(), "train_semionline.py", "--model", _rel(checkpoint_at(sft["dir"], args.sft_steps)),
           "--data", _rel(train or data["rl"]),
           "--image-root", data["image_root"], "--max-steps", str(args.rl_steps),
           "--lr", str(args.rl_lr), "--seed", str(seed),
           *_saves(args.rl_steps, points), *args.rl_extra, *flags]
    return job(args.out_root / "rl", f"{name}_s{seed}", cmd, f"ckpt/step_{args.rl_steps:06d}", resume="ckpt/latest")


def online_flags(args, keys: list[tuple[str, int]]) -> list[str]:
    """eval_sop.py's flags for the online episodes `keys` (episode_keys: the same seeds for every task)
    and the report, shared by the selection and the test evaluations."""
    tasks = list(dict.fromkeys(t for t, _ in keys))
    return ["--online", "--online-tasks", *tasks, "--online-seeds", str(len(keys) // len(tasks)),
            "--online-seed-base", str(min(s for _, s in keys)), "--online-max-steps", str(args.online_max_steps),
            "--online-batch", str(args.online_batch), "--report-episodes", "4", *args.eval_extra]


def eval_job(args, data: dict, model: str, name: str, seed: int, extra: list[str] = ()) -> dict:
    """eval_sop.py on the test file (SOP + static) and online on the shared episode list; `extra`:
    more eval_sop.py flags (e.g. --samples K --temperature T)."""
    base = args.model_args if model == args.model else []  # the untrained model's own flags (no base stage)
    cmd = [python(), "eval_sop.py", "--policy", "model", "--model", model, *base, "--seed", str(seed),
           "--data", _rel(data["test"]), "--image-root", data["image_root"], "--per-task-limit", str(args.eval_per_task),
           "--elements", "--protocol", "sop", "static", *online_flags(args, data["online_episodes"]), *extra]
    return job(args.out_root / "eval", name.replace(" ", "_").replace("/", "-"), cmd, "result.json")


def checkpoint_eval(args, data: dict, arm: str, seed: int, train_job: dict, step: int, final: bool = True,
                    extra: list[str] = ()) -> dict:
    """eval_job of `train_job`'s checkpoint at `step`, named as both scripts name it (so they share its
    folder), with the report's "meta" (name, arm, seed, step, final, run folder) and its "checkpoint"."""
    ck = checkpoint_at(train_job["dir"], step)
    return {**eval_job(args, data, _rel(ck), f"{arm}_s{seed}_step{step}_{train_job['dir'].name}", seed, extra),
            "meta": (f"{arm} s{seed}" + ("" if final else f" @{step}"), arm, seed, step, final, _rel(train_job["dir"])),
            "checkpoint": ck}


def headroom_tasks(checkpoints: list[dict], arm: str = "sft", lo: float = 0.0, hi: float = 1.0) -> dict:
    """The tasks with headroom: those on which `arm`'s final checkpoints, pooled over seeds (mean of
    their per-task online success on the selection episodes), succeed strictly between lo and hi. A
    task at 0 or 1 for SFT cannot show a difference between arms (every arm tends to stay there), so
    the claims' test episodes are drawn on the others; the choice uses SFT's numbers alone, never an
    RL arm's. Returns {"arm", "range", "per_task": {task: pooled SR}, "tasks": [selected, in order]}."""
    rows = final_rows(checkpoints, arm)
    tasks = list(dict.fromkeys(t for r in rows for t in (r.get("online_per_task") or {})))
    per_task = {}
    for t in tasks:
        v = [r["online_per_task"][t] for r in rows if (r.get("online_per_task") or {}).get(t) is not None]
        if v:
            per_task[t] = float(np.mean(v))
    return {"arm": arm, "range": [lo, hi], "per_task": per_task,
            "tasks": [t for t, v in per_task.items() if lo < v < hi]}


def flippable_tasks(checkpoints: list[dict], fmin: float, arm: str = "sft") -> dict:
    """The rule that chooses the RL tasks, from `arm`'s final checkpoints' flip_per_task (their
    evaluation with --samples K) alone, before any RL runs: per task the flippable episodes (greedy
    fails, one of the K samples succeeds) pooled over seeds, k of n; a task is chosen if k / n >=
    fmin. When none reaches fmin, the task with the most flippable episodes is chosen (ties: task
    order), so that RL has somewhere to go; `fallback` says so. These episodes are the ceiling of
    what RL can do to the greedy policy (Yue et al. 2025, arXiv 2504.13837). Returns {"arm", "min",
    "per_task": {task: {greedy, pass_at_k, flippable, n, rate}}, "tasks": [chosen, in task order],
    "fallback": bool}; tasks [] when no final checkpoint has flip counts."""
    per_task: dict[str, dict] = {}
    for r in final_rows(checkpoints, arm):
        for t, f in (r.get("flip_per_task") or {}).items():
            acc = per_task.setdefault(t, {"greedy": 0, "pass_at_k": 0, "flippable": 0, "n": 0})
            for key in acc:
                acc[key] += f[key]
    for f in per_task.values():
        f["rate"] = f["flippable"] / f["n"] if f["n"] else 0.0
    chosen = [t for t, f in per_task.items() if f["rate"] >= fmin]
    fallback = not chosen and bool(per_task)
    if fallback:
        chosen = [max(per_task, key=lambda t: per_task[t]["flippable"])]
    return {"arm": arm, "min": fmin, "per_task": per_task, "tasks": chosen, "fallback": fallback}


def history_gap_summary(checkpoints: list[dict], arm: str = "sft") -> dict | None:
    """Own vs expert history (claim 1b's mechanism) of `arm`'s final checkpoints, summed over seeds: per task
    and pooled, the steps after step 0 that SOP reached (every earlier step right under the model's own
    history), how many each history gets right, and the discordant pairs (eval_sop.py's history_gap,
    "later"). Semi-online and offline RL differ only in that history; with no discordant step they
    train on the same prompts. None when no checkpoint has the counts."""
    keys = ("steps", "own_right", "expert_right", "own_only", "expert_only")
    out: dict[str, dict] = {}
    for r in final_rows(checkpoints, arm):
        g = r.get("history_gap") or {}
        for task, v in [*(g.get("per_task") or {}).items(), ("pooled", g.get("pooled"))]:
            if v and v.get("later"):
                acc = out.setdefault(task, dict.fromkeys(keys, 0))
                for k in keys:
                    acc[k] += v["later"][k]
    for v in out.values():
        n = v["steps"]
        v.update(own_acc=v["own_right"] / n if n else None, expert_acc=v["expert_right"] / n if n else None,
                 gap=(v["own_right"] - v["expert_right"]) / n if n else None)
    return out or None


def episode_keys(tasks: list[str], n: int, seed_base: int) -> list[tuple[str, int]]:
    """An online episode list [(task, seed)] of at least n episodes: ceil(n / len(tasks)) seeds per task
    from seed_base, the same for every task (the selection and the test episodes; every checkpoint plays
    the same list: paired)."""
    per = math.ceil(n / len(tasks)) if tasks and n > 0 else 0
    return [(t, seed_base + i) for t in tasks for i in range(per)]


def test_eval_job(args, data: dict, keys: list[tuple[str, int]], ck_eval: dict, extra: list[str] = (),
                  script: str = "eval_sop.py", done: str = "result.json") -> dict:
    """Online-only eval_sop.py of the checkpoint that `ck_eval` (a checkpoint_eval job) scores, on the
    test episodes `keys` (episode_keys), in OUT/eval_test; carries ck_eval's meta. extra: as eval_job;
    script: a script that takes eval_sop.py's flags (e.g. runs/memory_probe.py), done: the file it writes last."""
    cmd = [python(), script, "--policy", "model", "--model", _rel(ck_eval["checkpoint"]),
           "--seed", str(ck_eval["meta"][2]), "--image-root", data["image_root"], *online_flags(args, keys), *extra]
    return {**job(args.out_root / "eval_test", ck_eval["dir"].name, cmd, done), "meta": ck_eval["meta"]}


def test_plan(args, data: dict, keys, finals: list[dict], rows: list[dict] | None = None):
    """(headroom_tasks selection, test episodes, test_eval_job of each of `finals`) from the SFT rows of
    `rows` (or, for the estimate, of the finished SFT evaluations among `finals` on disk); (None, [],
    None) while some SFT seed has no selection result yet."""
    if rows is None:
        rows = [{"arm": "sft", "seed": e["meta"][2], "final": True, **read_eval(e["dir"], keys)}
                for e in finals if e["meta"][1] == "sft" and e["done"].exists()]
    if len(final_rows(rows, "sft")) < len(args.seeds):
        return None, [], None
    sel = headroom_tasks(rows, "sft", *args.headroom)
    tkeys = episode_keys(sel["tasks"], args.test_episodes, args.test_seed_base)
    return sel, tkeys, [test_eval_job(args, data, tkeys, e) for e in finals] if tkeys else []


def add_test_counts(args, data: dict, keys, finals: list[dict], counts: dict, full: dict) -> None:
    """Add the test evaluations of `finals` to pending_counts' `counts` (those not yet done; all of them
    while the tasks are not chosen) and `full` (all)."""
    if not args.test_episodes:
        return
    todo = test_plan(args, data, keys, finals)[2]
    n = len(finals) if todo is None else len([j for j in todo if args.force or not j["done"].exists()])
    for c, k in ((counts, n), (full, len(finals))):
        c["online_episodes"] += k * args.test_episodes
        c["stages"] += k


def run_test_stage(args, data: dict, keys, finals: list[dict], rows: list[dict], test_rows: list[dict], test: dict,
                   stages, summary, out_json: Path, title: str) -> None:
    """After the selection episodes (`rows`): choose the tasks with headroom (test_plan), record the
    choice and the test episodes in `test` ({"headroom", "keys"}) and evaluate every checkpoint of
    `finals` that exists on them, appending to `test_rows` (run_evals). Prints why when nothing runs."""
    sel, tkeys, jobs = test_plan(args, data, keys, finals, rows)
    test.update(headroom=sel, keys=tkeys)
    if not args.test_episodes:
        return
    if sel is None:
        print("[test] not every SFT seed has its selection episodes: no test episodes", flush=True)
        return
    if not tkeys:
        print(f"[test] no task with headroom ({sel['per_task']}): the claims use the selection episodes", flush=True)
        return
    print(f"[test] tasks with headroom {sel['tasks']}: {len(tkeys)} test episodes per final checkpoint", flush=True)
    todo = [j for j, e in zip(jobs, finals) if args.dry_run or e["checkpoint"].exists()]
    run_evals(args, todo, stages, test_rows, tkeys, summary, out_json, title)


def checkpoints_of(steps: int, eval_mid: bool) -> list[tuple[int, bool]]:
    """[(step, final)] of the checkpoints to evaluate of a training job of `steps` steps: the midpoint
    (with eval_mid; the caller skips it when the job did not keep it) and the end."""
    return ([(steps // 2, False)] if eval_mid and steps >= 2 else []) + [(steps, True)]


def run_evals(args, todo, stages, rows: list, keys, summary, out_json: Path, title: str) -> None:
    """Run (or, with --report-only, read back) the evaluation jobs `todo`, append each evaluated
    checkpoint (read_eval on the episode list `keys`) to `rows` and rewrite the partial results after each."""
    def on_eval(j):
        name, arm, seed, step, final, run = j["meta"]
        rows.append({"name": name, "arm": arm, "seed": seed, "step": step, "final": final, "run": run,
                     "eval": _rel(j["dir"]), **read_eval(j["dir"], keys)})
        if not (args.report_only or args.dry_run):  # a dry run writes nothing
            write_results(summary(), out_json, f"{title} (partial)")

    if args.report_only:
        for j in todo:
            if j["done"].exists():
                on_eval(j)
    else:
        stages.run(todo, on_done=on_eval)


def collect_and_report(args, todo, stages, rows: list, keys, summary, out_json: Path, title: str, then=None) -> dict:
    """run_evals on `todo`, then `then()` (more evaluations that depend on these, e.g. the main table's
    test episodes), then write the final JSON/MD (summary(final_report=True)) and print the Markdown.
    Returns the results ({} on --dry-run)."""
    run_evals(args, todo, stages, rows, keys, summary, out_json, title)
    if then is not None:
        then()
    if args.dry_run:
        return {}
    result = summary(final_report=True)
    if args.report_only and out_json.exists():  # the runs' provenance stays; report_commit names the report's code
        old = json.loads(out_json.read_text())
        result.update({k: old[k] for k in ("command", "commit", "stages", "reused_stages", "wall_s") if k in old},
                      report_commit=git_commit())
    write_results(result, out_json, title)
    print(markdown(_nan_to_none(result), title), flush=True)
    return result

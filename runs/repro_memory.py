"""Claim 1b where history matters: on tasks that need the agent's own history (the memory tasks: a fact
shown at step 0 is typed 1 or 3 steps later, after it left the screen; data/miniwob/README.md), does
semi-online RL beat offline RL, and by more than on Markov MiniWob++ tasks (the interaction)? The
protocol, as a pre-registration draft, is docs/protocol_memory.md; every stage runs at one commit, from scratch:
  1. a shared base (the copy warm-up on the mixed demonstrations' page labels), SFT per seed on the
     memory tasks' and the Markov tasks' demonstrations mixed, with --num-images 1 (only the current
     screenshot: at the using step no kept screenshot shows the fact), SFT_POINTS checkpoints kept;
  2. from each SFT checkpoint: semi-online RL (gamma 0.5), offline RL (--history expert) and
     semi-online RL with gamma 0, repro_main.py's recipe, on RL demonstrations SFT never saw (both task
     sets), RL_POINTS checkpoints each (the dose points); and the control: SFT continued on the same
     demonstrations for as many demonstration steps as an RL arm trains on;
  3. every SFT checkpoint on the selection episodes (SOP, static, online; seeds ONLINE_SEED_BASE+): SFT's
     plateau, the check of the SFT length fixed from the pilot;
  4. every test checkpoint (SFT final, each RL arm at each dose point, the control) on the same fresh
     test episodes of both task sets (TEST_SEED_BASE+), through runs/memory_probe.py (eval_sop.py with
     every greedy response kept): online success, and the probe, how often the agent's step-0 note
     carries the fact;
  5. the claims with the primary test (stats.seed_paired_t on per-seed differences) and its simulated
     false-positive rate at this design (stats.null_fpr, null_fpr_interaction): 1a (semi-online - SFT,
     memory tasks), 1b (semi-online - offline, memory tasks), the interaction (1b on memory tasks minus 1b
     on Markov tasks), 3 (semi-online - gamma 0, memory tasks); the goal: 1b on the memory tasks
     >= +0.05 with primary p < 0.05.
Writes results/memory/repro_main.{json,md} (--quick: results/memory/repro_main_quick.*).

    python runs/repro_memory.py               # the full setting below (prints its estimated wall time first)
    python runs/repro_memory.py --quick       # a small check of the whole pipeline (a few minutes on 2 cores)
    python runs/repro_memory.py --dry-run     # the commands and the estimate, nothing run
    python runs/repro_memory.py --report-only # rebuild the results from the runs that exist

At GPU scale, with a pretrained VLM (a local Hugging Face folder of the Qwen2.5-VL family; its own tokenizer
and image processor, the memory tasks' 168 x 224 screenshots resized at its patch grid; no copy warm-up: the
folder is every seed's base), one preset of plain SETTING overrides (PRESETS: steps, batch, rollouts, sequence
budgets; explicit flags still win):

    python runs/repro_memory.py --model /models/Qwen2.5-VL-3B-Instruct --preset gpu1 --dry-run   # plan, GPU hours
    python runs/repro_memory.py --model /models/Qwen2.5-VL-7B-Instruct --preset gpu8              # 8 GPUs (torchrun)

The test evaluations then also play every memory episode PROBE_SAMPLES times at the RL temperature, so the
probe reports how often a sampled note is right where greedy's is not: what semi-online RL can reinforce
(docs/protocol_memory.md §9: the tiny model never samples it).

Stages are printed calls of the stage scripts, logged to their run folders and skipped when their output
exists (runs/repro_common.py); the results are rewritten after every evaluated checkpoint.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_probe  # noqa: E402
import repro_ablations as ra  # noqa: E402
import repro_common as rc  # noqa: E402
import repro_main as rm  # noqa: E402
from repro_report import fmt, fmt_ci  # noqa: E402
from evaluation import stats  # noqa: E402

MEMORY = ["memory-type-1", "memory-type-3"]
# Markov MiniWob++ tasks (the screen holds all an action needs) where SFT left headroom in the main
# table's run (results/repro_main.json, SFT selection success 0.28, 0.74, 0.21) and samples flip failures
MARKOV = ["click-option", "click-button-sequence", "enter-text"]
SETTING = dict(
    MEMORY_TASKS=MEMORY,
    MARKOV_TASKS=MARKOV,
    TRAIN_DATA=["data/miniwob/memory_train.jsonl", "data/miniwob/train.jsonl"],  # seeds 400000+ and 0+
    TEST_DATA=["data/miniwob/memory_test.jsonl", "data/miniwob/test.jsonl"],     # 500000+, 100000+ (SOP, static)
    RL_DATA=["data/miniwob/memory_rl.jsonl", "data/miniwob/rl.jsonl"],           # 600000+, 300000+: unseen by SFT
    MODEL="tiny:128x4",
    MODEL_ARGS=[],
    SEEDS=[0, 1, 2, 3, 4],                       # training seeds per arm (>= 5)
    BASE_STEPS=3000,
    BASE_EXTRA=rm.SETTING["BASE_EXTRA"] + ["--copy-warmup-code-frac", "0.5"],  # copies codes it never saw (results/LOG.md, pilot 16)
    SFT_STEPS=600,                               # TO BE SET FROM THE PILOT: SFT until its selection success plateaus
    SFT_LR=1e-3,
    SFT_EXTRA=["--num-images", "1"],             # the prompt contract of every later stage (from the checkpoint)
    SFT_POINTS=4,                                # SFT checkpoints on the selection episodes: the plateau check
    RL_STEPS=rm.SETTING["RL_STEPS"], RL_LR=rm.SETTING["RL_LR"],
    RL_POINTS=3,                                 # dose points per RL arm (RL_STEPS / 3, 2/3, all)
    RL_PASSES=rm.SETTING["RL_PASSES"],
    RL_TEMPERATURE=rm.SETTING["FLIP_TEMPERATURE"],
    RL_EXTRA=rm.SETTING["RL_EXTRA"],             # the release's recipe, as the main table
    CONTROL=True,                                # SFT continued on the RL demonstrations, as many demonstration steps
    EVAL_PER_TASK=4,                             # SOP/static test-file episodes per task (selection evaluations)
    ONLINE_EPISODES=50,                          # selection episodes per SFT checkpoint (10 per task)
    ONLINE_SEED_BASE=810000,                     # fresh: no data or results file uses 810000+ (a pilot: 800000+)
    ONLINE_MAX_STEPS=10,
    ONLINE_BATCH=2,
    EVAL_EXTRA=["--max-new-tokens", "80"],
    TEST_EPISODES=300,                           # per test checkpoint: 60 per task, 120 memory + 180 Markov
    TEST_SEED_BASE=900000,                       # fresh: tests/test_repro_memory.py checks results/ and data/
    PROBE_SAMPLES=0,                             # sampled plays of each test episode at RL_TEMPERATURE (final
                                                 # checkpoints; the probe's spread: a right note sampled where
                                                 # greedy's is wrong)
    NPROC=1,                                     # processes per training stage (> 1: torchrun, one per GPU)
)
# The release's recipe at GPU scale for a pretrained VLM (the paper's lr: SFT 1e-5, RL 1e-6; RL at the release's
# temperature 1.0), BASE_STEPS 0. SFT: ~3 passes over the 200 mixed demonstrations (~800 steps) at its batch.
# Sequence budgets: prompts of at most 2,048 tokens (one 168 x 224 screenshot is 48 visual tokens; the element
# list and the history are the rest), responses of at most 256 new tokens (a pretrained model's thought is longer
# than the tiny model's 80). Evaluations run one at a time (JOBS 1) on the first GPU.
_GPU_RL = ["--filter-std", "0.3", "--returns-form", "release", "--max-resample", "3", "--kl-coef", "1e-4",
           "--max-new-tokens", "256", "--max-prompt-tokens", "2048", "--gradient-checkpointing"]
PRESETS = {
    "gpu1": dict(BASE_STEPS=0, SFT_STEPS=150, SFT_LR=1e-5, SFT_POINTS=3,
                 SFT_EXTRA=["--num-images", "1", "--batch-size", "16", "--micro-batch-size", "4",
                            "--max-prompt-tokens", "2048", "--gradient-checkpointing"],
                 RL_STEPS=72, RL_LR=1e-6, RL_TEMPERATURE=1.0,
                 RL_EXTRA=["--tasks-per-step", "4", "--n-rollouts", "8", "--micro-batch-size", "4", *_GPU_RL],
                 EVAL_EXTRA=["--max-new-tokens", "256", "--max-prompt-tokens", "2048"], ONLINE_BATCH=8,
                 PROBE_SAMPLES=8, NPROC=1),
    "gpu8": dict(BASE_STEPS=0, SFT_STEPS=40, SFT_LR=1e-5, SFT_POINTS=4,
                 SFT_EXTRA=["--num-images", "1", "--batch-size", "64", "--micro-batch-size", "2",
                            "--max-prompt-tokens", "2048", "--gradient-checkpointing"],
                 RL_STEPS=72, RL_LR=1e-6, RL_TEMPERATURE=1.0,
                 RL_EXTRA=["--tasks-per-step", "8", "--n-rollouts", "8", "--micro-batch-size", "2", *_GPU_RL],
                 EVAL_EXTRA=["--max-new-tokens", "256", "--max-prompt-tokens", "2048"], ONLINE_BATCH=8,
                 PROBE_SAMPLES=8, NPROC=8),
    # the gpu presets' code path on a CPU with a tiny model folder, in tiny shapes (tests/test_repro_memory.py)
    "cpu-smoke": dict(BASE_STEPS=0, SEEDS=[0], SFT_STEPS=1, SFT_POINTS=1,
                      SFT_EXTRA=["--num-images", "1", "--batch-size", "2", "--micro-batch-size", "2", "--max-pixels",
                                 "20000"],
                      RL_STEPS=1, RL_POINTS=1, RL_PASSES=1, CONTROL=False, MEMORY_TASKS=["memory-type-1"],
                      MARKOV_TASKS=["click-option"], EVAL_PER_TASK=1, ONLINE_EPISODES=2, ONLINE_MAX_STEPS=1,
                      TEST_EPISODES=2, PROBE_SAMPLES=2, ONLINE_BATCH=2,
                      RL_EXTRA=["--tasks-per-step", "2", "--n-rollouts", "2", "--max-new-tokens", "8", "--max-pixels",
                                "20000", "--filter-std", "0", "--returns-form", "release", "--max-resample", "0"],
                      EVAL_EXTRA=["--max-new-tokens", "8", "--max-pixels", "20000"]),
}
# The GPU estimate's assumptions (gpu_plan): an H100's dense bf16 peak, the share of it training reaches, its
# memory bandwidth, and the share of it one decoding step reaches (every weight read once per decoded token of a batch)
H100 = dict(peak_flops=989e12, mfu=0.35, hbm_bytes_s=3.35e12, decode_eff=0.5)
QUICK = dict(SEEDS=[0, 1], BASE_STEPS=20, SFT_STEPS=20, SFT_POINTS=2, RL_STEPS=2, RL_POINTS=2, RL_PASSES=1,
             EVAL_PER_TASK=1, ONLINE_EPISODES=4, MEMORY_TASKS=["memory-type-1"], MARKOV_TASKS=["click-option"],
             TEST_EPISODES=4, EVAL_EXTRA=["--max-new-tokens", "48"],
             RL_EXTRA=["--tasks-per-step", "2", "--n-rollouts", "2", "--max-new-tokens", "48", "--filter-std", "0.3",
                       "--returns-form", "release", "--max-resample", "1", "--kl-coef", "1e-4"])
COSTS = rm.COSTS  # replaced by the usable unit_costs of this script's or the main table's results (rc.load_costs)
ARMS = {"semionline": rc.SEMIONLINE_REF, "offline": rm.ARMS["offline"], "gamma0": ra.ARMS["gamma0"]}
CONTROL = rm.CONTROL
SETS = ("memory", "markov")
FPR_MAX = 0.07  # a simulated false-positive rate above this at nominal 0.05: a calibration failure (protocol, §4)


# -----------------------------------------------------------------------------
# rows on a task subset, the probe


def subset_row(row: dict, keys: list[tuple[str, int]], tasks: list[str]) -> dict:
    """A test checkpoint row restricted to the episodes of `tasks` (keys: the test episode list, in the
    order of row["online_outcomes"]): the fields rc.compare_online reads, success recomputed."""
    bits = "".join(b for b, (t, _) in zip(row["online_outcomes"], keys) if t in tasks)
    k = bits.count("1")
    return {**{f: row[f] for f in ("name", "arm", "seed", "step", "final")}, "online_outcomes": bits,
            "online_sr": k / len(bits) if bits else None, "n_online_episodes": len(bits),
            "online_sr_ci95": list(rc.wilson(k, len(bits))) if bits else [None, None]}


def read_probe(eval_dir: Path) -> list[dict] | None:
    """runs/memory_probe.py's online_responses.jsonl of a test evaluation (None if absent)."""
    f = eval_dir / memory_probe.RESPONSES_FILE
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else None


def probe_fields(eval_dir: Path) -> dict:
    """The probe of one test evaluation: counts (memory_probe.probe_counts) and the note rate on the memory
    tasks with its Wilson interval, and with sampled plays (PROBE_SAMPLES) the sampled note rate and the share of
    episodes whose greedy note is wrong and a sample's right (headroom_rate; else None); {} without the file."""
    rows = read_probe(eval_dir)
    if rows is None:
        return {}
    c = memory_probe.probe_counts(rows)
    pooled = c.get("pooled") or {"n": 0, "note_right": 0}
    n, k = pooled["n"], pooled["note_right"]
    sampled = pooled.get("sampled") or {}
    return {"probe": c, "note_rate": k / n if n else None, "note_rate_ci95": list(rc.wilson(k, n)) if n else None,
            "sampled_note_rate": sampled.get("note_rate"), "headroom_rate": sampled.get("headroom_rate")}


# -----------------------------------------------------------------------------
# the claims


def finals_at(rows: list[dict], arm: str, step: int | None = None) -> list[dict]:
    """The rows of `arm` at `step` (None: its final checkpoints), marked final for rc.compare_online."""
    return [{**r, "final": True} for r in rows if r["arm"] == arm and (r["final"] if step is None else r["step"] == step)]


def fpr_of(sub: list[dict], a: str, b: str, repeats: int) -> dict | None:
    """The primary test's simulated false-positive rate (stats.null_fpr) at this comparison's design: its
    seeds, its episodes per checkpoint, the between-seed SD of success of arms a and b as measured
    (stats.seed_sd_of) and their pooled success as p0."""
    ra_, rb_ = rc.final_rows(sub, a), rc.final_rows(sub, b)
    if min(len(ra_), len(rb_)) < 2:
        return None
    n = int(ra_[0]["n_online_episodes"])
    sd = stats.seed_sd_of({a: [r["online_sr"] for r in ra_], b: [r["online_sr"] for r in rb_]}, n)
    p0 = float(np.mean([r["online_sr"] for r in ra_ + rb_]))
    sim = stats.null_fpr(len(ra_), n, 0.0 if math.isnan(sd) else sd, p0=p0, repeats=repeats, alpha=rc.ALPHA)
    return {"fpr_primary_t": sim["primary_t"], "calibrated": sim["primary_t"] <= FPR_MAX, "seed_sd_measured": sd,
            "p0": p0, "n_seeds": len(ra_), "n_episodes": n, "repeats": repeats}


def claims(test_rows: list[dict], tkeys: list[tuple[str, int]], sets: dict, repeats: int = 4000) -> dict:
    """The comparisons on each task set and the claims with their verdicts, the interaction, the probe's
    comparisons and the goal, from the test rows (final checkpoints; every arm evaluated on `tkeys`)."""
    subs = {name: [subset_row(r, tkeys, tasks) for r in test_rows] for name, tasks in sets.items()}
    pairs = [("semionline", "sft"), ("semionline", "offline"), ("semionline", "gamma0"), ("offline", "sft"),
             ("gamma0", "sft"), (CONTROL, "sft"), ("semionline", CONTROL)]
    cmps = {name: {(a, b): rc.compare_online(sub, a, b) for a, b in pairs} for name, sub in subs.items()}
    out_cmps = [{**c, "tasks": name, "fpr": fpr_of(subs[name], c["a"], c["b"], repeats)}
                for name in subs for c in cmps[name].values() if c]

    def claim(text, name, a, b):
        c = cmps[name][(a, b)]
        return {"claim": text, "test": f"{a} - {b}", "episodes": f"test, {name} tasks", **rm._pick(c),
                "fpr": fpr_of(subs[name], a, b, repeats) if c else None, "verdict": rc.verdict(c)}

    out = [claim("1a: semi-online RL > SFT on the memory tasks", "memory", "semionline", "sft"),
           claim("1b: semi-online RL > offline RL on the memory tasks", "memory", "semionline", "offline"),
           claim("1b on the Markov tasks (prediction: about 0)", "markov", "semionline", "offline")]
    inter = interaction(cmps["memory"][("semionline", "offline")], cmps["markov"][("semionline", "offline")])
    if inter is not None:
        mem = out[1]["fpr"] or {}
        mk = out[2]["fpr"] or {}
        if mem and mk:
            sim = stats.null_fpr_interaction(mem["n_seeds"], (mem["n_episodes"], mk["n_episodes"]),
                                             (mem["seed_sd_measured"] or 0.0, mk["seed_sd_measured"] or 0.0),
                                             (mem["p0"], mk["p0"]), repeats=repeats, alpha=rc.ALPHA)
            inter["fpr"] = {"fpr_primary_t": sim["primary_t"], "calibrated": sim["primary_t"] <= FPR_MAX, "n_seeds": mem["n_seeds"],
                            "n_episodes": sim["n_episodes"], "seed_sd_measured": sim["seed_sd"], "repeats": repeats}
    out.append({"claim": "interaction: 1b larger on the memory tasks than on the Markov tasks",
                "test": "(semionline - offline) memory - (semionline - offline) markov", "episodes": "test, both sets",
                **rm._pick(inter), "fpr": (inter or {}).get("fpr"), "verdict": rc.verdict(inter)})
    out.append(claim("3: gamma 0.5 > gamma 0 (semi-online) on the memory tasks", "memory", "semionline", "gamma0"))
    c1b = cmps["memory"][("semionline", "offline")]
    goal = None if c1b is None else {
        "target": "semionline - offline on the memory tasks >= +0.05 with primary p < 0.05 (test episodes)",
        "diff": c1b["diff"], "p_value": c1b["p_value"],
        "met": bool(c1b["diff"] >= 0.05 and c1b["p_value"] is not None and c1b["p_value"] < rc.ALPHA)}
    return {"comparisons": out_cmps, "claims": out, "interaction": inter, "goal": goal,
            "probe": probe_comparisons(test_rows), "checks": manipulation_checks(test_rows, tkeys, sets["memory"])}


def manipulation_checks(test_rows: list[dict], tkeys, memory: list[str]) -> dict:
    """The protocol's conditions (§5) under which the memory-task test is uninformative, from the final test
    checkpoints: SFT's pooled memory-task success >= 0.90 (no room); every arm's <= 0.30 (chance 0.25:
    nothing learnt); every arm's step-0 notes carry the fact in >= 95% of the memory episodes (history has
    nothing to fix). informative: none of them holds."""
    sr: dict = {}
    for r in test_rows:
        if r["final"]:
            sub = subset_row(r, tkeys, memory)
            acc = sr.setdefault(r["arm"], [0, 0])
            acc[0] += sub["online_outcomes"].count("1")
            acc[1] += sub["n_online_episodes"]
    rate = {arm: k / n for arm, (k, n) in sr.items() if n}
    notes: dict = {}
    for r in test_rows:
        if r["final"] and r.get("probe"):
            acc = notes.setdefault(r["arm"], [0, 0])
            acc[0] += r["probe"]["pooled"]["note_right"]
            acc[1] += r["probe"]["pooled"]["n"]
    note = {arm: k / n for arm, (k, n) in notes.items() if n}
    checks = {"sft_at_ceiling": rate.get("sft") is not None and rate["sft"] >= 0.90,
              "every_arm_near_chance": bool(rate) and all(v <= 0.30 for v in rate.values()),
              "notes_already_right": bool(note) and all(v >= 0.95 for v in note.values())}
    return {"memory_success": rate, "note_rate": note, **checks, "informative": not any(checks.values())}


def interaction(mem: dict | None, markov: dict | None) -> dict | None:
    """The primary test on the per-seed differences of two comparisons of the same arms and seeds:
    (a - b on the memory tasks) - (a - b on the Markov tasks), seed by seed."""
    if mem is None or markov is None or mem["seeds"] != markov["seeds"]:
        return None
    d = [x - y for x, y in zip(mem["per_seed_diff"], markov["per_seed_diff"])]
    return {"a": f"{mem['a']} - {mem['b']} (memory)", "b": f"{markov['a']} - {markov['b']} (markov)",
            "metric": "online_sr", "seeds": mem["seeds"], **stats.seed_paired_t(d)}


def probe_comparisons(test_rows: list[dict]) -> dict:
    """Per arm (final checkpoints): the note rate on the memory tasks pooled over seeds, per seed, and
    success among the episodes whose note carries the fact and among the others; and the primary test on
    the per-seed note rates of semi-online against offline, gamma 0 and SFT (the mechanism's prediction:
    semi-online's notes carry the fact more often)."""
    per_arm: dict = {}
    for r in test_rows:
        if r["final"] and r.get("probe"):
            a = per_arm.setdefault(r["arm"], {"seeds": [], "note_rate_per_seed": [], "n": 0, "note_right": 0,
                                              "success_note_right": 0, "success_note_wrong": 0})
            p = r["probe"]["pooled"]
            a["seeds"].append(r["seed"])
            a["note_rate_per_seed"].append(r["note_rate"])
            for k in ("n", "note_right", "success_note_right", "success_note_wrong"):
                a[k] += p[k]
            for k, v in (p.get("sampled") or {}).items():  # the sampled notes' counts (memory_probe.sampled_counts)
                if isinstance(v, int):
                    a.setdefault("sampled", {})[k] = a.get("sampled", {}).get(k, 0) + v
    for a in per_arm.values():
        n, k = a["n"], a["note_right"]
        a["note_rate"] = k / n if n else None
        a["note_rate_ci95"] = list(rc.wilson(k, n)) if n else None
        a["success_if_note_right"] = a["success_note_right"] / k if k else None
        a["success_if_note_wrong"] = a["success_note_wrong"] / (n - k) if n - k else None
        if a.get("sampled", {}).get("samples"):
            sm = a["sampled"]
            sm["note_rate"], sm["headroom_rate"] = sm["note_right"] / sm["samples"], sm["headroom"] / sm["episodes"]
    tests = []
    for b in ("offline", "gamma0", "sft"):
        A, B = per_arm.get("semionline"), per_arm.get(b)
        if A and B:
            by = dict(zip(B["seeds"], B["note_rate_per_seed"]))
            d = [x - by[s] for s, x in zip(A["seeds"], A["note_rate_per_seed"]) if s in by]
            if d:
                t = stats.seed_paired_t(d)
                tests.append({"a": "semionline", "b": b, "metric": "note_rate (memory tasks)", **t, "verdict": rc.verdict(t)})
    return {"per_arm": per_arm, "comparisons": tests}


def dose_table(test_rows: list[dict], tkeys, sets: dict, steps: list[int]) -> list[dict]:
    """Each RL arm at each dose point against SFT and semi-online against offline at each point, on each
    task set: the primary test (seed_paired_t) of the per-seed differences."""
    out = []
    for name, tasks in sets.items():
        sub = [subset_row(r, tkeys, tasks) for r in test_rows]
        sft = finals_at(sub, "sft")
        for st in steps:
            for a, b in [(arm, "sft") for arm in ARMS] + [("semionline", "offline")]:
                c = rc.compare_online(finals_at(sub, a, st) + (sft if b == "sft" else finals_at(sub, b, st)), a, b)
                if c:
                    out.append({"tasks": name, "step": st, **{k: c[k] for k in ("a", "b", "diff", "diff_ci95",
                                                                                 "p_value", "n_seeds")}})
    return out


def rl_training(curves: dict) -> dict:
    """Per RL arm, from its runs' metrics.jsonl (seeds pooled, the second half of the steps): the share of
    drawn tasks the std filter kept (tasks_kept / tasks_tried) and the mean training reward per task (the
    filter keys on step-0 returns, which under gamma 0 barely vary on the memory tasks: protocol, §2)."""
    out = {}
    for arm, runs in curves.items():
        rows = [r for rs in runs.values() for r in rs[len(rs) // 2:]]
        tried = sum(r.get("tasks_tried") or 0 for r in rows)
        per_task: dict = {}
        for r in rows:
            for t, v in (r.get("reward_by_task") or {}).items():
                if v.get("reward") is not None:
                    per_task.setdefault(t, []).append(v["reward"])
        if rows:
            out[arm] = {"kept_share": sum(r.get("tasks_kept") or 0 for r in rows) / tried if tried else None,
                        "reward_by_task": {t: float(np.mean(v)) for t, v in per_task.items()}}
    return out


def memory_markdown(s: dict) -> str:
    """The sections of this experiment after rc.markdown's tables."""
    f = fmt
    L = ["", "## Claims on the task sets (primary test: paired t across seeds), with the test's simulated "
         "false-positive rate at this design", "",
         "| claim | test | episodes | diff [95%] | p | seeds | FPR at 0.05 (seed SD measured) | verdict |",
         "|---|---|---|---|---|---|---|---|"]
    for c in s.get("claims") or []:
        fp = c.get("fpr") or {}
        sd = fp.get("seed_sd_measured")
        sd = "/".join(f(x) for x in sd) if isinstance(sd, list) else f(sd)
        L.append(f"| {c['claim']} | {c['test']} | {c.get('episodes', '')} | {f(c.get('diff'), '+.3f')} "
                 f"{fmt_ci(c.get('diff_ci95'))} | {f(c.get('p_value'), '.3g')} | {c.get('n_seeds') or ''} | "
                 f"{f(fp.get('fpr_primary_t'))} ({sd}) | **{c['verdict']}** |")
    if s.get("manipulation_checks"):
        m = s["manipulation_checks"]
        L += ["", "Manipulation checks (protocol §5; final checkpoints, memory tasks): SFT at ceiling (>= 0.90) "
              f"{m['sft_at_ceiling']}, every arm near chance (<= 0.30) {m['every_arm_near_chance']}, every arm's notes "
              f"already right (>= 0.95) {m['notes_already_right']}: the test is **"
              f"{'informative' if m['informative'] else 'uninformative'}**. A simulated false-positive rate above "
              f"{FPR_MAX} marks a calibration failure: "
              + (", ".join(c["claim"].split(":")[0] for c in s.get("claims") or []
                           if (c.get("fpr") or {}).get("calibrated") is False) or "none") + "."]
    if s.get("goal"):
        g = s["goal"]
        L += ["", f"Goal ({g['target']}): diff {f(g['diff'], '+.3f')}, p {f(g['p_value'], '.3g')}: "
              f"**{'met' if g['met'] else 'not met'}**."]
    L += ["", "## Comparisons per task set (test episodes, final checkpoints)", "",
          "| tasks | a | b | diff (a - b) [95%] | p | seeds | FPR at 0.05 | secondary: bootstrap [95%], p | McNemar p |",
          "|---|---|---|---|---|---|---|---|---|"]
    for c in s.get("set_comparisons") or []:
        L.append(f"| {c['tasks']} | {c['a']} | {c['b']} | {f(c['diff'], '+.3f')} {fmt_ci(c.get('diff_ci95'))} | "
                 f"{f(c['p_value'], '.3g')} | {c.get('n_seeds') or ''} | {f((c.get('fpr') or {}).get('fpr_primary_t'))} | "
                 f"{fmt_ci(c.get('diff_ci95_bootstrap'))}, {f(c.get('p_bootstrap'), '.3g')} | {f(c.get('p_mcnemar'), '.3g')} |")
    probe = s.get("probe") or {}
    if probe.get("per_arm"):
        L += ["", "## The probe: does the step-0 note carry the fact? (memory tasks, greedy online play, seeds pooled)", "",
              "| arm | seeds | note carries the fact [95% Wilson] | per seed | success if it does | success if not |",
              "|---|---|---|---|---|---|"]
        for arm, a in probe["per_arm"].items():
            L.append(f"| {arm} | {len(a['seeds'])} | {a['note_right']}/{a['n']} = {f(a['note_rate'])} "
                     f"{fmt_ci(a['note_rate_ci95'])} | {', '.join(f(x, '.2f') for x in a['note_rate_per_seed'])} | "
                     f"{f(a['success_if_note_right'])} | {f(a['success_if_note_wrong'])} |")
        sampled = {arm: a["sampled"] for arm, a in probe["per_arm"].items() if a.get("sampled", {}).get("samples")}
        if sampled:
            L += ["", "Sampled plays' step-0 notes (memory tasks, at the RL temperature): what semi-online RL can "
                  "reinforce is a right note sampled where greedy's is wrong (headroom).", "",
                  "| arm | sampled notes right | episodes with spread (greedy right / wrong) | headroom |",
                  "|---|---|---|---|"]
            for arm, sm in sampled.items():
                L.append(f"| {arm} | {sm['note_right']}/{sm['samples']} = {f(sm['note_rate'])} | {sm['spread']} "
                         f"({sm['spread_greedy_right']} / {sm['spread_greedy_wrong']}) | "
                         f"{sm['headroom']}/{sm['episodes']} = {f(sm['headroom_rate'])} |")
        L += ["", "| a | b | note rate diff [95%] | p (primary) | seeds | verdict |", "|---|---|---|---|---|---|"]
        for c in probe.get("comparisons") or []:
            L.append(f"| {c['a']} | {c['b']} | {f(c['diff'], '+.3f')} {fmt_ci(c['diff_ci95'])} | "
                     f"{f(c['p_value'], '.3g')} | {c['n_seeds']} | {c['verdict']} |")
    if s.get("dose"):
        L += ["", "## Dose points (each RL checkpoint against SFT, and semi-online against offline, per task set)", "",
              "| tasks | step | a | b | diff [95%] | p (primary) | seeds |", "|---|---|---|---|---|---|---|"]
        for d in s["dose"]:
            L.append(f"| {d['tasks']} | {d['step']} | {d['a']} | {d['b']} | {f(d['diff'], '+.3f')} "
                     f"{fmt_ci(d['diff_ci95'])} | {f(d['p_value'], '.3g')} | {d['n_seeds']} |")
    if s.get("rl_training"):
        tasks = sorted({t for a in s["rl_training"].values() for t in a["reward_by_task"]})
        L += ["", "RL training, second half of the steps, seeds pooled: share of drawn tasks the std filter kept, and the "
              "mean training reward per task:", "", "| arm | kept | " + " | ".join(tasks) + " |",
              "|---|---|" + "---|" * len(tasks)]
        for arm, a in s["rl_training"].items():
            L.append(f"| {arm} | {f(a['kept_share'], '.2f')} | "
                     + " | ".join(f(a["reward_by_task"].get(t), ".2f") for t in tasks) + " |")
    if s.get("sft_plateau"):
        L += ["", "SFT's selection success by checkpoint (mean over seeds; the plateau check): "
              + ", ".join(f"step {k} {f(v)}" for k, v in s["sft_plateau"].items()) + "."]
    return "\n".join(L) + "\n"


# -----------------------------------------------------------------------------
# a pretrained model at GPU scale: the preset, the model folder, the launcher, the plan in GPU hours


def take_preset(argv: list[str]) -> tuple[str | None, list[str]]:
    """(--preset NAME or None, argv without it). Raises utils.UsageError for a name not in PRESETS."""
    import utils
    if "--preset" not in argv:
        return None, argv
    i = argv.index("--preset")
    name = argv[i + 1] if i + 1 < len(argv) else ""
    if name not in PRESETS:
        raise utils.UsageError(f"--preset {name!r}: one of {', '.join(PRESETS)}")
    return name, argv[:i] + argv[i + 2:]


def check_model(args, argv: list[str]) -> None:
    """A --model that is not 'tiny'/'tiny:HxL' must be a local Hugging Face folder (config.json), and a pretrained
    model takes no copy warm-up (BASE_STEPS 0: the folder is the base). Raises utils.UsageError otherwise."""
    import utils
    from extras.tiny import parse_tiny
    if parse_tiny(args.model) is not None:  # a malformed 'tiny:...' raises here, before any run
        return
    if not (Path(args.model) / "config.json").is_file():
        raise utils.UsageError(f"--model {args.model}: not 'tiny:HxL' and no config.json there (a local Hugging Face "
                               "folder; nothing is downloaded)")
    if args.base_steps:
        if "--base-steps" in argv:
            raise utils.UsageError(f"--base-steps {args.base_steps}: a pretrained --model takes no copy warm-up (0)")
        args.base_steps = 0


def launched(job: dict, nproc: int) -> dict:
    """A training job under torchrun with `nproc` processes (one per GPU); the same job when nproc is 1."""
    if nproc <= 1:
        return job
    return {**job, "cmd": [job["cmd"][0], "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *job["cmd"][1:]]}


def model_size(model: str) -> int:
    """Parameters of `model` (a tiny spec or a local folder's config.json), counted on the meta device."""
    import torch
    import vlm
    from extras.tiny import parse_tiny, tiny_config
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration
    size = parse_tiny(model)
    cfg = tiny_config(*size, tokenizer=vlm.load_processor("tiny")[0]) if size else AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        return sum(t.numel() for t in Qwen2_5_VLForConditionalGeneration(cfg).parameters())


def flag_value(flags: list[str], name: str, default: int) -> int:
    return int(flags[flags.index(name) + 1]) if name in flags else default


def gpu_plan(args, counts: dict, steps_per_episode: float, gpu: dict = H100) -> dict:
    """The run's GPU hours from FLOP and byte counts (assumptions, not measurements; a first run's stage log
    gives real unit costs). N parameters; every sequence at its budget (prompt P = --max-prompt-tokens, response
    R = --max-new-tokens): an SFT step 8 N B (P + R) FLOPs (forward, backward, checkpointed forward again); an RL
    step's samples S = tasks x rollouts x steps_per_episode x 1.5 (refills), each a prefill (2 N P), R decoded
    tokens (every weight read once per token, the batch decoded together), an update (8 N (P + R)) and the old
    and reference log-probs (4 N (P + R)); an online play's step a prefill and R decoded tokens shared by
    ONLINE_BATCH episodes, plus 0.3 s of browser; an evaluation process 60 s of start and model load. Training
    FLOPs at gpu's mfu x peak over NPROC GPUs; evaluations on one GPU; every GPU held for the whole run
    (gpu_hours = wall x NPROC). Memory: 16 bytes a parameter (weights, gradients, AdamW's two moments), over NPROC."""
    n = model_size(args.model)
    flops = gpu["mfu"] * gpu["peak_flops"]
    decode = 2 * n / (gpu["hbm_bytes_s"] * gpu["decode_eff"])  # seconds per decoded token of a batch (bf16 weights)
    p_sft = flag_value(args.sft_extra, "--max-prompt-tokens", 2048)
    b_sft = flag_value(args.sft_extra, "--batch-size", 16)
    p_rl = flag_value(args.rl_extra, "--max-prompt-tokens", 2048)
    r_rl = flag_value(args.rl_extra, "--max-new-tokens", 256)
    r_eval = flag_value(args.eval_extra, "--max-new-tokens", 256)
    samples = flag_value(args.rl_extra, "--tasks-per-step", 4) * flag_value(args.rl_extra, "--n-rollouts", 8) \
        * steps_per_episode * 1.5
    unit = {"sft_steps": 8 * n * b_sft * (p_sft + 256) / (flops * args.nproc),
            "rl_steps": (samples * (2 * n * p_rl + 12 * n * (p_rl + r_rl)) / (flops * args.nproc)
                         + steps_per_episode * r_rl * decode),
            "online_episodes": steps_per_episode * (2 * n * p_rl / flops + r_eval * decode / args.online_batch + 0.3),
            "stages": 60.0}
    unit["sampled_plays"] = unit["online_episodes"]
    wall = sum(counts.get(k, 0) * unit[k] for k in unit)
    return {"parameters": n, "unit_seconds": {k: round(v, 2) for k, v in unit.items()}, "wall_h": wall / 3600,
            "gpu_hours": wall / 3600 * args.nproc, "gpus": args.nproc, "train_memory_gb": 16 * n / 1e9,
            "fits": 16 * n / 1e9 <= 78 * args.nproc, "gpu": gpu}


def print_gpu_plan(args, counts: dict, steps_per_episode: float) -> None:
    """The dry run's GPU lines: the model, the screenshots at its resolution, the units, the hours (gpu_plan)."""
    import gui
    g = gpu_plan(args, counts, steps_per_episode)
    max_px = flag_value(args.sft_extra, "--max-pixels", gui.MAX_PIXELS)
    w, h = gui.resized_size((168, 224), factor=28, max_pixels=max_px)
    print(f"[gpu] preset {args.preset}: {args.model}, {g['parameters'] / 1e9:.2f} B parameters, its own tokenizer; "
          f"screenshots 168 x 224 -> {w} x {h} at its patch grid (14 x 14, merged 2 x 2: {w * h // 784} visual "
          "tokens); "
          f"no copy warm-up. Units: {counts['sft_steps']} SFT steps, {counts['rl_steps']} RL steps, "
          f"{counts['online_episodes']} online episodes + {counts.get('sampled_plays', 0)} sampled plays, "
          f"{counts['stages']} evaluation processes; seconds each (assumed, runs/repro_memory.gpu_plan): "
          f"{g['unit_seconds']}.", flush=True)
    print(f"[gpu] estimate: {g['wall_h']:.1f} h wall on {g['gpus']} H100 = {g['gpu_hours']:.1f} GPU hours "
          "(assumptions: "
          f"bf16 peak {g['gpu']['peak_flops'] / 1e12:.0f} TFLOP/s at {g['gpu']['mfu']:.0%} for training and prefill, "
          f"decoding at {g['gpu']['decode_eff']:.0%} of {g['gpu']['hbm_bytes_s'] / 1e12:.2f} TB/s, every sequence at "
          f"its token budget, {steps_per_episode:.1f} steps an episode as in the demonstrations). Training memory "
          f"~{g['train_memory_gb']:.0f} GB (16 bytes a parameter) over {g['gpus']} x 78 GB: "
          + ("fits." if g["fits"] else "does NOT fit: use --preset gpu8, or LoRA ('--lora-r 64' in --sft-extra and "
                                       "--rl-extra)."), flush=True)


# -----------------------------------------------------------------------------
# main


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    preset, argv = take_preset(argv)
    args = rc.parse(__doc__, {**SETTING, **PRESETS.get(preset, {})}, QUICK, argv)
    args.preset = preset
    check_model(args, argv)
    if preset and "--jobs" not in argv:
        args.jobs = 1  # one GPU (or one torchrun of NPROC) at a time
    t_start = time.time()
    args.tasks = [*args.memory_tasks, *args.markov_tasks]
    sets = {"memory": list(args.memory_tasks), "markov": list(args.markov_tasks)}
    out_json = args.results_dir / "memory" / ("repro_main_quick.json" if args.quick else "repro_main.json")
    stages = rc.Stages(jobs=args.jobs, force=args.force, dry_run=args.dry_run)
    previous = rc.read_previous(out_json)
    data = rc.prepare_data(args)
    keys = data["online_episodes"]
    tkeys = rc.episode_keys(args.tasks, args.test_episodes, args.test_seed_base)

    # --- the plan
    base = rc.base_job(args, data)
    sft = {s: launched(rc.sft_job(args, data, s, base, points=args.sft_points), args.nproc) for s in args.seeds}
    sft_steps = rc.checkpoint_steps(args.sft_steps, args.sft_points)
    sel_evals = [rc.checkpoint_eval(args, data, "sft", s, j, st, st == args.sft_steps)
                 for s, j in sft.items() for st in sft_steps]
    rl_path = rm.rl_data(args, data, args.tasks)
    sub = rm.argparse_like(args, rl_extra=[*args.rl_extra, "--temperature", str(args.rl_temperature)])
    rl = {(arm, s): launched(rc.rl_job(sub, data, sft[s], s, arm, flags, train=rl_path, points=args.rl_points),
                             args.nproc) for arm, flags in ARMS.items() for s in args.seeds}
    control = {s: launched(rm.control_job(args, data, sft[s], s, rl_path), args.nproc)
               for s in args.seeds} if args.control else {}
    rl_steps = rc.checkpoint_steps(args.rl_steps, args.rl_points)
    finals = [e for e in sel_evals if e["meta"][4]]
    finals += [rc.checkpoint_eval(args, data, arm, s, j, st, st == args.rl_steps)
               for (arm, s), j in rl.items() for st in rl_steps]
    finals += [rc.checkpoint_eval(args, data, CONTROL, s, j, j["steps"], True) for s, j in control.items()]
    probe = (["--samples", str(args.probe_samples), "--temperature", str(args.rl_temperature)]
             if args.probe_samples else [])
    tests = [rc.test_eval_job(args, data, tkeys, e, probe if e["meta"][4] else [], script="runs/memory_probe.py",
                              done=memory_probe.RESPONSES_FILE) for e in finals]  # samples: final checkpoints only

    # --- the estimate
    costs = rc.load_costs(COSTS, rc.REPO / "results" / "repro_main.json", out_json, online_batch=args.online_batch)
    est = {}
    for everything in (False, True):
        left = lambda jobs: [j for j in jobs if everything or args.force or not j["done"].exists()]  # noqa: E731,B023
        c = rc.pending_counts(args, len(args.tasks), len(keys), base, {"sft": list(sft.values()), "rl": list(rl.values())},
                              sel_evals, everything=everything)
        c["sft_steps"] += sum(j["steps"] for j in left(list(control.values())))
        c["online_episodes"] += len(left(tests)) * len(tkeys)
        c["sampled_plays"] = c.get("sampled_plays", 0) + sum(
            len(tkeys) * args.probe_samples for j, e in zip(tests, finals) if e["meta"][4] and j in left(tests))
        c["stages"] += len(left(tests))
        est[everything] = (rc.estimate(c, costs, args.jobs), c)
    parts = {k: round(est[True][1].get(k, 0) * costs.get(k, 0.0) / 60, 1)
             for k in ("base_steps", "sft_steps", "rl_steps", "online_episodes", "sop_episodes", "stages")}
    print(f"[plan] tasks {sets}, seeds {args.seeds}, arms sft + {list(ARMS)} + {CONTROL if args.control else 'no control'}; "
          f"{len(sel_evals)} SFT checkpoints x {len(keys)} selection episodes, {len(tests)} test checkpoints x "
          f"{len(tkeys)} test episodes (seeds {args.test_seed_base}+); estimated wall {est[False][0] / 60:.0f} min with "
          f"{args.jobs} jobs for what is still to run (from scratch: {est[True][0] / 60:.0f} min; serial minutes by unit "
          f"from scratch, before {args.jobs} jobs share the cores: {parts}; costs s/unit: {costs})", flush=True)
    if args.preset and args.preset.startswith("gpu"):
        print_gpu_plan(args, est[True][1], float(np.mean([len(e["steps"]) for f in rc.data_files(args.train_data)
                                                          for e in map(json.loads, f.read_text().splitlines())])))

    rows, test_rows, curves = [], [], {}
    order = {a: i for i, a in enumerate(["sft", *ARMS, CONTROL])}
    ordered = lambda rs: sorted(rs, key=lambda r: (order.get(r["arm"], 9), r["seed"], r["step"]))  # noqa: E731

    def summary(final_report: bool = False) -> dict:
        ck, tck = ordered(rows), ordered(test_rows)
        for r in tck:
            r.update(probe_fields(rc.REPO / r["eval"]))
        r2f, _ = rc.r2_summary(ck)
        res = claims(tck, tkeys, sets, repeats=4000 if final_report else 200)
        plateau = {st: float(np.mean([r["online_sr"] for r in ck if r["arm"] == "sft" and r["step"] == st]))
                   for st in sft_steps if any(r["arm"] == "sft" and r["step"] == st for r in ck)}
        return {"command": rc.command_line("repro_memory.py", argv), "commit": rc.git_commit(), "seeds": args.seeds,
                "wall_s": round(time.time() - t_start, 1), "stages": stages.log,
                "reused_stages": rc.reused_stages(stages.skipped, previous),
                "config": {k.lower(): getattr(args, k.lower()) for k in SETTING}, "task_sets": sets,
                "rl_tasks": args.tasks, "tasks": args.tasks,
                "rl_data": {"file": rc._rel(rl_path), "episodes_per_task": rc.episodes_per_task(rl_path)},
                "online_episodes": [list(k) for k in keys], "checkpoints": ck, **r2f, "comparisons": [],
                "sft_plateau": plateau, "test_episodes": [list(k) for k in tkeys], "test_checkpoints": tck,
                "test_comparisons": [], "test_arms": rc.arm_summaries(tck, curves), "arms": rc.arm_summaries(ck, {}),
                "rl_training": rl_training(curves),
                "set_comparisons": res["comparisons"], "claims": res["claims"], "goal": res["goal"],
                "interaction": res["interaction"], "probe": res["probe"], "manipulation_checks": res["checks"],
                "dose": dose_table(tck, tkeys, sets, rl_steps),
                "unit_costs": rc.merged_costs(rc.unit_costs(stages.log, ck, args.sft_steps, args.rl_steps, args.base_steps),
                                              previous, args.online_batch),
                "complete": final_report}

    title = "MiniWob++ reproduction: claim 1b where history matters (memory tasks)"
    if not args.report_only:
        if args.base_steps > 0:
            stages.run([base])
        stages.run(list(sft.values()))
    # SFT's plateau on the selection episodes (before any RL: a look at it changes nothing that runs later)
    rc.run_evals(args, [e for e in sel_evals if args.dry_run or e["checkpoint"].exists()], stages, rows, keys,
                 summary, out_json, title)
    if not args.report_only:  # RL (semi-online first: the longest) and the control
        longest_first = sorted(rl, key=lambda k: k[0] != "semionline")
        stages.run([rl[k] for k in longest_first] + list(control.values()))
    curves.update({arm: {s: rc.read_metrics(rl[(arm, s)]["dir"]) for s in args.seeds} for arm in ARMS})
    todo = [j for j, e in zip(tests, finals) if args.dry_run or e["checkpoint"].exists()]
    rc.run_evals(args, todo, stages, test_rows, tkeys, summary, out_json, title)
    if args.dry_run:
        return {}
    result = summary(final_report=True)
    if args.report_only and out_json.exists():
        old = json.loads(out_json.read_text())
        result.update({k: old[k] for k in ("command", "commit", "stages", "reused_stages", "wall_s") if k in old},
                      report_commit=rc.git_commit())
    rc.write_results(result, out_json, title)
    clean = rc._nan_to_none(result)  # the claims and the goal in memory_markdown's table, with their FPRs
    md = rc.markdown({**clean, "claims": None, "goal": None}, title) + memory_markdown(clean)
    out_json.with_suffix(".md").write_text(md)
    print(md, flush=True)
    return result


if __name__ == "__main__":
    import cli
    cli.run_script(main)

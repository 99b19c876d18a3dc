"""The paper's ablations at CPU scale on MiniWob++ (docs/method.md §5, §6, §9), each arm semi-online
RL from the same SFT checkpoint of each seed, evaluated online on the same fresh episodes:
  3. discount: gamma 0.5 beats gamma 0;
  4. patch threshold: a higher threshold (0 vs 1 vs unlimited) helps and keeps policy entropy higher;
  5. patch modes: on-policy and thought-free thoughts beat off-policy thoughts;
  6. data scaling: online success against training episodes N follows y = A - B N^k, and a higher
     patch threshold (unlimited vs 0) moves k closer to 0 (paper: -1.13 -> -0.73).
Writes results/repro_ablations.{json,md} and results/repro_ablations_{bars,curves,scaling,r2}.png.

    python runs/repro_ablations.py            # the full setting below (prints its estimated wall time first)
    python runs/repro_ablations.py --quick    # a small check of the whole pipeline (< 20 min on 2 cores)
    python runs/repro_ablations.py --dry-run  # the commands and the estimate, nothing run

The setting is the main table's as it stood at 4dcb83c (RL 100 steps at 6e-5, 4 rollouts at
temperature 0.5, KL 0.05, no std filter, on all 8 tasks), not runs/repro_main.py's current one (the
release's recipe on the tasks its rule picks): the README's ablation table was measured in it. Runs
of an identical command under OUT (an earlier ablation run's SFT and reference arm, gamma 0.5,
threshold 2, thought-free) are reused, not retrained.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import repro_common as rc  # noqa: E402
from evaluation import stats  # noqa: E402
import repro_main  # noqa: E402
from repro_main import MULTI_STEP, TEST  # noqa: E402

# --- the setting: every default in one place (each key is also a command-line flag)
SETTING = dict(
    TASKS=MULTI_STEP,                            # the main table's setting at 4dcb83c (module docstring)
    TRAIN_DATA="data/miniwob/train.jsonl",
    TEST_DATA="data/miniwob/test.jsonl",
    RL_DATA="data/miniwob/rl.jsonl",             # RL demonstrations SFT never saw (seeds 300000+; "": TRAIN_DATA)
    MODEL="tiny:128x4",
    MODEL_ARGS=[],
    BASE_STEPS=3000,                             # copy warm-up steps of the shared base (0: --model is the base)
    BASE_EXTRA=["--copy-warmup-elements", "4", "--copy-warmup-type-frac", "0.25"],  # synthetic pages of 1-4 elements, 1 in 4 a type page
    SEEDS=[0, 1],                                # seeds per ablation arm (>= 2; the main table's seeds 0-1)
    SFT_STEPS=300, SFT_LR=1e-3, SFT_EXTRA=[],
    RL_STEPS=100, RL_LR=6e-5,
    RL_EXTRA=["--tasks-per-step", "4", "--n-rollouts", "4", "--max-new-tokens", "80", "--temperature", "0.5",
              "--filter-std", "0", "--kl-coef", "0.05"],
    EVAL_MID=False,
    EVAL_PER_TASK=4,
    ONLINE_EPISODES=104,
    ONLINE_SEED_BASE=200000,
    ONLINE_MAX_STEPS=10,
    ONLINE_BATCH=2,                              # online episodes in flight per evaluation (as repro_main.py)
    EVAL_EXTRA=["--max-new-tokens", "80"],
    ARMS=["gamma0", "thr0", "thr1", "thr_unlim"],  # ablation arms run besides the shared reference (ARMS below):
                                                 # claims 3-4; 71 min on 2 cores after repro_main.py (whose runs it
                                                 # reuses) at 4dcb83c. Patch modes: --arms ... off-policy on-policy
    SCALING_PER_TASK=[],                         # training episodes per task of the data-scaling runs ([]: none)
    SCALING_THRESHOLDS=[0, -1],                  # patch thresholds whose laws are compared
    SCALING_SEEDS=[0],
    **TEST,                                      # claims 3-5 on the main table's test episodes (the scaling points
                                                 # stay on the selection episodes)
)
QUICK = dict(SEEDS=[0], BASE_STEPS=20, SFT_STEPS=20, RL_STEPS=2, EVAL_PER_TASK=1, ONLINE_EPISODES=8,
             SCALING_PER_TASK=[2, 24], ARMS=["gamma0", "thr0"], TASKS=["enter-text", "click-option"], TEST_EPISODES=4)
# seconds per unit, 2 jobs: repro_main.py's COSTS but RL 9.8, the semi-online arms' CPU s per step in the main
# table's run at 4dcb83c (its 8.2 averages in the cheaper offline arm); replaced by the usable unit_costs of an
# earlier results JSON (rc.load_costs)
COSTS = {**repro_main.COSTS, "rl_steps": 9.8}


def flags(gamma="0.5", threshold="2", patch="thought-free") -> list[str]:
    return ["--history", "own", "--gamma", gamma, "--patch-threshold", threshold, "--patch", patch]


# arm -> RL flags; "semionline" is the reference, the same run as the main table's
ARMS = {"semionline": rc.SEMIONLINE_REF, "gamma0": flags(gamma="0"), "thr0": flags(threshold="0"),
        "thr1": flags(threshold="1"), "thr_unlim": flags(threshold="-1"), "on-policy": flags(patch="on-policy"),
        "off-policy": flags(patch="off-policy")}
assert ARMS["semionline"] == flags()
GROUPS = [("3: discount", ["semionline", "gamma0"]),
          ("4: patch threshold", ["thr0", "thr1", "semionline", "thr_unlim"]),
          ("5: patch mode", ["semionline", "on-policy", "off-policy"])]


def thr_name(t: int) -> str:
    return "unlim" if t < 0 else str(t)


def main(argv=None) -> dict:
    args = rc.parse(__doc__, SETTING, QUICK, argv)
    t_start = time.time()
    out_json = args.results_dir / ("repro_ablations_quick.json" if args.quick else "repro_ablations.json")
    stages = rc.Stages(jobs=args.jobs, force=args.force, dry_run=args.dry_run)
    previous = rc.read_previous(out_json)  # for the provenance of the stages this run reuses
    data = rc.prepare_data(args)
    keys = data["online_episodes"]
    n_tasks = len(data["tasks"])
    scale_runs = [(t, n, s) for t in args.scaling_thresholds for n in args.scaling_per_task for s in args.scaling_seeds]

    # --- SFT per seed (shared with repro_main.py when the setting is the same)
    sft_seeds = sorted(set(args.seeds) | set(args.scaling_seeds))
    base = rc.base_job(args, data)
    sft = {s: rc.sft_job(args, data, s, base) for s in sft_seeds}
    # --- RL: every ablation arm per seed, then the data-scaling runs on per-task subsets
    unknown = set(args.arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"--arms: unknown {sorted(unknown)}; known: {sorted(ARMS)}")
    arms = {a: f for a, f in ARMS.items() if a == "semionline" or a in args.arms}
    rl = {(arm, s): rc.rl_job(args, data, sft[s], s, arm, f) for arm, f in arms.items() for s in args.seeds}
    per_task_all = min(rc.episodes_per_task(data["rl"]).get(t, 0) for t in data["tasks"])
    point_arm = {}  # (threshold, episodes per task, seed) -> the arm whose final checkpoint is that point
    for t, n, s in scale_runs:
        same = next((a for a, f in arms.items() if f == flags(threshold=str(t))), None)
        if n >= per_task_all and same and s in args.seeds:  # the full data: the ablation arm's own run
            point_arm[(t, n, s)] = same
            continue
        name = f"scale_t{thr_name(t)}_n{n * n_tasks}"
        sub = rc.write_subset(data["rl"], args.out_root / "data" / f"{data['rl'].stem}_{n}pt.jsonl", data["tasks"], n)
        rl[(name, s)] = rc.rl_job(args, data, sft[s], s, name, flags(threshold=str(t)), train=sub)
        point_arm[(t, n, s)] = name

    # --- estimate: only what is still to run (a stage shared with repro_main.py or finished earlier is skipped)
    sft_evals = {s: rc.checkpoint_eval(args, data, "sft", s, sft[s], args.sft_steps) for s in args.seeds}
    rl_evals = {(arm, s): rc.checkpoint_eval(args, data, arm, s, tj, args.rl_steps) for (arm, s), tj in rl.items()}
    evals = [*sft_evals.values(), *rl_evals.values()]
    finals = [*sft_evals.values(), *(e for (arm, _), e in rl_evals.items() if arm in arms)]  # on the test episodes too
    counts = rc.pending_counts(args, n_tasks, len(keys), base, {"sft": list(sft.values()), "rl": list(rl.values())}, evals)
    # the main table's evaluation costs apply here; its RL step (8 rollouts, refills) does not: RL's from this script
    costs = {**rc.load_costs(COSTS, args.results_dir / "repro_main_quick.json", args.results_dir / "repro_main.json",
                             online_batch=args.online_batch), "rl_steps": COSTS["rl_steps"]}
    costs = rc.load_costs(costs, out_json, online_batch=args.online_batch)
    per_run = (args.rl_steps * costs["rl_steps"] + len(keys) * costs["online_episodes"]
               + args.eval_per_task * n_tasks * costs["sop_episodes"] + costs["stages"]) / max(args.jobs, 1)
    not_run = [{"what": f"arm {a} ({' '.join(ARMS[a])}), seeds {args.seeds}",
                "estimate_min": round(len(args.seeds) * per_run / 60)} for a in ARMS if a not in arms]
    if not scale_runs:
        n_scale = len(args.scaling_thresholds) * 4 * len(args.scaling_seeds)  # e.g. 4 data sizes per threshold
        not_run.append({"what": f"data scaling: thresholds {args.scaling_thresholds}, 4 sizes, seeds {args.scaling_seeds}",
                        "estimate_min": round(n_scale * per_run / 60)})
    full = rc.pending_counts(args, n_tasks, len(keys), base, {"sft": list(sft.values()), "rl": list(rl.values())}, evals,
                             everything=True)
    rc.add_test_counts(args, data, keys, finals, counts, full)
    print(f"[plan] {n_tasks} tasks, seeds {args.seeds}, {counts['rl_steps'] // max(args.rl_steps, 1)} of {len(rl)} RL runs and "
          f"{counts['stages']} of {full['stages']} evaluations still to run ({len(evals)} on the {len(keys)} selection episodes, "
          f"{len(finals)} on {args.test_episodes} test episodes); estimated wall "
          f"{rc.estimate(counts, costs, args.jobs) / 60:.0f} min with {args.jobs} jobs (from scratch, the shared SFT and "
          f"reference runs included: {rc.estimate(full, costs, args.jobs) / 60:.0f} min; costs s/unit: {costs})", flush=True)
    for n in not_run:
        print(f"[not run] {n['what']}: ~{n['estimate_min']} min", flush=True)

    if not args.report_only:
        if args.base_steps > 0:
            stages.run([base])
        stages.run(list(sft.values()))
        stages.run(list(rl.values()))

    # --- evaluate the SFT checkpoints and every RL run's end on the same online episodes
    todo = [e for s, e in sft_evals.items() if sft[s]["done"].exists()] + \
        [e for k, e in rl_evals.items() if rl[k]["done"].exists() or args.dry_run]
    rows, test_rows, test = [], [], {}
    curves = {arm: {s: rc.read_metrics(rl[(arm, s)]["dir"]) for s in args.seeds} for arm in arms}

    def summary(final_report: bool = False) -> dict:
        ck, tck = (sorted(r, key=lambda r: (r["arm"], r["seed"])) for r in (rows, test_rows))
        r2f, r2cmp = rc.r2_summary(ck)
        pairs = [("semionline", "gamma0"), ("thr1", "thr0"), ("thr_unlim", "thr0"), ("thr_unlim", "thr1"),
                 ("on-policy", "off-policy"), ("semionline", "off-policy"), ("semionline", "sft")]
        sel_cmps = {(a, b): rc.compare_online(ck, a, b) for a, b in pairs}
        test_cmps = {(a, b): rc.compare_online(tck, a, b) for a, b in pairs}
        on_test = any(test_cmps.values())  # the claims' episodes: the test episodes once they ran
        cmps = test_cmps if on_test else sel_cmps
        ent = {(a, b): rc.compare_curves(curves, a, b, "entropy") for a, b in (("thr_unlim", "thr0"), ("thr1", "thr0"))}
        # --- data scaling: one law per patch threshold over its (N, online SR) points
        points, fits = {}, {}
        for t in (args.scaling_thresholds if scale_runs else []):  # no scaling runs: no laws to fit
            name = f"thr {thr_name(t)}"
            pts = [(min(n, per_task_all) * n_tasks, r["online_sr"]) for (tt, n, sd), arm in point_arm.items() if tt == t
                   for r in ck if r["arm"] == arm and r["seed"] == sd]
            points[name] = pts
            try:
                fits[name] = stats.scaling_bootstrap([p[0] for p in pts], [p[1] for p in pts], seed=0)
            except ValueError as e:  # fewer than 3 sizes evaluated so far
                fits[name] = {"error": str(e)}
        k_cmp = None
        if scale_runs and len(args.scaling_thresholds) >= 2:
            hi, lo = max(args.scaling_thresholds, key=lambda t: 1e9 if t < 0 else t), min(
                args.scaling_thresholds, key=lambda t: 1e9 if t < 0 else t)
            k_cmp = rc.compare_scaling(fits.get(f"thr {thr_name(hi)}"), fits.get(f"thr {thr_name(lo)}"),
                                       f"k thr {thr_name(hi)}", f"k thr {thr_name(lo)}")

        def claim(text, c, higher_is="a"):
            return {"claim": text, "test": f"{c['a']} - {c['b']} ({c.get('metric')})" if c else "not run",
                    "episodes": ("test" if on_test else "selection") if c and c.get("metric") == "online_sr" else None,
                    "diff": c["diff"] if c else None, "diff_ci95": c.get("diff_ci95") if c else None,
                    "p_value": c["p_value"] if c else None, "n_seeds": c.get("n_seeds") if c else None,
                    "p_bootstrap": c.get("p_bootstrap") if c else None, "verdict": rc.verdict(c, higher_is)}
        claims = [claim("3: gamma 0.5 > gamma 0 (online SR)", cmps[("semionline", "gamma0")]),
                  claim("4a: threshold 1 > threshold 0 (online SR)", cmps[("thr1", "thr0")]),
                  claim("4b: unlimited threshold > threshold 0 (online SR)", cmps[("thr_unlim", "thr0")]),
                  claim("4c: unlimited threshold keeps entropy higher than 0", ent[("thr_unlim", "thr0")]),
                  claim("5a: on-policy thoughts > off-policy thoughts (online SR)", cmps[("on-policy", "off-policy")]),
                  claim("5b: thought-free > off-policy thoughts (online SR)", cmps[("semionline", "off-policy")]),
                  claim("6: a higher patch threshold moves the scaling exponent k towards 0", k_cmp)]
        comparisons = [c for c in [*sel_cmps.values(), *ent.values(), k_cmp, r2cmp] if c]
        s = {"command": rc.command_line("repro_ablations.py", argv),
             "commit": rc.git_commit(), "seeds": args.seeds, "scaling_seeds": args.scaling_seeds,
             "wall_s": round(time.time() - t_start, 1), "stages": stages.log, "reused_stages": rc.reused_stages(stages.skipped, previous),
             "config": {k.lower(): getattr(args, k.lower()) for k in SETTING}, "tasks": data["tasks"],
             "online_episodes": [list(k) for k in keys], "checkpoints": ck, **r2f, "comparisons": comparisons,
             "claims": claims, "arms": rc.arm_summaries(ck, curves),
             "scaling": {a: {k: v for k, v in f.items() if k != "k_boot"} for a, f in fits.items()},
             "scaling_points": points, "not_run": not_run,
             "unit_costs": rc.merged_costs(rc.unit_costs(stages.log, ck, args.sft_steps, args.rl_steps,
                                                           args.base_steps), previous, args.online_batch),
             "complete": final_report,
             "headroom": test.get("headroom"), "test_episodes": [list(k) for k in test.get("keys", [])],
             "test_checkpoints": tck, "test_comparisons": [c for c in test_cmps.values() if c],
             "test_arms": rc.arm_summaries(tck, {}),
             "primary_test_fpr": rc.primary_test_fpr(tck or ck) if final_report else None}
        if final_report:
            stem = args.results_dir / out_json.stem
            bars = (s["test_arms"], "test episodes") if on_test else (s["arms"], "selection episodes")
            figs = [rc.plot_bars(Path(f"{stem}_bars.png"), GROUPS, *bars), rc.plot_r2(Path(f"{stem}_r2.png"), ck, s)]
            if any(rs for runs in curves.values() for rs in runs.values()):
                figs.append(rc.plot_curves(Path(f"{stem}_curves.png"), curves))
            if any(points.values()):
                figs.append(rc.plot_scaling(Path(f"{stem}_scaling.png"), points, fits))
            s["figures"] = [rc._rel(f) for f in figs]
        return s

    title = "MiniWob++ reproduction: ablations"
    run_test = lambda: rc.run_test_stage(args, data, keys, finals, rows, test_rows, test, stages, summary, out_json, title)  # noqa: E731
    return rc.collect_and_report(args, todo, stages, rows, keys, summary, out_json, title, then=run_test)


if __name__ == "__main__":
    import cli
    cli.run_script(main)

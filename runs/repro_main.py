"""The main table of the MiniWob++ reproduction: base, SFT, SFT + offline RL and SFT + semi-online RL,
several seeds, every checkpoint measured by SOP, static step success and online success on the same
fresh *selection* episodes (every task). Then the *test* episodes: the tasks where SFT's pooled
selection success is strictly between 0 and 1 (where arms can differ; chosen by SFT's numbers only)
get TEST_EPISODES new seeds, played by every final SFT and RL checkpoint. Tests the paper's claims
(docs/method.md §9):
  1. SFT + semi-online RL beats SFT, and beats offline RL (--history expert) from the same SFT
     checkpoint, on online success on the test episodes (paired, per seed, then pooled with a
     two-level bootstrap; on the selection episodes when no task has headroom);
  2. SOP-PG tracks online success better than static step SR (R^2 over every evaluated checkpoint on
     the selection episodes: base, SFT and RL midpoints and ends; paper 0.934 vs 0.470).
Writes results/repro_main.{json,md}, results/repro_main_r2.png, results/repro_main_curves.png.

    python runs/repro_main.py               # the full setting below (prints its estimated wall time first)
    python runs/repro_main.py --quick       # a small check of the whole pipeline (< 20 min on 2 cores)
    python runs/repro_main.py --dry-run     # the commands and the estimate, nothing run
    python runs/repro_main.py --report-only # rebuild the results from the runs that exist

Each stage is a printed call of a stage script, logged to its run folder (OUT/<stage>/<name>_<hash>/
log.txt) and skipped when its output exists; the results are rewritten after every evaluated
checkpoint, so an interrupted run leaves partial results. runs/repro_ablations.py shares OUT and
reuses the SFT runs of an identical setting.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import repro_common as rc  # noqa: E402

# --- the setting: every default in one place (each key is also a command-line flag)
MULTI_STEP = ["enter-text", "enter-password", "login-user", "click-checkboxes", "click-tab-2", "click-option",
              "click-button-sequence", "click-collapsible"]  # 2-6 steps each (terminate included)
# the claims on online success are tested on fresh episodes of the tasks with headroom: those where SFT's
# pooled online success on the selection episodes (ONLINE_*) lies strictly inside HEADROOM (a task at 0 or 1
# for SFT adds pairs that cannot differ; the choice uses SFT's numbers only). 0 episodes: the claims use the
# selection episodes. Shared with runs/repro_ablations.py
TEST = dict(
    TEST_EPISODES=160,                           # per final checkpoint, split evenly over the selected tasks
    TEST_SEED_BASE=220000,                       # fresh: not the data files', ONLINE_SEED_BASE's or repro_confirm's (210000+)
    HEADROOM=[0.0, 1.0],
)
SETTING = dict(
    TASKS=MULTI_STEP,                            # MiniWob++ task subset (None: every task of TEST_DATA)
    TRAIN_DATA="data/miniwob/train.jsonl",
    TEST_DATA="data/miniwob/test.jsonl",
    RL_DATA="data/miniwob/rl.jsonl",             # RL demonstrations SFT never saw (seeds 300000+; "": TRAIN_DATA)
    MODEL="tiny:128x4",                          # 'tiny:HxL' or a Hugging Face folder
    MODEL_ARGS=[],                               # flags of the untrained model, given to the base stage and its eval
    SEEDS=[0, 1, 2],                             # training seeds per arm (claims 1-2: >= 3)
    BASE_STEPS=3000,                             # copy warm-up steps of the shared base (0: --model is the base)
    BASE_EXTRA=["--copy-warmup-elements", "4", "--copy-warmup-type-frac", "0.25"],  # synthetic pages of 1-4 elements, 1 in 4 a type page
    SFT_STEPS=300, SFT_LR=1e-3, SFT_EXTRA=[],
    RL_STEPS=100, RL_LR=6e-5,                    # RL on RL_DATA, demonstrations SFT never saw
    # temperature 0.5 and KL 0.05: why, in results/LOG.md (the tiny model's samples at 1.0 are far from greedy)
    RL_EXTRA=["--tasks-per-step", "4", "--n-rollouts", "4", "--max-new-tokens", "80", "--temperature", "0.5",
              "--filter-std", "0", "--kl-coef", "0.05"],
    EVAL_MID=False,                              # also evaluate the SFT and RL midpoints (more points for R^2)
    EVAL_PER_TASK=4,                             # SOP/static test episodes per task
    ONLINE_EPISODES=104,                         # at least this many fresh online episodes per checkpoint
    ONLINE_SEED_BASE=200000,                     # fresh: not the seeds of the train (0+) or test (100000+) files
    ONLINE_MAX_STEPS=10,
    ONLINE_BATCH=2,                              # online episodes in flight per evaluation (one browser each)
    EVAL_EXTRA=["--max-new-tokens", "80"],
    **TEST,
)
QUICK = dict(SEEDS=[0], BASE_STEPS=20, SFT_STEPS=20, RL_STEPS=2, EVAL_PER_TASK=1, ONLINE_EPISODES=8,
             TASKS=["enter-text", "click-option"], TEST_EPISODES=4)
# seconds per unit, 2 jobs on the 2-core machine, measured by this script's full run from scratch at 4dcb83c
# (results/repro_main.json: wall 69.1 min; the estimate from these costs, 70): base (alone, 2 threads; wall) 0.095,
# SFT 0.94, RL 8.2 (CPU s per step, process start included: offline 6.7, semi-online 9.8), online episodes 2 at a
# time 0.76; replaced by the usable unit_costs of an earlier run's results JSON (rc.load_costs)
COSTS = {"base_steps": 0.095, "sft_steps": 0.94, "rl_steps": 8.2, "online_episodes": 0.76, "sop_episodes": 0.43, "stages": 3.2}
ARMS = {"offline": ["--history", "expert"], "semionline": rc.SEMIONLINE_REF}  # RL arms and their flags


def main(argv=None) -> dict:
    args = rc.parse(__doc__, SETTING, QUICK, argv)
    t_start = time.time()
    out_json = args.results_dir / ("repro_main_quick.json" if args.quick else "repro_main.json")
    stages = rc.Stages(jobs=args.jobs, force=args.force, dry_run=args.dry_run)
    previous = rc.read_previous(out_json)  # for the provenance of the stages this run reuses
    data = rc.prepare_data(args)
    keys = data["online_episodes"]

    # --- estimate: only what is still to run (a finished stage, or one shared with repro_ablations.py, is skipped)
    base = rc.base_job(args, data)
    sft = {s: rc.sft_job(args, data, s, base) for s in args.seeds}
    rl = {(arm, s): rc.rl_job(args, data, sft[s], s, arm, flags) for arm, flags in ARMS.items() for s in args.seeds}
    base_eval = {**rc.eval_job(args, data, rc.base_model(args, base), f"base_{base['dir'].name}", 0),
                 "meta": ("base", "base", 0, 0, True, rc._rel(base["dir"]) if args.base_steps else None)}
    planned = [(tj, rc.checkpoint_eval(args, data, arm, s, tj, step, final))  # (training job, its evaluation)
               for arm, runs, steps in [("sft", sft, args.sft_steps)] + [(a, {s: rl[(a, s)] for s in args.seeds},
                                                                         args.rl_steps) for a in ARMS]
               for s, tj in runs.items() for step, final in rc.checkpoints_of(steps, args.eval_mid)]
    evals = [base_eval] + [e for _, e in planned]
    train = {"sft": list(sft.values()), "rl": list(rl.values())}
    finals = [e for _, e in planned if e["meta"][4]]  # the claims' checkpoints: final SFT and RL
    counts = rc.pending_counts(args, len(data["tasks"]), len(keys), base, train, evals)
    full = rc.pending_counts(args, len(data["tasks"]), len(keys), base, train, evals, everything=True)
    rc.add_test_counts(args, data, keys, finals, counts, full)
    costs = rc.load_costs(COSTS, out_json, online_batch=args.online_batch)
    print(f"[plan] {len(data['tasks'])} tasks, seeds {args.seeds}, {len(evals)} checkpoints x {len(keys)} online episodes; "
          f"estimated wall {rc.estimate(counts, costs, args.jobs) / 60:.0f} min with {args.jobs} jobs for what is still to run "
          f"(from scratch: {rc.estimate(full, costs, args.jobs) / 60:.0f} min; costs s/unit: {costs})", flush=True)

    # --- the shared base (trained once), then SFT from it, one run per seed
    if not args.report_only:
        if args.base_steps > 0:
            stages.run([base])
        stages.run(list(sft.values()))
    # --- RL from each seed's SFT checkpoint: offline (expert history) and semi-online (own history), the
    # longest runs first; the base and SFT evaluations queue behind them, so they fill the cores the last
    # RL run leaves idle (their results are read below like any finished stage)
    if not args.report_only:
        longest_first = sorted(rl, key=lambda k: k[0] != "semionline")
        early = ([base_eval] if args.base_steps == 0 or base["done"].exists() else []) + \
            [e for tj, e in planned if e["meta"][1] == "sft" and tj["done"].exists() and e["checkpoint"].exists()]
        stages.run([rl[k] for k in longest_first] + ([] if args.dry_run else early))

    # --- evaluate every checkpoint on the same online episodes
    todo = ([base_eval] if args.base_steps == 0 or base["done"].exists() or args.dry_run else []) + \
        [e for tj, e in planned if tj["done"].exists() and e["checkpoint"].exists()]  # a midpoint only when kept
    rows, test_rows, test = [], [], {}
    curves = {arm: {s: rc.read_metrics(rl[(arm, s)]["dir"]) for s in args.seeds} for arm in ARMS}
    order = {a: i for i, a in enumerate(["base", "sft", *ARMS])}
    ordered = lambda rs: sorted(rs, key=lambda r: (order.get(r["arm"], 9), r["seed"], r["step"]))  # noqa: E731

    def summary(final_report: bool = False) -> dict:
        ck, tck = ordered(rows), ordered(test_rows)
        r2f, r2cmp = rc.r2_summary(ck)
        pairs = [("semionline", "sft"), ("semionline", "offline"), ("offline", "sft")]
        cmps = [c for c in [rc.compare_online(ck, a, b) for a, b in pairs + [("sft", "base")]] + [r2cmp] if c]
        tcmps = [c for c in (rc.compare_online(tck, a, b) for a, b in pairs) if c]
        by = {(c["a"], c["b"]): c for c in cmps}
        on = ({(c["a"], c["b"]): c for c in tcmps}, "test") if tcmps else (by, "selection")  # the claims' episodes
        claims = [
            {"claim": "1a: SFT + semi-online RL > SFT (online SR)", "test": "semionline - sft", "episodes": on[1],
             **_pick(on[0].get(("semionline", "sft"))), "verdict": rc.verdict(on[0].get(("semionline", "sft")))},
            {"claim": "1b: semi-online RL > offline RL from the same SFT (online SR)", "test": "semionline - offline",
             "episodes": on[1], **_pick(on[0].get(("semionline", "offline"))),
             "verdict": rc.verdict(on[0].get(("semionline", "offline")))},
            {"claim": "2: R^2(SOP-PG, online) > R^2(static step SR, online)", "test": "r2_sop - r2_static",
             "episodes": "selection", **_pick(r2cmp), "verdict": rc.verdict(r2cmp)},
        ]
        s = {"command": "python runs/repro_main.py " + " ".join(sys.argv[1:] if argv is None else argv),
             "commit": rc.git_commit(), "seeds": args.seeds, "wall_s": round(time.time() - t_start, 1),
             "stages": stages.log, "reused_stages": rc.reused_stages(stages.skipped, previous), "config": {k.lower(): getattr(args, k.lower()) for k in SETTING},
             "tasks": data["tasks"], "online_episodes": [list(k) for k in keys],
             "checkpoints": ck, **r2f, "comparisons": cmps, "claims": claims,
             "arms": rc.arm_summaries(ck, curves),
             "unit_costs": rc.merged_costs(rc.unit_costs(stages.log, ck, args.sft_steps, args.rl_steps,
                                                           args.base_steps), previous, args.online_batch),
             "complete": final_report,
             "headroom": test.get("headroom"), "test_episodes": [list(k) for k in test.get("keys", [])],
             "test_checkpoints": tck, "test_comparisons": tcmps, "test_arms": rc.arm_summaries(tck, {})}
        if final_report:
            figs = [rc.plot_r2(args.results_dir / f"{out_json.stem}_r2.png", ck, s)]
            if any(rs for runs in curves.values() for rs in runs.values()):
                figs.append(rc.plot_curves(args.results_dir / f"{out_json.stem}_curves.png", curves))
            s["figures"] = [rc._rel(f) for f in figs]
        return s

    title = "MiniWob++ reproduction: main table"

    run_test = lambda: rc.run_test_stage(args, data, keys, finals, rows, test_rows, test, stages, summary, out_json, title)  # noqa: E731
    return rc.collect_and_report(args, todo, stages, rows, keys, summary, out_json, title, then=run_test)


def _pick(c: dict | None) -> dict:
    return {k: c[k] for k in ("diff", "diff_ci95", "p_value")} if c else {"diff": None, "p_value": None}


if __name__ == "__main__":
    import cli
    cli.cli(main)

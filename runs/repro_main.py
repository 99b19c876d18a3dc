"""The main table of the MiniWob++ reproduction: where RL can move the greedy policy, RL there with the
UI-S1 release's recipe, and what it moved. Every stage runs at one commit, from scratch:
  1. a shared base (the copy warm-up), SFT per seed on the demonstrations of 8 multi-step tasks;
  2. flippability: each SFT checkpoint plays the fresh *selection* episodes greedily and FLIP_SAMPLES
     more times sampled at the RL temperature; an episode is flippable when greedy fails and a sample
     succeeds (RLVR raises pass@1 towards pass@k and not beyond: Yue et al. 2025, arXiv 2504.13837);
  3. the rule, from SFT's numbers alone, before any RL: the RL tasks are those whose flippable
     fraction, pooled over seeds, is >= FLIP_MIN (rc.flippable_tasks);
  4. semi-online and offline (--history expert) RL from each SFT checkpoint on demonstrations of the
     chosen tasks SFT never saw, the release's recipe (8 rollouts per task, the std filter 0.3 with
     refills and the release's returns, KL 1e-4, RL_PASSES passes over the data) at FLIP_TEMPERATURE
     (the release samples at 1.0; the tiny model at 0.5, see the setting), RL_POINTS checkpoints each;
     and the control users ask for: SFT continued on the same demonstrations, as many demonstration
     steps as an RL arm trains on;
  5. every checkpoint (base, SFT at SFT_POINTS lengths, RL at each point, the control) on the
     selection episodes (SOP, static step SR, online success): claim 2, R^2 over all of them;
  6. the *test* episodes of the chosen tasks (TEST_EPISODES per checkpoint, fresh seeds): SFT greedy
     and sampled (its flippable episodes), each RL point and the control greedy: claims 1a (semi-online
     beats SFT) and 1b (semi-online beats offline), the dose-response and the conversion (of SFT's
     flippable test episodes, the share RL solves greedily; of its successes, the share RL loses).
Writes results/repro_main.{json,md} and results/repro_main_{dose,r2,curves}.png.

    python runs/repro_main.py               # the full setting below (prints its estimated wall time first)
    python runs/repro_main.py --quick       # a small check of the whole pipeline (< 20 min on 2 cores)
    python runs/repro_main.py --dry-run     # the commands and the estimate, nothing run
    python runs/repro_main.py --report-only # rebuild the results from the runs that exist

Each stage is a printed call of a stage script, logged to its run folder (OUT/<stage>/<name>_<hash>/
log.txt) and skipped when its output exists; the results are rewritten after every evaluated
checkpoint, so an interrupted run leaves partial results.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import dose_response as dr  # noqa: E402
import repro_common as rc  # noqa: E402

# --- the setting: every default in one place (each key is also a command-line flag)
MULTI_STEP = ["enter-text", "enter-password", "login-user", "click-checkboxes", "click-tab-2", "click-option",
              "click-button-sequence", "click-collapsible"]  # 2-6 steps each (terminate included)
# runs/repro_ablations.py's test episodes: the tasks where its SFT's selection success lies inside HEADROOM
TEST = dict(TEST_EPISODES=160, TEST_SEED_BASE=220000, HEADROOM=[0.0, 1.0])
SETTING = dict(
    TASKS=MULTI_STEP,                            # the candidates; the rule picks the RL tasks among them
    TRAIN_DATA="data/miniwob/train.jsonl",
    TEST_DATA="data/miniwob/test.jsonl",
    RL_DATA="data/miniwob/rl.jsonl",             # RL demonstrations SFT never saw (seeds 300000+)
    MODEL="tiny:128x4",                          # 'tiny:HxL' or a Hugging Face folder
    MODEL_ARGS=[],                               # flags of the untrained model, given to the base stage and its eval
    SEEDS=[0, 1, 2],                             # training seeds per arm (claims: >= 3)
    BASE_STEPS=3000,                             # copy warm-up steps of the shared base (0: --model is the base)
    BASE_EXTRA=["--copy-warmup-elements", "4", "--copy-warmup-type-frac", "0.25"],  # synthetic pages of 1-4 elements, 1 in 4 a type page
    SFT_STEPS=300, SFT_LR=1e-3, SFT_EXTRA=[],
    SFT_POINTS=4,                                # SFT checkpoints evaluated per seed (points of claim 2's R^2)
    FLIP_SAMPLES=8,                              # sampled plays per selection episode of each SFT checkpoint: RL's
                                                 # group size (an episode RL can flip is one a rollout of its group wins)
    FLIP_TEMPERATURE=0.5,                        # the temperature RL samples at (the release: 1.0; chosen on the
                                                 # selection episodes: at 1.0 the tiny model's RL fell below SFT,
                                                 # at 0.5 it rose; results/LOG.md, 2026-12-04)
    FLIP_MIN=0.15,                               # the rule: RL tasks have a pooled flippable fraction >= this
    RL_STEPS=72, RL_LR=2e-5,                     # lr chosen on the selection episodes (results/LOG.md, 2026-12-04)
    RL_POINTS=3,                                 # RL checkpoints per run: the dose-response's points
    RL_PASSES=3,                                 # passes over the RL data: demonstrations per chosen task =
                                                 # RL_STEPS x tasks-per-step / (RL_PASSES x chosen tasks)
    # the release's recipe (docs/method.md §6, the presets): 8 rollouts per task, the std filter 0.3
    # with refills and the returns it is scaled for (§6: under the paper's returns it drops the
    # groups split by the step-0 decision), KL 1e-4
    RL_EXTRA=["--tasks-per-step", "4", "--n-rollouts", "8", "--max-new-tokens", "80", "--filter-std", "0.3",
              "--returns-form", "release", "--max-resample", "3", "--kl-coef", "1e-4"],
    CONTROL=True,                                # SFT continued on the RL demonstrations (not a paper claim)
    EVAL_PER_TASK=4,                             # SOP/static test-file episodes per task
    ONLINE_EPISODES=104,                         # fresh selection episodes per checkpoint (13 per task)
    ONLINE_SEED_BASE=200000,                     # fresh: not the seeds of the train (0+), test (100000+) or RL (300000+) files
    ONLINE_MAX_STEPS=10,
    ONLINE_BATCH=2,                              # online episodes in flight per evaluation (one browser each)
    EVAL_EXTRA=["--max-new-tokens", "80"],
    TEST_EPISODES=TEST["TEST_EPISODES"],         # per checkpoint, split evenly over the chosen tasks
    TEST_SEED_BASE=TEST["TEST_SEED_BASE"],       # fresh: no data file or selection episode uses them
)
QUICK = dict(SEEDS=[0], BASE_STEPS=20, SFT_STEPS=20, SFT_POINTS=2, RL_STEPS=3, EVAL_PER_TASK=1, ONLINE_EPISODES=4,
             FLIP_SAMPLES=1, TASKS=["enter-text", "click-option"], TEST_EPISODES=4,
             RL_EXTRA=["--tasks-per-step", "2", "--n-rollouts", "2", "--max-new-tokens", "80", "--filter-std", "0.3",
                       "--returns-form", "release", "--max-resample", "1", "--kl-coef", "1e-4"])
# seconds per unit, 2 jobs on the 2-core machine (base: alone, 2 threads, wall per step; SFT and RL: CPU s per step,
# process start included; evaluations: wall per online episode 2 at a time, per SOP episode, per process). RL at the
# release's recipe: ~14 s a semi-online step and ~7 s an offline one (results/LOG.md, 2026-12-04); replaced by the
# usable unit_costs of an earlier run's results JSON (rc.load_costs)
COSTS = {"base_steps": 0.095, "sft_steps": 0.94, "rl_steps": 10.5, "online_episodes": 0.76, "sampled_plays": 0.6,
         "sop_episodes": 0.43, "stages": 3.2}
ARMS = {"offline": ["--history", "expert"], "semionline": rc.SEMIONLINE_REF}  # RL arms and their flags
CONTROL = "sft-continued"


# -----------------------------------------------------------------------------
# the stages that are new to this script: the flip evaluation, the RL data of the chosen tasks, the control


def flip_flags(args) -> list[str]:
    """eval_sop.py flags of an SFT evaluation that also plays every online episode sampled."""
    return ["--samples", str(args.flip_samples), "--temperature", str(args.flip_temperature)]


def rl_data(args, data: dict, tasks: list[str] | None) -> Path:
    """The RL demonstrations of the chosen tasks, RL_STEPS x tasks-per-step / (RL_PASSES x len(tasks)) of
    each (RL_PASSES passes over them; fewer, and so more passes, when RL_DATA holds fewer), or a
    placeholder path while the rule has not run (dry run)."""
    if not tasks:
        return args.out_root / "data" / "rl_chosen_tasks.jsonl"
    per = max(1, rl_steps_per_pass(args) * tasks_per_step(args) // len(tasks))
    src = rc.data_files(args.rl_data)                                       # one file, or several that mix
    name = f"{'+'.join(p.stem for p in src)}_{'+'.join(tasks)}_{per}.jsonl"  # the source files' names: no clash
    return rc.write_subset(src if len(src) > 1 else src[0], args.out_root / "data" / name, tasks, per)


def tasks_per_step(args) -> int:
    flags = args.rl_extra
    return int(flags[flags.index("--tasks-per-step") + 1]) if "--tasks-per-step" in flags else 4


def rl_steps_per_pass(args) -> int:
    return max(1, args.rl_steps // max(args.rl_passes, 1))


def control_steps(args, path: Path) -> int:
    """SFT steps of the control: as many demonstration steps as an RL arm trains on (RL_STEPS x
    tasks-per-step episodes, each with its mean number of steps), 8 examples an SFT step."""
    if not path.exists():
        return max(1, round(args.rl_steps * tasks_per_step(args) * 3 / 8))   # ~3 steps an episode (estimate)
    eps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    mean_steps = sum(len(e["steps"]) for e in eps) / len(eps)
    return max(1, round(args.rl_steps * tasks_per_step(args) * mean_steps / 8))


def control_job(args, data: dict, sft: dict, seed: int, path: Path) -> dict:
    """SFT continued from seed `seed`'s SFT checkpoint on the RL demonstrations `path` (a fresh
    cosine schedule from SFT_LR; no validation split: every demonstration is trained on)."""
    steps = control_steps(args, path)
    cmd = [rc.python(), "train_sft.py", "--data", rc._rel(path), "--image-root", data["image_root"],
           "--model", rc._rel(rc.checkpoint_at(sft["dir"], args.sft_steps)), "--copy-warmup-steps", "0",
           "--max-steps", str(steps), "--lr", str(args.sft_lr), "--seed", str(seed), "--val-frac", "0",
           "--save-every", str(steps), "--eval-every", "0", *args.sft_extra]
    return {**rc.job(args.out_root / "control", f"control_s{seed}", cmd, f"ckpt/step_{steps:06d}", resume="ckpt/latest"),
            "steps": steps}


def seed_keyed(folder: Path, seed: int) -> dict:
    """dose_response.read_episodes of one evaluation, keyed by (training seed: task, episode seed), so that
    the seeds' episodes pool into one set of pairs."""
    return {(f"s{seed}:{t}", s): row for (t, s), row in dr.read_episodes(str(folder)).items()}


def dose_summary(test_evals: list[dict], rl_steps: int) -> dict | None:
    """The dose-response over the test episodes, every seed's pairs pooled (dose_response.summarize):
    each RL arm at step 0 (its SFT start, greedy and sampled) and at each kept checkpoint, the control
    at RL_STEPS. None until every seed's SFT test evaluation exists."""
    done = [e for e in test_evals if e["done"].exists()]
    seeds = sorted({e["meta"][2] for e in done if e["meta"][1] == "sft"})
    if not seeds:
        return None
    start = {k: v for s in seeds for e in done if e["meta"][1] == "sft" and e["meta"][2] == s
             for k, v in seed_keyed(e["dir"], s).items()}
    points = {}
    for e in done:
        _, arm, seed, step, _, _ = e["meta"]
        if arm != "sft" and seed in seeds:
            points.setdefault((arm, rl_steps if arm == CONTROL else step), {}).update(seed_keyed(e["dir"], seed))
    full = [(arm, step, eps) for (arm, step), eps in points.items() if len(eps) == len(start)]
    return dr.summarize(start, full) if full else None


# -----------------------------------------------------------------------------
# main


def main(argv=None) -> dict:
    args = rc.parse(__doc__, SETTING, QUICK, argv)
    t_start = time.time()
    out_json = args.results_dir / ("repro_main_quick.json" if args.quick else "repro_main.json")
    stages = rc.Stages(jobs=args.jobs, force=args.force, dry_run=args.dry_run)
    previous = rc.read_previous(out_json)  # for the provenance of the stages this run reuses
    data = rc.prepare_data(args)
    keys = data["online_episodes"]
    T = args.flip_temperature

    # --- the plan: base, SFT (SFT_POINTS checkpoints each), the SFT evaluations (the finals also sampled)
    base = rc.base_job(args, data)
    sft = {s: rc.sft_job(args, data, s, base, points=args.sft_points) for s in args.seeds}
    base_eval = {**rc.eval_job(args, data, rc.base_model(args, base), f"base_{base['dir'].name}", 0),
                 "meta": ("base", "base", 0, 0, True, rc._rel(base["dir"]) if args.base_steps else None)}
    sft_steps = rc.checkpoint_steps(args.sft_steps, args.sft_points)
    sft_final = {s: rc.checkpoint_eval(args, data, "sft", s, j, args.sft_steps, True, flip_flags(args))
                 for s, j in sft.items()}
    sft_mid = [rc.checkpoint_eval(args, data, "sft", s, j, st, False) for s, j in sft.items() for st in sft_steps[:-1]]

    def rule(rows: list[dict]) -> dict:
        return rc.flippable_tasks(rows, args.flip_min)

    def rl_plan(chosen: list[str]) -> tuple[dict, dict, list]:
        """The RL and control jobs on the chosen tasks' demonstrations, and their selection evaluations."""
        path = state["rl_data"] = rl_data(args, data, chosen)
        flags = [*args.rl_extra, "--temperature", str(T)]
        sub = argparse_like(args, rl_extra=flags)
        rl = {(arm, s): rc.rl_job(sub, data, sft[s], s, arm, arm_flags, train=path, points=args.rl_points)
              for arm, arm_flags in ARMS.items() for s in args.seeds}
        control = {s: control_job(args, data, sft[s], s, path) for s in args.seeds} if args.control else {}
        rl_steps = rc.checkpoint_steps(args.rl_steps, args.rl_points)
        evals = [rc.checkpoint_eval(args, data, arm, s, j, st, st == args.rl_steps)
                 for (arm, s), j in rl.items() for st in rl_steps]
        evals += [rc.checkpoint_eval(args, data, CONTROL, s, j, j["steps"], True) for s, j in control.items()]
        return rl, control, evals

    # --- the estimate: only what is still to run
    state = {"rule": None, "dose": None, "test_keys": [], "rl_data": None}
    sel_rows0 = [{"arm": "sft", "seed": e["meta"][2], "final": True, **rc.read_eval(e["dir"], keys)}
                 for e in sft_final.values() if e["done"].exists()]
    chosen0 = rule(sel_rows0)["tasks"] if len(sel_rows0) == len(args.seeds) else []
    rl, control, rl_evals = rl_plan(chosen0)
    evals = [base_eval, *sft_final.values(), *sft_mid, *rl_evals]
    n_test_evals = len(args.seeds) * (1 + len(ARMS) * args.rl_points + int(args.control))
    counts, full = ({**rc.pending_counts(args, len(data["tasks"]), len(keys), base,
                                         {"sft": list(sft.values()), "rl": list(rl.values())}, evals, everything=e)}
                    for e in (False, True))
    for c, everything in ((counts, False), (full, True)):
        left = lambda jobs: [j for j in jobs if everything or args.force or not j["done"].exists()]  # noqa: E731,B023
        c["sft_steps"] += sum(j["steps"] for j in left(list(control.values())))   # the control: SFT steps
        c["sampled_plays"] = len(left(list(sft_final.values()))) * args.flip_samples * len(keys)  # selection
        c["sampled_plays"] += len(args.seeds) * args.flip_samples * args.test_episodes           # SFT's test plays
        c["online_episodes"] += n_test_evals * args.test_episodes              # the test episodes (counted as to run)
        c["stages"] += n_test_evals
    costs = rc.load_costs(COSTS, out_json, online_batch=args.online_batch)
    print(f"[plan] {len(data['tasks'])} candidate tasks, seeds {args.seeds}, {len(evals)} checkpoints x {len(keys)} "
          f"selection episodes, {args.test_episodes} test episodes per test checkpoint; estimated wall "
          f"{rc.estimate(counts, costs, args.jobs) / 60:.0f} min with {args.jobs} jobs for what is still to run "
          f"(from scratch: {rc.estimate(full, costs, args.jobs) / 60:.0f} min; costs s/unit: {costs})", flush=True)

    # --- 1-2. the shared base, SFT per seed, the SFT finals greedy and sampled on the selection episodes
    rows, test_rows = [], []
    order = {a: i for i, a in enumerate(["base", "sft", *ARMS, CONTROL])}
    ordered = lambda rs: sorted(rs, key=lambda r: (order.get(r["arm"], 9), r["seed"], r["step"]))  # noqa: E731
    curves = {}

    def summary(final_report: bool = False) -> dict:
        ck, tck = ordered(rows), ordered(test_rows)
        r2f, r2cmp = rc.r2_summary(ck)
        r2nb, _ = rc.r2_summary([c for c in ck if c["arm"] != "base"])
        cmps, tcmps, claims, goal = comparisons_and_claims(ck, tck, r2cmp)
        s = {"command": rc.command_line("repro_main.py", argv),
             "commit": rc.git_commit(), "seeds": args.seeds, "wall_s": round(time.time() - t_start, 1),
             "stages": stages.log, "reused_stages": rc.reused_stages(stages.skipped, previous),
             "config": {k.lower(): getattr(args, k.lower()) for k in SETTING},
             "tasks": data["tasks"], "online_episodes": [list(k) for k in keys],
             "flippability": state["rule"], "rl_tasks": (state["rule"] or {}).get("tasks"),
             "rl_data": ({"file": rc._rel(state["rl_data"]), "episodes_per_task": rc.episodes_per_task(state["rl_data"])}
                         if state.get("rl_data") and state["rl_data"].exists() else None),
             "history_gap": rc.history_gap_summary(ck),
             "checkpoints": ck, **r2f, "r2_without_base": r2nb, "comparisons": cmps, "claims": claims, "goal": goal,
             "primary_test_fpr": rc.primary_test_fpr(tck) if final_report else None,
             "arms": rc.arm_summaries(ck, curves),
             "unit_costs": rc.merged_costs(rc.unit_costs(stages.log, ck, args.sft_steps, args.rl_steps,
                                                           args.base_steps), previous, args.online_batch),
             "complete": final_report, "test_episodes": [list(k) for k in state["test_keys"]],
             "test_checkpoints": tck, "test_comparisons": tcmps, "test_arms": rc.arm_summaries(tck, {}),
             "dose_response": state["dose"]}
        if final_report:
            figs = [rc.plot_r2(args.results_dir / f"{out_json.stem}_r2.png", ck, s)]
            if state["dose"]:
                figs.append(args.results_dir / f"{out_json.stem}_dose.png")
                dr.plot(figs[-1], state["dose"])
            if any(rs for runs in curves.values() for rs in runs.values()):
                figs.append(rc.plot_curves(args.results_dir / f"{out_json.stem}_curves.png", curves))
            s["figures"] = [rc._rel(f) for f in figs]
        return s

    title = "MiniWob++ reproduction: main table"
    if not args.report_only:
        if args.base_steps > 0:
            stages.run([base])
        stages.run(list(sft.values()))
    rc.run_evals(args, list(sft_final.values()), stages, rows, keys, summary, out_json, title)

    # --- 3. the rule (SFT's flip numbers only), then the RL data and jobs of the chosen tasks
    if len(rc.final_rows(rows, "sft")) == len(args.seeds) or args.dry_run:
        state["rule"] = rule(rows)
        chosen = state["rule"]["tasks"]
        print(f"[rule] flippable at T {T} (pooled over seeds): "
              + ", ".join(f"{t} {f['flippable']}/{f['n']}" for t, f in state["rule"]["per_task"].items())
              + f" -> RL tasks {chosen or '(after the SFT evaluations)'}", flush=True)
        rl, control, rl_evals = rl_plan(chosen)
    curves.update({arm: {s: rc.read_metrics(rl[(arm, s)]["dir"]) for s in args.seeds} for arm in ARMS})

    # --- 4. RL (longest first) and the control; the base and the SFT midpoints' evaluations fill the cores
    if not args.report_only and (args.dry_run or (state["rule"] or {}).get("tasks")):
        longest_first = sorted(rl, key=lambda k: k[0] != "semionline")
        early = ([base_eval] if args.base_steps == 0 or base["done"].exists() else []) + \
            [e for e in sft_mid if e["checkpoint"].exists()]
        stages.run([rl[k] for k in longest_first] + list(control.values()) + ([] if args.dry_run else early))
        curves.update({arm: {s: rc.read_metrics(rl[(arm, s)]["dir"]) for s in args.seeds} for arm in ARMS})

    # --- 5. every checkpoint on the selection episodes
    todo = ([base_eval] if args.base_steps == 0 or base["done"].exists() or args.dry_run else []) + \
        [e for e in [*sft_mid, *rl_evals] if args.dry_run or e["checkpoint"].exists()]

    # --- 6. the test episodes of the chosen tasks: SFT sampled too, every RL point, the control
    def run_test():
        chosen = (state["rule"] or {}).get("tasks")
        if not chosen or not args.test_episodes:
            print("[test] no RL tasks chosen yet: no test episodes", flush=True)
            return
        tkeys = rc.episode_keys(chosen, args.test_episodes, args.test_seed_base)
        state["test_keys"] = tkeys
        of = [(rc.test_eval_job(args, data, tkeys, e, flip_flags(args)), e) for e in sft_final.values()]
        of += [(rc.test_eval_job(args, data, tkeys, e), e) for e in rl_evals]
        tests = [j for j, _ in of]
        print(f"[test] RL tasks {chosen}: {len(tkeys)} test episodes per checkpoint, {len(tests)} checkpoints", flush=True)
        rc.run_evals(args, [j for j, e in of if args.dry_run or e["checkpoint"].exists()], stages, test_rows, tkeys,
                     summary, out_json, title)
        state["dose"] = dose_summary(tests, args.rl_steps)

    return rc.collect_and_report(args, todo, stages, rows, keys, summary, out_json, title, then=run_test)


PAIRS = [("semionline", "sft"), ("semionline", "offline"), ("offline", "sft"), (CONTROL, "sft"), ("semionline", CONTROL)]


def comparisons_and_claims(ck: list[dict], tck: list[dict], r2cmp: dict | None) -> tuple[list, list, list, dict | None]:
    """The comparisons (selection and test episodes), claims 1a, 1b, 2 with their verdicts and the goal,
    from the checkpoint rows (also used to recompute the verdicts of stored results: runs/seed_verdicts.py).
    Claims 1a/1b read the primary test (the paired t-test across seeds) on the test episodes."""
    cmps = [c for c in [rc.compare_online(ck, a, b) for a, b in PAIRS + [("sft", "base")]] + [r2cmp] if c]
    tcmps = [c for c in (rc.compare_online(tck, a, b) for a, b in PAIRS) if c]
    on = {(c["a"], c["b"]): c for c in tcmps}
    c1a, c1b = on.get(("semionline", "sft")), on.get(("semionline", "offline"))
    claims = [
        {"claim": "1a: SFT + semi-online RL > SFT (online SR)", "test": "semionline - sft", "episodes": "test",
         **_pick(c1a), "verdict": rc.verdict(c1a)},
        {"claim": "1b: semi-online RL > offline RL from the same SFT (online SR)", "test": "semionline - offline",
         "episodes": "test", **_pick(c1b), "verdict": rc.verdict(c1b)},
        {"claim": "2: R^2(SOP-PG, online) > R^2(static step SR, online)", "test": "r2_sop - r2_static",
         "episodes": "selection", **_pick(r2cmp), "verdict": rc.verdict(r2cmp)},
    ]
    goal = None if c1a is None else {"target": "semionline - sft >= +0.05 with primary p < 0.05 (test episodes)",
                                     "diff": c1a["diff"], "p_value": c1a["p_value"],
                                     "met": bool(c1a["diff"] >= 0.05 and c1a["p_value"] < rc.ALPHA)}
    return cmps, tcmps, claims, goal


def argparse_like(args, **over):
    """A copy of the parsed args with some fields replaced (rc.rl_job reads args.rl_extra)."""
    import argparse
    return argparse.Namespace(**{**vars(args), **over})


def _pick(c: dict | None) -> dict:
    return {k: c.get(k) for k in ("diff", "diff_ci95", "p_value", "n_seeds", "p_bootstrap", "p_mcnemar")} if c \
        else {"diff": None, "p_value": None}


if __name__ == "__main__":
    import cli
    cli.run_script(main)

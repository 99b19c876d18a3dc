"""The report half of the MiniWob++ reproduction (runs/repro_common.py runs the stages): paired
comparisons of arms and their verdicts, R^2 of SOP and static metrics against online success, the
results JSON with its Markdown twin and its schema check, and the matplotlib figures.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from evaluation.stats import null_fpr, paired_binary, paired_bootstrap, r2_bootstrap, seed_paired_t, seed_sd_of, trend, wilson

ALPHA = 0.05  # verdict threshold on p-values


def rl_diagnostics(rows: list[dict]) -> dict:
    """Per RL run: means over the second half of the steps of reward, entropy, KL, patch rate."""
    half = rows[len(rows) // 2:]

    def mean(key):
        v = [r[key] for r in half if r.get(key) is not None]
        return float(np.mean(v)) if v else None
    return {k: mean(k) for k in ("reward_mean", "entropy", "kl", "patch_rate", "match_rate", "progress")}




def final_rows(checkpoints: list[dict], arm: str) -> list[dict]:
    return sorted((c for c in checkpoints if c["arm"] == arm and c.get("final", True)), key=lambda c: c["seed"])


def _with_secondary(primary: dict, boot: dict, test: str) -> dict:
    """The primary test's fields (diff, diff_ci95, p_value: what verdict() reads) and the pooled
    bootstrap's as secondary figures (diff_pooled, diff_ci95_bootstrap, p_bootstrap)."""
    return {**primary, "diff_pooled": boot["diff"], "diff_ci95_bootstrap": boot["diff_ci95"],
            "p_bootstrap": boot["p_value"], "test": test}


def compare_online(checkpoints: list[dict], a: str, b: str, seed: int = 0) -> dict | None:
    """Paired comparison of the final checkpoints of arms a and b on online success: seed s of a
    against seed s of b (or against b's only checkpoint when b has one seed, e.g. the base model),
    every pair on the same episodes.

    Primary (diff, diff_ci95, p_value; the verdicts read only these): stats.seed_paired_t, the
    paired t-test across seeds on the per-seed differences of online success (n_seeds,
    per_seed_diff); undefined (nan, verdict inconclusive) with one seed. Secondary, labelled so:
    the two-level paired bootstrap over (seeds, episodes) (diff_pooled, diff_ci95_bootstrap,
    p_bootstrap) and the exact McNemar test on the pooled pairs (p_mcnemar, discordant); both
    under-cover with 3-5 seeds (stats.null_fpr)."""
    ra, rb = final_rows(checkpoints, a), final_rows(checkpoints, b)
    if not ra or not rb:
        return None
    by_seed = {c["seed"]: c for c in rb}
    pairs = [(x, by_seed.get(x["seed"], rb[0] if len(rb) == 1 else None)) for x in ra]
    pairs = [(x, y) for x, y in pairs if y is not None]
    if not pairs:
        return None
    va = np.concatenate([np.array(list(x["online_outcomes"]), dtype=int) for x, _ in pairs])
    vb = np.concatenate([np.array(list(y["online_outcomes"]), dtype=int) for _, y in pairs])
    groups = np.concatenate([np.full(len(x["online_outcomes"]), i) for i, (x, _) in enumerate(pairs)])
    primary = seed_paired_t([x["online_sr"] - y["online_sr"] for x, y in pairs])
    pooled = paired_binary(va, vb, groups, seed=seed)
    return {"a": a, "b": b, "metric": "online_sr",
            **_with_secondary(primary, pooled, f"{primary['test']}; secondary: two-level paired bootstrap "
                                               "(seeds, episodes), exact McNemar on pooled pairs"),
            "p_mcnemar": pooled["p_mcnemar"], "discordant": pooled["discordant"],
            "n_pairs": int(va.size), "seeds": [x["seed"] for x, _ in pairs]}


def compare_curves(curves: dict, a: str, b: str, key: str, seed: int = 0) -> dict | None:
    """Paired comparison of a training-curve quantity (e.g. entropy) between arms a and b over the
    second half of their RL steps. Primary: seed_paired_t on the per-seed difference of the
    second-half means; secondary: the two-level bootstrap over (seed, step) pairs.
    curves: {arm: {seed: [metrics rows]}}."""
    va, vb, groups = [], [], []
    for s in sorted(set(curves.get(a, {})) & set(curves.get(b, {}))):
        xa = [r.get(key) for r in curves[a][s]]
        xb = [r.get(key) for r in curves[b][s]]
        n = min(len(xa), len(xb))
        for t in range(n // 2, n):
            if xa[t] is not None and xb[t] is not None:
                va.append(xa[t]), vb.append(xb[t]), groups.append(s)
    if not va:
        return None
    va, vb, groups = np.asarray(va, float), np.asarray(vb, float), np.asarray(groups)
    primary = seed_paired_t([va[groups == g].mean() - vb[groups == g].mean() for g in np.unique(groups)])
    return {"a": a, "b": b, "metric": key, "n_pairs": int(va.size),
            **_with_secondary(primary, paired_bootstrap(va, vb, groups, seed=seed),
                              f"{primary['test']} of second-half means; secondary: two-level paired "
                              "bootstrap over (seed, RL step)")}


def primary_test_fpr(checkpoints: list[dict], repeats: int = 4000) -> dict | None:
    """The primary test's simulated false-positive rate at nominal ALPHA for this run's design
    (stats.null_fpr): its number of seeds and episodes per checkpoint, the between-seed SD of
    success measured in its final checkpoints (stats.seed_sd_of) and the run's pooled success as
    p0; McNemar's beside it (secondary). None with fewer than 2 seeds."""
    finals = [c for c in checkpoints if c.get("final", True) and c.get("online_sr") is not None]
    per: dict = {}
    for c in finals:
        per.setdefault(c["arm"], []).append(c["online_sr"])
    n_seeds = max((len(v) for v in per.values()), default=0)
    if n_seeds < 2:
        return None
    n_ep = int(finals[0]["n_online_episodes"])
    sd = seed_sd_of(per, n_ep)
    p0 = float(np.mean([c["online_sr"] for c in finals]))
    sim = null_fpr(n_seeds, n_ep, sd, p0=p0, repeats=repeats, alpha=ALPHA)
    return {"alpha": ALPHA, "seed_sd_measured": sd, "p0": p0, "n_seeds": n_seeds, "n_episodes": n_ep,
            "repeats": repeats, "fpr_primary_t": sim["primary_t"], "fpr_mcnemar_secondary": sim["mcnemar"],
            "model": "stats.null_fpr: two arms, no effect, per-arm seed SD as measured, paired episodes (rho 0.5)"}


def verdict(cmp: dict | None, higher_is: str = "a") -> str:
    """held: the difference favours the claim with p < ALPHA; not held: it goes the other way with
    p < ALPHA; not run: no comparison (cmp None: an arm of it was not trained); inconclusive otherwise
    (or when it could not be computed, e.g. the primary test with one seed). p is cmp["p_value"]: for
    online success and training curves the primary test (seed_paired_t) only, never the secondary
    p_bootstrap or p_mcnemar."""
    if cmp is None:
        return "not run"
    if cmp.get("p_value") is None or math.isnan(cmp["p_value"]) or math.isnan(cmp["diff"]):
        return "inconclusive"
    good = cmp["diff"] > 0 if higher_is == "a" else cmp["diff"] < 0
    if cmp["p_value"] < ALPHA:
        return "held" if good else "not held"
    return "inconclusive"


def r2_summary(checkpoints: list[dict], seed: int = 0) -> tuple[dict, dict | None]:
    """Top-level R^2 fields over all checkpoints with the three metrics, and the paired bootstrap
    comparison R^2(SOP-PG) - R^2(static step SR) as a comparisons entry."""
    pts = [c for c in checkpoints if None not in (c.get("sop_pg"), c.get("static_step_sr"), c.get("online_sr"))]
    x_sop = [c["sop_pg"] for c in pts]
    x_st = [c["static_step_sr"] for c in pts]
    y = [c["online_sr"] for c in pts]
    if len(pts) < 3:
        nan = float("nan")
        return {"r2_sop_online": nan, "r2_sop_online_ci95": [nan, nan], "r2_static_online": nan,
                "r2_static_online_ci95": [nan, nan], "r2_n_checkpoints": len(pts)}, None
    bs_sop = r2_bootstrap(x_sop, y, x2=x_st, seed=seed)
    bs_st = r2_bootstrap(x_st, y, seed=seed)
    fields = {"r2_sop_online": bs_sop["r2"], "r2_sop_online_ci95": bs_sop["ci95"],
              "r2_static_online": bs_st["r2"], "r2_static_online_ci95": bs_st["ci95"],
              "r2_n_checkpoints": len(pts)}
    cmp = {"a": "r2_sop_online", "b": "r2_static_online", "metric": "r2", "diff": bs_sop["diff"],
           "diff_ci95": bs_sop["diff_ci95"], "p_value": bs_sop["p_value"], "n_pairs": len(pts),
           "test": "paired bootstrap over checkpoints (the same resample for both metrics)"}
    return fields, cmp


def _nan_to_none(o):
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {k: _nan_to_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_nan_to_none(v) for v in o]
    if isinstance(o, (np.floating, np.integer)):
        return _nan_to_none(o.item())
    return o


CHECKPOINT_KEYS = {"name": str, "arm": str, "seed": int, "sop_pg": float, "sop_tsr": float,
                   "static_step_sr": float, "online_sr": float, "online_sr_ci95": list, "n_online_episodes": int}
TOP_KEYS = ("command", "commit", "seeds", "wall_s", "checkpoints", "r2_sop_online", "r2_sop_online_ci95",
            "r2_static_online", "r2_static_online_ci95", "comparisons")


def validate_results(summary: dict, where: str = "results") -> None:
    """Raise ValueError naming the field if `summary` breaks the results schema (module docstring).
    Numbers may be None where they are undefined (e.g. R^2 of constant points); JSON has no NaN."""
    for k in TOP_KEYS:
        if k not in summary:
            raise ValueError(f"{where}: missing top-level field '{k}'")
    for field in ("checkpoints", "test_checkpoints"):
        for i, c in enumerate(summary.get(field) or []):
            for k, typ in CHECKPOINT_KEYS.items():
                if k not in c:
                    raise ValueError(f"{where}: {field}[{i}] missing '{k}'")
                v = c[k]
                ok = (v is None and typ is float) or (isinstance(v, typ) and not isinstance(v, bool)) or (
                    typ is float and isinstance(v, int) and not isinstance(v, bool))
                if not ok:
                    raise ValueError(f"{where}: {field}[{i}].{k} = {v!r} is not {typ.__name__}")
            lo, hi = c["online_sr_ci95"]
            if not lo <= c["online_sr"] <= hi:
                raise ValueError(f"{where}: {field}[{i}].online_sr_ci95 {c['online_sr_ci95']} excludes online_sr")
    for k in ("r2_sop_online_ci95", "r2_static_online_ci95"):
        if not (isinstance(summary[k], list) and len(summary[k]) == 2):
            raise ValueError(f"{where}: '{k}' must be [low, high]")
    for field in ("comparisons", "test_comparisons"):
        for i, c in enumerate(summary.get(field) or []):
            for k in ("a", "b", "diff", "p_value"):
                if k not in c:
                    raise ValueError(f"{where}: {field}[{i}] missing '{k}'")


def fmt(v, spec=".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def fmt_ci(ci) -> str:
    return "[n/a]" if ci is None or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in ci) \
        else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


PRIMARY_NOTE = ["Primary (the verdicts): the paired t-test across seeds on the per-seed differences (diff, its 95% "
                "t interval, p). Secondary, not used for verdicts: the two-level bootstrap over seeds and episodes "
                "and exact McNemar on the pooled episodes; both reject too often with 3-5 seeds."]
CMP_HEAD = "| a | b | metric | diff (a - b) [95%] | p | seeds | secondary: bootstrap [95%], p | secondary: McNemar p |"
CMP_RULE = "|---|---|---|---|---|---|---|---|"


def cmp_cells(c: dict) -> str:
    """A comparison's cells after its names: the primary test, then the secondary figures."""
    return (f"{fmt(c['diff'], '+.3f')} {fmt_ci(c.get('diff_ci95'))} | {fmt(c['p_value'], '.3g')} | "
            f"{c.get('n_seeds') or ''} | {fmt_ci(c.get('diff_ci95_bootstrap'))}, {fmt(c.get('p_bootstrap'), '.3g')} | "
            f"{fmt(c.get('p_mcnemar'), '.3g')} |")


def markdown(summary: dict, title: str) -> str:
    """The Markdown twin: the command, the checkpoint table, R^2, comparisons, claims with verdicts,
    per-arm diagnostics and per-task online success."""
    L = [f"# {title}", "", f"`{summary['command']}`  ", f"commit `{summary['commit']}`, seeds {summary['seeds']}, "
         f"wall {fmt(summary['wall_s'], '.0f')} s, {summary['checkpoints'][0]['n_online_episodes'] if summary['checkpoints'] else 0} "
         "online episodes per checkpoint (the same for all: paired)", "",
         "| checkpoint | arm | seed | SOP-PG | SOP-TSR | static step SR | online SR [95% Wilson] | n |",
         "|---|---|---|---|---|---|---|---|"]
    for c in summary["checkpoints"]:
        L.append(f"| {c['name']} | {c['arm']} | {c['seed']} | {fmt(c['sop_pg'])} | {fmt(c['sop_tsr'])} | "
                 f"{fmt(c['static_step_sr'])} | {fmt(c['online_sr'])} {fmt_ci(c['online_sr_ci95'])} | "
                 f"{c['n_online_episodes']} |")
    L += ["", f"R^2 over {summary.get('r2_n_checkpoints', len(summary['checkpoints']))} checkpoints: "
          f"SOP-PG vs online {fmt(summary['r2_sop_online'])} {fmt_ci(summary['r2_sop_online_ci95'])}, "
          f"static step SR vs online {fmt(summary['r2_static_online'])} {fmt_ci(summary['r2_static_online_ci95'])} "
          "(bootstrap 95% over checkpoints; paper: 0.934 vs 0.470)", "",
          "## Comparisons", "", *PRIMARY_NOTE, "", CMP_HEAD, CMP_RULE]
    for c in summary["comparisons"]:
        L.append(f"| {c['a']} | {c['b']} | {c.get('metric', '')} | " + cmp_cells(c))
    if summary.get("r2_without_base"):
        nb = summary["r2_without_base"]
        L += ["", f"Without the untrained base ({nb.get('r2_n_checkpoints')} checkpoints): SOP-PG "
              f"{fmt(nb.get('r2_sop_online'))} {fmt_ci(nb.get('r2_sop_online_ci95'))}, static step SR "
              f"{fmt(nb.get('r2_static_online'))} {fmt_ci(nb.get('r2_static_online_ci95'))}."]
    if summary.get("flippability"):
        f = summary["flippability"]
        L += ["", "## The rule: where samples can flip SFT's failures", "",
              f"Before any RL ran, from the final SFT checkpoints alone (greedy and "
              f"{summary.get('config', {}).get('flip_samples', '?')} sampled plays of each selection episode at "
              f"temperature {summary.get('config', {}).get('flip_temperature', '?')}, pooled over seeds): a task is an RL "
              f"task if its flippable fraction (greedy fails, a sample succeeds) is >= {f['min']}"
              + (" (none was: the task with the most flippable episodes)" if f.get("fallback") else "") + ".", "",
              "| task | greedy | pass@K | flippable | chosen |", "|---|---|---|---|---|"]
        for t, v in f["per_task"].items():
            L.append(f"| {t} | {v['greedy']}/{v['n']} | {v['pass_at_k']}/{v['n']} | {v['flippable']}/{v['n']} = "
                     f"{fmt(v['rate'], '.2f')} | {'yes' if t in f['tasks'] else ''} |")
    if summary.get("history_gap"):
        L += ["", "## Own vs expert history (SFT finals, steps after step 0 that SOP reached, seeds summed)", "",
              "| task | steps | right, own history | right, expert history | own only | expert only |",
              "|---|---|---|---|---|---|"]
        for t, v in summary["history_gap"].items():
            L.append(f"| {t} | {v['steps']} | {v['own_right']} | {v['expert_right']} | {v['own_only']} | {v['expert_only']} |")
    if summary.get("headroom"):
        h = summary["headroom"]
        L += ["", "## Test episodes: the tasks with headroom", "",
              f"Selected before any test episode ran, by the {h['arm']} arm's pooled online success on the episodes above "
              f"(strictly between {h['range'][0]} and {h['range'][1]}): "
              + ", ".join(f"{t} {v:.2f}" + (" (selected)" if t in h["tasks"] else "") for t, v in h["per_task"].items()) + "."]
    if summary.get("test_checkpoints"):
        tc = summary["test_checkpoints"]
        tasks = summary.get("rl_tasks") or (summary.get("headroom") or {}).get("tasks") or []
        L += ["", "## Test episodes", "", f"Every test checkpoint on the same {tc[0]['n_online_episodes']} fresh online "
              f"episodes (seeds from {summary.get('config', {}).get('test_seed_base', '?')}):", "",
              "| checkpoint | arm | seed | online SR [95% Wilson] | n | " + " | ".join(tasks) + " |",
              "|---|---|---|---|---|" + "---|" * len(tasks)]
        for c in tc:
            L.append(f"| {c['name']} | {c['arm']} | {c['seed']} | {fmt(c['online_sr'])} {fmt_ci(c['online_sr_ci95'])} | "
                     f"{c['n_online_episodes']} | " + " | ".join(fmt((c.get('online_per_task') or {}).get(t), ".2f")
                                                                for t in tasks) + " |")
        L += ["", "Pooled over seeds: " + "; ".join(f"{arm} {fmt(a['online_sr'])} {fmt_ci(a['online_sr_ci95'])}"
                                                    for arm, a in (summary.get("test_arms") or {}).items())]
        L += ["", CMP_HEAD.replace("| metric ", ""), CMP_RULE[4:]]
        for c in summary.get("test_comparisons") or []:
            L.append(f"| {c['a']} | {c['b']} | " + cmp_cells(c))
        if summary.get("primary_test_fpr"):
            f = summary["primary_test_fpr"]
            L += ["", f"The primary test's false-positive rate at nominal {f['alpha']}, simulated for this design "
                  f"({f['n_seeds']} seeds x {f['n_episodes']} episodes, between-seed SD {fmt(f['seed_sd_measured'])} as "
                  f"measured, no true effect, {f['repeats']} repeats): {fmt(f['fpr_primary_t'])} (secondary McNemar: "
                  f"{fmt(f['fpr_mcnemar_secondary'])})."]
    if summary.get("dose_response"):
        from dose_response import markdown as dose_markdown
        L += ["", "## Dose-response and conversion (test episodes, seeds pooled)", "", dose_markdown(summary["dose_response"])]
    if summary.get("goal"):
        g = summary["goal"]
        L += ["", f"Goal ({g['target']}): diff {fmt(g['diff'], '+.3f')}, p {fmt(g['p_value'], '.3g')}: "
              f"**{'met' if g['met'] else 'not met'}**."]
    if summary.get("claims"):
        L += ["", "## Claims (automatic verdict; the reading is in the README)", "",
              f"Rule: held = the difference favours the claim with p < {ALPHA}; not held = it goes the other way "
              f"with p < {ALPHA}; else inconclusive. p is the primary test's (online success: the paired t-test "
              "across seeds; R^2: the bootstrap over checkpoints).", "",
              "| claim | test | diff [95%] | p (primary) | seeds | verdict |", "|---|---|---|---|---|---|"]
        for c in summary["claims"]:
            L.append(f"| {c['claim']} | {c['test']}{' (' + c['episodes'] + ' episodes)' if c.get('episodes') else ''} "
                     f"| {fmt(c.get('diff'), '+.3f')} {fmt_ci(c.get('diff_ci95'))} | {fmt(c.get('p_value'), '.3g')} "
                     f"| {c.get('n_seeds') or ''} | **{c['verdict']}** |")
    if summary.get("dose_seed_level"):
        L += ["", "## Every test checkpoint against SFT, seed by seed (primary test)", "",
              "| arm | step | diff [95% t] | p (primary) | seeds | secondary: McNemar p |", "|---|---|---|---|---|---|"]
        for d in summary["dose_seed_level"]:
            L.append(f"| {d['arm']} | {d['step']} | {fmt(d['diff'], '+.3f')} {fmt_ci(d['diff_ci95'])} | "
                     f"{fmt(d['p_value'], '.3g')} | {d['n_seeds']} | {fmt(d.get('p_mcnemar_secondary'), '.3g')} |")
    if summary.get("verdicts_recomputed"):
        v = summary["verdicts_recomputed"]
        L += ["", f"Verdicts recomputed at `{v['commit'][:7]}` ({v['by']}) from the stored outcomes with the primary "
              "test; as first reported: " + "; ".join(f"{c['claim'].split(':')[0]} {c['verdict']}"
                                                        for c in v["previous_claims"]) + "."]
    if summary.get("arms"):
        L += ["", "## Per-arm diagnostics (final checkpoints pooled over seeds; RL means over the second half of steps)",
              "", "| arm | seeds | online SR [95%] | SOP-PG | reward | reward trend / 100 steps [95%] | entropy | KL "
              "| patch rate |", "|---|---|---|---|---|---|---|---|---|"]
        for arm, a in summary["arms"].items():
            d, tr = a.get("rl") or {}, a.get("reward_trend_per100") or {}
            L.append(f"| {arm} | {a['seeds']} | {fmt(a['online_sr'])} {fmt_ci(a['online_sr_ci95'])} | {fmt(a.get('sop_pg'))} "
                     f"| {fmt(d.get('reward_mean'))} | {fmt(tr['slope'], '+.3f') + ' ' + fmt_ci(tr['slope_ci95']) if tr else 'n/a'} "
                     f"| {fmt(d.get('entropy'))} | {fmt(d.get('kl'), '.2e')} | {fmt(d.get('patch_rate'))} |")
        L += ["", "Reward trend: least-squares slope of the per-step training reward (sampled rollouts) over "
              "100 steps, centred within each seed's run; the interval treats steps as independent."]
        tasks = sorted({t for a in summary["arms"].values() for t in a.get("online_per_task", {})})
        if tasks:
            L += ["", "Per-task online success (final checkpoints, mean over seeds):", "",
                  "| task | " + " | ".join(summary["arms"]) + " |", "|---|" + "---|" * len(summary["arms"])]
            for t in tasks:
                L.append(f"| {t} | " + " | ".join(fmt(a.get("online_per_task", {}).get(t), ".2f")
                                                   for a in summary["arms"].values()) + " |")
    if summary.get("scaling"):
        L += ["", "## Data scaling: y = A - B * N^k (N = training episodes)", "",
              "| arm | k [95%] | A | B | at grid bound |", "|---|---|---|---|---|"]
        for arm, f in summary["scaling"].items():
            L.append(f"| {arm} | {fmt(f.get('k'), '.2f')} {fmt_ci(f.get('k_ci95'))} | {fmt(f.get('A'))} | {fmt(f.get('B'))} "
                     f"| {f.get('at_bound')} |")
    if summary.get("not_run"):
        L += ["", "## Not run (estimated wall time with this run's unit costs)", ""]
        L += [f"- {n['what']}: ~{n['estimate_min']} min" for n in summary["not_run"]]
    if summary.get("figures"):
        L += ["", "Figures: " + ", ".join(f"`{p}`" for p in summary["figures"])]
    return "\n".join(L) + "\n"


def arm_summaries(checkpoints: list[dict], curves: dict) -> dict:
    """Per arm: its final checkpoints pooled over seeds (online SR with a Wilson interval on the
    pooled counts, mean SOP-PG, mean per-task online success) and its RL diagnostics."""
    out = {}
    for arm in dict.fromkeys(c["arm"] for c in checkpoints):
        rows = final_rows(checkpoints, arm)
        if not rows:
            continue
        k = sum(r["online_outcomes"].count("1") for r in rows)
        n = sum(len(r["online_outcomes"]) for r in rows)
        tasks = sorted({t for r in rows for t in (r.get("online_per_task") or {})})
        per_task = {t: float(np.mean([r["online_per_task"][t] for r in rows if r["online_per_task"].get(t) is not None]))
                    for t in tasks}
        rl = [rl_diagnostics(rs) for rs in curves.get(arm, {}).values() if rs]
        pts = [(r["step"], r["reward_mean"], seed) for seed, rs in curves.get(arm, {}).items() for r in rs
               if r.get("reward_mean") is not None and r.get("step") is not None]
        try:  # the training reward's within-run trend, pooled over seeds, per 100 steps
            tr = trend([p[0] / 100 for p in pts], [p[1] for p in pts], [p[2] for p in pts])
        except ValueError:  # too few steps logged (or no RL run)
            tr = None
        out[arm] = {"seeds": [r["seed"] for r in rows], "per_seed": [r["online_sr"] for r in rows],
                    "online_sr": k / n if n else None,
                    "online_sr_ci95": list(wilson(k, n)) if n else [None, None],
                    "sop_pg": float(np.mean([r["sop_pg"] for r in rows if r["sop_pg"] is not None] or [np.nan])),
                    "online_per_task": per_task,
                    "rl": {key: (float(np.mean([d[key] for d in rl if d[key] is not None]))
                                 if any(d[key] is not None for d in rl) else None) for key in rl[0]} if rl else None,
                    "reward_trend_per100": tr}
    return out


def write_results(summary: dict, json_path: Path, title: str) -> None:
    """Validate, then write the JSON and its Markdown twin (called after every evaluated checkpoint
    and at the end, so partial results survive an interrupted run)."""
    summary = _nan_to_none(summary)
    validate_results(summary, str(json_path))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(summary, indent=1) + "\n")
    json_path.with_suffix(".md").write_text(markdown(summary, title))


# --- figures (matplotlib, Agg)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _yerr(y: float, lo: float, hi: float) -> list[list[float]]:
    """matplotlib's yerr of one point from its interval: never negative (eval_sop.wilson keeps lo <= y <= hi;
    results written before that clamp may hold a bound one ulp past the rate at 0/n and n/n)."""
    return [[max(0.0, y - lo)], [max(0.0, hi - y)]]


def plot_r2(path: Path, checkpoints: list[dict], summary: dict) -> Path:
    """Two panels: SOP-PG and static step SR (x) against online success (y), one labelled point per
    checkpoint with its Wilson interval, the least-squares line and R^2 with its bootstrap interval."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    arms = list(dict.fromkeys(c["arm"] for c in checkpoints))
    colours = {a: plt.cm.tab10(i % 10) for i, a in enumerate(arms)}
    for ax, key, label, r2k in ((axes[0], "sop_pg", "SOP-PG", "r2_sop_online"),
                                (axes[1], "static_step_sr", "static step SR", "r2_static_online")):
        pts = [c for c in checkpoints if c.get(key) is not None and c.get("online_sr") is not None]
        for c in pts:
            lo, hi = c["online_sr_ci95"]
            ax.errorbar(c[key], c["online_sr"], yerr=_yerr(c["online_sr"], lo, hi), fmt="o",
                        color=colours[c["arm"]], capsize=2, alpha=0.8)
        labels: dict = {}  # coinciding points share one label instead of overprinting each other
        for c in pts:
            labels.setdefault((round(c[key], 4), round(c["online_sr"], 4)), []).append(c["name"])
        for (x, y), names in labels.items():
            text = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} more)"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=6)
        if len(pts) >= 2 and np.ptp([c[key] for c in pts]) > 0:
            slope, icpt = np.polyfit([c[key] for c in pts], [c["online_sr"] for c in pts], 1)
            xs = np.linspace(min(c[key] for c in pts), max(c[key] for c in pts), 10)
            ax.plot(xs, slope * xs + icpt, "k--", lw=1)
        ax.set_title(f"{label}: R$^2$ = {fmt(summary.get(r2k))} {fmt_ci(summary.get(r2k + '_ci95'))}")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("online success (95% Wilson)")
    handles = [plt.Line2D([], [], marker="o", ls="", color=colours[a], label=a) for a in arms]
    axes[1].legend(handles=handles, fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_curves(path: Path, curves: dict, keys=("reward_mean", "entropy", "kl", "patch_rate")) -> Path:
    """RL training curves per arm: the mean over seeds as a line, the min-max over seeds as a band.
    curves: {arm: {seed: [metrics.jsonl rows]}}."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.6))
    for i, arm in enumerate(curves):
        runs = [rs for rs in curves[arm].values() if rs]
        if not runs:
            continue
        n = min(len(rs) for rs in runs)
        for ax, key in zip(axes, keys):
            m = np.array([[np.nan if r.get(key) is None else r[key] for r in rs[:n]] for rs in runs], dtype=float)
            steps = np.arange(1, n + 1)
            colour = plt.cm.tab10(i % 10)
            ax.plot(steps, np.nanmean(m, axis=0), color=colour, label=f"{arm} ({len(runs)} seeds)")
            if len(runs) > 1:
                ax.fill_between(steps, np.nanmin(m, axis=0), np.nanmax(m, axis=0), color=colour, alpha=0.2)
    for ax, key in zip(axes, keys):
        ax.set_title(key)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_bars(path: Path, groups: list[tuple[str, list[str]]], arms: dict, episodes: str = "") -> Path:
    """Ablation bars: one panel per ablation (title, [arm, ...]), pooled online success per arm with
    its Wilson interval, the per-seed values as dots; `episodes` names the episode set on the y axis."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.8), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups):
        names = [a for a in names if a in arms]
        for j, a in enumerate(names):
            s = arms[a]
            lo, hi = s["online_sr_ci95"]
            ax.bar(j, s["online_sr"], color=plt.cm.tab10(j % 10), alpha=0.7)
            ax.errorbar(j, s["online_sr"], yerr=_yerr(s["online_sr"], lo, hi), color="k", capsize=4)
            for v in s.get("per_seed", []):
                ax.plot(j, v, "k.", ms=5)
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(f"online success{' (' + episodes + ')' if episodes else ''}\n95% Wilson, pooled seeds", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_scaling(path: Path, points: dict, fits: dict) -> Path:
    """Data scaling: points {arm: [(N, y), ...]} on a log N axis, each arm's fitted law y = A - B N^k."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for i, (arm, pts) in enumerate(points.items()):
        colour = plt.cm.tab10(i % 10)
        n = np.array([p[0] for p in pts], dtype=float)
        y = np.array([p[1] for p in pts], dtype=float)
        ax.plot(n, y, "o", color=colour, alpha=0.8)
        f = fits.get(arm)
        if f and f.get("k") is not None:
            xs = np.geomspace(n.min(), n.max(), 50)
            ax.plot(xs, f["A"] - f["B"] * xs ** f["k"], color=colour,
                    label=f"{arm}: k = {fmt(f['k'], '.2f')} {fmt_ci(f.get('k_ci95'))}")
        else:
            ax.plot([], [], "o", color=colour, label=f"{arm}: no fit")
    ax.set_xscale("log")
    ax.set_xlabel("training episodes N (log)")
    ax.set_ylabel("online success")
    ax.set_title("data scaling: y = A - B N^k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

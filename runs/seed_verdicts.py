"""Recompute the verdicts of stored reproduction results with the primary test (the paired t-test
across training seeds, stats.seed_paired_t) from the per-episode outcomes they hold; no model runs.

For each results JSON (repro_main.py's or repro_ablations.py's) it rebuilds the comparisons and the
claims from its checkpoint rows (the outcome strings), the dose points of the test episodes against
SFT seed by seed, and the primary test's simulated false-positive rate at the run's measured seed
spread; it rewrites the JSON and its Markdown twin (the previous claims kept under
verdicts_recomputed.previous_claims, written once) and writes a side-by-side of old and new verdicts:

    python runs/seed_verdicts.py results/repro_main.json results/varied/repro_main.json \\
        results/repro_ablations.json --out results/verdicts_seed_level.json

What cannot be recomputed from a results file (a training-curve claim: the per-step curves are not
stored) keeps its stored figures and gets the verdict "inconclusive" with a note, since the primary
test was not run on it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli  # noqa: E402
import repro_common as rc  # noqa: E402
from repro_report import fmt, fmt_ci  # noqa: E402
from evaluation.stats import seed_paired_t  # noqa: E402

FIELDS = ("diff", "diff_ci95", "p_value", "verdict")


def dose_points(tck: list[dict]) -> list[dict]:
    """Every non-SFT test checkpoint (each RL arm's dose points, the control) against SFT, seed by seed:
    the primary test, plus the pooled McNemar p (secondary) that older reports quoted."""
    sft = {c["seed"]: c for c in tck if c["arm"] == "sft"}
    out = []
    for arm in dict.fromkeys(c["arm"] for c in tck if c["arm"] != "sft"):
        for step in sorted({c.get("step") for c in tck if c["arm"] == arm}):
            rows = [c for c in tck if c["arm"] == arm and c.get("step") == step and c["seed"] in sft]
            if not rows:
                continue
            prim = seed_paired_t([c["online_sr"] - sft[c["seed"]]["online_sr"] for c in rows])
            pooled = rc.compare_online([{**c, "final": True} for c in rows] + list(sft.values()), arm, "sft")
            out.append({"arm": arm, "step": step, **{k: prim[k] for k in ("diff", "diff_ci95", "p_value", "n_seeds",
                                                                         "per_seed_diff")},
                        "p_mcnemar_secondary": pooled["p_mcnemar"], "p_bootstrap_secondary": pooled["p_bootstrap"],
                        "verdict": rc.verdict(prim)})
    return out


def recompute(path: Path, commit: str) -> dict:
    """Rewrite one results file's comparisons and claims with the primary test; returns old vs new."""
    s = json.loads(path.read_text())
    ck, tck = s["checkpoints"], s.get("test_checkpoints") or []
    meta = s.get("verdicts_recomputed") or {}
    previous = meta.get("previous_claims") or [{k: c.get(k) for k in ("claim", *FIELDS)} for c in s["claims"]]
    old_cmps = {(c["a"], c["b"], c.get("metric")): c for c in (s.get("comparisons") or [])}
    if "repro_main" in path.name:
        import repro_main
        r2cmp = next((c for c in s["comparisons"] if c.get("metric") == "r2"), None)
        s["comparisons"], s["test_comparisons"], s["claims"], s["goal"] = repro_main.comparisons_and_claims(ck, tck, r2cmp)
    else:  # the ablations: online-success claims recomputed; curve and scaling claims as stored (see the docstring)
        on_test = bool(tck)
        rows = tck if on_test else ck
        new_claims = []
        for c in s["claims"]:
            if c.get("diff") is None or "(online_sr)" not in c["test"]:
                if c.get("diff") is not None:
                    c = {**c, "verdict": "inconclusive", "p_bootstrap": c.get("p_bootstrap", c["p_value"]), "p_value": None,
                         "note": "primary test not computable from the stored results (per-step curves not kept); "
                                 "the stored p is the two-level bootstrap's (secondary)"}
                new_claims.append(c)
                continue
            a, b = c["test"].split(" (")[0].split(" - ")
            cmp = rc.compare_online(rows, a, b)
            new_claims.append({**c, "diff": cmp["diff"], "diff_ci95": cmp["diff_ci95"], "p_value": cmp["p_value"],
                               "n_seeds": cmp["n_seeds"], "p_bootstrap": cmp["p_bootstrap"],
                               "p_mcnemar": cmp["p_mcnemar"], "verdict": rc.verdict(cmp)})
        s["claims"] = new_claims
        s["comparisons"] = [rc.compare_online(ck, a, b) or old for (a, b, m), old in old_cmps.items()
                            if m == "online_sr"] + [c for k, c in old_cmps.items() if k[2] != "online_sr"]
        s["test_comparisons"] = [rc.compare_online(tck, c["a"], c["b"]) for c in s.get("test_comparisons") or []]
    s["primary_test_fpr"] = rc.primary_test_fpr(tck or ck)
    s["dose_seed_level"] = dose_points(tck) if tck else []
    for row in (s.get("dose_response") or {}).get("rows", []):  # the dose table's rows read the primary test too
        match = [d for d in s["dose_seed_level"] if d["arm"] == row["arm"]]
        match = [d for d in match if d["step"] == row["step"]] or (match if len(match) == 1 else [])
        if row["step"] and match and "diff_ci95_bootstrap" not in row:  # once: a rerun keeps the first bootstrap
            row.update(diff_ci95_bootstrap=row["diff_ci95"], diff_ci95=match[0]["diff_ci95"],
                       p_value=match[0]["p_value"], n_seeds=match[0]["n_seeds"])
    s["verdicts_recomputed"] = {"commit": commit, "by": "runs/seed_verdicts.py", "previous_claims": previous,
                                "note": "comparisons and claims recomputed from the stored per-episode outcomes "
                                        "with the primary test (paired t-test across seeds); the runs are those of "
                                        "'commit' at the top"}
    title = "MiniWob++ reproduction: " + ("main table" if "repro_main" in path.name else "ablations")
    rc.write_results(s, path, title)
    new = {c["claim"]: c for c in s["claims"]}
    return {"file": str(path.relative_to(rc.REPO)) if path.is_relative_to(rc.REPO) else str(path),
            "run_commit": s["commit"], "seeds": s["seeds"], "primary_test_fpr": s["primary_test_fpr"],
            "claims": [{"claim": o["claim"], "old": {k: o.get(k) for k in FIELDS},
                        "new": {k: new[o["claim"]].get(k) for k in (*FIELDS, "n_seeds", "p_bootstrap", "p_mcnemar")}}
                       for o in previous],
            "dose_seed_level": s["dose_seed_level"]}


def markdown(out: dict) -> str:
    f = fmt
    L = ["# Verdicts with the primary test (paired t-test across seeds), recomputed from stored outcomes", "",
         f"Recomputed at commit `{out['commit']}` by `{out['command']}`. Old: the verdicts as first reported "
         "(two-level bootstrap p). New: the primary test; bootstrap and McNemar p are secondary.", ""]
    for r in out["results"]:
        fp = r["primary_test_fpr"] or {}
        L += [f"## {r['file']} (runs at `{r['run_commit'][:7]}`, seeds {r['seeds']})", "",
              f"Primary test's simulated false-positive rate at nominal 0.05 for this design (seed SD "
              f"{f(fp.get('seed_sd_measured'))} measured): {f(fp.get('fpr_primary_t'))}; McNemar's (secondary) "
              f"{f(fp.get('fpr_mcnemar_secondary'))}.", "",
              "| claim | old: diff [95%], p, verdict | new: diff [95% t], p, verdict | seeds | secondary: bootstrap p, McNemar p |",
              "|---|---|---|---|---|"]
        for c in r["claims"]:
            o, n = c["old"], c["new"]
            L.append(f"| {c['claim']} | {f(o['diff'], '+.3f')} {fmt_ci(o['diff_ci95'])}, {f(o['p_value'], '.3g')}, "
                     f"{o['verdict']} | {f(n['diff'], '+.3f')} {fmt_ci(n['diff_ci95'])}, {f(n['p_value'], '.3g')}, "
                     f"**{n['verdict']}** | {n.get('n_seeds') or ''} | {f(n.get('p_bootstrap'), '.3g')}, "
                     f"{f(n.get('p_mcnemar'), '.3g')} |")
        if r["dose_seed_level"]:
            L += ["", "Every test checkpoint against SFT (dose points):", "",
                  "| arm | step | diff [95% t] | p (primary) | secondary: McNemar p |", "|---|---|---|---|---|"]
            for d in r["dose_seed_level"]:
                L.append(f"| {d['arm']} | {d['step']} | {f(d['diff'], '+.3f')} {fmt_ci(d['diff_ci95'])} | "
                         f"{f(d['p_value'], '.3g')} | {f(d['p_mcnemar_secondary'], '.3g')} |")
        L.append("")
    return "\n".join(L)


def main(argv=None) -> dict:
    """Recompute every file given, write --out (+ .md); prints {file: {claim: new verdict}} as its last line.
    A missing file, bad JSON or a file that is not a reproduction's results: one-line error, exit 2."""
    ap = cli.Parser(prog="seed_verdicts.py", description=__doc__, formatter_class=cli.HelpFormatter)
    ap.add_argument("results", nargs="+", help="results JSON files (repro_main.py / repro_ablations.py)")
    ap.add_argument("--out", default="results/verdicts_seed_level.json", help="the side-by-side JSON (+ .md twin)")
    args = ap.parse_args(argv)
    for p in args.results:
        try:
            rc.validate_results(json.loads(Path(p).read_text()), p)
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            ap.error(f"{p}: not a reproduction's results file ({e})")
    commit = rc.git_commit()
    out = {"commit": commit, "command": rc.command_line("seed_verdicts.py", argv),
           "results": [recompute(Path(p).resolve(), commit) for p in args.results]}
    out = rc._nan_to_none(out)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(out))
    print(json.dumps({r["file"]: {c["claim"].split(":")[0]: c["new"]["verdict"] for c in r["claims"]}
                      for r in out["results"]}))
    return out


if __name__ == "__main__":
    cli.run_script(main)

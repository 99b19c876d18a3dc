"""Statistics and report of the reproduction scripts (evaluation/stats.py, runs/repro_common.py) against
hand-computed values, and the results schema on a small fabricated results set (no training, no browser)."""
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runs"))
import repro_common as rc  # noqa: E402
from evaluation import stats  # noqa: E402


# --- Wilson: hand values, z = 1.959964
# 0/30: [0, z^2/(n+z^2)] = [0, 3.841459/33.841459] = [0, 0.113513]
# 15/30: centre 0.5, half = z*sqrt(0.25/30 + z^2/3600)/(1 + z^2/30) = 0.190030/1.128049 = 0.168459 -> [0.331541, 0.668459]
# 30/30: mirror of 0/30
@pytest.mark.parametrize("k,n,lo,hi", [(0, 30, 0.0, 0.113513), (15, 30, 0.331541, 0.668459), (30, 30, 0.886487, 1.0),
                                       (1, 18, 0.009875, 0.257573)])
def test_wilson_hand_values(k, n, lo, hi):
    got = stats.wilson(k, n)
    assert got[0] == pytest.approx(lo, abs=2e-6) and got[1] == pytest.approx(hi, abs=2e-6)


def test_wilson_rejects_bad_counts():
    with pytest.raises(ValueError, match="outside"):
        stats.wilson(5, 4)
    assert all(math.isnan(v) for v in stats.wilson(0, 0))


def test_mcnemar_exact_hand_values():
    # b=1, c=5: n=6, P(X<=1) = (1 + 6)/64, two-sided 14/64
    assert stats.mcnemar_exact(1, 5) == pytest.approx(14 / 64)
    assert stats.mcnemar_exact(5, 1) == pytest.approx(14 / 64)
    # b=0, c=6: 2 * 1/64
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    # balanced or empty: 1
    assert stats.mcnemar_exact(3, 3) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0
    with pytest.raises(ValueError):
        stats.mcnemar_exact(-1, 2)


# --- the primary test: Student's t by hand
# t = 2, df 1: p = 1 - (2/pi) atan(2) = 0.295167; df 2: p = 1 - t / sqrt(t^2 + 2) = 1 - 2/sqrt(6) = 0.183503
def test_t_distribution_hand_values():
    assert stats.t_two_sided_p(2.0, 1) == pytest.approx(0.295167, abs=1e-6)
    assert stats.t_two_sided_p(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-12)
    assert stats.t_two_sided_p(0.0, 4) == pytest.approx(1.0) and stats.t_two_sided_p(-2.0, 2) == stats.t_two_sided_p(2.0, 2)
    # table quantiles t_{0.975, df}
    for df, q in ((1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139)):
        assert stats.t_quantile(0.975, df) == pytest.approx(q, abs=1e-5)
        assert stats.t_two_sided_p(q, df) == pytest.approx(0.05, abs=1e-6)
    assert np.allclose(stats.t_two_sided_p(np.array([2.0, 2.0]), 2), 1 - 2 / math.sqrt(6))
    with pytest.raises(ValueError):
        stats.t_two_sided_p(1.0, 0)


def test_seed_paired_t_hand_values():
    # d = 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1/sqrt(3) = 0.0577350, t = 3.464102 on 2 df:
    # p = 1 - t/sqrt(t^2 + 2) = 1 - 3.464102/3.741657 = 0.0741799; half-width 4.302653 * 0.0577350 = 0.248414
    r = stats.seed_paired_t([0.1, 0.2, 0.3])
    assert r["diff"] == pytest.approx(0.2) and r["n_seeds"] == 3 and r["per_seed_diff"] == [0.1, 0.2, 0.3]
    assert r["p_value"] == pytest.approx(0.0741799, abs=1e-6)
    assert r["diff_ci95"] == pytest.approx([0.2 - 0.248414, 0.2 + 0.248414], abs=1e-6)
    # the varied-thoughts setting's claim-1a seeds (results/varied): the bootstrap said p 1/4001, the t-test 0.023
    assert stats.seed_paired_t([0.135802, 0.234568, 0.216049])["p_value"] == pytest.approx(0.0232, abs=5e-4)
    one = stats.seed_paired_t([0.3])
    assert math.isnan(one["p_value"]) and rc.verdict(one) == "inconclusive"  # one seed: no test, no verdict
    assert stats.seed_paired_t([0.1, 0.1])["p_value"] == 0.0 and stats.seed_paired_t([0.0, 0.0])["p_value"] == 1.0
    with pytest.raises(ValueError):
        stats.seed_paired_t([])


def test_null_simulation_primary_test_holds_its_level():
    """Under no true effect, S seeds x 160 paired episodes: the primary test rejects at about its nominal
    5% whatever the between-seed SD; the two-level bootstrap rejects too rarely without seed spread and
    too often with it, pooled McNemar far too often. 0.035 is the spread measured in results/varied (the
    largest of the stored runs; stats.seed_sd_of). Repeats 6000: Monte Carlo SE 0.0028 at 0.05."""
    res = {}
    for S in (3, 5):
        for sd in (0.0, 0.035, 0.05, 0.08):
            res[S, sd] = r = stats.null_fpr(S, 160, sd, repeats=6000, boot_repeats=600 if sd in (0.0, 0.08) else 0)
            assert r["primary_t"] <= 0.06, (S, sd, r)
            assert r["primary_t"] >= 0.04, (S, sd, r)  # not conservative either
    assert res[3, 0.08]["mcnemar"] > 0.1 and res[5, 0.08]["mcnemar"] > 0.1 and res[3, 0.05]["mcnemar"] > 0.1
    assert res[3, 0.0]["mcnemar"] <= 0.06  # without seed spread McNemar is right (pooled episodes are independent)
    assert res[3, 0.08]["bootstrap"] > 0.08  # 3 seeds: 10 distinct seed resamples, under-covers
    assert res[3, 0.0]["bootstrap"] < 0.04 and res[5, 0.0]["bootstrap"] < 0.04  # and over-covers without spread
    with pytest.raises(ValueError):
        stats.null_fpr(1, 160, 0.05)


def test_seed_sd_of_removes_binomial_noise():
    # rates 0.2 and 0.4 at n = 100: within variance 0.02 (1 df), binomial part (0.16 + 0.24) / 100 / 2 = 0.002
    assert stats.seed_sd_of({"a": [0.2, 0.4]}, 100) == pytest.approx(math.sqrt(0.018))
    assert stats.seed_sd_of({"a": [0.3, 0.3]}, 100) == 0.0 and math.isnan(stats.seed_sd_of({"a": [0.3]}, 100))


def test_paired_bootstrap_extremes_and_sign():
    a, b = np.ones(100), np.zeros(100)
    r = stats.paired_bootstrap(a, b, n_boot=500)
    assert r["diff"] == 1.0 and r["diff_ci95"] == [1.0, 1.0]
    assert r["p_value"] == pytest.approx(1 / 501)  # no resample as far from the null as the data
    same = stats.paired_bootstrap(a, a, n_boot=200)
    assert same["diff"] == 0.0 and same["p_value"] == 1.0
    # 10 discordant pairs for a, 0 for b, out of 100: diff 0.1, CI above 0, small p; reversed is the mirror
    x = np.zeros(100)
    x[:10] = 1
    r = stats.paired_bootstrap(x, np.zeros(100), n_boot=2000, seed=1)
    assert r["diff"] == pytest.approx(0.1) and r["diff_ci95"][0] > 0 and r["p_value"] < 0.01
    rr = stats.paired_bootstrap(np.zeros(100), x, n_boot=2000, seed=1)
    assert rr["diff"] == pytest.approx(-0.1) and rr["diff_ci95"][1] < 0
    with pytest.raises(ValueError):
        stats.paired_bootstrap([1, 0], [1])
    # one pair (e.g. the second half of a 2-step run): no test, not a p of 1/(B+1)
    one = stats.paired_bootstrap([0.5], [0.4], n_boot=100)
    assert one["diff"] == pytest.approx(0.1) and math.isnan(one["p_value"])
    assert rc.verdict(one) == "inconclusive"


def test_paired_bootstrap_groups_widen_for_seed_variance():
    # two seeds that disagree (+0.5 and -0.3): resampling seeds must widen the interval
    rng = np.random.default_rng(0)
    a = np.concatenate([np.ones(50) * (rng.random(50) < 0.8), np.ones(50) * (rng.random(50) < 0.2)])
    b = np.concatenate([np.ones(50) * (rng.random(50) < 0.3), np.ones(50) * (rng.random(50) < 0.5)])
    g = np.repeat([0, 1], 50)
    flat = stats.paired_bootstrap(a, b, n_boot=1000)
    two = stats.paired_bootstrap(a, b, groups=g, n_boot=1000)
    assert two["diff"] == flat["diff"]
    assert two["diff_ci95"][1] - two["diff_ci95"][0] > flat["diff_ci95"][1] - flat["diff_ci95"][0]


def test_trend_hand_values():
    # x = 0..3, y = 0,1,1,2: Sxy = 3, Sxx = 5 -> slope 0.6; residuals -0.1, 0.3, -0.3, 0.1 -> SSE 0.2;
    # se = sqrt(0.2 / (4 - 2) / 5) = 0.141421; half-width 1.959964 * 0.141421 = 0.277181
    t = stats.trend([0, 1, 2, 3], [0, 1, 1, 2])
    assert t["slope"] == pytest.approx(0.6) and t["n"] == 4
    assert t["slope_ci95"] == pytest.approx([0.322819, 0.877181], abs=1e-6)
    # two runs, the second later in x and lower in y: pooled, the slope is negative; centred within each
    # run it is 0.6 again, SSE 0.4 over 8 - 3 degrees of freedom, Sxx 10 -> se sqrt(0.008) = 0.0894427
    x, y, g = [0, 1, 2, 3, 4, 5, 6, 7], [10, 11, 11, 12, 0, 1, 1, 2], [0, 0, 0, 0, 1, 1, 1, 1]
    assert stats.trend(x, y)["slope"] < 0
    t = stats.trend(x, y, g)
    assert t["slope"] == pytest.approx(0.6)
    assert t["slope_ci95"] == pytest.approx([0.6 - 0.175304, 0.6 + 0.175304], abs=1e-6)
    assert math.isnan(stats.trend([1, 1, 1], [0, 1, 2])["slope"])
    with pytest.raises(ValueError, match="too few"):
        stats.trend([0, 1], [0, 1])
    with pytest.raises(ValueError, match="one length"):
        stats.trend([0, 1, 2], [0, 1])


def test_r2_hand_values():
    assert stats.r2([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(1.0)  # a perfect line
    assert stats.r2([0, 1, 2, 3], [7, 5, 3, 1]) == pytest.approx(1.0)  # a falling one too
    # x = 0,1,2, y = 0,2,1: sxy = 1, sxx = 2, syy = 2 -> 1/4
    assert stats.r2([0, 1, 2], [0, 2, 1]) == pytest.approx(0.25)
    assert math.isnan(stats.r2([1, 1, 1], [0, 1, 2]))  # constant x: undefined, not 0 or 1
    assert math.isnan(stats.r2([0, 1], [0, 1]))  # two points: always 1, reported as undefined


def test_r2_bootstrap_and_difference():
    x = np.linspace(0, 1, 12)
    y = x + np.array([0.01, -0.02, 0.0, 0.02, -0.01, 0.0, 0.01, -0.02, 0.02, 0.0, -0.01, 0.01])
    noise = np.array([0.9, 0.1, 0.5, 0.3, 0.8, 0.2, 0.7, 0.4, 0.6, 0.0, 1.0, 0.35])
    r = stats.r2_bootstrap(x, y, x2=noise, n_boot=1000)
    assert r["r2"] > 0.99 and r["ci95"][0] > 0.95 and r["ci95"][1] <= 1.0
    assert r["diff"] > 0.5 and r["diff_ci95"][0] > 0 and r["p_value"] < 0.01


def test_scaling_law_recovers_exponent():
    n = np.array([10, 20, 40, 80, 160, 320], dtype=float)
    y = 0.8 - 0.9 * n ** -0.7
    f = stats.fit_scaling_law(n, y)
    assert f["k"] == pytest.approx(-0.7, abs=0.01) and f["A"] == pytest.approx(0.8, abs=0.01)
    assert f["B"] == pytest.approx(0.9, rel=0.05) and not f["at_bound"]
    rng = np.random.default_rng(0)
    nn = np.repeat(n, 2)
    yy = 0.8 - 0.9 * nn ** -0.7 + rng.normal(0, 0.01, nn.size)
    b = stats.scaling_bootstrap(nn, yy, n_boot=200)
    assert b["k_ci95"][0] < -0.7 + 0.15 and b["k_ci95"][1] > -0.7 - 0.15 and b["k_ci95"][0] <= b["k_ci95"][1]
    with pytest.raises(ValueError, match="distinct"):
        stats.fit_scaling_law([1, 1, 2], [0.1, 0.2, 0.3])


def test_verdict_rule():
    assert rc.verdict({"diff": 0.1, "p_value": 0.01}) == "held"
    assert rc.verdict({"diff": -0.1, "p_value": 0.01}) == "not held"
    assert rc.verdict({"diff": 0.1, "p_value": 0.2}) == "inconclusive"
    assert rc.verdict(None) == "not run"


def _fabricated_checkpoints():
    """base, sft, offline, semionline on 2 seeds and 40 paired episodes; semionline wins."""
    rng = np.random.default_rng(3)
    rates = {"base": 0.05, "sft": 0.3, "offline": 0.3, "semionline": 0.6}
    rows = []
    for arm, p in rates.items():
        for s in ([0] if arm == "base" else [0, 1]):
            bits = "".join(str(int(v)) for v in rng.random(40) < p)
            k = bits.count("1")
            rows.append({"name": f"{arm} s{s}", "arm": arm, "seed": s, "step": 1, "final": True,
                         "sop_pg": p * 0.5 + 0.01 * s, "sop_tsr": p * 0.3, "static_step_sr": 0.4 + 0.01 * s,
                         "online_sr": k / 40, "online_sr_ci95": list(stats.wilson(k, 40)), "n_online_episodes": 40,
                         "online_outcomes": bits, "online_per_task": {"click-test": k / 40}})
    return rows


def test_report_schema_on_fabricated_results(tmp_path):
    ck = _fabricated_checkpoints()
    curves = {"semionline": {0: [{"step": t + 1, "reward_mean": 0.1 * t, "entropy": 1.0, "kl": 1e-3, "patch_rate": 0.2}
                                 for t in range(6)]}}
    r2f, r2cmp = rc.r2_summary(ck)
    cmp = rc.compare_online(ck, "semionline", "sft")
    assert cmp["seeds"] == [0, 1] and cmp["n_pairs"] == 80
    # the primary test is the t-test on the two per-seed differences; the bootstrap and McNemar are secondary
    by = {(c["arm"], c["seed"]): c["online_sr"] for c in ck}
    d = [by["semionline", s] - by["sft", s] for s in (0, 1)]
    assert cmp["per_seed_diff"] == pytest.approx(d) and cmp["n_seeds"] == 2
    assert cmp["p_value"] == pytest.approx(stats.seed_paired_t(d)["p_value"])
    assert cmp["diff"] == pytest.approx(cmp["diff_pooled"]) and "p_bootstrap" in cmp and "p_mcnemar" in cmp
    assert "(primary)" in cmp["test"] and "secondary" in cmp["test"]
    # a verdict reads the primary p only: a tiny secondary p does not make a claim hold
    assert rc.verdict({**cmp, "p_value": 0.3, "p_bootstrap": 1e-4, "p_mcnemar": 1e-6}) == "inconclusive"
    base_cmp = rc.compare_online(ck, "sft", "base")  # base has one seed: each sft seed is paired with it
    assert base_cmp["n_pairs"] == 80
    summary = {"command": "python runs/repro_main.py --fabricated", "commit": "0" * 40, "seeds": [0, 1], "wall_s": 1.0,
               "checkpoints": ck, **r2f, "comparisons": [cmp, base_cmp, r2cmp],
               "claims": [{"claim": "1a", "test": "semionline - sft", "diff": cmp["diff"], "p_value": cmp["p_value"],
                           "verdict": rc.verdict(cmp)}],
               "arms": rc.arm_summaries(ck, curves)}
    tr = summary["arms"]["semionline"]["reward_trend_per100"]  # reward + 0.1 a step = + 10 per 100 steps, exactly
    assert tr["slope"] == pytest.approx(10.0) and tr["slope_ci95"] == pytest.approx([10.0, 10.0])
    assert summary["arms"]["sft"]["reward_trend_per100"] is None
    summary["figures"] = [str(rc.plot_r2(tmp_path / "r2.png", ck, summary)), str(rc.plot_curves(tmp_path / "c.png", curves))]
    out = tmp_path / "repro.json"
    summary["not_run"] = [{"what": "arm thr1 (--patch-threshold 1), seeds [0, 1]", "estimate_min": 29}]
    rc.write_results(summary, out, "fabricated")
    assert "## Not run" in out.with_suffix(".md").read_text() and "- arm thr1 (--patch-threshold 1), seeds [0, 1]: ~29 min" \
        in out.with_suffix(".md").read_text()
    back = json.loads(out.read_text())
    rc.validate_results(back)
    assert back["r2_sop_online"] > back["r2_static_online"] or back["r2_static_online"] is None
    assert "| semionline | sft |" in out.with_suffix(".md").read_text()
    assert all((tmp_path / p).stat().st_size > 1000 for p in ("r2.png", "c.png"))
    # a broken row is named
    bad = json.loads(out.read_text())
    bad["checkpoints"][1]["seed"] = "0"
    with pytest.raises(ValueError, match=r"checkpoints\[1\]\.seed"):
        rc.validate_results(bad)
    del bad["comparisons"][0]["p_value"]
    bad["checkpoints"][1]["seed"] = 0
    with pytest.raises(ValueError, match=r"comparisons\[0\] missing 'p_value'"):
        rc.validate_results(bad)


def test_committed_results_follow_the_schema():
    """Whatever results the scripts committed must stay readable by the report code."""
    for name in ("repro_main.json", "repro_ablations.json"):
        p = Path(rc.REPO) / "results" / name
        if p.exists():
            rc.validate_results(json.loads(p.read_text()), str(p))


def test_stages_skip_done_and_resume_interrupted(tmp_path):
    """A job whose `done` file exists is skipped; one interrupted after a checkpoint (its `resume` file
    exists, `done` does not) runs again with --resume and appends to its log; a fresh one runs plain."""
    script = ("import sys, pathlib; d = pathlib.Path(sys.argv[1]); print('argv', sys.argv[2:]); "
              "(d / 'done').write_text(' '.join(sys.argv[2:]))")

    def make(name, state):
        d = tmp_path / name
        d.mkdir()
        if state in ("done", "interrupted"):
            (d / "latest").write_text("step_1")
            (d / "log.txt").write_text("first part\n")
        if state == "done":
            (d / "done").write_text("old")
        return {"name": name, "cmd": [sys.executable, "-c", script, str(d)], "dir": d, "done": d / "done",
                "resume": d / "latest"}

    jobs = [make("a", "done"), make("b", "interrupted"), make("c", "fresh")]
    seen = []
    st = rc.Stages(jobs=2)
    st.run(jobs, on_done=lambda j: seen.append(j["name"]))
    assert sorted(seen) == ["a", "b", "c"]
    # a second call meets b and c done: read again, but only a, done before this run, counts as reused
    st.run(jobs, on_done=lambda j: seen.append(j["name"]))
    assert sorted(seen[3:]) == ["a", "b", "c"] and st.skipped == [" ".join(jobs[0]["cmd"])] * 2
    assert (tmp_path / "a" / "done").read_text() == "old"  # skipped
    assert (tmp_path / "b" / "done").read_text() == "--resume"
    assert (tmp_path / "b" / "log.txt").read_text().startswith("first part\nargv ['--resume']")
    assert (tmp_path / "c" / "done").read_text() == ""


def test_stages_record_cpu_seconds_and_failures(tmp_path):
    """Each finished stage logs its wall and CPU seconds (a busy loop of ~0.3 s of CPU: CPU <= wall);
    a failing stage stops the run naming its command."""
    busy = "import time; t = time.process_time(); [0 for _ in iter(lambda: time.process_time() - t > 0.3, True)]"
    d = tmp_path / "busy"
    st = rc.Stages(jobs=1)
    st.run([{"name": "busy", "cmd": [sys.executable, "-c", busy], "dir": d, "done": d / "done"}])
    (e,) = st.log
    assert 0.3 <= e["cpu_s"] <= e["wall_s"] + 0.2
    bad = tmp_path / "bad"
    with pytest.raises(SystemExit, match="failed \\(3\\)"):
        st.run([{"name": "bad", "cmd": [sys.executable, "-c", "raise SystemExit(3)"], "dir": bad, "done": bad / "done"}])


def test_read_metrics_keeps_the_last_row_of_each_step(tmp_path):
    """A run resumed from its step-2 checkpoint after dying at step 3 writes step 3 again."""
    rows = [{"step": 1, "r": 0.1}, {"step": 2, "r": 0.2}, {"step": 3, "r": 0.0}, {"step": 3, "r": 0.3}, {"step": 4, "r": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [(r["step"], r["r"]) for r in rc.read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert rc.read_metrics(tmp_path / "absent") == []


def test_merged_costs_keep_what_a_skipped_stage_measured(tmp_path):
    prev = tmp_path / "r.json"
    assert rc.merged_costs({"rl_steps": 20.0, "online_episodes": None}, rc.read_previous(prev)) == \
        {"rl_steps": 20.0, "online_episodes": None, "basis": "cpu"}
    prev.write_text(json.dumps({"unit_costs": {"rl_steps": 22.0, "sft_steps": 1.8, "online_episodes": 2.4, "basis": "cpu"}}))
    got = rc.merged_costs({"rl_steps": None, "sft_steps": None, "online_episodes": 2.2, "stages": 4.6}, rc.read_previous(prev))
    assert got == {"rl_steps": 22.0, "sft_steps": 1.8, "online_episodes": 2.2, "stages": 4.6, "basis": "cpu"}
    # training costs of an older file are wall seconds of stages that shared the machine: dropped
    prev.write_text(json.dumps({"unit_costs": {"rl_steps": 27.8, "online_episodes": 2.4}}))
    got = rc.merged_costs({"rl_steps": None, "online_episodes": None}, rc.read_previous(prev))
    assert got == {"rl_steps": None, "online_episodes": 2.4, "basis": "cpu"}
    assert rc.load_costs({"rl_steps": 19.0, "online_episodes": 1.6}, prev) == {"rl_steps": 19.0, "online_episodes": 2.4}
    # evaluation costs measured one episode at a time (no online_batch key) do not price batched evaluations
    assert rc.load_costs({"online_episodes": 0.9, "stages": 9.0}, prev, online_batch=8) == {"online_episodes": 0.9, "stages": 9.0}
    assert rc.load_costs({"online_episodes": 0.9}, prev, online_batch=1) == {"online_episodes": 2.4}
    got = rc.merged_costs({"online_episodes": None, "stages": 8.0}, rc.read_previous(prev), online_batch=8)
    assert got == {"online_episodes": None, "stages": 8.0, "basis": "cpu", "online_batch": 8}
    prev.write_text(json.dumps({"unit_costs": got | {"online_episodes": 0.8}}))
    assert rc.load_costs({"online_episodes": 0.9}, prev, online_batch=8) == {"online_episodes": 0.8, "stages": 8.0}


def test_unit_costs_take_training_cpu_seconds():
    log = [{"cmd": "python train_semionline.py --seed 0", "wall_s": 2780.0, "cpu_s": 1900.0},
           {"cmd": "python train_semionline.py --seed 1", "wall_s": 2000.0, "cpu_s": 2100.0},
           {"cmd": "python train_sft.py --max-steps 300", "wall_s": 600.0}]  # no CPU seconds (older log): wall
    got = rc.unit_costs(log, [], sft_steps=300, rl_steps=100)
    assert got["rl_steps"] == pytest.approx(20.0) and got["sft_steps"] == pytest.approx(2.0)


def test_estimate_runs_stages_in_waves():
    """Base alone; 3 SFT runs on 2 jobs share the cores at once (1.5 run-lengths); 6 RL runs take three
    waves, 5 too; evaluations packed."""
    costs = {"base_steps": 0.2, "sft_steps": 2.0, "rl_steps": 20.0, "online_episodes": 1.5, "sop_episodes": 1.0, "stages": 4.0}
    counts = {"base_steps": 3000, "sft_steps": 900, "sft_runs": 3, "rl_steps": 600, "rl_runs": 6,
              "online_episodes": 1000, "sop_episodes": 320, "stages": 10}
    want = 600 + 1.5 * 600 + 3 * 2000 + (1500 + 320 + 40) / 2
    assert rc.estimate(counts, costs, 2) == pytest.approx(want)
    assert rc.estimate({**counts, "rl_runs": 5, "rl_steps": 500}, costs, 2) == pytest.approx(want)  # 5 runs: 3 rounds too
    assert rc.estimate(counts, costs, 1) == pytest.approx(600 + 1800 + 12000 + 1860)
    assert rc.estimate({**counts, "sft_runs": 1, "sft_steps": 300}, costs, 2) == pytest.approx(want - 300)


def test_stages_keep_every_core_busy(tmp_path):
    """A lone job gets the spare cores as threads; 3 jobs on 2 slots start together; 4 run 2 at a time."""
    st = rc.Stages(jobs=2)
    assert [st.slots(n) for n in (1, 2, 3, 4, 5)] == [(1, 2), (2, 1), (3, 1), (2, 1), (2, 1)]
    assert rc.Stages(jobs=4).slots(2) == (2, 2) and rc.Stages(jobs=4).slots(3) == (3, 1)
    # each job marks its start, then waits (up to 60 s) until the jobs of its call have all started:
    # "together" only if none was left waiting for one that had not been launched
    script = ("import os, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); n = int(sys.argv[2]); "
              "(d / 'started').write_text(''); t = time.time(); "
              "ok = lambda: len(list(d.parent.glob('*/started'))) >= n; "
              "[time.sleep(0.05) for _ in iter(lambda: ok() or time.time() - t > 60, True)]; "
              "(d / 'done').write_text(f\"{os.environ['OMP_NUM_THREADS']} {ok()}\")")

    def jobs(group, n):
        return [{"name": f"j{i}", "cmd": [sys.executable, "-c", script, str(tmp_path / group / f"j{i}"), str(n)],
                 "dir": tmp_path / group / f"j{i}", "done": tmp_path / group / f"j{i}" / "done"} for i in range(n)]
    st.run(jobs("one", 1))
    assert (tmp_path / "one" / "j0" / "done").read_text() == "2 True" and st.log[-1]["threads"] == 2
    st.run(jobs("three", 3))
    assert [(tmp_path / "three" / f"j{i}" / "done").read_text() for i in range(3)] == ["1 True"] * 3
    assert [e["threads"] for e in st.log[1:]] == [1, 1, 1]


def test_report_only_keeps_the_runs_provenance(tmp_path):
    """--report-only rewrites the report from finished stages; the command, commit, stage log and wall
    time stay those of the run that trained, and report_commit names the code that wrote the report."""
    from types import SimpleNamespace
    ck = _fabricated_checkpoints()
    r2f, _ = rc.r2_summary(ck)

    def summary(final_report=False, commit="1" * 40, command="python runs/repro_main.py --report-only"):
        return {"command": command, "commit": commit, "seeds": [0, 1], "wall_s": 2.0, "stages": [],
                "checkpoints": ck, **r2f, "comparisons": [], "claims": []}
    out = tmp_path / "repro.json"
    rc.write_results({**summary(commit="0" * 40, command="python runs/repro_main.py"), "wall_s": 4321.0,
                      "stages": [{"name": "sft_s0", "cmd": "train_sft.py", "wall_s": 99.0}]}, out, "t")
    args = SimpleNamespace(report_only=True, dry_run=False)
    back = rc.collect_and_report(args, [], None, [], [], summary, out, "t")
    assert back["commit"] == "0" * 40 and back["command"] == "python runs/repro_main.py" and back["wall_s"] == 4321.0
    assert back["stages"][0]["name"] == "sft_s0" and back["report_commit"] == rc.git_commit()
    assert json.loads(out.read_text())["commit"] == "0" * 40


def _eval_dir(d: Path, outcomes: dict) -> Path:
    """A finished eval_sop.py --out folder with the given online outcomes {(task, seed): 0/1}."""
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"sop_pg": 0.5, "sop_tsr": 0.25, "static_step_sr": 0.5, "episodes": 2,
                                               "seconds": 3.0, "per_task": {"click-test": {"online_sr": 0.5}}}))
    (d / "online_episodes.jsonl").write_text("".join(json.dumps({"task": t, "seed": s, "success": bool(v), "seconds": 1.0})
                                                     + "\n" for (t, s), v in outcomes.items()))
    (d / "done").write_text("")
    return d


def test_pending_counts_skip_finished_stages(tmp_path):
    """The estimate counts only stages whose done file is missing; everything=True (or --force) counts all."""
    from types import SimpleNamespace
    args = SimpleNamespace(force=False, base_steps=700, sft_steps=300, rl_steps=100, eval_per_task=4)

    def jb(name, done):
        d = tmp_path / name
        d.mkdir()
        if done:
            (d / "done").write_text("")
        return {"dir": d, "done": d / "done"}
    base, sft = jb("base", True), [jb("sft0", True), jb("sft1", False)]
    rl, evals = [jb("rl0", False), jb("rl1", False), jb("rl2", True)], [jb("e0", True), jb("e1", False), jb("e2", False)]
    got = rc.pending_counts(args, 8, 104, base, {"sft": sft, "rl": rl}, evals)
    assert got == {"base_steps": 0, "sft_steps": 300, "rl_steps": 200, "sft_runs": 1, "rl_runs": 2, "online_episodes": 208,
                   "sop_episodes": 2 * 4 * 8, "stages": 2}
    full = {"base_steps": 700, "sft_steps": 600, "rl_steps": 300, "sft_runs": 2, "rl_runs": 3, "online_episodes": 312,
            "sop_episodes": 3 * 32, "stages": 3}
    assert rc.pending_counts(args, 8, 104, base, {"sft": sft, "rl": rl}, evals, everything=True) == full
    args.force = True
    assert rc.pending_counts(args, 8, 104, base, {"sft": sft, "rl": rl}, evals) == full
    args.base_steps = 0  # no base stage: the untrained --model is the base
    assert rc.pending_counts(args, 8, 104, None, {"sft": sft, "rl": rl}, evals)["base_steps"] == 0


def test_checkpoint_eval_names_and_midpoints(tmp_path, monkeypatch):
    """Both scripts name an evaluation <arm>_s<seed>_step<step>_<run folder> (so they share it) and the
    report's meta marks a midpoint; the midpoint is planned only with eval_mid."""
    from types import SimpleNamespace
    assert rc.checkpoints_of(300, False) == [(300, True)]
    assert rc.checkpoints_of(300, True) == [(150, False), (300, True)]
    assert rc.checkpoints_of(1, True) == [(1, True)]
    monkeypatch.setattr(rc, "eval_job", lambda args, data, model, name, seed, extra=(): {"name": name, "model": model, "seed": seed})
    tj = {"dir": Path(rc.REPO) / "out" / "repro" / "rl" / "semionline_s1_abcd1234"}
    e = rc.checkpoint_eval(SimpleNamespace(), {}, "semionline", 1, tj, 50, final=False)
    assert e["name"] == "semionline_s1_step50_semionline_s1_abcd1234" and e["seed"] == 1
    assert e["model"] == "out/repro/rl/semionline_s1_abcd1234/ckpt/step_000050" and e["checkpoint"] == tj["dir"] / "ckpt" / "step_000050"
    assert e["meta"] == ("semionline s1 @50", "semionline", 1, 50, False, "out/repro/rl/semionline_s1_abcd1234")
    assert rc.checkpoint_eval(SimpleNamespace(), {}, "sft", 0, tj, 300)["meta"][0] == "sft s0"


def test_dry_run_writes_no_results(tmp_path):
    """A dry run reads finished evaluations (they are skipped as done) but writes no results file; a real
    run over the same finished evaluations writes the partial and the final report."""
    from types import SimpleNamespace
    keys = [("click-test", 200000), ("click-test", 200001)]
    d = _eval_dir(tmp_path / "eval" / "sft_s0", {keys[0]: 1, keys[1]: 0})
    todo = [{"name": "sft_s0", "cmd": ["true"], "dir": d, "done": d / "done", "meta": ("sft s0", "sft", 0, 300, True, None)}]
    calls = []

    def summary(final_report=False):
        calls.append(final_report)
        return {"command": "c", "commit": "0" * 40, "seeds": [0], "wall_s": 1.0, "stages": [], "checkpoints": list(rows),
                "r2_sop_online": None, "r2_sop_online_ci95": [None, None], "r2_static_online": None,
                "r2_static_online_ci95": [None, None], "comparisons": [], "claims": []}
    out = tmp_path / "results" / "r.json"
    rows = []
    args = SimpleNamespace(report_only=False, dry_run=True)
    assert rc.collect_and_report(args, todo, rc.Stages(dry_run=True), rows, keys, summary, out, "t") == {}
    assert len(rows) == 1 and rows[0]["online_outcomes"] == "10" and not out.exists() and calls == []
    rows.clear()
    args.dry_run = False
    back = rc.collect_and_report(args, todo, rc.Stages(), rows, keys, summary, out, "t")
    assert out.exists() and back["checkpoints"][0]["online_sr"] == 0.5 and calls == [False, True]


def test_rl_runs_on_their_own_demonstrations(tmp_path, monkeypatch):
    """--rl-data gives the RL stages (and the data-scaling subsets) a file of their own, subset to the
    table's tasks like the SFT file; empty, RL runs on the SFT file; a file outside the SFT file's folder
    (another --image-root) is refused."""
    from types import SimpleNamespace
    monkeypatch.setattr(rc, "REPO", tmp_path)
    d = tmp_path / "data"
    d.mkdir()
    ep = lambda task, seed: json.dumps({"task": task, "seed": seed, "goal": "g", "steps": []})  # noqa: E731
    (d / "train.jsonl").write_text("\n".join([ep("a", 0), ep("b", 1), ep("c", 2)]) + "\n")
    (d / "test.jsonl").write_text("\n".join([ep("a", 100000), ep("b", 100001)]) + "\n")
    (d / "rl.jsonl").write_text("\n".join([ep("a", 300000), ep("c", 300001), ep("b", 300002), ep("a", 300003)]) + "\n")
    args = SimpleNamespace(tasks=["a", "b"], train_data="data/train.jsonl", test_data="data/test.jsonl",
                           rl_data="data/rl.jsonl", out_root=tmp_path / "out", online_episodes=4, online_seed_base=200000)
    data = rc.prepare_data(args)
    assert [json.loads(l)["seed"] for l in data["rl"].read_text().splitlines()] == [300000, 300002, 300003]
    assert [json.loads(l)["seed"] for l in data["train"].read_text().splitlines()] == [0, 1]
    assert data["rl"] != data["train"] and data["image_root"] == "data"
    assert rc.episodes_per_task(d / "rl.jsonl") == {"a": 2, "c": 1, "b": 1}  # the ablations' data-scaling cap
    (d / "bad.jsonl").write_text(ep("a", 1) + "\n" + json.dumps({"seed": 2}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: episode has no 'task'"):
        rc.episodes_per_task(d / "bad.jsonl")
    args2 = SimpleNamespace(sft_steps=300, rl_steps=100, rl_lr=6e-5, rl_extra=[], out_root=tmp_path / "out")
    sft = {"dir": tmp_path / "out" / "sft" / "sft_s0_x"}
    cmd = rc.rl_job(args2, data, sft, 0, "semionline", [])["cmd"]
    assert cmd[cmd.index("--data") + 1] == "out/data/rl_2t.jsonl"
    args.rl_data = ""
    assert rc.prepare_data(args)["rl"] == data["train"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "rl.jsonl").write_text(ep("a", 300000) + "\n")
    args.rl_data = "other/rl.jsonl"
    with pytest.raises(SystemExit, match="must sit beside"):
        rc.prepare_data(args)


def test_headroom_tasks_use_sft_alone_and_exclude_floor_and_ceiling():
    """Pooled SFT per-task success (mean over seeds): a at 0 and d at 1 for every seed are out; b
    (0 and 0.25: pooled 0.125) and c are in; an RL arm's numbers never enter; the range bounds are strict."""
    rows = [{"arm": "sft", "seed": 0, "final": True, "online_per_task": {"a": 0.0, "b": 0.0, "c": 0.5, "d": 1.0}},
            {"arm": "sft", "seed": 1, "final": True, "online_per_task": {"a": 0.0, "b": 0.25, "c": 0.75, "d": 1.0}},
            {"arm": "sft", "seed": 1, "final": False, "online_per_task": {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}},
            {"arm": "semionline", "seed": 0, "final": True, "online_per_task": {"a": 0.5, "b": 0.0, "c": 0.5, "d": 0.5}}]
    h = rc.headroom_tasks(rows)
    assert h["per_task"] == {"a": 0.0, "b": 0.125, "c": 0.625, "d": 1.0} and h["tasks"] == ["b", "c"]
    assert rc.headroom_tasks(rows, lo=0.125, hi=0.9)["tasks"] == ["c"]  # strict: 0.125 is out
    assert rc.headroom_tasks(rows, arm="offline")["tasks"] == []


def test_test_episodes_and_their_online_only_eval(tmp_path):
    """ceil(n / tasks) fresh seeds per task from the base; the eval command is online only (no offline
    data), on exactly those tasks and seeds, in OUT/eval_test, and carries the checkpoint's meta."""
    from types import SimpleNamespace
    assert rc.episode_keys(["b", "c"], 5, 220000) == [("b", 220000), ("b", 220001), ("b", 220002),
                                                       ("c", 220000), ("c", 220001), ("c", 220002)]
    assert rc.episode_keys([], 160, 220000) == [] and rc.episode_keys(["b"], 0, 220000) == []
    args = SimpleNamespace(out_root=tmp_path / "out", online_max_steps=10, online_batch=8, eval_extra=["--max-new-tokens", "80"])
    ck = {"dir": tmp_path / "out" / "eval" / "sft_s1_step300_sft_s1_abcd", "checkpoint": tmp_path / "ck",
          "meta": ("sft s1", "sft", 1, 300, True, "out/repro/sft/sft_s1_abcd")}
    j = rc.test_eval_job(args, {"image_root": "data/miniwob"}, rc.episode_keys(["b", "c"], 5, 220000), ck)
    cmd = j["cmd"]
    assert "--data" not in cmd and "--protocol" not in cmd and "--online" in cmd
    i = cmd.index("--online-tasks")
    assert cmd[i + 1:i + 3] == ["b", "c"] and cmd[i + 3] == "--online-seeds" and cmd[i + 4] == "3"
    assert cmd[cmd.index("--online-seed-base") + 1] == "220000" and cmd[cmd.index("--seed") + 1] == "1"
    assert cmd[cmd.index("--online-batch") + 1] == "8"
    assert j["dir"].parent == tmp_path / "out" / "eval_test" and j["dir"].name.startswith(ck["dir"].name + "_")
    assert j["meta"] == ck["meta"] and j["done"] == j["dir"] / "result.json"


def test_report_with_test_episodes(tmp_path):
    """The test section (headroom choice, per-checkpoint table, comparisons) is written and checked by
    the schema like the selection checkpoints."""
    ck = _fabricated_checkpoints()
    r2f, _ = rc.r2_summary(ck)
    test_ck = [{**c, "online_per_task": {"click-test": c["online_sr"]}} for c in ck if c["arm"] != "base"]
    cmp = rc.compare_online(test_ck, "semionline", "sft")
    summary = {"command": "c", "commit": "0" * 40, "seeds": [0, 1], "wall_s": 1.0, "config": {"test_seed_base": 220000},
               "checkpoints": ck, **r2f, "comparisons": [],
               "headroom": {"arm": "sft", "range": [0.0, 1.0], "per_task": {"click-test": 0.3, "click-x": 0.0},
                            "tasks": ["click-test"]},
               "test_checkpoints": test_ck, "test_comparisons": [cmp], "test_arms": rc.arm_summaries(test_ck, {}),
               "claims": [{"claim": "1a", "test": "semionline - sft", "episodes": "test", "diff": cmp["diff"],
                           "p_value": cmp["p_value"], "verdict": rc.verdict(cmp)}]}
    out = tmp_path / "r.json"
    rc.write_results(summary, out, "t")
    md = out.with_suffix(".md").read_text()
    assert "click-test 0.30 (selected), click-x 0.00" in md and "(seeds from 220000)" in md
    assert "| semionline - sft (test episodes) |" in md and f"| semionline | sft | {cmp['diff']:+.3f}" in md
    bad = json.loads(out.read_text())
    bad["test_checkpoints"][0]["online_sr"] = 2.0
    with pytest.raises(ValueError, match=r"test_checkpoints\[0\]\.online_sr_ci95"):
        rc.validate_results(bad)


def test_reused_stages_keep_the_provenance_of_skipped_stages():
    """A rerun that skips finished stages keeps, from the results file it overwrites, the log entries of
    those stages (with the commit that ran them), whatever the interpreter's path; ones it reran or
    never planned are dropped; entries reused by the previous file carry over with their own commit."""
    old = {"commit": "b" * 40, "stages": [{"name": "sft_s0", "cmd": "/a/python train_sft.py --seed 0", "wall_s": 400.0},
                                         {"name": "eval", "cmd": "/a/python eval_sop.py --x", "wall_s": 50.0}],
           "reused_stages": [{"name": "base", "cmd": "/z/python train_sft.py --max-steps 0", "wall_s": 600.0,
                              "commit": "a" * 40}]}
    got = rc.reused_stages(["/b/python train_sft.py --seed 0", "/b/python train_sft.py --max-steps 0"], old)
    assert got == [{"name": "sft_s0", "cmd": "/a/python train_sft.py --seed 0", "wall_s": 400.0, "commit": "b" * 40},
                   old["reused_stages"][0]]
    assert rc.reused_stages(["/b/python eval_sop.py --y"], old) == [] and rc.reused_stages(["x"], None) == []


def test_run_test_stage_runs_the_finals_on_the_headroom_tasks(tmp_path, monkeypatch, capsys):
    """The test stage end to end with a stand-in for eval_sop.py: the tasks come from the SFT rows of
    the selection episodes, every final checkpoint that exists is evaluated on the same test episodes,
    the rows land in test_rows and the partial results are written; with no task in range it says so
    and runs nothing."""
    from types import SimpleNamespace
    monkeypatch.setattr(rc, "REPO", tmp_path)
    fake = ("import json, pathlib, sys; a = sys.argv; d = pathlib.Path(a[a.index('--out') + 1]); d.mkdir(parents=True, "
            "exist_ok=True); i = a.index('--online-tasks'); j = a.index('--online-seeds'); base = int(a[a.index("
            "'--online-seed-base') + 1]); eps = [{'task': t, 'seed': base + k, 'success': k % 2 == 0} for t in a[i + 1:j] "
            "for k in range(int(a[j + 1]))]; (d / 'online_episodes.jsonl').write_text(''.join(json.dumps(e) + chr(10) "
            "for e in eps)); (d / 'result.json').write_text(json.dumps({'per_task': {}}))")
    real_job = rc.test_eval_job

    def job(args, data, keys, ck_eval):
        j = real_job(args, data, keys, ck_eval)
        return {**j, "cmd": [sys.executable, "-c", fake] + j["cmd"][2:]}
    monkeypatch.setattr(rc, "test_eval_job", job)
    args = SimpleNamespace(seeds=[0, 1], headroom=[0.0, 1.0], test_episodes=4, test_seed_base=220000, out_root=tmp_path / "out",
                           online_max_steps=10, online_batch=8, eval_extra=[], dry_run=False, report_only=False, force=False)
    finals = []
    for arm, seed in [("sft", 0), ("sft", 1), ("semionline", 0), ("semionline", 1)]:
        ck = tmp_path / f"{arm}{seed}"
        if (arm, seed) != ("semionline", 1):  # that run has no checkpoint yet: not evaluated
            ck.mkdir()
        finals.append({"dir": tmp_path / "out" / "eval" / f"{arm}_s{seed}", "checkpoint": ck,
                       "meta": (f"{arm} s{seed}", arm, seed, 1, True, None)})
    rows = [{"arm": "sft", "seed": s, "final": True, "online_per_task": {"a": 0.0, "b": 0.5, "c": 0.25 * s + 0.5}}
            for s in (0, 1)]
    test_rows, test, writes = [], {}, []
    out = tmp_path / "r.json"
    monkeypatch.setattr(rc, "write_results", lambda s, path, title: writes.append(title))
    rc.run_test_stage(args, {"image_root": "img"}, [], finals, rows, test_rows, test, rc.Stages(jobs=2),
                      lambda: {}, out, "t")
    assert test["headroom"]["tasks"] == ["b", "c"] and test["keys"] == [("b", 220000), ("b", 220001), ("c", 220000),
                                                                        ("c", 220001)]
    assert sorted(r["name"] for r in test_rows) == ["semionline s0", "sft s0", "sft s1"]
    assert all(r["online_outcomes"] == "1010" and r["n_online_episodes"] == 4 for r in test_rows)
    assert writes == ["t (partial)"] * 3
    rows = [{"arm": "sft", "seed": s, "final": True, "online_per_task": {"a": 0.0, "b": 1.0}} for s in (0, 1)]
    test_rows, test = [], {}
    rc.run_test_stage(args, {"image_root": "img"}, [], finals, rows, test_rows, test, rc.Stages(), lambda: {}, out, "t")
    assert test_rows == [] and test["keys"] == [] and "no task with headroom" in capsys.readouterr().out


def test_list_flags_are_typed_like_their_setting(tmp_path):
    """A list flag's items take the type of its default, or of QUICK's value when the default is empty
    (--scaling-per-task 3 6 must be ints, not the strings '3' '6')."""
    import repro_ablations
    argv = ["--scaling-per-task", "3", "6", "--seeds", "0", "--online-batch", "4", "--results", str(tmp_path)]
    args = rc.parse("doc", repro_ablations.SETTING, repro_ablations.QUICK, argv)
    assert args.scaling_per_task == [3, 6] and args.seeds == [0] and args.online_batch == 4
    assert args.tasks[:2] == ["enter-text", "enter-password"]


def _flip_dir(d: Path, episodes: dict) -> Path:
    """A finished eval_sop.py --samples K folder: {(task, seed): (greedy 0/1, [sample 0/1, ...])}."""
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"sop_pg": 0.5, "sop_tsr": 0.25, "static_step_sr": 0.5, "episodes": 2,
                                               "seconds": 3.0, "per_task": {}}))
    (d / "online_episodes.jsonl").write_text("".join(
        json.dumps({"task": t, "seed": s, "success": bool(g), "sampled_success": [bool(x) for x in sm], "seconds": 1.0})
        + "\n" for (t, s), (g, sm) in episodes.items()))
    (d / "done").write_text("")
    return d


def test_read_eval_counts_greedy_pass_at_k_and_flippable(tmp_path):
    """Per task, by hand: a: greedy 1 of 3, pass@2 2 of 3 (seeds 1, 2), flippable 1 (seed 2: greedy fails, a
    sample wins; seed 1's greedy win is no flip); b: greedy 0, pass@2 0; without --samples: None."""
    eps = {("a", 0): (1, [0, 0]), ("a", 1): (1, [0, 1]), ("a", 2): (0, [1, 0]), ("b", 0): (0, [0, 0])}
    r = rc.read_eval(_flip_dir(tmp_path / "f", eps), list(eps))
    assert r["flip_per_task"] == {"a": {"greedy": 2, "pass_at_k": 2, "flippable": 1, "n": 3},
                                  "b": {"greedy": 0, "pass_at_k": 0, "flippable": 0, "n": 1}}
    assert r["online_outcomes"] == "1100"
    plain = _eval_dir(tmp_path / "g", {("a", 0): 1})
    assert rc.read_eval(plain, [("a", 0)])["flip_per_task"] is None


def test_flippable_tasks_rule_uses_sft_finals_alone():
    """Pooled over seeds, by hand: a 1/4 + 2/4 = 3/8 = 0.375 (in at 0.15), b 0/4 + 1/4 = 0.125 (out),
    c 0/8 (out); an SFT midpoint and an RL arm never enter; nothing at fmin -> the most flippable task,
    flagged as the fallback."""
    f = lambda fl, n=4: {"greedy": 1, "pass_at_k": fl + 1, "flippable": fl, "n": n}  # noqa: E731
    rows = [{"arm": "sft", "seed": 0, "final": True, "flip_per_task": {"a": f(1), "b": f(0), "c": f(0)}},
            {"arm": "sft", "seed": 1, "final": True, "flip_per_task": {"a": f(2), "b": f(1), "c": f(0)}},
            {"arm": "sft", "seed": 1, "final": False, "flip_per_task": {"c": f(4)}},
            {"arm": "semionline", "seed": 0, "final": True, "flip_per_task": {"c": f(4)}}]
    r = rc.flippable_tasks(rows, 0.15)
    assert r["tasks"] == ["a"] and not r["fallback"]
    assert r["per_task"]["a"] == {"greedy": 2, "pass_at_k": 5, "flippable": 3, "n": 8, "rate": 0.375}
    assert r["per_task"]["b"]["rate"] == 0.125 and r["per_task"]["c"]["rate"] == 0.0
    assert rc.flippable_tasks(rows, 0.125)["tasks"] == ["a", "b"]           # >=: the bound is in
    low = rc.flippable_tasks(rows, 0.5)
    assert low["tasks"] == ["a"] and low["fallback"]
    assert rc.flippable_tasks([], 0.15) == {"arm": "sft", "min": 0.15, "per_task": {}, "tasks": [], "fallback": False}


def test_checkpoint_steps_match_the_trainers_saves():
    """_saves' flags keep exactly checkpoint_steps: every steps // points and the last; more than two
    points keep every checkpoint (--keep-checkpoints 0); two points is the old command (midpoint kept)."""
    assert rc.checkpoint_steps(300, 4) == [75, 150, 225, 300] and rc._saves(300, 4) == ["--save-every", "75", "--keep-checkpoints", "0"]
    assert rc.checkpoint_steps(72, 3) == [24, 48, 72]
    assert rc.checkpoint_steps(100, 2) == [50, 100] and rc._saves(100, 2) == ["--save-every", "50"]
    assert rc.checkpoint_steps(3, 3) == [1, 2, 3] and rc.checkpoint_steps(7, 3) == [2, 4, 6, 7]
    assert rc.checkpoint_steps(5, 1) == [5]


def test_main_table_rl_data_control_and_pooled_dose(tmp_path, monkeypatch):
    """repro_main's new stages by hand: the RL data holds RL_STEPS x tasks-per-step / (RL_PASSES x tasks)
    demonstrations of each chosen task (72 x 4 / (3 x 2) = 48); the control trains on as many demonstration
    steps (72 x 4 episodes x 2.5 steps / 8 = 90 SFT steps); the dose-response pools the seeds' pairs."""
    from types import SimpleNamespace
    import repro_main as rm
    monkeypatch.setattr(rc, "REPO", tmp_path)
    (tmp_path / "data").mkdir()
    lines = [json.dumps({"task": t, "seed": s, "goal": "g", "steps": [{}] * (2 if t == "a" else 3)})
             for s in range(60) for t in ("a", "b", "c")]
    (tmp_path / "data" / "rl.jsonl").write_text("\n".join(lines) + "\n")
    args = SimpleNamespace(rl_data="data/rl.jsonl", out_root=tmp_path / "out", rl_steps=72, rl_passes=3,
                           rl_extra=["--tasks-per-step", "4", "--n-rollouts", "8"])
    path = rm.rl_data(args, {}, ["a", "b"])
    assert rc.episodes_per_task(path) == {"a": 48, "b": 48}
    assert rm.control_steps(args, path) == 90                       # mean 2.5 steps an episode
    assert rm.rl_data(args, {}, []).name == "rl_chosen_tasks.jsonl"   # before the rule: a placeholder, not written
    # the dose-response: 2 seeds x 2 episodes; SFT s0 wins ep 0, s1 none; a sample wins s0 ep 1 and s1 ep 0
    def job(name, meta, eps):
        d = _flip_dir(tmp_path / "t" / name, {k: (g, sm) for k, (g, sm) in eps.items()})
        return {"dir": d, "done": d / "done", "meta": meta}
    tests = [job("sft0", ("sft s0", "sft", 0, 300, True, ""), {("a", 1): (1, [0]), ("a", 2): (0, [1])}),
             job("sft1", ("sft s1", "sft", 1, 300, True, ""), {("a", 1): (0, [1]), ("a", 2): (0, [0])}),
             job("semi0", ("semionline s0", "semionline", 0, 72, True, ""), {("a", 1): (1, []), ("a", 2): (1, [])}),
             job("semi1", ("semionline s1", "semionline", 1, 72, True, ""), {("a", 1): (0, []), ("a", 2): (0, [])}),
             job("ctl0", ("c s0", rm.CONTROL, 0, 90, True, ""), {("a", 1): (0, []), ("a", 2): (0, [])})]
    d = rm.dose_summary(tests, 72)
    assert d["episodes"] == 4 and d["flippable"] == 2 and d["start_successes"] == 1
    semi = [r for r in d["rows"] if r["arm"] == "semionline"]
    assert [(r["step"], r["successes"], r["converted"], r["lost"]) for r in semi] == [(0, 1, 0, 0), (72, 2, 1, 0)]
    assert not any(r["arm"] == rm.CONTROL for r in d["rows"])      # the control has seed 0 only: not every pair


def test_history_gap_summary_sums_sft_finals_later_steps():
    """Per task and pooled, the 'later' counts (t >= 1) of the SFT finals summed over seeds, by hand:
    a: 3 + 1 steps, own 2 + 1, expert 3 + 0 -> own_acc 3/4, expert_acc 3/4, gap 0; midpoints and RL
    arms never enter; no counts at all -> None."""
    g = lambda n, own, exp, oo, eo: {"later": {"steps": n, "own_right": own, "expert_right": exp,  # noqa: E731
                                               "own_only": oo, "expert_only": eo}}
    rows = [{"arm": "sft", "seed": 0, "final": True, "history_gap": {"per_task": {"a": g(3, 2, 3, 0, 1)},
                                                                     "pooled": g(3, 2, 3, 0, 1)}},
            {"arm": "sft", "seed": 1, "final": True, "history_gap": {"per_task": {"a": g(1, 1, 0, 1, 0)},
                                                                     "pooled": g(1, 1, 0, 1, 0)}},
            {"arm": "sft", "seed": 1, "final": False, "history_gap": {"per_task": {"a": g(9, 9, 0, 9, 0)}}},
            {"arm": "semionline", "seed": 0, "final": True, "history_gap": {"per_task": {"a": g(9, 0, 9, 0, 9)}}}]
    s = rc.history_gap_summary(rows)
    assert s["a"] == {"steps": 4, "own_right": 3, "expert_right": 3, "own_only": 1, "expert_only": 1,
                      "own_acc": 0.75, "expert_acc": 0.75, "gap": 0.0}
    assert s["pooled"] == s["a"]
    assert rc.history_gap_summary([{"arm": "sft", "seed": 0, "final": True, "history_gap": None}]) is None


def test_task_subsets_of_other_files_get_other_names(tmp_path, monkeypatch):
    """A subset is named after its source file as well as its role, so a run on other data (the varied
    thoughts) never finds, and reuses, another file's subset under the same path."""
    from types import SimpleNamespace
    monkeypatch.setattr(rc, "REPO", tmp_path)
    d = tmp_path / "data"
    d.mkdir()
    ep = lambda task, seed: json.dumps({"task": task, "seed": seed, "goal": "g", "steps": []})  # noqa: E731
    for name in ("train", "test", "rl", "train_varied", "rl_varied"):
        (d / f"{name}.jsonl").write_text(ep("a", 0) + "\n" + ep("b", 1) + "\n")
    args = SimpleNamespace(tasks=["a"], train_data="data/train.jsonl", test_data="data/test.jsonl",
                           rl_data="data/rl.jsonl", out_root=tmp_path / "out", online_episodes=2, online_seed_base=200000)
    plain = rc.prepare_data(args)
    args.train_data, args.rl_data = "data/train_varied.jsonl", "data/rl_varied.jsonl"
    varied = rc.prepare_data(args)
    assert [plain[k].name for k in ("train", "rl", "test")] == ["train_1t.jsonl", "rl_1t.jsonl", "test_1t.jsonl"]
    assert [varied[k].name for k in ("train", "rl")] == ["train_train_varied_1t.jsonl", "rl_rl_varied_1t.jsonl"]


def test_recorded_command_reruns_the_same_arguments():
    """The results' command is shell-quoted: an --rl-extra value with spaces comes back as one argument."""
    argv = ["--rl-extra", "--n-rollouts 8 --kl-coef 1e-4", "--results", "results/varied", "--eval-extra", "--max-new-tokens 120"]
    line = rc.command_line("repro_main.py", argv)
    assert shlex.split(line) == ["python", "runs/repro_main.py", *argv]
    assert " ".join(["python", "runs/repro_main.py", *argv]) != line  # a plain join would not round-trip


def test_seed_verdicts_recomputes_stored_results(tmp_path):
    """runs/seed_verdicts.py on a copy of the varied-thoughts results: claim 1a's verdict from the t-test
    on its three per-seed differences (p 0.023, not the bootstrap's floor 1/4001), the first-reported
    claims kept, a second run changing nothing; a file that is not results: one line, exit 2."""
    import shutil
    import subprocess
    src = Path(rc.REPO) / "results" / "varied" / "repro_main.json"
    res = tmp_path / "repro_main.json"
    shutil.copy(src, res)
    cmd = [sys.executable, str(Path(rc.REPO) / "runs" / "seed_verdicts.py"), str(res), "--out", str(tmp_path / "v.json")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    s = json.loads(res.read_text())
    c1a = s["claims"][0]
    sr = {(c["arm"], c["seed"]): c["online_sr"] for c in s["test_checkpoints"]}
    d = [sr["semionline", k] - sr["sft", k] for k in (0, 1, 2)]
    assert c1a["p_value"] == pytest.approx(stats.seed_paired_t(d)["p_value"]) and c1a["p_value"] == pytest.approx(0.0232, abs=5e-4)
    assert c1a["p_bootstrap"] == pytest.approx(1 / 4001) and c1a["verdict"] == "held"
    assert s["verdicts_recomputed"]["previous_claims"][0]["p_value"] == pytest.approx(1 / 4001)
    assert 0.04 <= s["primary_test_fpr"]["fpr_primary_t"] <= 0.06
    assert json.loads(first.stdout.strip().splitlines()[-1])[str(res)]["1a"] == "held"
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=120).returncode == 0
    again = json.loads(res.read_text())
    assert again["dose_response"] == s["dose_response"] and again["comparisons"] == s["comparisons"]
    assert again["claims"] == s["claims"] and again["verdicts_recomputed"]["previous_claims"][0]["p_value"] == pytest.approx(1 / 4001)
    (tmp_path / "bad.json").write_text("{")
    bad = subprocess.run(cmd[:2] + [str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1

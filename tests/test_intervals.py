"""Every interval the project reports lies inside [0, 1] and holds its estimate: evaluation/stats.wilson (the one
Wilson function; eval_sop.py and the figure scripts import it) at k = 0 and k = n for every n up to 1,000, where rounding
once put a bound one ulp on the wrong side of k/n; and every figure script that draws intervals as error
bars (runs/dose_response.py, runs/repro_report.py) draws 0/n and n/n, which matplotlib refuses as a
negative bar if a bound crosses the rate."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runs"))
import dose_response  # noqa: E402
import repro_report  # noqa: E402
from evaluation import stats  # noqa: E402
from eval_sop import wilson  # noqa: E402


def test_one_wilson_function():
    # eval_sop, report.py and the scripts in runs/ all import evaluation.stats: one file, one definition
    for f in (stats.wilson, dose_response.wilson, repro_report.wilson, wilson):
        assert Path(f.__code__.co_filename).resolve() == REPO / "evaluation" / "stats.py", f.__code__.co_filename
    defs = [p for p in REPO.rglob("*.py") if ".venv" not in p.parts and "tests" not in p.parts
            and "\ndef wilson(" in p.read_text(encoding="utf-8")]
    assert defs == [REPO / "evaluation" / "stats.py"], defs


def test_wilson_holds_the_rate_at_the_edges_for_every_n():
    bad = []
    for n in range(1, 1001):
        for k in (0, 1, n - 1, n):
            if not 0 <= k <= n:
                continue
            lo, hi = wilson(k, n)
            if not (0.0 <= lo <= k / n <= hi <= 1.0):
                bad.append((k, n, lo, hi))
    assert not bad, bad[:5]
    assert wilson(0, 96)[0] == 0.0 and wilson(96, 96)[1] == 1.0   # the release recipe's test size


def test_wilson_interior_values_unchanged():
    # 15/30 by hand: centre 0.5, half 0.168459 (tests/test_repro_stats.py); the clamp moves only the edges
    lo, hi = wilson(15, 30)
    assert lo == pytest.approx(0.331541, abs=2e-6) and hi == pytest.approx(0.668459, abs=2e-6)


def _write(folder: Path, rows):
    folder.mkdir(parents=True)
    (folder / "online_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


@pytest.mark.parametrize("n", [7, 96])
def test_dose_response_draws_zero_and_all(tmp_path, n):
    """The start solves none (0/n), the RL checkpoint all (n/n): the script exits 0 and draws the figure."""
    start = _write(tmp_path / "start", [{"task": "t", "seed": i, "success": False, "sampled_success": [True]} for i in range(n)])
    rl = _write(tmp_path / "rl", [{"task": "t", "seed": i, "success": True} for i in range(n)])
    out = tmp_path / "res" / "dose"
    p = subprocess.run([sys.executable, "runs/dose_response.py", "--start", start, "--point", "semi", "10", rl,
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert out.with_suffix(".png").stat().st_size > 0 and out.with_suffix(".json").exists()
    rows = json.loads(p.stdout.strip().splitlines()[-1])["rows"]
    assert [(r["successes"], r["episodes"]) for r in rows] == [(0, n), (n, n)]


@pytest.mark.parametrize("n", [7, 96, 599])
def test_repro_report_figures_draw_zero_and_all(tmp_path, n):
    ck = []
    for name, k in (("none", 0), ("all", n)):
        ck.append({"name": name, "arm": name, "sop_pg": 0.5 if k else 0.1, "static_step_sr": 0.4 if k else 0.2,
                   "online_sr": k / n, "online_sr_ci95": list(wilson(k, n))})
    summary = {"r2_sop_online": None, "r2_static_online": None}
    assert repro_report.plot_r2(tmp_path / "r2.png", ck, summary).stat().st_size > 0
    arms = {c["name"]: {"online_sr": c["online_sr"], "online_sr_ci95": c["online_sr_ci95"]} for c in ck}
    assert repro_report.plot_bars(tmp_path / "bars.png", [("edges", ["none", "all"])], arms).stat().st_size > 0

"""runs/dose_response.py against a case computed by hand: greedy success per checkpoint, the paired
difference to the start, the conversion of the start's flippable episodes and the start's lost successes;
run as a user runs it (exit 0, the JSON last); a malformed row is an error naming its file and line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runs"))
import dose_response  # noqa: E402


def write(folder: Path, rows):
    folder.mkdir(parents=True)
    (folder / "online_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def ep(seed, success, sampled=None):
    row = {"task": "t", "seed": seed, "success": success}
    if sampled is not None:
        row["sampled_success"] = sampled
    return row


@pytest.fixture
def case(tmp_path):
    # start: episode 1 solved; 2 and 4 flippable (a sample succeeds); 3 out of reach
    start = write(tmp_path / "start", [ep(1, True, [True, False]), ep(2, False, [False, True]), ep(3, False, [False, False]),
                                       ep(4, False, [True, False])])
    s10 = write(tmp_path / "s10", [ep(1, True), ep(2, True), ep(3, False), ep(4, False), ep(9, True)])  # 9: not in start
    s20 = write(tmp_path / "s20", [ep(1, False), ep(2, True), ep(3, True), ep(4, True)])
    return tmp_path, start, s10, s20


def test_dose_response_by_hand(case):
    _, start, s10, s20 = case
    pts = [("semi", 20, dose_response.read_episodes(s20)), ("semi", 10, dose_response.read_episodes(s10))]
    s = dose_response.summarize(dose_response.read_episodes(start), pts)
    assert s["episodes"] == 4 and s["flippable"] == 2 and s["start_successes"] == 1  # episode 9 is left out
    rows = [(r["step"], r["successes"], r["converted"], r["lost"]) for r in s["rows"]]
    assert rows == [(0, 1, 0, 0), (10, 2, 1, 0), (20, 3, 2, 1)]  # sorted by step, the start as step 0
    r20 = s["rows"][2]
    assert r20["discordant"] == [3, 1] and r20["diff"] == pytest.approx(0.5)  # 3/4 - 1/4
    lo, hi = dose_response.wilson(3, 4)
    assert r20["ci95"] == [lo, hi] and 0.3 < lo < 0.75 < hi < 1.0


def test_script_runs_and_refuses_bad_rows(case):
    tmp, start, s10, s20 = case
    out = subprocess.run([sys.executable, "runs/dose_response.py", "--start", start, "--point", "semi", "10", s10,
                          "--point", "semi", "20", s20, "--out", str(tmp / "res" / "dose")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["flippable"] == 2 and [r["successes"] for r in last["rows"]] == [1, 2, 3]
    assert (tmp / "res" / "dose.png").stat().st_size > 0 and "| semi | 20 | 3/4" in (tmp / "res" / "dose.md").read_text()
    (Path(s20) / "online_episodes.jsonl").write_text('{"task": "t", "seed": 1, "success": true}\n{"task": "t"}\n')
    with pytest.raises(dose_response.utils.UsageError, match="online_episodes.jsonl: line 2: missing 'seed'"):
        dose_response.read_episodes(s20)


BAD_ROWS = [  # each a malformed online_episodes.jsonl line (the second), with what the one line must say
    ('{"task": "t"', "invalid JSON"), ('[1, 2]', "not an object"), ('{"task": 3, "seed": 1, "success": true}', "task 3"),
    ('{"task": "t", "seed": 1.5, "success": true}', "seed 1.5 is not an integer"),
    ('{"task": "t", "seed": 1e400, "success": true}', "is not an integer"),
    ('{"task": "t", "seed": 2, "success": "yes"}', "success 'yes'"),
    ('{"task": "t", "seed": 2, "success": true, "sampled_success": 3}', "sampled_success 3"),
]


@pytest.mark.parametrize("line, says", BAD_ROWS)
def test_malformed_inputs_are_one_line_exit_2(case, line, says):
    tmp, start, s10, s20 = case
    (Path(s20) / "online_episodes.jsonl").write_text('{"task": "t", "seed": 1, "success": true}\n' + line + "\n")
    p = subprocess.run([sys.executable, "runs/dose_response.py", "--start", start, "--point", "semi", "20", s20,
                        "--out", str(tmp / "res" / "dose")], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("dose_response.py: error: "), p.stderr
    assert says in lines[0] and not (tmp / "res").exists(), lines[0]


@pytest.mark.parametrize("argv, says", [(["--point", "semi", "-5", "{s10}"], "STEP -5: must be >= 1"),
                                        (["--point", "semi", "2.5", "{s10}"], "STEP '2.5' is not an integer"),
                                        (["--point", "semi", "10", "{s10}", "--out", "{s10}/online_episodes.jsonl/dose"], "is not a writable folder"),
                                        (["--point", "semi", "10", "{tmp}/nope"], "no such file"),
                                        (["--point", "semi", "10", "{s10}", "--start", "{tmp}/nope"], "argument --start")])
def test_bad_flags_are_one_line_exit_2(case, argv, says):
    tmp, start, s10, s20 = case
    argv = [a.format(s10=s10, tmp=tmp) for a in argv]
    full = ["runs/dose_response.py", "--start", start, "--out", str(tmp / "res" / "dose"), *argv]
    p = subprocess.run([sys.executable, *full], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and ": error: " in lines[0] and says in lines[0], p.stderr

"""runs/diagnose_copy.py: the digit split counts exactly the coordinate digits, a random model
scores near ln V, and the copy task trains and reports its curve."""
import math
import re
import subprocess
import sys
from pathlib import Path

import gui

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runs"))
import diagnose_copy  # noqa: E402

DATA = REPO / "data" / "miniwob_click" / "test.jsonl"


def test_digit_split_counts_and_random_model():
    n_eps = 6
    out = diagnose_copy.digit_nll("tiny", str(DATA), max_episodes=n_eps)
    # by hand from the data: each click episode's thought and action both carry the point's digits
    clicks = [e.steps[0] for e in gui.load_episodes(str(DATA), limit=n_eps) if e.steps[0].action["action"] == "click"]
    want = sum(len(re.sub(r"\D", "", "".join(map(str, s.action["coordinate"])))) for s in clicks)
    assert out["n_episodes"] == len(clicks) > 0
    assert out["n_tokens"]["thought_digits"] == out["n_tokens"]["action_digits"] == want
    # an untrained model's NLL is near ln(vocab) = 11.9 nats for every group
    for k in ("thought_digits", "action_digits", "other"):
        assert 9.0 < out[k] < 15.0, (k, out[k])


def test_copy_sanity_curve():
    out = diagnose_copy.copy_sanity("tiny", lr=1e-3, steps=3)
    assert [s for s, _ in out["loss"]] == [0, 2]
    assert all(math.isfinite(v) and v > 0 for _, v in out["loss"])


def test_cli_error_is_one_line():
    r = subprocess.run([sys.executable, str(REPO / "runs" / "diagnose_copy.py"), "digits", "/no/such/ckpt"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1

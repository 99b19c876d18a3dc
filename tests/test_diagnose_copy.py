"""runs/diagnose_copy.py: the digit split counts exactly the coordinate digits, a random model
scores near ln V, and the copy task trains and reports its curve."""
import math
import re
import subprocess
import sys
from pathlib import Path

import torch

import dataset
import gui
from extras import synthetic_pages

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runs"))
import diagnose_copy  # noqa: E402

DATA = REPO / "data" / "miniwob_click" / "test.jsonl"


def test_digit_split_counts_and_random_model():
    n_eps = 6
    out = diagnose_copy.digit_nll("tiny", str(DATA), max_episodes=n_eps)
    # by hand from the data: each click episode's thought and action both carry the point's digits
    clicks = [e.steps[0] for e in dataset.load_episodes(str(DATA), limit=n_eps) if e.steps[0].action["action"] == "click"]
    want = sum(len(re.sub(r"\D", "", "".join(map(str, s.action["coordinate"])))) for s in clicks)
    assert out["n_episodes"] == len(clicks) > 0
    assert out["n_tokens"]["thought_digits"] == out["n_tokens"]["action_digits"] == want
    # an untrained model's NLL is near ln(vocab) = ln(8,192) = 9.0 nats for every group
    for k in ("thought_digits", "action_digits", "other"):
        assert 7.0 < out[k] < 11.5, (k, out[k])


def test_copy_sanity_curve():
    out = diagnose_copy.copy_sanity("tiny", lr=1e-3, steps=3)
    assert [s for s, _ in out["loss"]] == [0, 2]
    assert all(math.isfinite(v) and v > 0 for _, v in out["loss"])


def test_cli_error_is_one_line():
    r = subprocess.run([sys.executable, str(REPO / "runs" / "diagnose_copy.py"), "digits", "/no/such/ckpt"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_synthetic_page_is_a_consistent_click():
    import random
    rng = random.Random(3)
    labels = synthetic_pages.page_labels(dataset.load_episodes(str(REPO / "data" / "miniwob_click" / "train.jsonl")))
    assert len(labels) > 50 and "" not in labels
    for _ in range(20):
        goal, lines, action, thought = synthetic_pages.synthetic_page(rng, labels, 5)
        rows = lines.splitlines()
        assert 1 <= len(rows) <= 5
        x, y = action["coordinate"]
        # exactly one line carries the target's label and point, and the point is inside its box
        hit = [r for r in rows if f"at ({x},{y})" in r and f"'{goal.split(chr(34))[1]}'" in r]
        assert len(hit) == 1
        x0, y0, x1, y1 = map(int, hit[0].rsplit("(", 1)[1].rstrip(")").split(","))
        assert x0 <= x <= x1 and y0 <= y <= y1 and 0 <= x0 and x1 <= 160
        parsed = gui.parse_response(gui.format_response(thought, action))
        assert parsed.action == action and f"({x},{y})" in parsed.thought


def test_pages_and_induction_train_and_report():
    out = diagnose_copy.pages("tiny", lr=1e-3, steps=2, elements=3, mix_induction=2, untie=True)
    assert [s for s, _ in out["curve"]] == [0, 1]
    for _, row in out["curve"]:
        assert set(row) == {"loss", "digits", "other"} and all(math.isfinite(v) and v > 0 for v in row.values())
    ind = diagnose_copy.induction("tiny", lr=1e-3, steps=2)
    assert [s for s, _ in ind["loss"]] == [0, 1] and all(v > 0 for _, v in ind["loss"])


def test_untie_gives_an_own_lm_head_with_the_same_values():
    m = diagnose_copy._fresh("tiny", 0, untie=True)
    E, W = m.get_input_embeddings().weight, m.lm_head.weight
    assert E is not W and torch.equal(E, W) and not m.config.tie_word_embeddings


def test_embedding_geometry_by_hand(tmp_path):
    import vlm
    fresh = diagnose_copy.embeddings("tiny")
    assert abs(fresh["digit_cos_mean"]) < 0.2 and fresh["mean_row_norm"] < 0.1 * fresh["row_norm"]
    # every row = the same unit vector u plus a small private part: cosines near 1, |mean row| ~ |row|
    m = vlm.load_model("tiny")
    E = m.get_input_embeddings().weight
    with torch.no_grad():
        u = torch.zeros(E.shape[1])
        u[0] = 1.0
        E.copy_(u + 0.01 * torch.randn_like(E))
    m.save_pretrained(tmp_path)
    out = diagnose_copy.embeddings(str(tmp_path))
    assert out["digit_cos_mean"] > 0.99 and out["digit_cos_to_mean_row"] > 0.99
    assert abs(out["mean_row_norm"] - 1.0) < 0.01 and out["row_norm"] > out["mean_row_norm"]


def test_induction_rows_repeat_ids_below_vocab():
    import random
    rows = diagnose_copy._induction_rows(random.Random(0), 5, length=24, vocab=30)
    assert len(rows) == 5
    for prompt, target in rows:
        assert prompt == target and len(prompt) == 24 and all(0 <= t < 30 for t in prompt)


def test_cli_rejects_a_bad_vocab_in_one_line():
    r = subprocess.run([sys.executable, str(REPO / "runs" / "diagnose_copy.py"), "induction", "--vocab", "1"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--vocab" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

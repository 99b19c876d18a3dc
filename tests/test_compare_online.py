"""runs/compare_online.py: paired per-task comparison of two arms' online episodes (hand-counted cases)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runs"))
import compare_online as co  # noqa: E402

X, Y = "click-test", "click-button"  # two MiniWob++ tasks (--tasks takes task names only)


def write_eval(folder: Path, outcomes: dict) -> Path:
    """An eval_sop.py --out folder holding only online_episodes.jsonl: {(task, seed): success}."""
    folder.mkdir(parents=True)
    lines = [json.dumps({"seed": s, "task": t, "success": ok, "steps": 3}) for (t, s), ok in outcomes.items()]
    (folder / "online_episodes.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_per_task_and_pooled_counts(tmp_path):
    # two training seeds; task x: A wins 4 pairs, loses none; task y: 1 each way, one both, one neither
    a0 = {(X, 1): True, (X, 2): True, (Y, 1): True, (Y, 2): False, (Y, 3): True, (Y, 4): False}
    b0 = {(X, 1): False, (X, 2): False, (Y, 1): False, (Y, 2): True, (Y, 3): True, (Y, 4): False}
    a1 = {(X, 1): True, (X, 2): True}
    b1 = {(X, 1): False, (X, 2): False}
    dirs = [write_eval(tmp_path / n, o) for n, o in [("a0", a0), ("b0", b0), ("a1", a1), ("b1", b1)]]
    res = co.main(["--a", str(dirs[0]), str(dirs[2]), "--b", str(dirs[1]), str(dirs[3]), "--names", "rl", "sft",
                   "--out", str(tmp_path / "cmp.json")])
    x, y, pooled = res["tasks"][X], res["tasks"][Y], res["pooled"]
    assert (x["n"], x["a"], x["b"], x["only_a"], x["only_b"]) == (4, 4, 0, 4, 0)
    assert x["mcnemar_p"] == pytest.approx(2 / 16) and x["diff"] == pytest.approx(1.0)
    assert (y["n"], y["a"], y["b"], y["only_a"], y["only_b"]) == (4, 2, 2, 1, 1)
    assert y["mcnemar_p"] == 1.0 and y["diff"] == 0.0
    assert (pooled["n"], pooled["a"], pooled["b"], pooled["only_a"], pooled["only_b"]) == (8, 6, 2, 5, 1)
    assert pooled["mcnemar_p"] == pytest.approx(2 * 7 / 64)  # 2 * P(X <= 1), X ~ Bin(6, 1/2)
    lo, hi = pooled["diff_ci95"]
    assert lo <= 0.5 <= hi
    saved = json.loads((tmp_path / "cmp.json").read_text())
    assert saved["names"] == ["rl", "sft"] and saved["pooled"]["only_a"] == 5
    # --tasks: a run that played only task x pairs with the two-task runs on x alone
    a2 = write_eval(tmp_path / "a2", {k: v for k, v in a0.items() if k[0] == X})
    only_x = co.main(["--a", str(a2), "--b", str(dirs[1]), "--tasks", X])
    assert list(only_x["tasks"]) == [X] and (only_x["pooled"]["only_a"], only_x["pooled"]["only_b"]) == (2, 0)
    with pytest.raises(ValueError, match="did not play the same episodes"):
        co.main(["--a", str(a2), "--b", str(dirs[1])])


def test_refuses_unpaired_inputs(tmp_path):
    a = write_eval(tmp_path / "a", {(X, 1): True, (X, 2): False})
    b = write_eval(tmp_path / "b", {(X, 1): True, (X, 3): False})
    with pytest.raises(ValueError, match="did not play the same episodes"):
        co.main(["--a", str(a), "--b", str(b)])
    with pytest.raises(ValueError, match="1 runs of A against 2 of B"):
        co.main(["--a", str(a), "--b", str(a), str(b)])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "online_episodes.jsonl").write_text(json.dumps({"seed": 1, "task": X, "success": True}) + "\n"
                                               + json.dumps({"seed": 2, "task": X}) + "\n")
    with pytest.raises(ValueError, match=r"online_episodes.jsonl:2: online episode has no field\(s\) \['success'\]"):
        co.load_online(bad)

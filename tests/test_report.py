"""What a person reads of an evaluation: the summary card of report.html (before the raw fields,
intervals to 3 digits, each metric explained), eval_sop.py's short stdout, and `python report.py A B`,
two evaluations side by side with the paired difference, checked against counts done by hand."""

import html
import json
import re
from pathlib import Path

import pytest

import utils
import eval_sop
import report
from evaluation import stats

REPO = Path(__file__).resolve().parent.parent

# 68 of 160 online episodes (the interval as eval_sop writes it, to 16 digits), SOP 2 of 8 episodes
SUMMARY = {"policy": "model", "model": "out/sft/ckpt", "match_rules": "strict", "protocols": ["sop", "online"],
           "episodes": 8, "steps": 30, "online_sr": 68 / 160, "online_sr_ci95": [0.35104349819846475, 0.5024734310772612],
           "n_online_episodes": 160, "online_tasks": ["a", "b"], "sop_tsr": 0.25, "sop_pg": 0.4375,
           "floor_sop_tsr": 0.0, "floor_sop_pg": 0.0625,
           "history_gap": {"pooled": {"steps": 12, "own_right": 9, "expert_right": 10, "own_acc": 0.75,
                                      "expert_acc": 10 / 12, "gap": -1 / 12, "own_only": 1, "expert_only": 2}},
           "per_task": {"a": {"online_sr": 0.625, "n_online_episodes": 80, "sop_tsr": 0.5, "episodes": 4},
                        "b": {"online_sr": 0.225, "n_online_episodes": 80, "sop_tsr": 0.0, "episodes": 4}}}


def test_card_comes_first_with_3_digit_intervals(tmp_path):
    page = tmp_path / "r.html"
    report.write_report(str(page), "t", SUMMARY, [("Online MiniWob++: live pages", "note", []), ("SOP: own", "n", [])])
    text = page.read_text()
    card, rest = text.split("<nav>", 1)
    assert card.index("class='card'") < text.index("All fields") and "All fields" in rest
    # Wilson 95% of 68/160 (as eval_sop wrote it) and of 2/8 = [0.0709, 0.5907] (hand: centre
    # (0.25 + 1.92/8) / 1.48 = 0.3310, half-width 1.96 sqrt(0.1875/8 + 3.84/256) / 1.48 = 0.2599)
    assert "<td class='v'>0.425 [0.351, 0.502]</td><td>160 episodes</td>" in card
    assert "<td class='v'>0.250 [0.071, 0.591]</td><td>8 episodes</td><td>0.000</td>" in card
    assert "<td class='v'>0.438</td><td></td><td>0.062</td>" in card  # PG: no interval, its floor
    for _, name, _, _, meaning in report.METRICS[:1] + report.METRICS[3:5]:  # each metric named and explained
        assert f"<th>{name}</th>" in card and html.escape(meaning) in card
    assert not re.search(r"\d\.\d{4,}", card)  # no 16-digit numbers in the card
    assert "0.35104349819846475" not in text and "[0.351, 0.502]" in rest  # the raw fields, rounded too
    assert "own_only" not in card and "0.750 with the policy's own history vs 0.833" in card  # the gap in words
    # per task: a 50/80 [0.516, 0.723] and b 18/80, TSR 2/4 [0.150, 0.850]
    assert "<tr><th>a</th><td>4</td><td>80</td><td>0.625 [0.515, 0.723]</td><td>0.500 [0.150, 0.850]</td></tr>" in card
    assert text.index("<h2>Online MiniWob++") < text.index("<h2>SOP")


def test_summary_text_is_short_and_readable():
    text = report.summary_text(SUMMARY, "results: out/result.json")
    lines = text.splitlines()
    assert len(lines) <= 8 and lines[-1] == "results: out/result.json"
    assert re.search(r"online success\s+0\.425\s+\[0\.351, 0\.502\]\s+160 episodes\s+-$", text, re.M)
    assert re.search(r"SOP PG\s+0\.438\s+-\s+0\.062$", text, re.M)
    assert "{" not in text


def write_eval(folder: Path, online: list[int], extra_online: list[int], sop: list[tuple[int, int]],
               static: list[list[int]]) -> None:
    """An eval_sop.py --out folder: online episodes of task t, seeds 0.. (then extra seeds 10..),
    SOP episodes e0, e1 (correct, steps), static steps of e0, e1 (match 0/1, type always right)."""
    folder.mkdir()
    rows = [{"task": "t", "seed": s, "success": bool(x)} for s, x in enumerate(online)]
    rows += [{"task": "t", "seed": 10 + s, "success": bool(x)} for s, x in enumerate(extra_online)]
    (folder / "online_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    eps = [{"task": "t", "episode_id": f"e{i}", "correct": c, "steps": n, "success": c == n} for i, (c, n) in enumerate(sop)]
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eps))
    steps = [{"task": "t", "episode_id": f"e{i}", "t": t, "match": bool(m), "type_match": True}
             for i, ms in enumerate(static) for t, m in enumerate(ms)]
    (folder / "static_steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    k, n = sum(r["success"] for r in rows), len(rows)
    (folder / "result.json").write_text(json.dumps({
        "policy": "model", "online_sr": k / n, "n_online_episodes": n, "episodes": len(sop),
        "sop_tsr": sum(c == n for c, n in sop) / len(sop), "sop_pg": sum(c / n for c, n in sop) / len(sop),
        "static_step_sr": sum(map(sum, static)) / sum(map(len, static)), "static_steps": sum(map(len, static)),
        "per_task": {"t": {"online_sr": k / n, "n_online_episodes": n}}}))


def test_side_by_side_paired_difference_by_hand(tmp_path, capsys):
    """Online, 5 shared episodes: A 1 success, B 4; B alone played a 6th. Paired: B - A = (4 - 1) / 5
    = +0.600, discordant 3 (only B) and 0, exact McNemar p = 2 * 0.5^3 = 0.25.
    Static, 5 shared steps: A right on 2, B on 4 (2 only B): +0.400, p = 2 * 0.5^2 = 0.5.
    SOP: A 1/3 and 0/2, B 3/3 and 1/2: TSR 0 -> 1/2 (+0.500), PG 1/6 -> 3/4 (+7/12 = +0.583)."""
    write_eval(tmp_path / "A", [0, 0, 0, 0, 1], [], [(1, 3), (0, 2)], [[1, 0, 1], [0, 0]])
    write_eval(tmp_path / "B", [1, 1, 1, 0, 1], [1], [(3, 3), (1, 2)], [[1, 1, 1], [1, 0]])
    c = report.main([str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(tmp_path / "c.html")])
    d = c["diffs"]["B"]
    online = d["online_sr"]["pooled"]
    assert online["pairs"] == 5 and online["only_other"] == 1 and online["only_first"] == 0
    assert online["diff"] == pytest.approx(0.6) and online["p"] == pytest.approx(0.25) and online["discordant"] == [3, 0]
    # the interval is Tango's score interval of B - A (not A - B): with c = 0 only-A pairs it has the closed
    # form [(b - z^2) / (n + z^2), Wilson's upper limit of b / n] (evaluation/stats.py tango_interval), here b 3, n 5:
    # [-0.095, 0.882], 0 inside as the McNemar p 0.25 says (the bootstrap's [0.2, 1.0] left 0 out)
    z2 = stats.Z95 ** 2
    ref = {"diff_ci95": [(3 - z2) / (5 + z2), stats.wilson(3, 5)[1]]}
    assert online["diff_ci95"] == pytest.approx(ref["diff_ci95"], abs=1e-9) and online["interval"] == "Tango score"
    assert f"{ref['diff_ci95'][0]:+.3f}" == "-0.095" and f"{ref['diff_ci95'][1]:+.3f}" == "+0.882"
    static = d["static_step_sr"]["pooled"]
    assert static["pairs"] == 5 and static["diff"] == pytest.approx(0.4) and static["p"] == pytest.approx(0.5)
    assert d["sop_tsr"]["pooled"]["diff"] == pytest.approx(0.5) and d["sop_pg"]["pooled"]["diff"] == pytest.approx(7 / 12)
    assert d["online_sr"]["per_task"]["t"]["diff"] == pytest.approx(0.6)
    out = capsys.readouterr().out
    # A's 1 of 5: Wilson [0.036, 0.624]; B's 5 of 6 (its extra episode counts for its own rate)
    assert re.search(r"online success\s+0\.200 \[0\.036, 0\.624\]\s+0\.833 \[0\.436, 0\.970\]", out)
    lo, hi = ref["diff_ci95"]
    assert f"+0.600 [{lo:+.3f}, {hi:+.3f}] p 0.25 (5 pairs)" in out
    page = (tmp_path / "c.html").read_text()
    assert f"<td class='v'>+0.600 [{lo:+.3f}, {hi:+.3f}] p 0.25 (5 pairs)</td>" in page
    assert json.loads((tmp_path / "c.json").read_text())["diffs"]["B"]["sop_pg"]["pooled"]["pairs"] == 2


def test_compare_input_errors(tmp_path):
    (tmp_path / "A").mkdir()
    with pytest.raises(utils.UsageError, match="no result.json"):
        report.main([str(tmp_path / "A"), str(tmp_path)])
    write_eval(tmp_path / "x", [1], [], [(1, 1)], [[1]])
    with pytest.raises(utils.UsageError, match="distinct names"):
        report.main([str(tmp_path / "x"), str(tmp_path / "x")])


def test_eval_sop_stdout_is_a_summary_and_the_json_goes_to_the_folder(tmp_path, capsys):
    """The expert replay of 3 AndroidControl episodes: stdout is a few readable lines (no JSON unless
    --json); result.json in --out holds the full summary; the report opens on the card."""
    data = REPO / "data" / "android_control" / "android_control_test_uis1.jsonl"
    argv = ["--data", str(data), "--limit", "3", "--blank-screens", "1080x2400", "--protocol", "sop", "static",
            "--out", str(tmp_path / "o"), "--report-episodes", "1"]
    s = eval_sop.main(argv)
    out = capsys.readouterr().out
    assert "{" not in out and len(out.splitlines()) <= 12
    assert re.search(r"SOP TSR\s+1\.000\s+\[0\.439, 1\.000\]\s+3 episodes", out)  # Wilson of 3/3
    assert f"results: {tmp_path / 'o' / 'result.json'}" in out
    full = json.loads((tmp_path / "o" / "result.json").read_text())
    assert full["sop_tsr"] == s["sop_tsr"] == 1.0 and full["per_task"] and "args" in full
    page = (tmp_path / "o" / "report.html").read_text()
    assert page.index("class='card'") < page.index("<h2>SOP") < page.index("All fields")
    assert full["complete"] is True
    eval_sop.main(argv + ["--json", "--overwrite"])  # the folder holds a run: replacing it is asked for
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sop_tsr"] == 1.0

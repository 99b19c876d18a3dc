"""runs/repro_memory.py (claim 1b on the memory tasks) and runs/memory_probe.py (the step-0 note probe): its
episode seeds are fresh, its claims by hand, the probe's match rule, and the probe on a live episode."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runs"))
import memory_probe  # noqa: E402
import repro_common as rc  # noqa: E402
import repro_memory as rmem  # noqa: E402

INT = re.compile(r"(?<![\d.])\d{5,7}(?![\d.])")  # an integer, not a digit run inside a float


def used_numbers() -> dict[int, str]:
    """Every integer of 5-7 digits in a file name or text file under results/ and data/ (a seed of a data
    file, an episode list of a results file, a seed base of a config), with one file that holds it; the
    memory run's own results (results/memory/) list its seeds and are left out."""
    out: dict[int, str] = {}
    for root in ("results", "data"):
        for p in (REPO / root).rglob("*"):
            rel = p.relative_to(REPO)
            if not p.is_file() or rel.parts[:2] == ("results", "memory"):
                continue
            texts = [p.name] + ([] if p.suffix in (".png", ".jpg", ".pdf") else [p.read_text(errors="replace")])
            for text in texts:
                for m in INT.findall(text):
                    out.setdefault(int(m), str(rel))
    return out


def test_selection_and_test_seeds_are_used_by_no_results_or_data_file():
    """The memory run's selection and test episodes (the SETTING's seed bases, as many seeds per task as its
    episode counts need) are fresh: no data file, results file, manifest or image name under results/ or
    data/ holds any of them (the memory run's own results/memory/ aside)."""
    s = rmem.SETTING
    tasks = s["MEMORY_TASKS"] + s["MARKOV_TASKS"]
    want = {seed for _, seed in rc.episode_keys(tasks, s["ONLINE_EPISODES"], s["ONLINE_SEED_BASE"])}
    test = {seed for _, seed in rc.episode_keys(tasks, s["TEST_EPISODES"], s["TEST_SEED_BASE"])}
    assert not want & test, "the selection and test episodes share seeds"
    used = used_numbers()
    clash = {seed: used[seed] for seed in sorted(want | test) if seed in used}
    assert not clash, f"seeds already used: {clash}"
    assert used.get(220000) and used.get(400000) and used.get(500000)  # the scan sees the seeds it should


def _row(arm, seed, bits, step=10, final=True, probe=None):
    k = bits.count("1")
    return {"name": f"{arm} s{seed}", "arm": arm, "seed": seed, "step": step, "final": final, "online_outcomes": bits,
            "online_sr": k / len(bits), "n_online_episodes": len(bits), "online_sr_ci95": list(rc.wilson(k, len(bits))),
            **(probe or {})}


def test_claims_on_task_subsets_by_hand():
    """Episodes m0 m1 (memory) k0 k1 (Markov); 3 seeds. Memory: semi-online wins 2, 2, 1 of 2, offline 0,
    1, 0 -> per-seed 1b 1.0, 0.5, 0.5; Markov: semi 1, 1, 1 and offline 1, 1, 0 -> 0, 0, 0.5; interaction
    1.0, 0.5, 0.0 (mean 0.5). gamma 0 as offline; SFT loses everything."""
    keys = [("m", 0), ("m", 1), ("k", 0), ("k", 1)]
    sets = {"memory": ["m"], "markov": ["k"]}
    semi = ["1110", "1110", "1010"]
    off = ["0010", "1010", "0000"]
    rows = [_row(a, s, b) for a, bits in (("semionline", semi), ("offline", off), ("gamma0", off),
                                         ("sft", ["0000"] * 3)) for s, b in enumerate(bits)]
    rows.append(_row("semionline", 0, "0000", step=5, final=False))  # a dose point: never a final
    out = rmem.claims(rows, keys, sets, repeats=200)
    by = {c["claim"].split(":")[0]: c for c in out["claims"]}
    b = by["1b"]
    assert b["diff"] == pytest.approx(2 / 3) and b["n_seeds"] == 3 and b["fpr"]["n_episodes"] == 2
    assert by["1b on the Markov tasks (prediction"]["diff"] == pytest.approx(1 / 6)
    inter = by["interaction"]
    assert inter["diff"] == pytest.approx(0.5) and out["interaction"]["per_seed_diff"] == pytest.approx([1.0, 0.5, 0.0])
    assert 0 <= inter["fpr"]["fpr_primary_t"] <= 1
    assert by["3"]["diff"] == pytest.approx(2 / 3) and by["1a"]["diff"] == pytest.approx(5 / 6)
    assert out["goal"]["diff"] == pytest.approx(2 / 3)
    m = out["checks"]  # memory success: SFT 0, semi-online 5/6, offline and gamma 0 1/6; no probe files
    assert m["memory_success"]["semionline"] == pytest.approx(5 / 6) and m["informative"]
    assert not m["sft_at_ceiling"] and not m["every_arm_near_chance"] and not m["notes_already_right"]
    dose = rmem.dose_table(rows, keys, sets, [5, 10])
    assert {(d["tasks"], d["step"], d["a"], d["b"]) for d in dose} >= {("memory", 10, "semionline", "offline")}
    assert not [d for d in dose if d["step"] == 5 and d["a"] == "semionline" and d["b"] == "offline"]  # offline has no 5
    md = rmem.memory_markdown(rc._nan_to_none({"claims": out["claims"], "goal": out["goal"], "dose": dose,
                                               "set_comparisons": out["comparisons"], "probe": out["probe"]}))
    assert "| 1b: semi-online RL > offline RL on the memory tasks |" in md and "Goal (" in md
    md = rmem.memory_markdown(rc._nan_to_none({"claims": out["claims"], "manipulation_checks": out["checks"]}))
    assert "the test is **informative**" in md


def test_interaction_test_keeps_its_level_under_no_effect():
    """stats.null_fpr_interaction: the primary test on (a - b) on one set minus (a - b) on another, no
    effect anywhere: about 0.05 at nominal 0.05 (2,000 repeats: Monte Carlo SE 0.005), reproducible."""
    import stats
    f = stats.null_fpr_interaction(5, (180, 120), (0.03, 0.05), (0.5, 0.3), repeats=2000)
    assert 0.03 < f["primary_t"] < 0.07 and f == stats.null_fpr_interaction(5, (180, 120), (0.03, 0.05), (0.5, 0.3),
                                                                           repeats=2000)


def test_probe_note_rule_and_counts(tmp_path):
    """The fact counts as a whole token only; rows off the memory tasks (fact None) are left out."""
    assert memory_probe.note_carries("K7Q2", "<think>The code is K7Q2; I note it.</think>")
    assert not memory_probe.note_carries("K7Q2", "The code is K7Q2X") and not memory_probe.note_carries("Ann", "Anna")
    assert memory_probe.note_carries(None, "anything") is None
    rows = [{"task": "memory-type-1", "seed": 1, "success": True, "fact": "AB12", "responses": ["AB12"],
             "note_carries_fact": True},
            {"task": "memory-type-1", "seed": 2, "success": True, "fact": "CD34", "responses": ["x"],
             "note_carries_fact": False},
            {"task": "click-option", "seed": 1, "success": True, "fact": None, "responses": ["x"],
             "note_carries_fact": None}]
    (tmp_path / memory_probe.RESPONSES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = rmem.probe_fields(tmp_path)
    assert f["note_rate"] == 0.5 and f["probe"]["pooled"] == {"n": 2, "note_right": 1, "success": 2,
                                                             "success_note_right": 1, "success_note_wrong": 1}
    assert rmem.probe_fields(tmp_path / "none") == {}


def test_fact_shown_is_the_experts_note():
    """The probe reads the fact off the step-0 element list; on every shipped memory episode that is the
    fact the scripted expert noted (its thought quotes it), and nothing off the memory tasks."""
    n = 0
    for f in sorted((REPO / "data" / "miniwob").glob("memory_*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            noted = re.search(r"the (?:code|name) is '([^']+)'", e["steps"][0]["thought"], re.I)[1]
            assert memory_probe.fact_shown(e["task"], e["steps"][0]["elements"]) == noted, (f.name, e["episode_id"])
            assert not any(memory_probe.fact_shown(e["task"], s["elements"]) for s in e["steps"][1:])
            n += 1
    assert n == 2 * (128 + 32 + 96)
    assert memory_probe.fact_shown("click-option", "[5] b 'X' at (1,2) (0,0,2,4)") is None


@pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium + chromedriver (MiniWob++)")
def test_probe_keeps_every_greedy_response_and_the_fact(tmp_path):
    """memory_probe.py with eval_sop.py's flags: the evaluation's own outputs, plus one line per online episode
    with its responses (one per step played) and, on a memory task, the code the page showed."""
    out = tmp_path / "probe"
    proc = subprocess.run([sys.executable, "runs/memory_probe.py", "--policy", "model", "--model", "tiny", "--online",
                           "--online-tasks", "memory-type-1", "click-option", "--online-seeds", "1",
                           "--online-seed-base", "990000", "--online-max-steps", "2", "--max-new-tokens", "4",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / memory_probe.RESPONSES_FILE).read_text().splitlines()]
    eps = [json.loads(line) for line in (out / "online_episodes.jsonl").read_text().splitlines()]
    assert [(r["task"], r["seed"]) for r in rows] == [(e["task"], e["seed"]) for e in eps]
    mem, click = rows
    assert re.fullmatch(r"[A-Z0-9]{8}", mem["fact"]) and mem["note_carries_fact"] is False  # an untrained model
    assert click["fact"] is None and click["note_carries_fact"] is None
    assert all(len(r["responses"]) == e["steps"] for r, e in zip(rows, eps))

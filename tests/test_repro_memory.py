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
    from evaluation import stats
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


def _episode(task, seed, fact, greedy_note, sampled_notes):
    """An online_episodes.jsonl line as eval_sop.py --samples K writes it: the step-0 page shows `fact` (its bold
    element), greedy's step-0 response and each sampled play's note the given codes."""
    say = lambda code: f"<think>The code is '{code}' and I note it.</think><action>...</action>"  # noqa: E731
    return {"task": task, "seed": seed, "success": greedy_note == fact, "steps": 1,
            "elements": [f"[3] b '{fact}' at (84,60) (60,52,108,68)\n[4] button 'Next' at (84,90) (70,82,98,98)"],
            "responses": [say(greedy_note)], "sampled_success": [n == fact for n in sampled_notes],
            "sampled_responses": [[say(n)] for n in sampled_notes]}


def test_probe_reads_every_sampled_note_by_hand(tmp_path):
    """memory_probe --read on a hand-built online_episodes.jsonl (K = 4 sampled plays): per episode the samples'
    notes, and the counts by hand. E1 greedy right, 3 of 4 samples right (spread, greedy right; 1 sample lost);
    E2 greedy wrong, 1 of 4 right (spread, greedy wrong: headroom); E3 greedy wrong, none right; E4 greedy right,
    all right; a Markov episode is left out. Samples right 3 + 1 + 0 + 4 = 8 of 16."""
    f = "12345678"
    eps = [_episode("memory-d8-type-1", 1, f, f, [f, "12345670", f, f]),
           _episode("memory-d8-type-1", 2, f, "12345679", ["12345679", f, "1234567", "12345679"]),
           _episode("memory-d8-type-3", 3, f, "1234", ["1234", "12345", "123456789", "99"]),
           _episode("memory-d8-type-3", 4, f, f, [f] * 4),
           {**_episode("click-option", 5, "x", "x", ["x"] * 4), "elements": ["[1] button 'A' at (1,2) (0,0,2,4)"]}]
    (tmp_path / "online_episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    out = memory_probe.main(["--read", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / memory_probe.RESPONSES_FILE).read_text().splitlines()]
    assert [r["sampled_notes"] for r in rows] == [[True, False, True, True], [False, True, False, False],
                                                 [False] * 4, [True] * 4, []]
    assert rows[2]["fact"] == f and rows[4]["fact"] is None and "123456789" in rows[2]["sampled_responses"][2][0]
    s = out["probe"]["pooled"]["sampled"]
    assert (s["episodes"], s["samples"], s["note_right"], s["note_rate"]) == (4, 16, 8, 0.5)
    assert s["share_mean"] == pytest.approx((0.75 + 0.25 + 0 + 1) / 4)
    assert (s["spread"], s["spread_greedy_right"], s["spread_greedy_wrong"]) == (2, 1, 1)
    assert (s["headroom"], s["headroom_rate"], s["lost"]) == (1, 0.25, 1)
    assert s["hist_greedy_right"] == {"3": 1, "4": 1} and s["hist_greedy_wrong"] == {"1": 1, "0": 1}
    per_task = out["probe"]["memory-d8-type-3"]["sampled"]  # E3, E4: no spread, no headroom, 4 of 8 right
    assert (per_task["note_right"], per_task["spread"], per_task["headroom"]) == (4, 0, 0)
    f_ = rmem.probe_fields(tmp_path)  # the run's per-checkpoint fields, and the per-arm sums of two checkpoints
    assert f_["sampled_note_rate"] == 0.5 and f_["headroom_rate"] == 0.25 and f_["note_rate"] == 0.5
    rows2 = [{"arm": "sft", "seed": s_, "final": True, **f_} for s_ in (0, 1)]
    arm = rmem.probe_comparisons(rows2)["per_arm"]["sft"]["sampled"]
    assert (arm["samples"], arm["note_right"], arm["headroom"], arm["headroom_rate"]) == (32, 16, 2, 0.25)
    assert "| sft | 16/32 = 0.500 | 4 (2 / 2) | 2/8 = 0.250 |" in rmem.memory_markdown(
        {"probe": rmem.probe_comparisons(rows2)})
    with pytest.raises(Exception, match="online_episodes.jsonl"):
        memory_probe.main(["--read", str(tmp_path / "none")])


def tiny_model_folder(path: Path) -> Path:
    """A local Hugging Face folder as a user's pretrained VLM would be: vlm's tiny config saved with
    save_pretrained, its tokenizer beside it (no args.json: not one of this project's checkpoints)."""
    import vlm
    from extras.tiny import tiny_config
    from transformers import Qwen2_5_VLForConditionalGeneration
    tok, _ = vlm.load_processor("tiny")
    Qwen2_5_VLForConditionalGeneration(tiny_config(64, 2, tokenizer=tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _repro(args, tmp_path, timeout=300):
    return subprocess.run([sys.executable, "runs/repro_memory.py", *args, "--out", str(tmp_path / "out"),
                           "--results", str(tmp_path / "res")], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_dry_run_plans_a_local_model_folder_on_gpus(tmp_path):
    """--model FOLDER --preset gpu1 --dry-run prints the plan: no copy warm-up (no base stage; SFT starts from the
    folder), the preset's budgets in the stage commands, the GPU lines; gpu8 launches training under torchrun with
    8 processes; bad input is one line, exit 2."""
    model = tiny_model_folder(tmp_path / "model")
    r = _repro(["--model", str(model), "--preset", "gpu1", "--dry-run"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    cmds = [line for line in r.stdout.splitlines() if line.startswith("[dry-run]")]
    sft = [c for c in cmds if "train_sft.py" in c]
    assert len(sft) == 5 + 5 and all(f"--model {model}" in c or "--model" in c for c in sft)  # 5 seeds + 5 controls
    assert not any("--max-steps 0" in c for c in sft)  # no base stage: a pretrained folder is the base
    assert all("--copy-warmup-steps 0" in c for c in sft) and sum(f"--model {model} " in c for c in sft) == 5
    assert all("--batch-size 16" in c and "--lr 1e-05" in c for c in sft[:5])
    rl = [c for c in cmds if "train_semionline.py" in c]
    assert len(rl) == 15 and all("--n-rollouts 8" in c and "--max-new-tokens 256" in c and "--temperature 1.0" in c
                                 for c in rl)
    probes = [c for c in cmds if "memory_probe.py" in c]
    assert sum("--samples 8 --temperature 1.0" in c for c in probes) == 25  # the 25 final test checkpoints
    assert "[gpu] preset gpu1" in r.stdout and "GPU hours" in r.stdout and "48 visual tokens" in r.stdout
    r8 = _repro(["--model", str(model), "--preset", "gpu8", "--dry-run"], tmp_path)
    assert r8.returncode == 0, r8.stderr[-2000:]
    train = [c for c in r8.stdout.splitlines() if "train_sft.py" in c or "train_semionline.py" in c]
    assert train and all("-m torch.distributed.run --nproc_per_node=8" in c for c in train)
    assert "on 8 H100" in r8.stdout
    for bad, msg in ((["--model", str(tmp_path / "nowhere"), "--preset", "gpu1"], "no config.json"),
                     (["--model", str(model), "--preset", "gpu3"], "--preset 'gpu3'"),
                     (["--model", str(model), "--base-steps", "100"], "takes no copy warm-up")):
        r = _repro(bad + ["--dry-run"], tmp_path)
        assert r.returncode == 2 and msg in r.stderr, (bad, r.stderr[-1000:])


def test_gpu_plan_by_hand(monkeypatch):
    """gpu_plan's units for a 7 B model (size stubbed) under the gpu1 preset, by hand: an SFT step 8 N B (P + R) /
    (0.35 x 989e12) = 8 x 7e9 x 16 x 2,304 / 3.4615e14 = 5.963 s; an online play of 4 steps
    4 (2 N P / 3.4615e14 + 256 x 2 N / (0.5 x 3.35e12) / 8 + 0.3) = 4 (0.0828 + 0.2675 + 0.3) = 2.602 s;
    memory 16 N = 112 GB: not on one GPU."""
    import argparse
    monkeypatch.setattr(rmem, "model_size", lambda model: 7_000_000_000)
    p = rmem.PRESETS["gpu1"]
    args = argparse.Namespace(model="m", nproc=1, online_batch=p["ONLINE_BATCH"], sft_extra=p["SFT_EXTRA"],
                              rl_extra=p["RL_EXTRA"], eval_extra=p["EVAL_EXTRA"])
    g = rmem.gpu_plan(args, {"sft_steps": 100, "online_episodes": 10, "rl_steps": 0, "stages": 1}, 4.0)
    assert g["unit_seconds"]["sft_steps"] == pytest.approx(5.963, abs=0.01)
    assert g["unit_seconds"]["online_episodes"] == pytest.approx(2.602, abs=0.01)
    assert g["wall_h"] == pytest.approx((100 * 5.963 + 10 * 2.602 + 60) / 3600, rel=1e-3)
    assert g["train_memory_gb"] == pytest.approx(112) and not g["fits"]
    args.nproc = 8
    g8 = rmem.gpu_plan(args, {"sft_steps": 100}, 4.0)
    assert g8["fits"] and g8["unit_seconds"]["sft_steps"] == pytest.approx(5.963 / 8, abs=0.01)
    assert g8["gpu_hours"] == pytest.approx(8 * g8["wall_h"])


@pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium + chromedriver (MiniWob++)")
def test_cpu_smoke_run_of_the_gpu_path(tmp_path):
    """--preset cpu-smoke: the gpu presets' code path (a local model folder, no warm-up, probe samples at the final
    test checkpoints) end to end in tiny shapes: SFT, the three RL arms, the probe with its sampled notes, the
    results; ~1-2 min on an idle 2-core machine (9 stage processes)."""
    model = tiny_model_folder(tmp_path / "model")
    r = _repro(["--model", str(model), "--preset", "cpu-smoke"], tmp_path, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "memory" / "repro_main.json").read_text())
    assert res["config"]["base_steps"] == 0 and res["config"]["probe_samples"] == 2
    assert {t["arm"] for t in res["test_checkpoints"]} == {"sft", "semionline", "offline", "gamma0"}
    assert all(t["probe"]["pooled"]["sampled"]["samples"] == 2 for t in res["test_checkpoints"])  # 1 memory episode x 2
    assert "Sampled plays' step-0 notes" in (tmp_path / "res" / "memory" / "repro_main.md").read_text()

"""Every benchmark and tool script runs at HEAD: each is started as a user starts it (a subprocess,
tiny shapes, seconds), must exit 0 and print, as its last stdout line, the JSON object its docstring
promises with the keys the README and results/ read. A refactor that breaks a script fails here.

Scripts with a test of their own elsewhere: bench/gpu_check.py (test_gpu_check), tools/plot_metrics.py
(test_cli), tools/convert_android_control.py, tools/build_tiny_tokenizer.py, tools/make_miniwob_data.py,
envs/miniwob_experts.py (test_miniwob), runs/compare_online.py, runs/diagnose_copy.py,
runs/diagnose_reward.py, runs/memory_probe.py (test_repro_memory). test_every_script_is_smoked keeps this list and the files in step.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTED_ELSEWHERE = {"bench/gpu_check.py", "bench/gpu_sections.py", "tools/plot_metrics.py", "tools/convert_android_control.py",
                    "tools/build_tiny_tokenizer.py", "tools/make_miniwob_data.py", "runs/compare_online.py",
                    "runs/diagnose_copy.py", "runs/diagnose_reward.py", "runs/repro_common.py",
                    "tools/merge_lora.py", "runs/dose_response.py", "runs/seed_verdicts.py", "runs/memory_probe.py"}
HAS_BROWSER = shutil.which("chromedriver") is not None
TRL = importlib.util.find_spec("trl") is not None

STEP_TINY = ["--tasks", "1", "--rollouts", "2", "--steps", "1", "--max-new-tokens", "6", "--repeats", "1",
             "--micro-batch-size", "2", "--mini-batches", "1"]
STEP_KEYS = {"seconds", "seconds_runs", "floor_s", "ratio_to_floor", "decode_tokens", "decode_tok_s", "share_speedup"}

# (id, argv after the interpreter, keys the last JSON line must hold, needs the browser, needs TRL)
CASES = [
    ("bench_step_no_peer", ["bench/bench_step.py", *STEP_TINY, "--no-peer"],
     STEP_KEYS | {"vocab_speedup", "vocab_speedup_phases", "seconds_real", "ratio_to_floor_real"}, False, False),
    ("bench_step_peer", ["bench/bench_step.py", *STEP_TINY, "--vocab", "small"],
     STEP_KEYS | {"ratio_vs_trl", "ratio_vs_peer", "peer_seconds"}, False, True),
    ("bench_sampler", ["bench/bench_sampler.py", "--tasks", "2", "--samples", "2", "--step", "1", "--max-new-tokens", "4",
                       "--repeats", "1"], {"ratio_group", "ratio_distinct", "tok_s_ours_group", "tok_s_hf_group"}, False, False),
    ("bench_logprob", ["bench/bench_logprob.py", "--n", "64", "--h", "16", "--v", "300"],
     {"peak_mem_ratio", "time_ratio", "logp_max_abs_err"}, False, False),
    ("tune_logprob_dry", ["bench/tune_logprob.py", "--dry-run"], {"mode", "gemm_fwd_bwd_s", "configs", "best"}, False, False),
    ("bench_old_logp", ["bench/bench_old_logp.py", "--model", "tiny", "--data", "data/miniwob_click/train.jsonl",
                        "--steps", "2", "--tasks-per-step", "1", "--n-rollouts", "2", "--max-new-tokens", "6",
                        "--max-episodes", "4"], {"seconds", "logp_ratio", "step_ratio", "sampler_logp_gap_max"}, False, False),
    ("bench_online", ["bench/bench_online.py", "--model", "tiny", "--tasks", "click-test", "--seeds", "2",
                      "--max-steps", "1", "--max-new-tokens", "4", "--batches", "1", "2"],
     {"episodes", "same_outcomes", "batch_1", "batch_2"}, True, False),
    ("score", ["eval_sop.py", "score", "--data", "data/miniwob_click/test.jsonl", "--responses", "{tmp}/responses.jsonl",
               "--out", "{tmp}/scores.jsonl", "--image-root", "data/miniwob_click"], {"responses", "reward_mean", "match_rate", "malformed_responses", "floor_step_sr"}, False, False),
    ("baselines", ["eval_sop.py", "baselines", "--data", "data/miniwob_click/test.jsonl"], {"rules", "steps", "rates"}, False, False),
    ("draw_rollout", ["tools/draw_rollout.py", "--out", "{tmp}/rollout.png", "--dpi", "40"],
     {"out", "rollouts", "steps", "patches", "ended_early"}, False, False),
    ("repro_main_dry", ["runs/repro_main.py", "--dry-run", "--out", "{tmp}/repro", "--results", "{tmp}/results"], None, False, False),
    ("repro_ablations_dry", ["runs/repro_ablations.py", "--dry-run", "--out", "{tmp}/repro", "--results", "{tmp}/results"],
     None, False, False),
    ("repro_memory_dry", ["runs/repro_memory.py", "--dry-run", "--out", "{tmp}/repro", "--results", "{tmp}/results"],
     None, False, False),
]


def run_script(argv, tmp_path, timeout=240):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv,keys,browser,trl", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_script_runs_and_prints_its_json(argv, keys, browser, trl, tmp_path):
    if browser and not HAS_BROWSER:
        pytest.skip("needs chromium + chromedriver (MiniWob++)")
    if trl and not TRL:
        pytest.skip("needs TRL: pip install --no-deps -r bench/requirements-bench.txt")
    if "score" in argv:  # one malformed response a step: scored 0, never a crash
        import dataset
        eps = dataset.load_episodes(REPO / "data/miniwob_click/test.jsonl")
        (tmp_path / "responses.jsonl").write_text("".join(
            json.dumps({"episode_id": e.episode_id, "step": t, "response": "<action>{oops"}) + "\n"
            for e in eps for t in range(len(e.steps))))
    proc = run_script(argv, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    if keys is None:  # a reproduction's dry run: its plan, nothing run, nothing written
        assert any(x.startswith("[plan]") and "estimated wall" in x for x in lines), proc.stdout[-2000:]
        assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
        return
    out = json.loads(lines[-1])
    assert keys <= set(out), sorted(keys - set(out))
    if "score" in argv:
        assert out["responses"] == 64 and out["malformed_responses"] == 64 and out["reward_mean"] == 0.0


def test_bench_step_counts_one_sample_number_per_prompt(tmp_path):
    """The sampler takes one sample count per prompt; the benchmark's token count follows it."""
    proc = run_script(["bench/bench_step.py", *STEP_TINY, "--no-peer", "--vocab", "small", "--no-share-prompts"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["decode_tokens"] == 1 * 2 * 6  # tasks x rollouts x max_new_tokens (stop disabled)
    assert out["ratio_to_floor"]["decode"] > 0


def test_every_script_is_smoked():
    """A new script with a main under bench/, tools/ or runs/ gets a smoke case here (or a test elsewhere)."""
    smoked = {c[1][0] for c in CASES} | TESTED_ELSEWHERE
    scripts = {str(p.relative_to(REPO)) for d in ("bench", "tools", "runs") for p in (REPO / d).glob("*.py")
               if "__main__" in p.read_text(encoding="utf-8") or "parse_args" in p.read_text(encoding="utf-8")}
    assert scripts <= smoked, sorted(scripts - smoked)
    for name in TESTED_ELSEWHERE:
        assert (REPO / name).exists(), name


def test_project_files_name_dates_and_commits_only():
    """The record names dates and commits, never the work sessions or issue numbers behind them: no
    session or issue followed by its number anywhere, and in the prose (Markdown) not the word "session" at all, which
    there can only mean a sitting (in code it may be pytest's fixture scope or a browser's session)."""
    numbered = re.compile(r"\b(session|issue) #?[0-9]", re.I)
    sitting = re.compile(r"\bsessions?\b", re.I)
    hits = [f"{p.relative_to(REPO)}:{i}" for p in REPO.rglob("*") if p.suffix in (".md", ".py", ".txt", ".sh")
            and not {".git", ".venv", "out"} & set(p.relative_to(REPO).parts)
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if numbered.search(line) or (p.suffix == ".md" and sitting.search(line))]
    assert not hits, hits
    assert numbered.search("as in session " + "6") and sitting.search("the session's end") and not sitting.search("sessional")


def test_gpu_check_dry_run_never_touches_the_committed_gpu_results(tmp_path):
    """A dry run writes out/gpu_check_dry.* by default and refuses results/gpu_check.json."""
    before = (REPO / "results" / "gpu_check.json").read_bytes()
    proc = run_script(["bench/gpu_check.py", "--dry-run", "--out", "results/gpu_check.json"], tmp_path)
    assert proc.returncode == 2 and "holds the committed GPU results" in proc.stderr, proc.stderr[-2000:]
    assert (REPO / "results" / "gpu_check.json").read_bytes() == before
    src = (REPO / "bench" / "gpu_check.py").read_text()
    assert 'DRY_OUT = "out/gpu_check_dry.json"' in src and "a.out or (DRY_OUT if a.dry_run else GPU_OUT)" in src

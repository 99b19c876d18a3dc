"""bench/gpu_check.py cannot rot: its --dry-run (CPU, tiny shapes, Triton interpreter, the tiny model,
the static decode standing in for CUDA graphs, a 3-layer 'full depth' and one RL step under torchrun)
runs every section here, passes, and writes exactly the keys a GPU run writes; its harness records a
failing check and goes on to the next; the roofline's bytes per step are counted by hand."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"


def load_script(name="gpu_check"):
    """bench/gpu_check.py (the driver) or bench/gpu_sections.py (its checks), by file."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # stdlib imports only at module level: torch comes in main()
    return mod


def key_paths(d, prefix=""):
    """Dotted paths of every dict key; list items are not descended into (rows vary in number)."""
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict):
            out |= key_paths(v, prefix + k + ".")
    return out


def test_dry_run_passes_with_the_gpu_keys(tmp_path):
    gc, sections = load_script(), load_script("gpu_sections")
    out = tmp_path / "gc.json"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("UIS1_FORCE_TRITON", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == res
    assert out.with_suffix(".md").read_text().startswith("# GPU check (dry-run")
    assert res["failures"] == [], res["failures"]
    # same keys as a GPU run: the schema both modes start from, nothing added, nothing lost
    assert key_paths(res) == key_paths(gc.SCHEMA)
    assert res["meta"]["mode"] == "dry-run" and all(v > 0 for v in res["meta"]["sections_s"].values())
    for row in res["kernels"]["logprob"]:
        assert set(row) == set(sections._LOGPROB_ROW)
        assert row["err_logp_max_abs"] < 1e-5 and row["err_entropy_max_abs"] < 1e-5  # fp32 accumulation
        assert row["err_dh_rel"] < 2e-2 and row["err_dw_rel"] < 2e-2  # bf16 gradients
        assert row["naive_err_logp_max_abs"] > row["err_logp_max_abs"]  # bf16 logits: the naive path is worse
        assert row["time_fused_s"] > 0 and row["time_matmul_fwd_bwd_s"] > 0
    assert res["kernels"]["ppo_loss"]["err_grad_max_abs"] < 1e-5
    assert res["kernels"]["group_norm"]["err_max_abs"] < 1e-5
    s = res["sampler"]
    assert s["tok_s_ours"] > 0 and s["tok_s_hf"] > 0 and s["prefill_tokens_ours"] < s["prefill_tokens_hf"]
    dc = res["decode"]
    assert dc["rows"] == 4 and dc["decode_path_graph"] == "static" and dc["graph_error"] is None
    assert dc["ids_equal_frac"] == 1.0 and dc["logp_max_abs_diff"] < 5e-5  # same seed: the same samples (fp32, other shapes)
    assert dc["decode_tok_s_graph"] > 0 and dc["decode_tok_s_eager"] > 0 and dc["hbm_bandwidth_bytes_s"] > 1e8
    assert dc["roofline_tok_s"] == pytest.approx(dc["hbm_bandwidth_bytes_s"] * dc["rows"] / dc["bytes_per_step"], rel=1e-3)
    assert dc["decode_roofline_frac"] == pytest.approx(dc["decode_tok_s_graph"] / dc["roofline_tok_s"], abs=1e-4)  # rounded to 4 places
    f = res["full_depth"]
    assert f["layers"] == 3 and "--gradient-checkpointing" in f["command"] and f["loss_finite"]
    assert f["time_step_s"] > 0 and f["full_depth_peak_mem_bytes"] > 0 and f["decode_path"] == "eager"
    assert "decode_roofline_frac" in proc.stdout and "full_depth_peak_mem_bytes" in proc.stdout
    r = res["rl"]
    assert r["steps_done"] == 1 and r["loss_finite"] and r["first_ratio_dev"] == [0.0]
    assert 0 <= r["sampler_logp_gap"][0] < 1e-3  # the trainer scores the sampled tokens as the sampler did
    assert r["time_rollout_s"][0] > 0 and r["time_update_s"][0] > 0


def test_failing_check_is_recorded_and_the_next_runs(tmp_path):
    gc = load_script()
    C = gc.Check(tmp_path / "x.json", budget_s=100.0)

    def boom():
        raise ValueError("no such kernel")

    assert C.run("kernels", "broken", boom) is None
    assert C.run("kernels", "fine", lambda: 42) == 42
    assert C.run("rl", "too_long", lambda: 1, min_left_s=1e9) is None  # not started: the budget is short
    on_disk = json.loads((tmp_path / "x.json").read_text())
    assert [(f["section"], f["check"]) for f in on_disk["failures"]] == [("kernels", "broken"), ("rl", "too_long")]
    assert on_disk["failures"][0]["error"] == "ValueError: no such kernel"
    assert "boom" in on_disk["failures"][0]["traceback"]
    assert "skipped" in on_disk["failures"][1]["error"]
    assert "kernels/broken: ValueError: no such kernel" in (tmp_path / "x.md").read_text()


@pytest.mark.parametrize("text,n", [('{"step": 1, "loss": 0.5}\n{"step": 2, "lo', 1), ('{"t": 1}\n', 0), ("", 0)])
def test_metrics_rows_read_defensively(tmp_path, text, n):
    """A line the trainer is still writing, or a row without a step, is skipped."""
    sections = load_script("gpu_sections")
    p = tmp_path / "metrics.jsonl"
    p.write_text(text)
    assert len(sections._read_rows(p)) == n


def test_decode_bytes_by_hand():
    """The roofline's bytes per decode step on the tiny model (fp32, hidden 64, 2 layers, 4 heads of
    16, 2 KV heads, MLP 128, tied 8,192-token vocabulary of assets/tiny_tokenizer), counted by hand."""
    import vlm

    sections = load_script("gpu_sections")
    model = vlm.load_model("tiny", seed=0)
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q, k+v (bias), o, MLP, 2 norms
    weights = 4 * (2 * per_layer + 64 + 8192 * 64)            # + final norm + lm_head (the embedding is not read)
    kv_tok = 2 * 2 * 2 * 16 * 4                                 # (K, V) x layers x KV heads x head_dim x fp32
    assert sections.decode_bytes(model, rows=8, context_mean=100.5) == (weights, kv_tok, weights + 8 * kv_tok * 100.5)

"""The training scripts as users run them (subprocesses, tiny model, a few MiniWob++ episodes):

- FSDP2: a 2-process run (torchrun, gloo, CPU) ends with the same parameters and losses as a
  1-process run on the same data, for SFT and for semi-online RL;
- semi-online RL with dynamic sampling ON, from a checkpoint whose rollouts earn varying rewards
  (tests/rl_checkpoint.py), so tasks are dropped and refill rounds run: 2 processes == 1 process,
  and stop-and-resume == uninterrupted (schedule, RNG and optimizer state restored);
- a step where dynamic sampling keeps nothing is still a step: logged with its number, saved;
- a process killed while writing a checkpoint leaves the previous one loadable;
- the RNG state of every generator survives a checkpoint round trip.

Tolerances: fp32 all the way; the two runs differ only in the order of floating-point sums
(gradient reduce-scatter), so parameters agree to ~1e-6 after Adam's few steps.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vlm

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

# semi-online RL on 4 MiniWob++ episodes with dynamic sampling on (--filter-std 0: drop a task whose
# rollouts all earn the same step-0 return), from the rl_ckpt fixture's model, fitted to 2 of them: their
# rollouts' rewards vary, the other 2 earn 0 (dropped, then refilled). The reference is a differently
# seeded tiny model, so the KL term is large too.
RL = ["train_semionline.py", "--data", "data/miniwob/train.jsonl", "--max-episodes", "4", "--tasks-per-step", "2", "--n-rollouts", "3",
      "--max-new-tokens", "40", "--max-pixels", "20000", "--temperature", "1.0", "--filter-std", "0",
      "--max-resample", "2", "--kl-coef", "0.5", "--ref-model", "tiny", "--ref-seed", "1", "--lr", "2e-4",
      "--micro-batch-size", "2", "--ppo-mini-batches", "2"]
SFT = ["train_sft.py", "--data", "data/miniwob/train.jsonl", "--model", "tiny", "--max-episodes", "8", "--batch-size", "4", "--micro-batch-size", "2",
       "--lr", "1e-3", "--warmup-steps", "1", "--eval-every", "0", "--val-frac", "0.25", "--copy-warmup-steps", "0"]


@pytest.fixture(scope="session")
def rl_ckpt(rl_checkpoint_dir):
    """A tiny model fitted to the first MiniWob++ steps: its rollouts' rewards vary (conftest: built once)."""
    return ["--model", str(rl_checkpoint_dir)]


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory, rl_ckpt):
    """rl_run(*flags) -> (out, last, metrics) of `RL + rl_ckpt + flags`, launched once per distinct flags in
    this module (several tests read the same seeded 1- and 3-step runs; none writes into them)."""
    done = {}

    def get(*flags):
        if flags not in done:
            out = tmp_path_factory.mktemp("rl_run")
            done[flags] = (out, *launch(RL + rl_ckpt + list(flags), out))
        return done[flags]
    return get


def launch(args, out, nproc=1):
    cmd = ([PY, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"] if nproc > 1 else [PY]) + args + ["--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def params(out):
    ptr = out / "ckpt" / "latest"
    return load_file(str(out / "ckpt" / ptr.read_text().strip() / "model.safetensors"))


def assert_same_params(a, b, atol, tight=1e-6, share=0.999):
    """Every entry within atol, and `share` of all entries within `tight`. Adam divides each
    gradient by its own running RMS, so a parameter whose gradient is ~0 (rounding noise)
    can move by a visible fraction of lr under a different summation order; atol bounds that."""
    assert a.keys() == b.keys()
    diffs = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert diffs.max().item() <= atol, f"max parameter difference {diffs.max().item()}"
    assert (diffs <= tight).float().mean().item() >= share, f"only {(diffs <= tight).float().mean().item():.5f} within {tight}"


def test_sft_fsdp_two_processes_match_one(tmp_path):
    last1, m1 = launch(SFT + ["--max-steps", "2"], tmp_path / "p1")
    last2, m2 = launch(SFT + ["--max-steps", "2"], tmp_path / "p2", nproc=2)
    assert [r["loss"] for r in m1] == pytest.approx([r["loss"] for r in m2], rel=1e-5)
    assert last1["val_loss"] == pytest.approx(last2["val_loss"], rel=1e-5)
    assert last1["loss"] < 10.0  # a real NLL of an 8,192-way softmax, not a dummy
    assert_same_params(params(tmp_path / "p1"), params(tmp_path / "p2"), atol=2e-5)


def test_sft_copy_warmup_runs_logs_and_records(tmp_path):
    import train_sft
    assert train_sft.copy_warmup_default("tiny") == train_sft.copy_warmup_default("tiny:128x4") == 1000
    assert train_sft.copy_warmup_default(str(tmp_path)) == 0
    args = SFT[:-2]  # without its "--copy-warmup-steps 0": the flag is given below instead
    last, m = launch(args + ["--max-steps", "1", "--copy-warmup-steps", "3"], tmp_path / "w")
    rows = [json.loads(l) for l in (tmp_path / "w" / "copy_warmup.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # an untrained tiny model: ~ln(8,192) = 9.0 nats per token (its vocabulary), digits included
    assert all(7.0 < r["loss"] < 11.5 and 7.0 < r["digit_nll"] < 11.5 for r in rows), rows
    assert json.loads((tmp_path / "w" / "args.json").read_text())["copy_warmup_steps"] == 3
    assert len(m) == 1 and m[0]["step"] == 1 and last["loss"] < 10.0
    # --copy-warmup-code-frac reaches the warm-up loop: the same seed, every page's labels fresh codes, other pages
    # (the same flags without it repeat the losses above to the digit: the warm-up is seeded)
    for name, extra in (("same", []), ("codes", ["--copy-warmup-code-frac", "1"])):
        launch(args + ["--max-steps", "1", "--copy-warmup-steps", "3", *extra], tmp_path / name)
    losses = {name: [json.loads(l)["loss"] for l in (tmp_path / name / "copy_warmup.jsonl").read_text().splitlines()]
              for name in ("same", "codes")}
    assert losses["same"] == [r["loss"] for r in rows]
    assert losses["codes"] != losses["same"]
    assert json.loads((tmp_path / "codes" / "args.json").read_text())["copy_warmup_code_frac"] == 1.0


def test_copy_warmup_save_at_is_the_shorter_warm_ups_base(tmp_path):
    # --copy-warmup-save-at 2 in a 3-step warm-up saves the model an independent 2-step warm-up saves as its base
    # (constant learning rate, pages drawn step by step from the same seed): one run gives the shorter bases
    args = SFT[:-2] + ["--max-steps", "0"]
    launch(args + ["--copy-warmup-steps", "3", "--copy-warmup-save-at", "2"], tmp_path / "long")
    launch(args + ["--copy-warmup-steps", "2"], tmp_path / "short")
    at2 = load_file(str(tmp_path / "long" / "warmup_ckpt" / "step_000002" / "model.safetensors"))
    base2 = load_file(str(tmp_path / "short" / "ckpt" / "step_000000" / "model.safetensors"))
    assert_same_params(at2, base2, atol=1e-6)
    assert any((at2[k] - params(tmp_path / "long")[k]).abs().max() > 1e-4 for k in at2)  # step 3 moved on
    res = subprocess.run([PY, *args, "--copy-warmup-steps", "3", "--copy-warmup-save-at", "4", "--out", str(tmp_path / "x")],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--copy-warmup-save-at [4]: every step must be <=" in res.stderr


def test_copy_warmup_code_pages_use_fresh_codes():
    # --copy-warmup-code-frac 1: every page's labels are fresh random codes (3-8 of A-Z, 0-9), none of the
    # training labels; the target copies the code (click: its point and label; type: the code itself)
    import random
    import train_sft
    from vlm import load_processor

    tok, _ = load_processor()
    rng, seen = random.Random(0), set()
    for _ in range(40):
        prompt, target = train_sft.synthetic_example(rng, ["TRAINLABEL"], tok, max_elements=4, type_frac=0.5,
                                                     code_frac=1.0)
        text, answer = tok.decode(prompt.input_ids.tolist()), tok.decode(target)
        assert "TRAINLABEL" not in text + answer
        code = answer.split("'")[1]
        assert 3 <= len(code) <= 8 and set(code) <= set(train_sft.CODE_CHARS)
        assert f"'{code}'" in text or f'"{code}"' in text  # a click page's element line, a type page's goal
        seen.add(code)
    assert len(seen) == 40  # fresh every page
    _, target = train_sft.synthetic_example(random.Random(0), ["TRAINLABEL"], tok, code_frac=0.0)
    assert "TRAINLABEL" in tok.decode(target)


def assert_refilled(m):
    """Dynamic sampling did something: a task dropped, a refill round run, some task trained on."""
    assert sum(r["tasks_tried"] for r in m) > sum(r["tasks_kept"] for r in m) > 0
    assert max(r["rounds"] for r in m) > 1 and sum(r["train_tokens"] for r in m) > 0


def test_semionline_fsdp_two_processes_match_one(tmp_path, rl_ckpt, rl_run):
    """One step (dynamic sampling with refills, 2 PPO mini-batches = 2 Adam steps, the second off-policy)
    in 1 and in 2 FSDP processes: the same schedule, rollouts, losses and parameters. One step only: the
    next step samples from parameters that differ slightly between world sizes (below: one entry by 3.6e-5),
    and one token drawn differently then makes the runs legitimately diverge (most likely what happened at
    step 2: loss 3.69593 vs 3.69570, equal rewards and token counts). 2 steps x 1 mini-batch and 1 x 1
    matched to 8e-8 (results/LOG.md)."""
    p1, last1, m1 = rl_run("--max-steps", "1")
    last2, m2 = launch(RL + rl_ckpt + ["--max-steps", "1"], tmp_path / "p2", nproc=2)
    assert [r["step"] for r in m1] == [r["step"] for r in m2] == [1]
    assert_refilled(m1)
    # same schedule, same keep decisions, same rollouts (per-slot sampling seeds), same losses, same parameters
    for a, b in zip(m1, m2):
        for k in ("rounds", "tasks_tried", "tasks_kept", "partial", "train_tokens"):
            assert a[k] == b[k], k
        assert a["reward_mean"] == pytest.approx(b["reward_mean"]) and a["progress"] == pytest.approx(b["progress"])
        ta, tb = a["reward_by_task"], b["reward_by_task"]  # summed over ranks: the same on both world sizes
        assert ta and set(ta) == set(tb) and all(ta[t]["responses"] == tb[t]["responses"] for t in ta)
        assert all(ta[t]["reward"] == pytest.approx(tb[t]["reward"]) for t in ta)
        if a["loss"] is not None:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)
            assert a["kl"] == pytest.approx(b["kl"], rel=1e-4)
    first = next(r for r in m1 if r["loss"] is not None)
    assert 0.0 <= first["sampler_logp_gap"] < 1e-3 and 0.0 <= first["truncated_rate"] <= 1.0  # top-p 1: measured
    if first["step"] == 1:  # pi_old on CPU is the sampler's (--old-logp auto): ratio 1 to the trainer-sampler gap
        assert first["old_logp"] == "sampler" and 0.0 <= first["first_ratio_dev"] < 1e-3
    # lr 2e-4 x 2 Adam steps: an entry moves by up to ~4e-4. Adam divides each gradient by its own RMS, so an
    # entry whose two gradients nearly cancel can move by a visible fraction of a step under another summation
    # order (one entry of 2.9 M by 3.6e-5 seen); atol bounds that, the share within 1e-6 is the real check
    assert_same_params(params(p1), params(tmp_path / "p2"), atol=2e-4)


def test_semionline_sampler_old_logp_trains_as_recompute(tmp_path, rl_ckpt, rl_run):
    """--old-logp sampler (pi_old = the sampler's own log-probs: no forward; CPU's default) and recompute
    (a no-grad policy forward, the release's) train the same step: the same rollouts, losses within the
    trainer-sampler gap (~1e-5 in fp32), parameters within Adam's rounding. The second of the 2 PPO
    mini-batches is off-policy, so pi_old really enters its ratio. Recompute's first ratio is exactly 1."""
    _, rec = launch(RL + rl_ckpt + ["--max-steps", "1", "--old-logp", "recompute"], tmp_path / "rec")
    smp_out, _, smp = rl_run("--max-steps", "1")
    (a,), (b,) = rec, smp
    assert (a["old_logp"], b["old_logp"]) == ("recompute", "sampler")
    for k in ("rounds", "tasks_tried", "tasks_kept", "train_tokens"):
        assert a[k] == b[k], k
    assert a["reward_mean"] == b["reward_mean"] and a["train_tokens"] > 0
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-5) and a["kl"] == pytest.approx(b["kl"], rel=1e-3)
    # one distribution for both: the sampler scores the full vocabulary, as the trainer (vision tokens banned from the draw only)
    assert a["first_ratio_dev"] == 0.0 and 0.0 <= b["first_ratio_dev"] < 1e-4
    assert 0.0 <= a["sampler_logp_gap"] < 1e-4 and 0.0 <= b["sampler_logp_gap"] < 1e-4
    assert_same_params(params(tmp_path / "rec"), params(smp_out), atol=2e-4)


def test_semionline_logs_reward_by_task(tmp_path, rl_ckpt):
    """reward_by_task splits the step's responses by MiniWob task: counts add up to every response
    rolled out, the count-weighted means give reward_mean, and only tasks of the data appear."""
    lines = (REPO / "data" / "miniwob" / "train.jsonl").read_text().splitlines()
    by = {}
    for line in lines:
        by.setdefault(json.loads(line)["task"], []).append(line)
    two = [t for t in by if len(by[t]) >= 2][:2]
    data = tmp_path / "two.jsonl"
    data.write_text("\n".join(by[two[0]][:2] + by[two[1]][:2]) + "\n")
    argv = [a if a != "data/miniwob/train.jsonl" else str(data) for a in RL] + ["--image-root", "data/miniwob"]
    _, m = launch(argv + rl_ckpt + ["--max-steps", "2", "--tasks-per-step", "3", "--max-resample", "0"], tmp_path / "r")
    seen = set()
    for row in m:
        bt = row["reward_by_task"]
        assert set(bt) <= set(two)
        seen |= set(bt)
        n = sum(v["responses"] for v in bt.values())
        assert n > 0 and all(v["responses"] > 0 and 0.0 <= v["reward"] <= 1.0 for v in bt.values())
        assert sum(v["reward"] * v["responses"] for v in bt.values()) / n == pytest.approx(row["reward_mean"])
    assert seen == set(two)  # 3 of 4 episodes (2 per task) drawn without replacement: both tasks, every step


def test_semionline_resume_matches_uninterrupted(tmp_path, rl_ckpt, rl_run):
    full_out, _, full = rl_run("--max-steps", "3")
    assert_refilled(full)
    # killed (kill -9) after step 2 was logged, before its checkpoint, with a line half written:
    # the resumed run redoes step 2 and logs each step once
    launch(RL + rl_ckpt + ["--max-steps", "3", "--stop-after", "2", "--save-every", "1"], tmp_path / "cut")
    ck = tmp_path / "cut" / "ckpt"
    shutil.rmtree(ck / "step_000002")
    (ck / "latest").write_text("step_000001")
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')
    first = params(tmp_path / "cut")
    _, cut = launch(RL + rl_ckpt + ["--max-steps", "3", "--resume"], tmp_path / "cut")
    final = params(tmp_path / "cut")
    assert [r["step"] for r in cut] == [1, 2, 3]
    for a, b in zip(full, cut):
        for k in ("rounds", "tasks_tried", "tasks_kept", "train_tokens"):
            assert a[k] == b[k], (a["step"], k)
        assert a["reward_mean"] == pytest.approx(b["reward_mean"])
        assert (a["loss"] is None) == (b["loss"] is None)
        if a["loss"] is not None:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-8)
    assert max((first[k] - final[k]).abs().max().item() for k in first) > 1e-5  # steps 2-3 did train
    assert_same_params(params(full_out), final, atol=1e-6)


def test_semionline_step_that_keeps_nothing_is_a_step(tmp_path):
    """An untrained model earns 0 everywhere: dynamic sampling drops every task in every round; each
    step still logs its own number, says it is partial, and the end (and --save-every) still saves."""
    last, m = launch(["train_semionline.py", "--data", "data/miniwob/train.jsonl", "--model", "tiny", "--max-episodes", "3", "--tasks-per-step", "2",
                      "--n-rollouts", "2", "--max-new-tokens", "4", "--max-steps", "3", "--save-every", "2",
                      "--max-resample", "1", "--top-p", "0.9"], tmp_path)
    assert [r["step"] for r in m] == [1, 2, 3] and last["step"] == 3
    assert all(r["rounds"] == 2 and r["tasks_tried"] == 4 and r["tasks_kept"] == 0 and r["partial"] for r in m)
    # 4 tokens: every response is cut at the cap (a malformed, zero-reward step); at top-p < 1, where
    # --old-logp sampler is not offered, no gap to the trainer's is logged
    assert all(r["truncated_rate"] == 1.0 and r["reward_mean"] == 0.0 and r["sampler_logp_gap"] is None for r in m)
    assert all(r["loss"] is None and r["train_tokens"] == 0 for r in m)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_000002", "step_000003"]


def test_rng_state_round_trip(tmp_path):
    """Every global generator is saved and restored, the ones nothing has drawn from yet included."""
    import random

    import numpy as np

    import utils
    import vlm
    from extras import resume
    model = vlm.load_model("tiny")
    opt = torch.optim.AdamW(model.parameters())
    utils.seed_everything(7)
    torch.rand(3), np.random.rand(2), random.random()  # advance some, not others (np's gauss cache)
    np.random.standard_normal()  # leaves a cached Gaussian in numpy's state
    vlm.save_checkpoint(tmp_path, model, None, {}, optimizer=opt, extra={"step": 1})
    want = (torch.rand(4).tolist(), np.random.standard_normal(3).tolist(), random.random())
    utils.seed_everything(123)
    resume.load_checkpoint_state(utils.latest_checkpoint(tmp_path), model, opt)
    got = (torch.rand(4).tolist(), np.random.standard_normal(3).tolist(), random.random())
    assert got == want


KILLER = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {repo!r})
    import utils
    import vlm
    model = vlm.load_model("tiny")
    opt = torch.optim.AdamW(model.parameters())
    vlm.save_checkpoint({out!r}, model, None, {{"a": 1}}, optimizer=opt, extra={{"step": 1}})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    real = type(model).save_pretrained
    def slow(self, *a, **k):  # write the files, then hang before the folder is renamed into place
        real(self, *a, **k)
        print("WRITING", flush=True)
        time.sleep(60)
    type(model).save_pretrained = slow
    vlm.save_checkpoint({out!r}, model, None, {{"a": 2}}, optimizer=opt, extra={{"step": 2}})
""")


def test_kill_during_checkpoint_keeps_previous(tmp_path):
    out = tmp_path / "ckpt"
    proc = subprocess.Popen([PY, "-c", KILLER.format(repo=str(REPO), out=str(out))], stdout=subprocess.PIPE,
                            text=True, env=ENV)
    deadline = time.time() + 120
    saw = False
    for line in proc.stdout:
        if "WRITING" in line:
            saw = True
            break
        if time.time() > deadline:
            break
    assert saw, "the writer never reached the middle of its checkpoint"
    # killed mid-write: step 2's files exist, but only in the temporary folder
    tmp = list(out.glob(".tmp_step_000002_*"))
    assert len(tmp) == 1 and (tmp[0] / "model.safetensors").exists()
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # it died of the kill, not of finishing
    assert tmp[0].exists() and (out / "latest").read_text().strip() == "step_000001"
    from transformers import Qwen2_5_VLForConditionalGeneration

    import utils
    latest = utils.latest_checkpoint(out)
    assert latest is not None and latest.name == "step_000001"
    assert not (out / "step_000002").exists()  # the half-written one never took the name
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(latest))
    ref = vlm.load_model("tiny")
    for (k, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k  # the step-1 weights, not the +1 ones


def test_keep_checkpoints(tmp_path):
    """save_checkpoint keeps the newest `keep` step folders (the trainers' --keep-checkpoints, default 2);
    keep 0 keeps every one (a dose-response evaluates the intermediate steps)."""
    import train_semionline
    import train_sft

    model = vlm.load_model("tiny:32x1")
    for keep, want in ((2, ["step_000003", "step_000004"]), (0, ["step_000001", "step_000002", "step_000003", "step_000004"])):
        out = tmp_path / f"keep{keep}"
        for step in range(1, 5):
            vlm.save_checkpoint(out, model, None, {}, extra={"step": step}, keep=keep)
        assert sorted(p.name for p in out.glob("step_*")) == want
        assert (out / "latest").read_text().strip() == "step_000004"
    for p in (train_sft.parser, train_semionline.parser):
        assert p.parse_args([]).keep_checkpoints == 2 and p.parse_args(["--keep-checkpoints", "0"]).keep_checkpoints == 0


# metrics that measure the machine, not the method: left out of the comparison with the stored runs
TIMINGS = {"tok_s", "time_rollout_s", "time_logp_s", "time_update_s", "time_s", "peak_mem_bytes", "t"}
# other flags than RL's, each one a value a route could lose: temperature and top-p (the sampler and the
# trainer's log-probs), the release's returns, gamma, the overlong penalty (max-new-tokens), Dr.GRPO's
# denominator (max-new-tokens), and the held-out evaluation (temperature, samples)
VARIED = ["--temperature", "0.8", "--top-p", "0.95", "--returns-form", "release", "--overlong-buffer", "8",
          "--gamma", "0.9", "--loss-agg", "dr-grpo", "--eval-data", "data/miniwob/test.jsonl",
          "--eval-episodes", "2", "--eval-samples", "2", "--eval-every", "2"]


def same_rows(got, want):
    """Rows equal key by key, floats to 1e-6 relative (the reference was written on another CPU run)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = {k: v for k, v in g.items() if k not in TIMINGS}
        assert g.keys() == w.keys(), (g.keys() ^ w.keys())
        for k in w:
            assert g[k] == (pytest.approx(w[k], rel=1e-6) if isinstance(w[k], float) else w[k]), (w["step"], k)


@pytest.mark.parametrize("name,extra", [("default", []), ("varied", VARIED)])
def test_semionline_metrics_as_before(rl_run, name, extra):
    """The typed configs changed how the flags reach the code, not the numbers: a seeded 3-step run gives
    the metrics.jsonl that the same command gave at 06de78c, before the rework
    (tests/data/config_reference.json, timings dropped)."""
    want = json.loads((REPO / "tests" / "data" / "config_reference.json").read_text())[f"semionline_{name}"]
    _, _, rows = rl_run("--max-steps", "3", *extra)  # the default's run is the resume test's uninterrupted one
    same_rows(rows, want)


def test_sft_metrics_as_before(tmp_path):
    """The same for SFT: 2 copy warm-up steps, then 2 SFT steps, as at 06de78c."""
    want = json.loads((REPO / "tests" / "data" / "config_reference.json").read_text())
    _, rows = launch(SFT[:-2] + ["--copy-warmup-steps", "2", "--max-steps", "2"], tmp_path / "s")
    same_rows(rows, want["sft"])
    same_rows([json.loads(l) for l in (tmp_path / "s" / "copy_warmup.jsonl").read_text().splitlines()],
              want["sft_copy_warmup"])

"""LoRA (lora.py, through PEFT) in SFT and RL, against references:

- a freshly initialised adapter (B = 0) gives the base model's log-probs exactly;
- the PPO update's gradient reaches only adapter parameters and equals the autograd reference of
  tests/update_case.py on an identically adapted model (1e-4 of the largest entry, as there), with
  --gradient-checkpointing too (1e-6 of the largest entry against the run without);
- the RL reference, the policy with its adapters disabled, gives exactly a separately loaded base's log-probs;
- a checkpoint holds the adapter in PEFT's layout; merged (tools/merge_lora.py, --merge, or
  vlm.load_model of the adapter folder) it gives the adapted model's log-probs (fp32 merge: 1e-5);
- the trainers: 1 vs 2 FSDP2 processes give the same update (SFT, RL), and an RL stop-and-resume
  equals the uninterrupted run (adapters, optimizer, RNG), with the KL to the adapters-off reference on;
- --resume with other LoRA flags (rank, alpha, targets, vision) is one line naming the flag and both
  values, before the run's folder is touched (args.json, metrics.jsonl as they were), in both trainers;
- the RL command train_sft.py prints after a LoRA SFT runs as printed and trains.
"""
import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_train import ENV, PY, REPO, RL, SFT, assert_same_params, launch, rl_ckpt  # noqa: F401 (fixture)
from update_case import ARGV, make_records, reference_grads

import train_semionline as ts
import utils
import vlm
import lora
from extras import resume

LORA = ["--lora-r", "4", "--lora-alpha", "8"]


def trainable(module) -> list:
    """The parameters utils.adamw optimises: those with requires_grad (under LoRA, the adapters)."""
    return [p for p in module.parameters() if p.requires_grad]


@pytest.fixture(scope="module")
def case():
    base = vlm.load_model("tiny", seed=0)
    records, pad_id = make_records(base)
    batch = vlm.collate_sequences([r.prompt for r in records], [r.response_ids for r in records], pad_id)
    with torch.no_grad():
        base_logp = vlm.PolicyLogProb(base)(batch)[0]
    return records, pad_id, batch, base_logp


def adapted(nonzero_b=True, argv=LORA):
    """The tiny model (seed 0) with adapters (seed 0); B set to seeded non-zero values unless fresh."""
    model = vlm.load_model("tiny", seed=0)
    peft = lora.apply_lora(model, ts.parser.parse_args(ARGV + argv), base="tiny", seed=0)
    if nonzero_b:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model, peft


def test_fresh_adapter_gives_the_base_logprobs_exactly(case):
    _, _, batch, base_logp = case
    model, peft = adapted(nonzero_b=False)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    # decoder linear layers only: 7 per layer x 2 layers x (A, B); the vision tower and the rest frozen
    assert len(names) == 28 and all("lora_" in n and "language_model" in n for n in names)
    with torch.no_grad():
        assert torch.equal(vlm.PolicyLogProb(model)(batch)[0], base_logp)
    vis = lora.apply_lora(vlm.load_model("tiny", seed=0), ts.parser.parse_args(LORA + ["--lora-vision"]), "tiny")
    assert any("visual" in n for n, p in vis.named_parameters() if p.requires_grad)


def test_update_gradient_reaches_only_adapters_and_equals_reference(case):
    records, pad_id, _, _ = case
    args = ts.parser.parse_args(ARGV)
    model, _ = adapted()
    policy = vlm.PolicyLogProb(model)
    opt = torch.optim.SGD(trainable(policy), lr=0.0)
    mb = ts._micro_batches(records[::-1], 1, 2, utils.Dist(0, 1, 0, torch.device("cpu")),
                           length=lambda r: len(r.prompt.input_ids) + len(r.response_ids))[0]
    st = ts.ppo_step(policy, opt, mb, lambda c: vlm.collate_sequences([r.prompt for r in c], [r.response_ids for r in c],
                                                                     pad_id), utils.Dist(0, 1, 0, torch.device("cpu")),
                     **ts.loss_config(args, sampler=args))
    assert st["clipped"] > 0 and st["kl"] > 0 and st["skipped"] == 0
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == {n for n, _ in model.named_parameters() if "lora_" in n}  # adapters only, all of them
    ref = reference_grads(adapted()[0], records, args)
    assert ref.keys() == got.keys()
    scale = max(g.abs().max().item() for g in ref.values())
    assert scale > 1e-3 and all(got[n].abs().max() > 0 for n in got if "lora_A" in n)  # A gets gradient too
    assert max((got[n] - ref[n]).abs().max().item() for n in ref) <= 1e-4 * scale


def test_gradient_checkpointing_gives_the_same_adapter_gradient(case):
    """--gradient-checkpointing (the 7B's path) under LoRA: the same adapter gradients (1e-6 of the largest)."""
    records, pad_id, _, _ = case
    args = ts.parser.parse_args(ARGV)
    grads = []
    for ckpt in (False, True):
        model, _ = adapted()
        if ckpt:
            vlm.checkpoint_activations(model)
        policy = vlm.PolicyLogProb(model)
        one = utils.Dist(0, 1, 0, torch.device("cpu"))
        mb = ts._micro_batches(records, 1, 3, one)[0]
        ts.ppo_step(policy, torch.optim.SGD(trainable(policy), lr=0.0), mb,
                    lambda c: vlm.collate_sequences([r.prompt for r in c], [r.response_ids for r in c], pad_id), one,
                    **ts.loss_config(args, sampler=args))
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    a, b = grads
    scale = max(g.abs().max().item() for g in a.values())
    assert a.keys() == b.keys() and len(a) == 28
    assert max((a[n] - b[n]).abs().max().item() for n in a) <= 1e-6 * scale


def test_reference_with_adapters_disabled_is_the_base(case):
    _, _, batch, base_logp = case
    model, peft = adapted()
    policy = vlm.PolicyLogProb(model)
    with torch.no_grad():
        on = policy(batch)[0]
        off = lora.AdaptersOff(policy, peft)(batch)[0]
        again = policy(batch)[0]  # the context gives the adapters back
    assert torch.equal(off, base_logp)
    assert (on - base_logp).abs().max() > 1e-3 and torch.equal(on, again)


def test_checkpoint_merge_and_resume_load(case, tmp_path):
    _, pad_id, batch, _ = case
    model, peft = adapted()
    tok = vlm.load_processor("tiny")[0]
    ckpt = vlm.save_checkpoint(tmp_path / "ckpt", model, tok, {"x": 1}, extra={"step": 3}, adapter=peft)
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "lora_base.json"} <= names
    assert "model.safetensors" not in names and utils.latest_checkpoint(tmp_path / "ckpt") == ckpt
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    assert len(saved) == 28 and all(k.startswith("base_model.model.model.language_model.") for k in saved)
    with torch.no_grad():
        want = vlm.PolicyLogProb(model)(batch)[0]
    # merged into a plain Hugging Face folder (the tool), then loaded like any other model
    res = subprocess.run([PY, "tools/merge_lora.py", str(tmp_path / "ckpt"), "--out", str(tmp_path / "merged")],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    merged_names = {p.name for p in (tmp_path / "merged").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= merged_names and "adapter_config.json" not in merged_names
    for folder in (tmp_path / "merged", ckpt):  # the merged folder; the adapter folder merged on load
        loaded = vlm.load_model(str(folder))
        with torch.no_grad():
            got = vlm.PolicyLogProb(loaded)(batch)[0]
        assert (got - want).abs().max().item() < 1e-5
        # trainable like any loaded model (PEFT had frozen the base: RL's full fine-tune of the merged
        # SFT then met 'optimizer got an empty parameter list')
        assert all(p.requires_grad for p in loaded.parameters())
    # resume: a fresh adapted model takes the saved adapters exactly
    fresh, _ = adapted(nonzero_b=False)
    assert resume.load_checkpoint_state(ckpt, fresh)["step"] == 3
    assert all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in fresh.named_parameters())
    wrong, _ = adapted(argv=["--lora-r", "2"])
    with pytest.raises(lora.LoraError, match="same --lora-r"):  # an input error: one line from the trainers
        resume.load_checkpoint_state(ckpt, wrong)


@pytest.mark.parametrize("argv,msg", [(["--lora-targets", "q_proj,nope"], "nope not a linear layer"),
                                      (["--merge"], "--merge needs --lora-r"),
                                      (["--lora-r", "-1"], "must be >= 0")])
def test_bad_lora_flags_are_one_line_errors(tmp_path, argv, msg):
    if "--lora-r" not in argv:
        argv = argv + (LORA if "--lora-targets" in argv else [])
    res = subprocess.run([PY] + SFT + ["--max-steps", "1", "--out", str(tmp_path / "o")] + argv, cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and msg in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]


def adapter_params(out):
    return load_file(str(utils.latest_checkpoint(out / "ckpt") / "adapter_model.safetensors"))


def test_sft_lora_two_processes_match_one(tmp_path):
    _, m1 = launch(SFT + LORA + ["--max-steps", "2"], tmp_path / "p1")
    _, m2 = launch(SFT + LORA + ["--max-steps", "2"], tmp_path / "p2", nproc=2)
    assert [r["loss"] for r in m1] == pytest.approx([r["loss"] for r in m2], rel=1e-5)
    a, b = adapter_params(tmp_path / "p1"), adapter_params(tmp_path / "p2")
    assert max(v.abs().max().item() for k, v in a.items() if "lora_B" in k) > 1e-4  # it trained
    assert_same_params(a, b, atol=1e-5)


# KL to the adapters-off base (no --ref-model); lr 2e-3 (LoRA's usual 10x) so that the second mini-batch's
# policy moves far enough from the base for a k3 KL above fp32 rounding
RL_LORA = [{"2e-4": "2e-3"}.get(a, a) for a in RL if a not in ("--ref-model", "tiny", "--ref-seed", "1")] + LORA


def test_semionline_lora_two_processes_match_one(tmp_path, rl_ckpt):  # noqa: F811
    _, m1 = launch(RL_LORA + rl_ckpt + ["--max-steps", "1"], tmp_path / "p1")
    _, m2 = launch(RL_LORA + rl_ckpt + ["--max-steps", "1"], tmp_path / "p2", nproc=2)
    (a,), (b,) = m1, m2
    assert a["train_tokens"] == b["train_tokens"] > 0 and a["reward_mean"] == pytest.approx(b["reward_mean"])
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7) and a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-9)
    assert_same_params(adapter_params(tmp_path / "p1"), adapter_params(tmp_path / "p2"), atol=2e-3)
    assert json.loads((tmp_path / "p1" / "args.json").read_text())["lora_r"] == 4


def test_semionline_lora_resume_matches_uninterrupted(tmp_path, rl_ckpt):  # noqa: F811
    _, full = launch(RL_LORA + rl_ckpt + ["--max-steps", "3"], tmp_path / "full")
    launch(RL_LORA + rl_ckpt + ["--max-steps", "3", "--stop-after", "1"], tmp_path / "cut")
    _, cut = launch(RL_LORA + rl_ckpt + ["--max-steps", "3", "--resume", "--merge"], tmp_path / "cut")
    assert [r["step"] for r in cut] == [1, 2, 3] and sum(r["train_tokens"] for r in full) > 0
    assert any(r["kl"] for r in full)  # once the adapters have moved, the KL to the adapters-off base is live
    for a, b in zip(full, cut):
        assert (a["tasks_kept"], a["train_tokens"]) == (b["tasks_kept"], b["train_tokens"])
        assert (a["loss"] is None) == (b["loss"] is None)
        if a["loss"] is not None:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-8)
    assert_same_params(adapter_params(tmp_path / "full"), adapter_params(tmp_path / "cut"), atol=1e-6)
    assert (tmp_path / "cut" / "merged" / "model.safetensors").is_file()  # --merge: a plain folder


# -----------------------------------------------------------------------------
# --resume with other LoRA flags; the next stage after a LoRA SFT


def flags(**kw):
    return SimpleNamespace(**{"lora_r": 4, "lora_alpha": 8.0, "lora_targets": lora.DECODER_TARGETS,
                              "lora_vision": False, **kw})


@pytest.mark.parametrize("new,message", [
    (dict(lora_alpha=16.0), "--lora-alpha 16 differs from the checkpoint's 8 "),
    (dict(lora_alpha=None), None),                                   # the default, 2 x rank, is 8
    (dict(lora_r=2, lora_alpha=None), "--lora-r 2 differs from the checkpoint's 4 "),
    (dict(lora_r=0), "--lora-r 0 differs from the checkpoint's 4 "),
    (dict(lora_targets="v_proj, q_proj"), "--lora-targets q_proj,v_proj differs from the checkpoint's "
                                          "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj "),
    (dict(lora_targets="v_proj,up_proj,q_proj,o_proj,k_proj,gate_proj,down_proj"), None),  # the same set
    (dict(lora_vision=True), "--lora-vision True differs from the checkpoint's False "),
])
def test_check_resume_names_the_flag_and_both_values(tmp_path, new, message):
    (tmp_path / "args.json").write_text(json.dumps({**vars(flags()), "lora_alpha": None, "lr": 1e-3}))
    if message is None:
        lora.check_resume(flags(**new), tmp_path)
    else:
        with pytest.raises(lora.LoraError, match="^--resume: " + message.replace("(", r"\(")):
            lora.check_resume(flags(**new), tmp_path)
    lora.check_resume(flags(**new), None)                           # nothing to resume: nothing to check
    full = tmp_path / "full"
    full.mkdir()
    (full / "args.json").write_text(json.dumps({"lr": 1e-3}))       # a full fine-tune's (older: no lora_r)
    with pytest.raises(lora.LoraError, match="--lora-r 4 differs from the checkpoint's 0 "):
        lora.check_resume(flags(), full)
    lora.check_resume(flags(lora_r=0), full)


# the rl_ckpt model (rollouts of varying reward), SFT-ed with LoRA for a step at a small lr, in the
# prompt it was fitted in: the RL step after it keeps tasks, so its update is not empty
SFT_BASE = [a for a in SFT if a not in ("--model", "tiny")] + [
    "--max-steps", "1", "--lr", "1e-5", "--max-pixels", "20000", "--system-prompt", "full"]
SFT_LORA = SFT_BASE + LORA
RL_BASE = RL_LORA[:-len(LORA)]                                      # the tests' RL flags, without LoRA


@pytest.fixture(scope="module")
def lora_sft(tmp_path_factory, rl_ckpt):  # noqa: F811
    out = tmp_path_factory.mktemp("lora_sft") / "sft"
    res = subprocess.run([PY] + SFT_LORA + rl_ckpt + ["--out", str(out)], cwd=REPO, env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out, res.stdout


def run_resume(script_args, out):
    """A resume of `out` (its files' bytes before and after): exit 2 and one line, nothing rewritten."""
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    res = subprocess.run([PY] + script_args + ["--resume", "--out", str(out)], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    return res.stderr


def test_sft_resume_with_other_lora_flags_is_refused_before_writing(lora_sft, rl_ckpt, tmp_path):  # noqa: F811
    """The report's case: --lora-alpha changed on resume silently rescaled the adapters (grad norm 0.21 ->
    1.59) and rewrote args.json; another rank was a traceback."""
    out = tmp_path / "sft"
    shutil.copytree(lora_sft[0], out)
    ckpt = utils.latest_checkpoint(out / "ckpt")
    base = SFT_BASE + rl_ckpt
    err = run_resume(base + ["--lora-r", "4", "--lora-alpha", "16"], out)
    assert f"--resume: --lora-alpha 16 differs from the checkpoint's 8 ({ckpt}/args.json)" in err
    err = run_resume(base + ["--lora-r", "2"], out)
    assert "--resume: --lora-r 2 differs from the checkpoint's 4" in err and "Traceback" not in err


def test_semionline_resume_with_other_lora_flags_is_refused_before_writing(tmp_path, case):
    out = tmp_path / "rl"
    model, peft = adapted()
    args = ts.parser.parse_args(ARGV + LORA)
    vlm.save_checkpoint(out / "ckpt", model, vlm.load_processor("tiny")[0], vars(args), extra={"step": 1},
                        adapter=peft)
    (out / "args.json").write_text(json.dumps(vars(args)))
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    rl = RL_BASE + ["--model", "tiny"]
    err = run_resume(rl + ["--lora-r", "4", "--lora-vision"], out)
    assert "--resume: --lora-vision True differs from the checkpoint's False" in err
    err = run_resume(rl, out)                                        # LoRA dropped: --lora-r 0
    assert "--resume: --lora-r 0 differs from the checkpoint's 4" in err


def test_printed_next_stage_after_lora_sft_runs_and_trains(lora_sft, tmp_path):
    """train_sft.py --lora-r prints the RL command; its flags (one process, 1 step, the tests' small
    rollout settings) train: the RL checkpoint's adapters moved from B = 0. Before: the printed command
    (no LoRA flags) loaded the merged SFT model frozen: 'optimizer got an empty parameter list'."""
    out, stdout = lora_sft
    line = next(ln for ln in stdout.splitlines() if ln.startswith("next stage: "))
    cmd = line.removeprefix("next stage: ").split()
    assert cmd[:3] == ["torchrun", "--nproc_per_node=2", "train_semionline.py"]
    printed = cmd[3:]
    assert printed == ["--sft-dir", str(out / "ckpt"), "--lora-r", "4", "--lora-alpha", "8"]
    small = RL_BASE                                                 # data and rollout sizes, no --model
    assert "--model" not in small and RL_LORA[-len(LORA):] == LORA
    last, rows = launch(small + printed + ["--max-steps", "1"], tmp_path / "rl")
    assert rows[-1]["step"] == 1 and rows[-1]["train_tokens"] > 0
    moved = [v.abs().max().item() for k, v in adapter_params(tmp_path / "rl").items() if "lora_B" in k]
    assert len(moved) == 14 and min(moved) > 0                       # 7 linear layers x 2 decoder layers, all moved
    assert lora.read_base(utils.latest_checkpoint(tmp_path / "rl" / "ckpt"))["model"] == \
        str(utils.latest_checkpoint(out / "ckpt"))                  # RL started from the SFT checkpoint

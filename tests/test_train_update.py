"""The PPO update of train_semionline.py (`ppo_step` + `_micro_batches`), with real, non-zero advantages.

The parameter gradient that `ppo_step` leaves (real micro-batching: 3 micro-batches of <= 2 sequences,
one mini-batch; the loss aggregated over the whole mini-batch; PPO + dual clip + k3 KL through
kernels.ppo_loss on the fused log-prob) equals an independent autograd reference of the same objective
(tests/update_case.py: one sequence at a time, plain log_softmax, the formulas written out), for each
--loss-agg, in one process and under torchrun with 2 FSDP2 processes. Tolerance: fp32; the two differ
in summation order and in the chunked vs plain log-softmax, so 1e-4 of the largest gradient entry.
With --gradient-checkpointing the gradient equals the one without (1e-6), plain and under FSDP2.
"""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from update_case import ARGV, make_records, reference_grads

import train_semionline as ts
import utils
import vlm
from extras.shared_prompt import collate_shared

REPO = Path(__file__).resolve().parents[1]
ONE = utils.Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "dr-grpo"]


@pytest.fixture(scope="module")
def case():
    model = vlm.load_model("tiny", seed=0)
    records, pad_id = make_records(model)
    return model, records, pad_id


_REFS = {}


def ref_grads(records, agg):
    """The reference gradient of each aggregation, computed once per session."""
    if agg not in _REFS:
        _REFS[agg] = reference_grads(vlm.load_model("tiny", seed=0), records,
                                     ts.parser.parse_args(ARGV + ["--loss-agg", agg]))
    return _REFS[agg]


def run_update(model, records, pad_id, args, micro_size=2, opt=None, share=False):
    """ppo_step on micro-batches cut as the trainer cuts them (sorted by length), from the records in
    reverse order: the micro-batches group the records differently from the reference's order.
    share: collate with the shared prompt heads (extras/shared_prompt.py: each micro-batch's run once)."""
    policy = vlm.PolicyLogProb(model)
    opt = opt or torch.optim.SGD(policy.parameters(), lr=0.0)
    mb = ts._micro_batches(records[::-1], 1, micro_size, ONE,
                           length=lambda r: len(r.prompt.input_ids) + len(r.response_ids))[0]
    assert [id(r) for c in mb for r in c] != [id(r) for r in records]

    def collate(chunk):
        rows = [r.prompt for r in chunk], [r.response_ids for r in chunk], pad_id
        return collate_shared(*rows, model.config.image_token_id) if share else vlm.collate_sequences(*rows)

    return ts.ppo_step(policy, opt, mb, collate, ONE, **ts.loss_config(args, sampler=args)), mb


@pytest.mark.parametrize("agg,share", [(a, False) for a in AGGS] + [("token-mean", True), ("seq-mean-token-mean", True)])
def test_update_gradient_equals_reference(case, agg, share):
    """share: the micro-batches run their shared prompt heads once (--share-prompts on): same gradient."""
    model, records, pad_id = case
    args = ts.parser.parse_args(ARGV + ["--loss-agg", agg])
    assert len(records) >= 5 and len({r.adv for r in records}) >= 4
    if share:  # the case holds rows that share a head, so the shared path runs
        b = collate_shared([r.prompt for r in records], [r.response_ids for r in records], pad_id,
                           model.config.image_token_id)
        assert len(b["head_len"]) < len(records)
    st, mb = run_update(model, records, pad_id, args, share=share)
    assert len(mb) == (len(records) + 1) // 2 >= 3  # several micro-batches, the last one maybe short
    # the case exercises what it claims: clipped tokens, including dual-clipped ones, and a KL term
    assert st["clipped"] > 0 and st["kl"] > 0 and st["skipped"] == 0
    got = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    ref = ref_grads(records, agg)
    assert ref.keys() == got.keys()
    scale = max(g.abs().max().item() for g in ref.values())
    assert scale > 1e-3  # a real policy gradient, not the zero of all-zero advantages
    worst = max((got[n] - ref[n]).abs().max().item() for n in ref)
    assert worst <= 1e-4 * scale, (worst, scale)
    assert st["grad_norm"] == pytest.approx(torch.sqrt(sum((g.double() ** 2).sum() for g in ref.values())).item(),
                                            rel=1e-4)


def test_update_gradient_sees_the_aggregation(case):
    """The reference comparison can fail: token-mean and seq-mean-token-mean differ on ragged lengths."""
    model, records, pad_id = case
    a, b = ref_grads(records, "token-mean"), ref_grads(records, "seq-mean-token-sum")
    scale = max(g.abs().max().item() for g in a.values())
    assert max((a[n] - b[n]).abs().max().item() for n in a) > 1e-2 * scale


@pytest.mark.parametrize("agg,share", [("token-mean", "off"), ("seq-mean-token-mean", "off"), ("token-mean", "on")])
def test_update_gradient_two_processes(tmp_path, agg, share):
    """share on: each rank's micro-batches run their shared prompt heads once (two decoder calls in
    one FSDP2 root forward)."""
    out = tmp_path / "res.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(REPO / "tests" / "update_worker.py"),
           str(out), agg, share]
    for attempt in range(2):
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        # gloo on an overloaded 2-core machine once aborted a rank in C++ ("terminate called without an
        # active exception", SIGABRT) before any result: rerun that crash once; any other failure, or a
        # wrong gradient, fails at once
        if res.returncode == 0 or attempt or out.exists() or "SIGABRT" not in res.stderr:
            break
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert 0 < r["n_mine"] < r["n_records"] and r["skipped"] == 0
    assert (r["shared_rows"] > 0) == (share == "on")
    assert r["scale"] > 1e-3 and r["worst"] <= 1e-4 * r["scale"], r


def test_non_finite_grad_norm_skips_the_step(case):
    model, records, pad_id = case
    args = ts.parser.parse_args(ARGV)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    bad = [copy.copy(r) for r in records]
    bad[1].adv = float("nan")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    st, _ = run_update(model, bad, pad_id, args, opt=opt)
    assert st["skipped"] == 1 and not np.isfinite(st["grad_norm"])
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # no step taken
    assert all(p.grad is None for p in model.parameters())  # and the NaN gradients dropped
    st, _ = run_update(model, records, pad_id, args, opt=opt)  # the same optimizer, finite data: it steps
    assert st["skipped"] == 0
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(before[n])


# ---------------------------------------------------------------------------------------------------
# --gradient-checkpointing (vlm.checkpoint_activations): the same update gradient.
# On CPU the recompute runs the same fp32 kernels on the same inputs, so the two agree to rounding:
# 1e-6 of the largest gradient entry.

def _counting(model):
    """Calls of the first decoder layer's and vision block's MLP forward: 1 each per forward, 2
    when the backward recomputes them (checkpointing on; module hooks do not fire in a recompute,
    so the forward itself is wrapped)."""
    calls = {"text": 0, "vision": 0}
    for key, mod in (("text", model.model.language_model.layers[0].mlp), ("vision", model.model.visual.blocks[0].mlp)):
        def counted(*a, _f=mod.forward, _key=key, **kw):
            calls[_key] += 1
            return _f(*a, **kw)
        mod.forward = counted
    return calls


def _grads(named_params, prefix=""):
    """{name without prefix: full gradient} (an FSDP2 gradient is a DTensor shard: gathered)."""
    return {n.removeprefix(prefix): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for n, p in named_params if p.grad is not None}


def _plain_update_grads(records, pad_id, args):
    model = vlm.load_model("tiny", seed=0)
    calls = _counting(model)
    run_update(model, records, pad_id, args, micro_size=len(records))
    assert calls == {"text": 1, "vision": 1}
    return _grads(model.named_parameters())


def _assert_grads_equal(got, want):
    assert got.keys() == want.keys()
    scale = max(g.abs().max().item() for g in want.values())
    worst = max((got[n] - want[n]).abs().max().item() for n in want)
    assert scale > 1e-3 and worst <= 1e-6 * scale, (worst, scale)


def test_gradient_checkpointing_same_gradient(case):
    """One process: the PPO update's gradient with checkpointing on equals the one without, and the
    checkpointing is real (the layers run again in the backward)."""
    _, records, pad_id = case
    args = ts.parser.parse_args(ARGV)
    want = _plain_update_grads(records, pad_id, args)
    model = vlm.load_model("tiny", seed=0)
    vlm.checkpoint_activations(model)
    calls = _counting(model)
    run_update(model, records, pad_id, args, micro_size=len(records))
    assert calls == {"text": 2, "vision": 2}                   # forward + recompute
    _assert_grads_equal(_grads(model.named_parameters()), want)


def test_gradient_checkpointing_under_fsdp2(case):
    """The same under FSDP2 on a 1-process gloo group, sharded by apply_fsdp as the trainers do
    (checkpointing first, then fully_shard per layer and the root)."""
    import torch.distributed as dist

    _, records, pad_id = case
    args = ts.parser.parse_args(ARGV)
    want = _plain_update_grads(records, pad_id, args)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = vlm.load_model("tiny", seed=0)
        vlm.checkpoint_activations(model)
        calls = _counting(model)
        policy = vlm.apply_fsdp(model, vlm.PolicyLogProb(model), ONE, mixed_precision=False)
        mb = ts._micro_batches(records, 1, len(records), ONE)[0]

        def collate(chunk):
            return vlm.collate_sequences([r.prompt for r in chunk], [r.response_ids for r in chunk], pad_id)

        st = ts.ppo_step(policy, torch.optim.SGD(policy.parameters(), lr=0.0), mb, collate, ONE,
                         **ts.loss_config(args, sampler=args))
        assert st["skipped"] == 0 and calls == {"text": 2, "vision": 2}
        _assert_grads_equal(_grads(policy.named_parameters(), prefix="model."), want)   # the root's own prefix
    finally:
        dist.destroy_process_group()


def test_gradient_checkpointing_flag():
    """Both trainers list the flag (off by default); the run's args.json is vars(args), so it records it."""
    import train_sft

    for parser in (ts.parser, train_sft.parser):
        assert "--gradient-checkpointing" in parser.format_help()
        assert parser.parse_args([]).gradient_checkpointing is False
        assert vars(parser.parse_args(["--gradient-checkpointing"]))["gradient_checkpointing"] is True
    # shared prompt heads need the KV cache that checkpointing drops: refused before anything runs
    with pytest.raises(utils.UsageError, match="share-prompts"):
        ts.check_args(ts.parse(["--model", "tiny", "--share-prompts", "on", "--gradient-checkpointing"])[0])
    ts.check_args(ts.parse(["--model", "tiny", "--share-prompts", "auto", "--gradient-checkpointing"])[0])  # auto: off then


class R:
    def __init__(self, task, n_tok, adv=0.0, step=0):
        self.task_idx, self.response_ids, self.adv, self.step_idx = task, [0] * n_tok, adv, step


def test_loss_aggregations_by_hand():
    """Two sequences of 2 and 4 tokens with per-token losses (1, 3) and (2, 2, 2, 6), generation budget 8:
    token-mean = 16 / 6; seq-mean-token-mean = (2 + 3) / 2 = 2.5; seq-mean-token-sum = (4 + 12) / 2 = 8;
    dr-grpo = 16 / (2 x 8) = 1 (kernels.aggregate_loss / kernels.loss_denominator)."""
    from kernels import LOSS_AGGS, aggregate_loss, loss_denominator

    lengths = [2, 4]
    per_tok = torch.tensor([1.0, 3.0, 2.0, 2.0, 2.0, 6.0])
    for agg, want in [("token-mean", 16 / 6), ("seq-mean-token-mean", 2.5), ("seq-mean-token-sum", 8.0), ("dr-grpo", 1.0)]:
        got = aggregate_loss(per_tok, lengths, agg, loss_denominator(lengths, agg, max_len=8))
        assert got.item() == pytest.approx(want, rel=1e-6), agg
        # split over two micro-batches: each divides by the mini-batch's denominator, and the shares add up
        denom = loss_denominator(lengths[:1], agg, 8) + loss_denominator(lengths[1:], agg, 8)
        parts = aggregate_loss(per_tok[:2], [2], agg, denom) + aggregate_loss(per_tok[2:], [4], agg, denom)
        assert parts.item() == pytest.approx(want, rel=1e-6), agg
    assert list(LOSS_AGGS) == AGGS and ts.parser.parse_args(["--loss-agg", "dr-grpo"]).loss_agg == "dr-grpo"
    with pytest.raises(ValueError, match="token-sum"):
        loss_denominator(lengths, "token-sum")  # not a form: no silent token-sum
    with pytest.raises(ValueError, match="max_len"):
        loss_denominator(lengths, "dr-grpo")  # Dr.GRPO's constant needs the budget
    with pytest.raises(ValueError, match="lengths sum to 5"):
        aggregate_loss(per_tok, [1, 4], "token-mean", 6.0)
    with pytest.raises(ValueError, match="token-sum"):
        aggregate_loss(per_tok, lengths, "token-sum", 6.0)  # a misspelt form: no silent token-mean


def test_per_item_split_by_hand():
    """A flat (N,) tensor of a micro-batch back to (L_i,) fp32 CPU pieces, in record order."""
    parts = ts._per_item([R(0, 2), R(1, 0), R(1, 3)], torch.arange(5, dtype=torch.float64))
    assert [p.tolist() for p in parts] == [[0.0, 1.0], [], [2.0, 3.0, 4.0]]
    assert all(p.dtype == torch.float32 for p in parts)


def test_pad_token_id_rule():
    """The one pad-id rule: pad id, else EOS, else 0; never <|image_pad|>."""
    class Tok:
        def __init__(self, pad, eos):
            self.pad_token_id, self.eos_token_id = pad, eos

        def get_vocab(self):
            return {"<|image_pad|>": 151655}
    assert vlm.pad_token_id(Tok(151643, 151645)) == 151643
    assert vlm.pad_token_id(Tok(None, 151645)) == 151645
    assert vlm.pad_token_id(Tok(None, None)) == 0
    assert vlm.pad_token_id(Tok(151655, 151645)) == 0
    tok, _ = vlm.load_processor(None)
    assert vlm.pad_token_id(tok) == tok.pad_token_id == 151643  # the shipped Qwen2.5-VL tokenizer
    tok, _ = vlm.load_processor("tiny")
    assert vlm.pad_token_id(tok) == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")


def test_micro_batches_by_hand():
    # task 0 has records a0..a4 at steps 0, 0, 1, 1, 2; task 1 b0..b2 at steps 0, 0, 1 (record order);
    # 2 mini-batches, micro-batches of 2
    recs = [R(0, 1) for _ in range(5)] + [R(1, 1) for _ in range(3)]
    for i, (r, step) in enumerate(zip(recs, [0, 0, 1, 1, 2, 0, 0, 1])):
        r.name, r.step_idx = (f"a{i}" if i < 5 else f"b{i - 5}"), step
    out = ts._micro_batches(recs, 2, 2, ONE)
    names = [[[r.name for r in c] if c is not None else None for c in mb] for mb in out]
    # the records of (task, step) -> mini-batch (task + step) % 2, together; then chunks of 2 in record order
    assert names == [[["a0", "a1"], ["a4", "b2"]], [["a2", "a3"], ["b0", "b1"]]]
    # more mini-batches than groups: the empty ones are dropped
    assert [len(mb) for mb in ts._micro_batches(recs[:2], 4, 2, ONE)] == [1]
    assert ts._micro_batches([], 2, 2, ONE) == []
    # with a length, each mini-batch is sorted (stable) by its groups' longest length, then within a group
    size = {"a0": 9, "a1": 3, "a2": 5, "a3": 3, "a4": 1, "b0": 5, "b1": 7, "b2": 2}
    out = ts._micro_batches(recs, 2, 2, ONE, length=lambda r: size[r.name])
    names = [[[r.name for r in c] for c in mb] for mb in out]
    assert names == [[["a4", "b2"], ["a1", "a0"]], [["a3", "a2"], ["b0", "b1"]]]

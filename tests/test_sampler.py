"""sampler.Sampler against references: Hugging Face generate (greedy, token for token), a full
forward pass (log-probs), its own unshared path (prefix sharing), and hand-computed
distributions (temperature, top-p). Tiny random Qwen2.5-VL in fp32 on CPU.

The tiny model's weights are redrawn with std 0.3: at the default init (std 0.02) it just
repeats its last input token whatever the positions or images, and a greedy comparison
with it could not fail. With std 0.3 a wrong rope position or rope delta changes the output
(checked in test_positions_matter).
"""
import contextlib
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import cli
import sampler as sampling_mod
import vlm
from extras import cascade, lean_step, static_decode
from extras.shared_prefix import prefix_tree
from sampler import (
    LogitsError,
    SampleOutput,
    Sampler,
    _inverse_cdf,
    process_logits,
    sample_from_logits,
)
from vlm import sampling_mode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from hf_peer import generate_inputs  # noqa: E402  the Hugging Face generate peer

MAX_NEW = 12


def spice(model, std=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


@pytest.fixture(scope="module")
def proc():
    return vlm.load_processor(max_pixels=64 * 28 * 28)


@pytest.fixture(scope="module")
def model():
    return spice(vlm.load_model("tiny")).eval()


def make_prompt(proc, text, size=None, seed=0, system="You are a GUI agent. Act on the screen."):
    """<system><user>{text}[image]<assistant header> as ids, with the image expanded."""
    tok, ip = proc
    ids = tok.encode(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}", add_special_tokens=False)
    pv = thw = None
    if size is not None:
        rng = np.random.default_rng(seed)
        img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        feats = ip(images=[img], return_tensors="pt")
        pv, thw = feats["pixel_values"], feats["image_grid_thw"]
        ids += tok.convert_tokens_to_ids(["<|vision_start|>"]) + \
            tok.convert_tokens_to_ids(["<|image_pad|>"]) * (int(thw.prod()) // 4) + \
            tok.convert_tokens_to_ids(["<|vision_end|>"])
    ids += tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return SimpleNamespace(input_ids=torch.tensor(ids), pixel_values=pv, image_grid_thw=thw)


@pytest.fixture(scope="module")
def prompts(proc):
    # different text lengths and image sizes -> different prompt lengths and 3-D position layouts
    return [make_prompt(proc, "Open the settings app, then turn on wifi.", (160, 210), seed=0),
            make_prompt(proc, "Hi", (300, 120), seed=1),
            make_prompt(proc, "Go back to the home screen and open the mail app to read the newest message.",
                        (1080, 2400), seed=2)]


@contextlib.contextmanager
def concentrated(model, k=32):
    """Put the mass on k fixed tokens (the model still decides among them). Sampled ids of two
    runs whose logits differ in the last bits (other batch shapes) agree only if no uniform
    lands within ~1e-6 of a CDF boundary; the random model spreads its mass over 152k tokens of
    p ~ 1e-5, where a flip is likely, while among k tokens it is not."""
    V = model.config.text_config.vocab_size
    focus = torch.randperm(V, generator=torch.Generator().manual_seed(0))[:k]
    bias = torch.zeros(V).index_fill(0, focus, 40.0)
    hook = model.lm_head.register_forward_hook(lambda m, i, out: out + bias)
    try:
        yield set(focus.tolist())
    finally:
        hook.remove()


def hf_generate(model, tok, prompts, sampler, max_new=MAX_NEW):
    """model.generate(do_sample=False) on a left-padded batch; returns per-row generated ids,
    cut after the first stop token (HF pads finished rows)."""
    kw = generate_inputs(prompts, tok.pad_token_id, getattr(model.config, "image_token_id", None))  # None: text-only LM
    T = kw["input_ids"].shape[1]
    out = model.generate(**kw, do_sample=False, max_new_tokens=max_new,
                         suppress_tokens=sampler.banned_ids.tolist(), eos_token_id=sampler.stop_token_ids,
                         pad_token_id=tok.pad_token_id)
    rows = []
    for r in out[:, T:].tolist():
        cut = next((k + 1 for k, t in enumerate(r) if t in sampler.stop_token_ids), len(r))
        rows.append(r[:cut])
    return rows


# ---------------------------------------------------------------------------------------------------
# the pure functions: definitions on a hand-built distribution

P = torch.tensor([0.15, 0.5, 0.05, 0.3])       # deliberately not sorted: checks the un-sorting


def test_process_logits_temperature_and_top_p():
    logits = P.log()[None]
    torch.testing.assert_close(process_logits(logits)[0], P)
    for T in (0.5, 2.0):                        # p_T(v) ~ p(v)^(1/T)
        q = P ** (1 / T)
        torch.testing.assert_close(process_logits(logits, temperature=T)[0], q / q.sum())
    # nucleus = smallest set of most likely tokens with mass >= top_p, renormalised
    torch.testing.assert_close(process_logits(logits, top_p=0.75)[0], torch.tensor([0, .5, 0, .3]) / .8)
    torch.testing.assert_close(process_logits(logits, top_p=0.85)[0], torch.tensor([.15, .5, 0, .3]) / .95)
    torch.testing.assert_close(process_logits(logits, top_p=0.3)[0], torch.tensor([0., 1, 0, 0]))
    # temperature first, then the nucleus of the tempered distribution: sqrt(p) normalised is
    # [.208, .379, .120, .294]; mass before the 3rd most likely (.208) is .673 >= .6 -> 2 tokens
    q = P.sqrt() / P.sqrt().sum()
    want = torch.tensor([0, q[1], 0, q[3]]) / (q[1] + q[3])
    torch.testing.assert_close(process_logits(logits, temperature=2.0, top_p=0.6)[0], want)
    # banned ids get 0 and the rest is renormalised
    torch.testing.assert_close(process_logits(logits, banned_ids=torch.tensor([1]))[0],
                               torch.tensor([.15, 0, .05, .3]) / .5)
    with pytest.raises(ValueError):
        process_logits(logits, temperature=0.0)
    with pytest.raises(ValueError):
        process_logits(logits, top_p=0.0)


def test_sample_from_logits_frequencies_and_logp():
    N = 200_000
    logits = P.log().expand(N, 4) * 3.0 + 1.0        # a shift must not matter; the scale is undone by T=3
    g = torch.Generator().manual_seed(0)
    tok, logp = sample_from_logits(logits, temperature=3.0, top_p=0.85, generator=g, banned_ids=torch.tensor([0]))
    # T=3 gives back P; banning 0 leaves [0, .59, .06, .35]; its 0.85-nucleus is tokens {1, 3}
    want = torch.tensor([0, .5, 0, .3]) / .8
    freq = torch.bincount(tok, minlength=4).double() / N
    sigma = (want * (1 - want) / N).sqrt()
    assert (freq - want).abs().max() <= 5 * sigma.max() + 1e-12, (freq, want)
    assert freq[0] == 0 and freq[2] == 0             # banned / outside the nucleus: never drawn
    torch.testing.assert_close(logp, want.log()[tok].float())
    greedy_tok, greedy_logp = sample_from_logits(logits[:2], temperature=3.0, greedy=True)
    assert greedy_tok.tolist() == [1, 1]
    torch.testing.assert_close(greedy_logp, torch.full((2,), math.log(0.5)))


BAD_ROWS = {"nan": (float("nan"), "a NaN logit"), "+inf": (float("inf"), "a \\+inf logit"),
            "-inf": (float("-inf"), "no finite logit among the allowed ids")}


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("kind", list(BAD_ROWS))
def test_sample_from_logits_refuses_nonfinite_rows_before_drawing(kind, greedy):
    """A NaN or +inf anywhere in a row (one entry; a banned id's too: it enters the normaliser), or a
    row with no finite logit, is a LogitsError naming the step and the row, raised before any uniform is
    drawn (the generator has not moved). Without the check: greedy returned the NaN's index and
    sampling `index 2047 is out of bounds` (inverse CDF over a NaN total)."""
    value, message = BAD_ROWS[kind]
    logits = torch.randn(4, 2500, generator=torch.Generator().manual_seed(0))
    for entry in (7, 3) if kind != "-inf" else (slice(None),):   # (7, 3): one entry; -inf: the whole row
        bad = logits.clone()
        bad[2, entry] = value
        for banned in (None, torch.tensor([3])):     # entry 3 banned: NaN / +inf there still refused
            g = torch.Generator().manual_seed(5)
            before = g.get_state()
            with pytest.raises(LogitsError, match=rf"^step 4, row 2: {message}"):
                sample_from_logits(bad, generator=g, banned_ids=banned, greedy=greedy, step=4)
            assert torch.equal(g.get_state(), before)
    # every finite logit banned: nothing left to draw from
    only = torch.full((2, 10), float("-inf"))
    only[0, 0] = only[1, 4] = 0.0                # row 0 keeps id 0; row 1's one finite id is banned
    with pytest.raises(LogitsError, match="^row 1: no finite logit among the allowed ids"):
        sample_from_logits(only, banned_ids=torch.tensor([4]), greedy=greedy)


@pytest.mark.parametrize("greedy", [False, True])
def test_masked_rows_are_legitimate(greedy):
    """-inf everywhere but a few allowed ids is masking, not an error: the draw stays among them."""
    logits = torch.full((3, 3000), float("-inf"))
    logits[0, 2999] = 1.0                        # one allowed id: drawn with probability 1
    logits[1, [5, 2050]] = torch.tensor([0.0, 0.0])
    logits[2, [10, 11]] = torch.tensor([2.0, 1.0])
    tok, lp = sample_from_logits(logits, greedy=greedy, generator=torch.Generator().manual_seed(0))
    assert tok[0] == 2999 and tok[1].item() in (5, 2050) and tok[2].item() in (10, 11)
    assert lp[0] == 0.0 and lp[1] == pytest.approx(math.log(0.5))
    assert tok[2] == 10 if greedy else True


def test_inverse_cdf_by_hand(monkeypatch):
    """Blocks of 3 over V = 8 (two full blocks and a tail of 2); weights 0 are never drawn."""
    monkeypatch.setattr(sampling_mod, "_CDF_BLOCK", 3)
    w = torch.tensor([[1., 0, 2, 0, 0, 3, 0, 2]])             # cdf 1 1 3 3 3 6 6 8, total 8
    want = {0.0: 0, 0.12: 0, 0.125: 2, 0.37: 2, 0.375: 5, 0.74: 5, 0.75: 7, 0.999: 7, 1 - 2**-24: 7}
    for u, tok in want.items():
        got, total = _inverse_cdf(w, torch.tensor([[u]]))
        assert got.tolist() == [tok] and total.tolist() == [8.0], (u, got, total)


@pytest.mark.parametrize("V,block", [(151_936, None), (1000, 64), (50, 64)])
def test_inverse_cdf_vs_flat_cumsum(monkeypatch, V, block):
    """The two-level draw against the flat one (fp64 cumsum + searchsorted) on random rows with a
    third of the weights 0: the same token wherever u * total is not within rounding of a boundary,
    and never a token of weight 0."""
    if block:
        monkeypatch.setattr(sampling_mod, "_CDF_BLOCK", block)
    g = torch.Generator().manual_seed(V)
    x = torch.randn(256, V, generator=g) * 4
    w = torch.softmax(x, dim=-1)
    w[:, torch.randperm(V, generator=g)[: V // 3]] = 0.0
    u = torch.rand(256, 1, generator=g)
    tok, total = _inverse_cdf(w, u)
    cdf = w.double().cumsum(dim=-1)
    t = u.double() * cdf[:, -1:]
    flat = torch.searchsorted(cdf, t, right=True).squeeze(-1)
    assert (w.gather(1, tok[:, None]) > 0).all()
    torch.testing.assert_close(total, cdf[:, -1])
    near = (cdf - t).abs().min(dim=-1).values < 1e-5 * cdf[:, -1]   # within rounding of a boundary
    assert (tok == flat)[~near].all() and (~near).sum() > 200


def test_prefix_tree_by_hand():
    # 0, 1, 2, 4 share [1, 2]; 0, 1, 4 also share 3; 3 shares nothing. 4 is 0 plus a token: 0 must
    # end in a leaf of its own (its last token gives its first logits), so 4's leaf is [3, 5)
    keys = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7, 8], [1, 2, 3, 4, 9]]
    nodes = prefix_tree(keys, [[] for _ in keys])
    spans = sorted((n.start, n.end, n.leaf) for n in nodes)
    assert spans == [(0, 2, -1), (0, 2, 3), (2, 3, -1), (2, 3, 2), (3, 4, 0), (3, 4, 1), (3, 5, 4)]
    by_span = {(n.start, n.end, n.leaf): n for n in nodes}
    assert nodes[by_span[(3, 5, 4)].parent] is by_span[(2, 3, -1)]
    # an image run [1, 4) whose pixels differ (keys -1 vs -2) must not be split: cut before it
    keys = [[5, -1, -1, -1, 6], [5, -2, -2, -2, 6]]
    nodes = prefix_tree(keys, [[(1, 4)], [(1, 4)]])
    assert sorted((n.start, n.end, n.leaf) for n in nodes) == [(0, 1, -1), (1, 5, 0), (1, 5, 1)]


# ---------------------------------------------------------------------------------------------------
# the sampler on the tiny Qwen2.5-VL

def test_greedy_matches_hf_generate(model, proc, prompts):
    tok = proc[0]
    batch = prompts + [make_prompt(proc, "A text-only prompt, no screenshot at all.")]
    sampler = Sampler(model, tok, max_new_tokens=MAX_NEW)
    ours = sampler.generate(batch, greedy=True)
    ref = hf_generate(model, tok, batch, sampler)
    assert [o[0].ids for o in ours] == ref
    for i, o in enumerate(ours):
        assert isinstance(o[0], SampleOutput) and o[0].prompt_index == i
        assert o[0].finish_reason == ("stop" if ref[i][-1] in sampler.stop_token_ids else "length")
        assert o[0].text == tok.decode(ref[i], skip_special_tokens=True)
    # HF generate leaves its batch's rope deltas on the model: they must not leak into our call,
    # and we leave none behind
    assert model.model.rope_deltas is not None
    assert [o[0].ids for o in sampler.generate(batch, greedy=True)] == ref
    assert model.model.rope_deltas is None


def test_positions_matter(model, proc, prompts):
    """The greedy test can fail: a wrong rope delta (decode positions) changes the output."""
    sampler = Sampler(model, proc[0], max_new_tokens=MAX_NEW, stop_token_ids=[])
    good = [o[0].ids for o in sampler.generate(prompts, greedy=True)]
    prepare = sampler._prepare

    def off_by_3(p):
        q = prepare(p)
        q.next_pos += 3                      # the rope delta of every decoded token off by 3
        return q

    sampler._prepare = off_by_3
    bad = [o[0].ids for o in sampler.generate(prompts, greedy=True)]
    assert all(g[0] == b[0] and g != b for g, b in zip(good, bad))


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (2.0, 1.0), (1.0, 0.7)])
def test_logprobs_match_full_forward(model, proc, prompts, temperature, top_p):
    """The logprobs are the trainer's: log_softmax(logits / T) over the whole vocabulary (what
    vlm.PolicyLogProb scores), not of the draw's renormalised distribution. The vision tokens get
    +8 on their logits here so that the banned mass is large (the draw excludes them)."""
    sampler = Sampler(model, proc[0], max_new_tokens=MAX_NEW, stop_token_ids=[], seed=0,
                      temperature=temperature, top_p=top_p)
    banned = sampler.banned_ids

    def boost(_, __, out):
        out = out.clone()
        out[..., banned] += 8.0
        return out

    hook = model.lm_head.register_forward_hook(boost)
    try:
        outs = sampler.generate(prompts[:2], n=2)
        for p, row in zip(prompts, outs):
            for o in row:
                assert o.logprobs.dtype == torch.float32 and o.logprobs.shape == (len(o.ids),) == (MAX_NEW,)
                ids = torch.cat([p.input_ids, torch.tensor(o.ids)])[None]
                with torch.no_grad():
                    logits = model(input_ids=ids, pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw,
                                   mm_token_type_ids=(ids == model.config.image_token_id).int()).logits[0]
                T = len(p.input_ids)
                logp = torch.log_softmax(logits[T - 1:-1].float() / temperature, -1)    # (L, V)
                full = logp.gather(-1, torch.tensor(o.ids)[:, None]).squeeze(-1)
                assert logp[:, banned].exp().sum(-1).max() > 0.05  # the renormalised logprobs would be off by > 0.05
                torch.testing.assert_close(o.logprobs, full, atol=1e-4, rtol=0)
                assert not set(o.ids) & set(banned.tolist())
    finally:
        hook.remove()


def test_sampler_refuses_what_it_cannot_sample(model, proc):
    """A temperature whose logits / T leaves fp32 (or NaN / inf), and a token budget below 1."""
    for t in (1e-45, 1e-9, float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            Sampler(model, proc[0], temperature=t)
        with pytest.raises(ValueError, match="temperature"):
            process_logits(torch.zeros(1, 4), t)
    for m in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_new_tokens"):
            Sampler(model, proc[0], max_new_tokens=m)
    tok, lp = sample_from_logits(torch.tensor([[0.0, 50.0, 49.0]]), temperature=cli.MIN_TEMPERATURE)
    assert tok.item() == 1 and torch.isfinite(lp).all()


@pytest.mark.parametrize("temperature,top_p,greedy", [(cli.MIN_TEMPERATURE, 1.0, False), (0.05, 1.0, False),
                                                      (cli.MIN_TEMPERATURE, 0.9, False),
                                                      (cli.MIN_TEMPERATURE, 1.0, True)])
def test_banned_id_far_ahead_draws_only_allowed_ids(model, proc, prompts, temperature, top_p, greedy):
    """A banned (vision) id leading every allowed one by ~100 x T nats at the lowest allowed temperature:
    a softmax taken before the ban puts every allowed id at 0 (the inverse CDF then returns the last id,
    log-prob -inf). Every path of the draw forms the allowed set first: only allowed ids come out, each
    with a finite log-prob equal to the trainer's log_softmax(z / T) over the whole vocabulary."""
    sampler = Sampler(model, proc[0], max_new_tokens=4, stop_token_ids=[], seed=0, temperature=temperature, top_p=top_p)
    banned = sampler.banned_ids
    lead = 100.0 * temperature + 0.5  # the banned id's logit above the best allowed one, in logit units

    def push(_, __, out):
        out = out.clone()
        out[..., banned[0]] = out.amax(-1) + lead
        return out

    hook = model.lm_head.register_forward_hook(push)
    try:
        outs = sampler.generate(prompts[:2], n=3, greedy=greedy)
    finally:
        hook.remove()
    V = model.config.text_config.vocab_size
    for row in outs:
        for o in row:
            assert not set(o.ids) & set(banned.tolist()), o.ids
            assert max(o.ids) < V - 1 or V - 1 not in o.ids          # not the inverse CDF's fall-through
            assert torch.isfinite(o.logprobs).all(), o.logprobs
            assert (o.logprobs < -90).all()   # the banned id holds nearly all the policy's mass: ~ -100 nats
    # the draw's pure function, on the same shape of logits
    z = torch.randn(3, 50)
    z[:, 7] = z.amax(-1) + lead
    for g in (False, True):
        tok, lp = sample_from_logits(z, temperature, top_p, torch.Generator().manual_seed(0), banned_ids=torch.tensor([7]),
                                     greedy=g)
        assert (tok != 7).all() and torch.isfinite(lp).all()
        probs = process_logits(z, temperature, top_p, torch.tensor([7]))
        assert probs[:, 7].eq(0).all() and torch.allclose(probs.sum(-1), torch.ones(3))


def test_sampler_temperature_is_checked_when_set(model, proc):
    """The evaluator sets a sampler's temperature for its sampled plays: the setter holds the same rule."""
    s = Sampler(model, proc[0])
    for t in (1e-9, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            s.temperature = t
    with pytest.raises(ValueError, match="top_p"):
        s.top_p = 0.0
    s.temperature = 0.5
    assert s.temperature == 0.5


def test_shared_prefix_equals_unshared(model, proc, prompts):
    tok = proc[0]
    same_size = make_prompt(proc, "Open the settings app, then turn on wifi.", (160, 210), seed=9)  # other pixels
    batch = [prompts[0], prompts[1], prompts[0], same_size]                  # a duplicate, a near-duplicate
    for greedy in (True, False):
        kw = dict(max_new_tokens=MAX_NEW, stop_token_ids=[], seed=3)
        shared, plain = Sampler(model, tok, **kw), Sampler(model, tok, share_prefix=False, **kw)
        with concentrated(model) if not greedy else contextlib.nullcontext() as focus:
            a = shared.generate(batch, n=3, greedy=greedy)
            b = plain.generate(batch, n=3, greedy=greedy)
        assert [[o.ids for o in r] for r in a] == [[o.ids for o in r] for r in b]
        for ra, rb in zip(a, b):
            for oa, ob in zip(ra, rb):
                torch.testing.assert_close(oa.logprobs, ob.logprobs, atol=5e-5, rtol=0)
        if not greedy:      # the samples of one prompt are independent draws, not copies
            assert a[0][0].ids != a[0][1].ids and set(a[0][0].ids) <= focus
    assert shared.stats["distinct_prompts"] == 3 and shared.stats["images_encoded"] == 3
    # the tree's levels are padded to their longest segment; the decode cache keeps only real slots
    assert shared.stats["kv_slots"] == plain.stats["kv_slots"] == max(len(p.input_ids) for p in batch)
    assert plain.stats["images_encoded"] == 4 and plain.stats["distinct_prompts"] == 4   # each prompt once
    assert shared.stats["prefill_tokens_real"] < sum(len(p.input_ids) for p in batch[1:])   # system prompt once
    assert plain.stats["prefill_tokens_real"] == sum(len(p.input_ids) for p in batch)


def test_seeded_sampling_reproducible(model, proc, prompts):
    tok = proc[0]

    def run(seed):
        s = Sampler(model, tok, max_new_tokens=MAX_NEW, seed=seed)
        return [[o.ids for o in r] for r in s.generate(prompts[:2], n=2)]

    first = run(11)
    assert run(11) == first
    assert run(12) != first


def test_per_prompt_seeds_do_not_depend_on_the_batch(model, proc, prompts):
    """seeds=[...]: a prompt's samples are the same alone, next to other prompts, and in
    another position; other seeds give other samples."""
    tok = proc[0]
    s = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=[])
    with concentrated(model):
        alone = [o.ids for o in s.generate([prompts[1]], n=2, seeds=[7])[0]]
        mixed = s.generate([prompts[0], prompts[2], prompts[1]], n=2, seeds=[5, 6, 7])
        other = [o.ids for o in s.generate([prompts[1]], n=2, seeds=[8])[0]]
    assert [o.ids for o in mixed[2]] == alone
    assert alone[0] != alone[1] and other != alone
    with pytest.raises(ValueError):
        s.generate(prompts, seeds=[1])


def test_sample_count_per_prompt(model, proc, prompts):
    """n=[3, 1, 2]: one call gives each prompt its own number of samples, the same ones (seeded)
    as a call per prompt; counts that are not one per prompt, or below 1, raise."""
    s = Sampler(model, proc[0], max_new_tokens=MAX_NEW, stop_token_ids=[])
    with concentrated(model):
        one_call = s.generate(prompts, n=[3, 1, 2], seeds=[5, 6, 7])
        apart = [s.generate([p], n=k, seeds=[seed])[0] for p, k, seed in zip(prompts, [3, 1, 2], [5, 6, 7])]
    assert [len(r) for r in one_call] == [3, 1, 2]
    assert [[o.ids for o in r] for r in one_call] == [[o.ids for o in r] for r in apart]
    assert [o.prompt_index for r in one_call for o in r] == [0, 0, 0, 1, 2, 2]
    for r, q in zip(one_call, apart):
        for a, b in zip(r, q):
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=5e-5, rtol=0)
    for bad in ([1, 1], [1, 0, 1]):
        with pytest.raises(ValueError, match="sample count"):
            s.generate(prompts, n=bad)


def test_finish_reason_stop_and_length(model, proc, prompts):
    """A row that stops leaves the batch; the rows that remain decode exactly as before."""
    tok = proc[0]
    long = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=[]).generate(prompts, greedy=True)
    ids0 = long[0][0].ids
    k = next(k for k in range(2, MAX_NEW) if ids0[k] not in ids0[:k] and all(ids0[k] not in o[0].ids for o in long[1:]))
    s = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=[ids0[k]])
    short = s.generate(prompts, greedy=True)
    assert short[0][0].ids == ids0[:k + 1] and short[0][0].finish_reason == "stop"   # stop id included
    assert len(short[0][0].logprobs) == k + 1
    for a, b in zip(short[1:], long[1:]):
        assert a[0].ids == b[0].ids and a[0].finish_reason == "length" and len(a[0].ids) == MAX_NEW
        torch.testing.assert_close(a[0].logprobs, b[0].logprobs, atol=5e-5, rtol=0)
    assert s.stats["decode_tokens"] == (k + 1) + 2 * MAX_NEW                         # row 0 dropped


# ---------------------------------------------------------------------------------------------------
# the plain path (sampler.py alone) against each speed-up of extras/, alone and all on (the CPU defaults)

PLAIN = dict(share_prefix=False, decode="eager", lean=False)
SPEEDUPS = {"shared_prefix": dict(PLAIN, share_prefix=True), "lean_rows": dict(PLAIN, lean=True, cascade="rows"),
            "cascade_grid": dict(PLAIN, lean=True, cascade="grid"), "static": dict(PLAIN, decode="static"),
            "static_lean": dict(PLAIN, decode="static", lean=True), "defaults": {}}


def _assert_same(a, b, atol=5e-5):
    assert [[o.ids for o in r] for r in a] == [[o.ids for o in r] for r in b]
    assert [[o.finish_reason for o in r] for r in a] == [[o.finish_reason for o in r] for r in b]
    for ra, rb in zip(a, b):
        for oa, ob in zip(ra, rb):
            torch.testing.assert_close(oa.logprobs, ob.logprobs, atol=atol, rtol=0)


@pytest.mark.parametrize("speedup", list(SPEEDUPS))
def test_plain_path_equals_each_speed_up(model, proc, prompts, speedup):
    """The plain path (each prompt prefilled whole in one forward, the transformers forward over a
    DynamicCache) and each speed-up give the same ids, finish reasons and logprobs (to 5e-5: other
    batch shapes and summation orders): 4 prompts (a duplicate, a text-only one) with 3, 1, 2, 2
    samples, greedy with a stop token that ends some rows early, and (the speed-ups without the lean
    step, which a logits hook turns off) sampled with per-prompt seeds under `concentrated`; the lean
    step's sampled logprobs are checked against a full forward below. The speed-up ran (its stats)."""
    tok = proc[0]
    batch = [prompts[0], prompts[1], prompts[0], make_prompt(proc, "A text-only prompt, no screenshot at all.")]
    ns = [3, 1, 2, 2]
    free = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=[], **PLAIN).generate(batch, n=ns, greedy=True)
    stop = [free[1][0].ids[3]]                      # a token prompt 1 produces: its row stops early
    plain = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=5, **PLAIN)
    fast = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=5, **SPEEDUPS[speedup])
    ref = plain.generate(batch, n=ns, greedy=True)
    assert {o.finish_reason for r in ref for o in r} == {"stop", "length"}
    _assert_same(fast.generate(batch, n=ns, greedy=True), ref)
    assert plain.stats["distinct_prompts"] == 4 and plain.stats["lean"] is False and plain.stats["decode"] == "eager"
    assert not {"cascade_grids", "decode_buckets"} & plain.stats.keys()
    st, want = fast.stats, SPEEDUPS[speedup]
    assert st["distinct_prompts"] == (3 if want.get("share_prefix", True) else 4)
    assert st["lean"] is (want.get("lean", True) is not False)                   # lean None: on for this CPU model
    assert st["decode"] == want.get("decode", "eager") and ("decode_buckets" in st) == (st["decode"] == "static")
    assert ("cascade_grids" in st) == (st["lean"] and st["decode"] == "eager")
    if want.get("lean", True) is False:  # `concentrated`'s hook on lm_head would turn the lean step off
        with concentrated(model, k=16):
            seeds = [3, 1, 4, 1]
            _assert_same(fast.generate(batch, n=ns, seeds=seeds), plain.generate(batch, n=ns, seeds=seeds))
    if speedup == "cascade_grid":
        assert st["cascade_grids"][0] == 4 and st["cascade_row_rows"][0] == 0


# ---------------------------------------------------------------------------------------------------
# the static decode (extras/static_decode.py) against the eager loop, the reference:
# the step a CUDA graph captures, run uncaptured. The static path runs other batch shapes (bucket
# padding, dead rows), so fp32 logits may differ in the last bits: log-probs to 5e-5 (a log-softmax over
# 8,192 entries summed in another order; 1.1e-5 seen), and sampled
# ids compared under `concentrated` (no uniform lands within rounding of a CDF boundary).

def _pair(model, tok, **kw):
    """(eager, static) samplers with the same settings and seed."""
    return [Sampler(model, tok, max_new_tokens=MAX_NEW, seed=5, decode=d, **kw) for d in ("eager", "static")]


def test_static_decode_equals_eager_sampled(model, proc, prompts):
    """Seeded sampling, 4 prompts of different lengths (one text-only) x 3 samples: R = 12 rows in
    a bucket of 16 (4 padded rows); a stop token among the 8 likely ones ends rows at different
    steps, so dead rows and bucket shrinks (16 -> 8 -> ...) happen; the sampler's generator and
    per-prompt seeds both."""
    tok = proc[0]
    batch = prompts + [make_prompt(proc, "A text-only prompt, no screenshot at all.")]
    with concentrated(model, k=16) as focus:
        for seeds in (None, [3, 1, 4, 1]):
            eager, static = _pair(model, tok, stop_token_ids=[min(focus)])
            a, b = eager.generate(batch, n=3, seeds=seeds), static.generate(batch, n=3, seeds=seeds)
            _assert_same(b, a)
            lengths = [len(o.ids) for r in a for o in r]
            # the case exercises what it claims: early stops, a full-length row, shrinking buckets
            assert min(lengths) < MAX_NEW // 2 and max(lengths) == MAX_NEW, lengths
            assert static.stats["decode"] == "static" and "decode_buckets" not in eager.stats
            assert static.stats["decode_buckets"][0] == 16 and len(static.stats["decode_buckets"]) >= 2
            assert static.stats["decode_tokens"] == eager.stats["decode_tokens"] == sum(lengths)


def test_static_decode_equals_eager_greedy(model, proc, prompts):
    """Greedy, no bias on the logits: the 3 image prompts x 2 samples (R = 6 in a bucket of 8), the
    first prompt's rows stopped early by a token it produces that the others do not; and a
    text-only causal LM (1-D positions)."""
    tok = proc[0]
    long = Sampler(model, tok, max_new_tokens=MAX_NEW, stop_token_ids=[]).generate(prompts, greedy=True)
    ids0 = long[0][0].ids
    k = next(k for k in range(2, MAX_NEW) if ids0[k] not in ids0[:k] and all(ids0[k] not in o[0].ids for o in long[1:]))
    eager, static = _pair(model, tok, stop_token_ids=[ids0[k]])
    a, b = eager.generate(prompts, n=2, greedy=True), static.generate(prompts, n=2, greedy=True)
    _assert_same(b, a)
    assert [len(o.ids) for r in a for o in r] == [k + 1] * 2 + [MAX_NEW] * 4
    assert static.stats["decode_buckets"] == [8, 4]           # 4 live rows of 6 fit a bucket of 4

    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    lm = spice(Qwen2ForCausalLM(cfg)).eval()
    texts = [tok.encode(t, add_special_tokens=False) for t in ("a b c d e f g h", "hello", "one two three")]
    eager, static = _pair(lm, tok, stop_token_ids=[])
    _assert_same(static.generate(texts, greedy=True), eager.generate(texts, greedy=True))


def test_static_decode_can_fail(model, proc, prompts):
    """The comparisons above can fail: a static step that forgets to advance the positions
    decodes other tokens. And the modes are checked: graph needs CUDA."""

    eager, static = _pair(model, proc[0], stop_token_ids=[])
    want = [o[0].ids for o in eager.generate(prompts, greedy=True)]
    step = static_decode.StaticDecode._step

    def stale_positions(self, b):
        out = step(self, b)
        self.pos.sub_(1)
        return out

    static_decode.StaticDecode._step = stale_positions
    try:
        got = [o[0].ids for o in static.generate(prompts, greedy=True)]
    finally:
        static_decode.StaticDecode._step = step
    assert all(g[:2] == w[:2] and g != w for g, w in zip(got, want))   # the first two do not use pos
    with pytest.raises(ValueError, match="CUDA"):
        Sampler(model, proc[0], decode="graph")
    with pytest.raises(ValueError, match="decode"):
        Sampler(model, proc[0], decode="compiled")
    assert Sampler(model, proc[0]).decode == "eager"                   # auto on CPU


def test_vision_tokens_never_sampled(model, proc, prompts):
    tok = proc[0]
    image_pad = model.config.image_token_id
    hook = model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, torch.tensor([image_pad]), 1e4))
    try:
        s = Sampler(model, tok, max_new_tokens=4, stop_token_ids=[])
        for greedy in (True, False):
            for r in s.generate(prompts[:2], n=2, greedy=greedy):
                assert all(not set(o.ids) & set(s.banned_ids.tolist()) for o in r)
        s.banned_ids = torch.tensor([], dtype=torch.long)      # the hook works: unbanned, it wins
        assert s.generate(prompts[:1], greedy=True)[0][0].ids == [image_pad] * 4
    finally:
        hook.remove()


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("kind", list(BAD_ROWS))
def test_sampler_names_the_step_and_row_of_nonfinite_logits(model, proc, prompts, monkeypatch, kind, greedy):
    """The engine's own draw (rollouts, eval_sop): logits poisoned at decode step 2 in row 3 (prompt 1,
    sample 1 of 2 prompts x 2 samples) -> LogitsError naming them, greedy and sampled. A row of -inf but
    for one allowed id at that step draws that id (masking)."""
    value, message = BAD_ROWS[kind]
    draw, calls = Sampler._draw, []

    def poisoned(self, logits, *args, **kw):
        calls.append(1)
        if len(calls) == 3:                     # decode step 2: one bad entry, or a whole row of -inf
            logits[3, slice(None) if kind == "-inf" else 17] = value
        return draw(self, logits, *args, **kw)

    monkeypatch.setattr(Sampler, "_draw", poisoned)
    s = Sampler(model, proc[0], max_new_tokens=5, stop_token_ids=[])
    with pytest.raises(LogitsError, match=rf"^decode step 2, row 3 \(prompt 1, sample 1\): {message}"):
        s.generate(prompts[:2], n=2, greedy=greedy)

    def masked(self, logits, *args, **kw):
        calls.append(1)
        if len(calls) == 3:
            logits[3] = float("-inf")
            logits[3, 17] = 0.0
        return draw(self, logits, *args, **kw)

    calls.clear()
    monkeypatch.setattr(Sampler, "_draw", masked)
    outs = s.generate(prompts[:2], n=2, greedy=greedy)
    assert outs[1][1].ids[2] == 17 and outs[1][1].logprobs[2] == 0.0


def test_bad_prompts_raise(model, proc, prompts):
    s = Sampler(model, proc[0], max_new_tokens=2)
    p = prompts[0]
    with pytest.raises(ValueError, match="placeholder"):
        s.generate([SimpleNamespace(input_ids=p.input_ids, pixel_values=None, image_grid_thw=None)])
    image_at = int((p.input_ids == model.config.image_token_id).nonzero()[0])
    cut = torch.cat([p.input_ids[:image_at], p.input_ids[image_at + 2:]])        # two pads short
    with pytest.raises(ValueError, match="placeholder tokens"):
        s.generate([SimpleNamespace(input_ids=cut, pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw)])


def test_attention_implementations(model, proc, prompts):
    """A policy loaded with flash-attention (vlm.load_model on CUDA) cannot take 4-D masks:
    generate runs it under sdpa and restores its setting. Stand-in: a registered attention
    function that fails if called."""
    from transformers import AttentionInterface

    def refuse(*args, **kwargs):
        raise AssertionError("the sampler ran the policy with its mask-less attention")

    AttentionInterface.register("no_4d_masks", refuse)
    want = [o[0].ids for o in Sampler(model, proc[0], max_new_tokens=4).generate(prompts[:2], greedy=True)]
    model.set_attn_implementation("no_4d_masks")
    try:
        got = [o[0].ids for o in Sampler(model, proc[0], max_new_tokens=4).generate(prompts[:2], greedy=True)]
        assert model.config._attn_implementation == "no_4d_masks"
        model.set_attn_implementation("eager")          # eager attention too runs under sdpa for the call
        assert [o[0].ids for o in Sampler(model, proc[0], max_new_tokens=4).generate(prompts[:2], greedy=True)] == want
    finally:
        model.set_attn_implementation("sdpa")
    assert got == want


def test_plain_causal_lm(proc):
    """A text-only causal LM (Qwen2): 1-D positions, left padding, same greedy ids as generate."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = proc[0]
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    lm = spice(Qwen2ForCausalLM(cfg)).eval()
    batch = [tok.encode(t, add_special_tokens=False) for t in ("a b c d e f g h", "hello", "one two three")]
    s = Sampler(lm, tok, max_new_tokens=MAX_NEW)
    ours = [o[0].ids for o in s.generate(batch, greedy=True)]
    ref = hf_generate(lm, tok, [SimpleNamespace(input_ids=torch.tensor(b), pixel_values=None) for b in batch], s)
    assert ours == ref
    assert [len(r) for r in s.generate(batch, n=2)] == [2, 2, 2]


def test_sampling_mode_without_fsdp(model):
    model.train()
    with sampling_mode(model) as m:
        assert m is model and not model.training and not torch.is_grad_enabled()
    assert model.training and torch.is_grad_enabled()
    model.eval()


class _Policy(torch.nn.Module):
    """The training root, as vlm.PolicyLogProb: FSDP's root wraps the HF model, while the
    sampler calls the HF model inside it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, p):
        if p is None:                      # sampling_mode's no-op call, as PolicyLogProb
            return None
        ids = p.input_ids[None]
        return self.model(input_ids=ids, pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw,
                          mm_token_type_ids=(ids == self.model.config.image_token_id).int()).logits.float().mean()


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")     # the training forward's logits view
def test_sampling_mode_fsdp2_single_process(proc, prompts):
    """FSDP2 on a 1-process gloo group, sharded like vlm.apply_fsdp (layers, vision blocks, then
    a wrapping root), rollout before the first training forward: unsharded inside (same greedy
    ids as the plain model), sharded DTensors after, and training works; then a second round."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    ref_model = spice(vlm.load_model("tiny")).eval()
    want = [o[0].ids for o in Sampler(ref_model, proc[0], max_new_tokens=6).generate(prompts[:2], greedy=True)]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = spice(vlm.load_model("tiny"))
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.language_model.layers:
            fully_shard(layer, mesh=mesh)
        for block in model.model.visual.blocks:
            fully_shard(block, mesh=mesh)
        policy = fully_shard(_Policy(model), mesh=mesh)
        policy.train()
        sampler = Sampler(model, proc[0], max_new_tokens=6)
        static = Sampler(model, proc[0], max_new_tokens=6, decode="static")
        ctx = policy._get_fsdp_state()._state_ctx
        for _ in range(2):
            with sampling_mode(policy):
                assert not policy.training
                assert not any(isinstance(p, DTensor) for p in policy.parameters())     # unsharded
                got = [o[0].ids for o in sampler.generate(prompts[:2], greedy=True)]
                # the graph decode's step under FSDP2 hooks; the root kept the forward-root role
                # throughout (no layer forked FSDP's streams, which a CUDA graph capture cannot hold)
                assert [o[0].ids for o in static.generate(prompts[:2], greedy=True)] == want
                assert ctx.iter_forward_root is policy._get_fsdp_state()
            assert ctx.iter_forward_root is None
            assert got == want
            assert policy.training and all(isinstance(p, DTensor) for p in policy.parameters())
            policy(prompts[0]).backward()
            assert all(q.grad is not None for q in model.model.language_model.layers[0].parameters())
            policy.zero_grad()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# the lean decode step (extras/lean_step.py) against the transformers forward


def test_lean_step_equals_transformers_forward(model, proc, prompts):
    """Greedy: the same ids, finish reasons and logprobs (to 1e-5) with the lean decode step as with
    the transformers forward, eager and static, image prompts of three sizes and a text-only one, a
    stop token that ends some rows early. The reference attends over a DynamicCache that grows by a
    slot a step, the lean step over a fixed buffer with the slots not written yet masked: fp32 sums in
    another order, logprobs to 2e-5 (1.04e-5 seen)."""
    tok = proc[0]
    batch = prompts + [make_prompt(proc, "A text-only prompt, no screenshot at all.")]
    ref = Sampler(model, tok, max_new_tokens=MAX_NEW, lean=False).generate(batch, n=2, greedy=True)
    stop = [ref[1][0].ids[3]]  # a token the second prompt produces: its rows stop early
    ref = Sampler(model, tok, max_new_tokens=MAX_NEW, lean=False, stop_token_ids=stop).generate(batch, n=2, greedy=True)
    assert any(o.finish_reason == "stop" for r in ref for o in r) and any(o.finish_reason == "length" for r in ref for o in r)
    for mode in ("eager", "static"):
        s = Sampler(model, tok, max_new_tokens=MAX_NEW, lean=True, decode=mode, stop_token_ids=stop)
        ours = s.generate(batch, n=2, greedy=True)
        assert s.stats["lean"] is True
        assert [[o.ids for o in r] for r in ours] == [[o.ids for o in r] for r in ref]
        assert [[o.finish_reason for o in r] for r in ours] == [[o.finish_reason for o in r] for r in ref]
        for ra, rb in zip(ours, ref):
            for oa, ob in zip(ra, rb):
                torch.testing.assert_close(oa.logprobs, ob.logprobs, atol=2e-5, rtol=0)


def test_lean_step_sampled_logprobs_match_full_forward(model, proc, prompts):
    s = Sampler(model, proc[0], max_new_tokens=MAX_NEW, stop_token_ids=[], seed=0, temperature=1.5, lean=True)
    outs = s.generate(prompts[:2], n=2, seeds=[7, 8])
    assert s.stats["lean"] is True
    assert_full_forward_logprobs(model, prompts, outs, 1.5)


def assert_full_forward_logprobs(model, prompts, outs, temperature):
    """Each returned logprob is log_softmax(logits / T) of a full forward over prompt + sampled ids."""
    for p, row in zip(prompts, outs):
        for o in row:
            ids = torch.cat([p.input_ids, torch.tensor(o.ids)])[None]
            with torch.no_grad():
                logits = model(input_ids=ids, pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw,
                               mm_token_type_ids=(ids == model.config.image_token_id).int()).logits[0]
            T = len(p.input_ids)
            full = torch.log_softmax(logits[T - 1:-1].float() / temperature, -1).gather(-1, torch.tensor(o.ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(o.logprobs, full, atol=1e-4, rtol=0)


def test_lean_step_steps_aside_for_what_it_does_not_compute(model, proc, prompts):
    """A forward hook (it could change a module's output) or PEFT adapters (their .weight is the base
    weight alone): the transformers forward runs instead; lean=True then refuses."""
    tok = proc[0]
    assert lean_step.LeanStep.supports(model)
    hook = model.model.language_model.layers[0].mlp.register_forward_hook(lambda m, i, out: out)
    try:
        s = Sampler(model, tok, max_new_tokens=2)
        s.generate(prompts[:1], greedy=True)
        assert s.stats["lean"] is False
        with pytest.raises(ValueError, match="lean=True"):
            Sampler(model, tok, max_new_tokens=2, lean=True).generate(prompts[:1], greedy=True)
    finally:
        hook.remove()
    peft = pytest.importorskip("peft")
    import copy
    adapted = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert not lean_step.LeanStep.supports(adapted.base_model.model)


@pytest.mark.parametrize("layout, grids, row_rows", [("grid", 4, 0), ("auto", 4, 0), ("split", 2, 2), ("rows", 0, 7)])
def test_cascade_decode_equals_per_row_decode(model, proc, prompts, layout, grids, row_rows):
    """The lean step's prompt grid (extras/cascade.py: each prompt's KV read once for all its samples,
    the samples' own tokens interleaved after it) against the transformers forward over per-row caches:
    uneven sample counts (3, 1, 2, 1: grid slots no row holds), a stop token that ends every row of three
    prompts early (the grid shrinks to the prompts still live), greedy ids, finish reasons and logprobs. In
    each layout: every prompt on the grid ("auto" too: 7 rows fill more than half of 4 x 3 slots), "split"
    (prompts 0 and 2 fill more than half a grid row of 3: on the grid; the single-sample prompts' rows on
    per-row caches), every row on its own cache."""
    tok = proc[0]
    batch = prompts + [make_prompt(proc, "A text-only prompt, no screenshot at all.")]
    ns = [3, 1, 2, 1]
    ref = Sampler(model, tok, max_new_tokens=MAX_NEW, lean=False).generate(batch, n=ns, greedy=True)
    stop = sorted({r[0].ids[2] for r in ref[:3]} - set(ref[3][0].ids))   # ends prompts 0-2 at their 3rd token
    assert stop, "the fixture's outputs leave no token to stop prompts 0-2 on"
    ref = Sampler(model, tok, max_new_tokens=MAX_NEW, lean=False, stop_token_ids=stop).generate(batch, n=ns, greedy=True)
    s = Sampler(model, tok, max_new_tokens=MAX_NEW, lean=True, decode="eager", stop_token_ids=stop, cascade=layout)
    ours = s.generate(batch, n=ns, greedy=True)
    assert s.stats["cascade_grids"][0] == grids and s.stats["cascade_row_rows"][0] == row_rows
    if layout == "grid":
        assert s.stats["cascade_grids"][-1] <= 2     # the grid shrank
    if layout == "rows":
        assert s.stats["cascade_row_rows"][-1] <= 4  # the stopped rows left the per-row caches
    _assert_same(ours, ref, atol=1e-5)


@pytest.mark.parametrize("counts, layout", [([4, 4], "grid"), ([3, 1, 2, 1], "grid"), ([8, 1, 1, 1], "rows"),
                                           ([16, 1, 1, 1, 1, 1, 1, 1], "rows")])
def test_cascade_auto_picks_the_layout_by_occupancy(counts, layout):
    """auto: the grid when the rows fill more than half of its prompts x largest-group slots, else per-row
    caches (one prompt of 8 samples beside seven of 1: 15 rows on 64 slots)."""
    lean = SimpleNamespace(nq=2, nkv=1, D=4)
    U, K0 = len(counts), 3
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(U, 1, K0, 4), values=torch.zeros(U, 1, K0, 4))])
    rows = [u for u, c in enumerate(counts) for _ in range(c)]
    dec = cascade.CascadeDecode(lean, cache, torch.ones(U, K0, dtype=torch.bool), rows, [K0] * U, 2)
    assert (dec.grids[0], dec.row_rows[0]) == ((U, 0) if layout == "grid" else (0, len(rows)))


def test_cascade_sampled_logprobs_match_full_forward(model, proc, prompts):
    """Sampled at temperature 1.5 with uneven counts: each returned logprob is log_softmax(logits / T) of
    a full forward over prompt + sampled ids (the trainer's distribution), on the prompt grid and on a
    per-row cache in the same step."""
    s = Sampler(model, proc[0], max_new_tokens=MAX_NEW, stop_token_ids=[], seed=0, temperature=1.5, lean=True,
                cascade="split")
    outs = s.generate(prompts[:2], n=[3, 1], seeds=[7, 8])
    assert s.stats["cascade_grids"] == [1] and s.stats["cascade_row_rows"] == [1]   # 3 samples: grid; 1: its own row
    assert_full_forward_logprobs(model, prompts, outs, 1.5)

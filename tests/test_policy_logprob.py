"""The trainer's log-prob forward (vlm.PolicyLogProb + vlm.collate_sequences) must score exactly
the positions the sampler generated with: Qwen2.5-VL's 3-D mrope positions, also for prompts
with two screenshots and under right padding in a batch (docs/method.md §11). A regression test: without
mm_token_type_ids transformers falls back to 1-D positions and the gap reached several nats."""
import numpy as np
import pytest
import torch
from PIL import Image

import chat
import dataset
import gui
import vlm
from extras.shared_prompt import collate_shared, prompt_heads
from sampler import Sampler
from vlm import PolicyLogProb, collate_sequences, sampling_mode


def _logp_entropy_grads(policy, batch):
    """(log-probs, entropies, {parameter name: gradient}) of logp.sum() + 0.3 entropy.sum() on batch."""
    policy.model.zero_grad()
    logp, ent = policy(batch, return_entropy=True)
    (logp.sum() + 0.3 * ent.sum()).backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters()
                                         if p.grad is not None}


def _assert_same_forward(policy, batch, other, atol, vision=True):
    """Two batches of the same rows score the same: log-probs and entropies to atol, every gradient
    (the vision tower's included, unless not vision) to 1e-5 / 1e-4 relative. Returns batch's log-probs."""
    (lp1, e1, g1), (lp2, e2, g2) = _logp_entropy_grads(policy, batch), _logp_entropy_grads(policy, other)
    torch.testing.assert_close(lp2, lp1, atol=atol, rtol=1e-5)
    torch.testing.assert_close(e2, e1, atol=atol, rtol=1e-5)
    assert g1.keys() == g2.keys() and any("visual" in n for n in g1) == vision
    for n in g1:
        torch.testing.assert_close(g2[n], g1[n], atol=1e-5, rtol=1e-4, msg=n)
    return lp1


def test_trainer_logp_equals_sampler_logp_on_two_image_prompts():
    tok, ip = vlm.load_processor()
    torch.manual_seed(0)
    model = vlm.load_model("tiny")
    with torch.no_grad():  # a sharper random model, so positions visibly change the logits
        for p in model.model.language_model.parameters():
            p.mul_(8.0) if p.dim() > 1 else None
    eps = dataset.load_episodes("data/miniwob/test.jsonl", limit=12)
    prompts = []
    for ep in [e for e in eps if len(e.steps) > 1][:3]:
        shots = [dataset.load_screenshot(s) for s in ep.steps[:2]]
        hist = [gui.expert_response(ep.steps[0], shots[0].size, thought=ep.steps[0].thought)]
        prompts.append(chat.build_prompt(tok, ip, chat.PromptSpec(), goal=ep.goal, screenshots=shots, history=hist,
                                        elements=ep.steps[1].elements))
    assert all(p.image_grid_thw.shape[0] == 2 for p in prompts)
    sampler = Sampler(model, tok, max_new_tokens=12, stop_token_ids=[])
    with sampling_mode(model):
        outs = sampler.generate(prompts, n=1, seeds=[0, 1, 2])
    policy = PolicyLogProb(model)
    with torch.no_grad():
        batch = collate_sequences(prompts, [o[0].ids for o in outs], tok.pad_token_id)
        logp, _ = policy(batch)  # (N,) over all response tokens, right-padded batch
    sampled = torch.cat([o[0].logprobs for o in outs])
    # the sampler renormalises over non-vision tokens (little mass) and runs another forward path (KV cache,
    # shared prefixes): on this sharpened model the two agree to ~2.5e-3 nats at V = 8,192 (1e-3 at 151,936)
    assert (logp - sampled).abs().max().item() < 5e-3
    # and 1-D positions would have been visibly different (the test can fail)
    with torch.no_grad():
        flat = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"]).last_hidden_state
    assert flat.shape[0] == len(prompts)
    lm = model.lm_head(flat[:, :-1]).float().log_softmax(-1)
    tgt = batch["targets"][:, 1:]
    sel = tgt != -100
    wrong = lm[sel].gather(-1, tgt[sel][:, None])[:, 0]
    assert (wrong - sampled).abs().max().item() > 1e-2


def test_shared_screenshots_encoded_once_same_logp_and_grads():
    """collate_sequences marks repeated screenshots (image_index) and PolicyLogProb encodes each
    distinct one once: log-probs, entropies and every gradient equal those of encoding all."""
    tok, ip = vlm.load_processor(max_pixels=64 * 28 * 28)
    model = vlm.load_model("tiny")
    eps = [e for e in dataset.load_episodes("data/miniwob/test.jsonl", limit=12) if len(e.steps) > 1][:2]
    prompts = []
    rng = np.random.default_rng(0)
    for ep in eps:  # noise screenshots: all four differ (two real MiniWob screens may be identical)
        shots = [Image.fromarray(rng.integers(0, 256, (210, 160, 3), dtype=np.uint8)) for _ in range(2)]
        prompts.append(chat.build_prompt(tok, ip, chat.PromptSpec(), goal=ep.goal, screenshots=shots, history=["x"]))
    rows = [prompts[0], prompts[1], prompts[0], prompts[0]]       # task 0 rolled out 3 times
    batch = collate_sequences(rows, [[101, 102, 103], [104, 105], [106], [107, 108]], tok.pad_token_id)  # plain text ids
    # images in row order: (p0 a, p0 b), (p1 a, p1 b), (p0 a, p0 b), (p0 a, p0 b) -> first occurrences
    assert batch["image_index"].tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    policy = PolicyLogProb(model)
    full = {k: v for k, v in batch.items() if k != "image_index"}
    lp1 = _assert_same_forward(policy, batch, full, atol=1e-5)
    # and the index is used: pointing an image at another screenshot changes the log-probs
    wrong = dict(batch, image_index=torch.tensor([0, 1, 0, 1, 0, 1, 0, 1]))
    with torch.no_grad():
        assert (policy(wrong)[0] - lp1).abs().max() > 1e-4


def test_causal_only_drops_right_padding_masks_only():
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert vlm.causal_only(right) is None
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    gap = torch.tensor([[1, 0, 1, 1]])
    assert vlm.causal_only(left) is left and vlm.causal_only(gap) is gap
    assert vlm.causal_only(None) is None


def test_right_padded_batch_scores_like_each_sequence_alone():
    """PolicyLogProb drops a right-padding mask (vlm.causal_only): the log-probs, entropies and
    gradients of a padded batch with screenshots equal those of each sequence scored on its own,
    and those of the model run with the padding mask (the dense masked attention)."""
    tok, ip = vlm.load_processor(max_pixels=64 * 28 * 28)
    torch.manual_seed(0)
    model = vlm.load_model("tiny")
    rng = np.random.default_rng(1)

    def shots(k):
        return [Image.fromarray(rng.integers(0, 256, (210, 160, 3), dtype=np.uint8)) for _ in range(k)]
    prompts = [chat.build_prompt(tok, ip, chat.PromptSpec(), goal=g, history=h, screenshots=shots(len(h) + 1))
               for g, h in (("click the OK button", []), ("type hello into the box", ["x"]))]
    responses = [[101, 102, 103, 104, 105, 106, 107], [108, 109]]    # lengths differ: row 1 is padded
    policy = PolicyLogProb(model)
    batch = collate_sequences(prompts, responses, tok.pad_token_id)
    assert (batch["attention_mask"] == 0).any()                                    # really padded
    assert vlm.causal_only(batch["attention_mask"]) is None
    lp, ent, grads = _logp_entropy_grads(policy, batch)
    alone = [_logp_entropy_grads(policy, collate_sequences([p], [r], tok.pad_token_id)) for p, r in zip(prompts, responses)]
    torch.testing.assert_close(lp, torch.cat([a[0] for a in alone]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, torch.cat([a[1] for a in alone]), atol=1e-5, rtol=1e-5)
    for n, g in grads.items():
        torch.testing.assert_close(g, alone[0][2][n] + alone[1][2][n], atol=1e-5, rtol=1e-4, msg=n)
    # the dense masked path (what PolicyLogProb ran before) gives the same log-probs
    with torch.no_grad():
        h = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
                        mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int()).last_hidden_state
        tgt = batch["targets"][:, 1:]
        sel = tgt != -100
        masked = model.lm_head(h[:, :-1][sel]).float().log_softmax(-1).gather(-1, tgt[sel][:, None])[:, 0]
    torch.testing.assert_close(lp, masked, atol=1e-5, rtol=1e-5)


def test_prompt_heads_by_hand():
    """Keys X = 1 2 3 4 (rows 0, 2), Y = 1 2 3 5 6 (row 1), Z = 7 8 (row 3), responses of 2 tokens.
    Counting tokens only (key_cost 0): X alone costs 4 + 2 x 2 = 8, Y alone 5 + 2 = 7; X and Y under
    their 3-token common head 3 + 2 x (1 + 2) + (2 + 2) = 13 < 15, so they join; Z shares nothing."""
    X, Y, Z = [1, 2, 3, 4], [1, 2, 3, 5, 6], [7, 8]
    keys, runs, lens = [X, Y, X, Z], [[], [], [], []], [2, 2, 2, 2]
    assert prompt_heads(keys, runs, lens, key_cost=0.0) == ([0, 0, 0, 1], [0, 3], [3, 2])
    # when attention is dear (key_cost 1: the tails' keys cost as much as tokens) X + Y = 81.5 > 40 + 33.5: apart
    assert prompt_heads(keys, runs, lens, key_cost=1.0) == ([0, 1, 0, 2], [0, 1, 3], [4, 5, 2])
    # a head never ends inside an image run: a common prefix of 4 inside the run [2, 6) is cut back to 2
    A, B = [1, 2, 9, 9, 9, 9, 3], [1, 2, 9, 9, 8, 8, 4]
    assert prompt_heads([A, B], [[(2, 6)], [(2, 6)]], [1, 1], key_cost=0.0)[2] == [2]


def test_shared_prompt_heads_same_logp_entropy_and_grads():
    """extras/shared_prompt.py's collate_shared + PolicyLogProb: each head once, then the tails on its
    cache rows. Rows: one prompt three times (its head is the whole prompt: tails are responses), two
    prompts that share the goal and first screenshot and differ from the second (a head ending before
    an image; that image in the tails), and a prompt of its own. Log-probs, entropies and every
    gradient equal the plain forward's."""
    tok, ip = vlm.load_processor(max_pixels=64 * 28 * 28)
    torch.manual_seed(0)
    model = vlm.load_model("tiny")
    rng = np.random.default_rng(2)
    s1, s2, s3, s4 = [Image.fromarray(rng.integers(0, 256, (210, 160, 3), dtype=np.uint8)) for _ in range(4)]
    goal, spec = "click the OK button", chat.PromptSpec(system_prompt="short")  # the long one would be the head
    same = chat.build_prompt(tok, ip, spec, goal="select the red item", history=[], screenshots=[s1])
    a = chat.build_prompt(tok, ip, spec, goal=goal, history=["x"], screenshots=[s1, s2])
    b = chat.build_prompt(tok, ip, spec, goal=goal, history=["x"], screenshots=[s1, s3])
    alone = chat.build_prompt(tok, ip, spec, goal="type hello", history=[], screenshots=[s4])
    rows = [same, a, same, b, alone, same]
    responses = [[101, 102, 103], [104, 105, 106, 107], [108], [109, 110], [111, 112, 113, 114, 115], [116, 117]]
    img = model.config.image_token_id
    plain = collate_sequences(rows, responses, tok.pad_token_id)
    shared = collate_shared(rows, responses, tok.pad_token_id, img)
    hr, hl = shared["head_of_row"].tolist(), shared["head_len"].tolist()
    assert hr[0] == hr[2] == hr[5] and hl[hr[0]] == len(same.input_ids)        # whole prompt, run once
    assert hr[1] == hr[3] != hr[0] and hr[4] not in (hr[0], hr[1])
    second = (a.input_ids == img).nonzero().flatten()
    run2 = int(second[(torch.diff(second, prepend=second[:1] - 1) > 1).nonzero().flatten()[-1]])  # 2nd image start
    assert hl[hr[1]] == run2 and not (a.input_ids[:run2] != b.input_ids[:run2]).any()
    assert len(hl) == 3 and len(shared["image_start"]) == 3 + 2 + 2 + 1          # three heads; every image listed
    policy = PolicyLogProb(model)
    assert "hidden_at_targets" not in plain and "hidden_at_targets" in shared  # the shared batch names its reader
    lp1 = _assert_same_forward(policy, plain, shared, atol=2e-5)
    # the heads are used: giving row 3 the head of row 0 changes its log-probs
    wrong = dict(shared, head_of_row=torch.tensor([hr[0], hr[1], hr[0], hr[0], hr[4], hr[0]]))
    with torch.no_grad():
        assert (policy(wrong)[0] - lp1).abs().max() > 1e-4
    # a batch with images needs the image token id; activation checkpointing cannot share
    with pytest.raises(ValueError, match="image_token_id"):
        collate_shared(rows, responses, tok.pad_token_id)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    try:
        with pytest.raises(ValueError, match="checkpointing"):
            policy.train()
            policy(shared)
    finally:
        model.activation_checkpointing_disable()


def test_shared_prompt_heads_text_only_prefix_prompts():
    """Text prompts (1-D positions), one a strict prefix of another (its tail is its response alone),
    an empty response, a prompt of its own: the shared forward scores like the plain one."""
    from types import SimpleNamespace
    torch.manual_seed(1)
    model = vlm.load_model("tiny")
    g = torch.Generator().manual_seed(3)
    base = torch.randint(100, 600, (40,), generator=g)
    texts = [base, torch.cat([base, torch.randint(100, 600, (7,), generator=g)]), base,
             torch.randint(100, 600, (25,), generator=g)]
    rows = [SimpleNamespace(input_ids=t, pixel_values=None, image_grid_thw=None) for t in texts]
    responses = [[101, 102, 103], [104, 105], [], [106, 107, 108, 109]]
    plain = collate_sequences(rows, responses, 0)
    shared = collate_shared(rows, responses, 0)
    hr, hl = shared["head_of_row"].tolist(), shared["head_len"].tolist()
    assert hr[0] == hr[1] == hr[2] != hr[3] and hl[hr[0]] == 40 and hl[hr[3]] == 25
    policy = PolicyLogProb(model)
    assert _assert_same_forward(policy, plain, shared, atol=2e-5, vision=False).numel() == 9
    wrong = dict(shared, head_of_row=torch.tensor([hr[3], hr[0], hr[0], hr[3]]), head_len=torch.tensor(hl))
    with torch.no_grad():  # the shared path ran: rows on another prompt's head score otherwise
        assert (policy(wrong)[0] - policy(plain)[0]).abs().max() > 1e-4


def test_collate_sequences_layout_by_hand():
    """Two text rows, pad id 0, the second response ending in a sampled 0: right padding, targets
    only on the response positions (-100 elsewhere), and the sampled 0 kept as a target (padding is
    masked by position, never by the pad id)."""
    from types import SimpleNamespace
    rows = [SimpleNamespace(input_ids=torch.tensor(ids, dtype=torch.int32), pixel_values=None, image_grid_thw=None)
            for ids in ([5, 6, 7], [1])]
    batch = collate_sequences(rows, [[8, 9], [2, 0]], 0)
    assert sorted(batch) == ["attention_mask", "input_ids", "targets"]  # no images: no pixel keys
    assert all(v.dtype == torch.long and v.shape == (2, 5) for v in batch.values())
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [1, 2, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["targets"].tolist() == [[-100, -100, -100, 8, 9], [-100, 2, 0, -100, -100]]

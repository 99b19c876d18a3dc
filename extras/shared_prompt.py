"""The shared-prompt forward (--share-prompts): rows of a micro-batch that share a prompt head run it once.

A CPU speed-up of the trainer's log-prob forwards, off the RL path a learner reads: train_semionline.py
imports this module only when --share-prompts resolves to on (auto: on on CPU without
--gradient-checkpointing), and then collates with `collate_shared` instead of vlm.collate_sequences.
The log-probs, the entropies and every gradient are the plain forward's (to ~1e-5: the same math,
another summation order; tests/test_policy_logprob.py).

1. `collate_shared`: the plain batch (vlm.collate_sequences) plus the heads its rows share
   (`prompt_heads`, chosen by a cost model of the CPU forward, KEY_COST) and the forward that reads them.
2. `hidden_at_targets`, that forward (vlm.PolicyLogProb calls it for such a batch): two decoder calls,
   the H heads once (KV cache kept), then every row's tail (the rest of its prompt, then its response)
   on a copy of its head's cache rows. Prefix Grouper's shared-prefix forward (Liu et al., 2025).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from vlm import PolicyLogProb, cache_attention_mask, collate_sequences, image_digests, image_runs

KEY_COST = 1 / 256  # attention per key as a fraction of a token's other work (measured, tiny:128x4 on CPU)


# -----------------------------------------------------------------------------
# the batch: which rows share which head


def collate_shared(prompts: list, responses: list[list[int]], pad_id: int,
                   image_token_id: int | None = None) -> dict:
    """vlm.collate_sequences' batch plus its heads: head_of_row (B,), head_rep (H,) (the row whose
    tokens the head is), head_len (H,) int64, image_row and image_start (I,) int64 (each image's row
    and first token), pad_id, and hidden_at_targets, the forward that reads them (vlm.PolicyLogProb
    calls it: the batch and its reader cannot disagree). Needs image_token_id (<|image_pad|>) when a
    prompt has images. Raises ValueError without it."""
    batch = collate_sequences(prompts, responses, pad_id)
    if "pixel_values" in batch and image_token_id is None:
        raise ValueError("collate_shared: prompts with images need image_token_id")
    digests = image_digests(batch) if "pixel_values" in batch else []
    batch.update(_head_fields(prompts, [len(r) for r in responses], digests, pad_id, image_token_id))
    batch["hidden_at_targets"] = hidden_at_targets  # how vlm.PolicyLogProb reads this batch
    return batch


def _head_fields(prompts: list, response_lens: list[int], digests: list[tuple], pad_id: int,
                 image_token_id) -> dict:
    """Each prompt's key (its ids, every image run replaced by its (grid, pixel digest), so same-size
    screenshots differ), its image runs, then prompt_heads. digests: one per image, in row order."""
    keys, runs, image_row, image_start = [], [], [], []
    k = 0  # the next image's index in digests
    for b, p in enumerate(prompts):
        key = p.input_ids.tolist()
        r = image_runs(p.input_ids == image_token_id) if image_token_id is not None else []
        for i, j in r:
            key[i:j] = [digests[k]] * (j - i)
            image_row.append(b)
            image_start.append(i)
            k += 1
        keys.append(key)
        runs.append(r)
    head_of_row, head_rep, head_len = prompt_heads(keys, runs, response_lens)
    out = {"head_of_row": torch.tensor(head_of_row), "head_rep": torch.tensor(head_rep),
           "head_len": torch.tensor(head_len), "pad_id": pad_id}
    if image_row:
        out.update(image_row=torch.tensor(image_row), image_start=torch.tensor(image_start))
    return out


def prompt_heads(keys: list[list], runs: list[list[tuple[int, int]]], response_lens: list[int],
                 key_cost: float = KEY_COST):
    """Group B rows into heads: a head is a prefix that several rows' prompts share, run once.

    keys[b]: row b's prompt as comparable tokens (equal keys = identical prompts, images included);
    runs[b]: its image runs [a, c) (a head never ends inside one: each image lies wholly in a head
    or a tail); response_lens[b]: its response length. Distinct prompts are sorted (prompts with
    long common prefixes become neighbours) and joined greedily while the modelled cost falls: a
    head of h tokens costs h (1 + key_cost h / 2) (causal kernel), a tail of t tokens after it
    t (1 + key_cost (h + t)) (dense masked attention over the head and itself). A prompt alone is
    its own head, whole, so its rows' tails are just their responses: identical prompts always share.
    Returns (head_of_row (B,), head_rep (H,): a row holding each head, head_len (H,)) as lists."""
    distinct: dict[tuple, list[int]] = {}
    for b, k in enumerate(keys):
        distinct.setdefault(tuple(k), []).append(b)
    order = sorted(distinct, key=_sortable)

    def cost(members, h):  # the modelled work of one head of length h over these distinct prompts
        tails = [len(k) - h + response_lens[b] for k in members for b in distinct[k]]
        return h * (1 + key_cost * h / 2) + sum(t * (1 + key_cost * (h + t)) for t in tails)

    def cut(k, h):  # h moved back to the start of an image run it would split
        for a, c in runs[distinct[k][0]]:
            if a < h < c:
                return a
        return h

    groups: list[tuple[list[tuple], int]] = []
    for k in order:
        if groups:
            members, h = groups[-1]
            lcp, first = 0, members[0]
            while lcp < min(h, len(k)) and first[lcp] == k[lcp]:
                lcp += 1
            h2 = cut(k, lcp)
            if h2 > 0 and cost(members + [k], h2) < cost(members, h) + cost([k], len(k)):
                groups[-1] = (members + [k], h2)
                continue
        groups.append(([k], len(k)))
    head_of_row, head_rep, head_len = [0] * len(keys), [], []
    for g, (members, h) in enumerate(groups):
        for k in members:
            for b in distinct[k]:
                head_of_row[b] = g
        head_rep.append(distinct[members[0]][0])
        head_len.append(h)
    return head_of_row, head_rep, head_len


def _sortable(key: tuple) -> tuple:
    """A sort key for prompt keys mixing token ids (int) and image digests (tuple): images first."""
    return tuple((0, t) if isinstance(t, tuple) else (1, (t,)) for t in key)


# -----------------------------------------------------------------------------
# the forward: heads once, then the tails on their heads' cache rows


def hidden_at_targets(policy: PolicyLogProb, batch: dict):
    """vlm.PolicyLogProb.hidden_at_targets for a collate_shared batch (which names this function in its
    field "hidden_at_targets"): the same hidden states before each target (N, H) and targets (N,),
    up to summation order, with each shared prompt head run once. Positions are the full sequences'
    (one get_rope_index over the batch), so every token sees the same positions and keys as in the
    plain forward; gradients reach a head through the copied cache rows (the sum over its tails).
    Raises ValueError under activation checkpointing in training (transformers' checkpointed layers
    drop the cache the tails read) and with an attention that takes no 4-D mask (flash-attn)."""
    model = policy.model
    if policy.training and torch.is_grad_enabled() and model.is_activation_checkpointing:
        raise ValueError("shared-prompt batches need the KV cache, which activation checkpointing "
                         "drops: collate without shared heads")
    attn = model.config.get_text_config()._attn_implementation
    if attn not in ("sdpa", "eager"):
        raise ValueError(f"shared-prompt batches need a 4-D attention mask (sdpa or eager), not {attn}")
    ids, targets = batch["input_ids"], batch["targets"]             # (B, T)
    B, T = ids.shape
    if "image_grid_thw" in batch:   # mrope positions of the full rows, as the plain forward computes them
        img = (ids == model.config.image_token_id).int()  # (B, T): 1 = image token
        pos, _ = model.model.get_rope_index(ids, image_grid_thw=batch["image_grid_thw"],
                                            mm_token_type_ids=img)
        feats = policy._image_features(batch).pooler_output
    else:
        pos, feats = torch.arange(T, device=ids.device).expand(3, B, T), None
    head_h, cache, head_valid, in_head = _heads(model, batch, pos, feats)
    start = batch["head_len"][batch["head_of_row"]]                  # (B,) where each row's tail starts
    tail_h = _tails(model, batch, pos, feats, cache, head_valid, in_head, start)
    # the hidden state before each target: in the head or in the tail, row-major target order
    b, p = (targets[:, 1:] != -100).nonzero(as_tuple=True)         # position p predicts token p + 1
    s, Kh, S = start[b], head_h.shape[1], tail_h.shape[1]
    h = torch.where((p < s)[:, None], head_h[batch["head_of_row"][b], p.clamp(max=Kh - 1)],
                    tail_h[b, (p - s).clamp(min=0, max=S - 1)])     # (N, D)
    return h, targets[b, p + 1]


def _heads(model, batch: dict, pos: torch.Tensor, feats):
    """The H heads, row head_rep[h], tokens [0, head_len[h]), right-padded under the causal kernel,
    KV cache kept. -> (hidden (H, Kh, D), cache, valid (H, Kh) bool, in_head (I,) bool or None:
    which images lie in a head)."""
    head_of_row, head_rep, head_len = batch["head_of_row"], batch["head_rep"], batch["head_len"]
    Kh = int(head_len.max())
    head_valid = torch.arange(Kh, device=head_len.device)[None] < head_len[:, None]  # (H, Kh)
    head_ids = batch["input_ids"][head_rep, :Kh].masked_fill(~head_valid, int(batch["pad_id"]))
    in_head, kw = None, {}
    if feats is not None:  # an image lies wholly in a head or in a tail (a head never splits a run)
        img_row, img_start = batch["image_row"], batch["image_start"]
        in_head = img_start < head_len[head_of_row[img_row]]
        # the head batch's images: those of each head's own row (head_rep) inside it, in head order
        mine = (in_head & (img_row == head_rep[head_of_row[img_row]])).nonzero().flatten()
        mine = mine[torch.argsort(head_of_row[img_row[mine]], stable=True)].tolist()
        if mine:
            kw = dict(mm_encoder_outputs={"image": _Pooled(tuple(feats[i] for i in mine))})
    out = model.model(input_ids=head_ids, position_ids=pos[:, head_rep, :Kh], attention_mask=None,
                      use_cache=True, **kw)
    return out.last_hidden_state, out.cache, head_valid, in_head


def _tails(model, batch: dict, pos: torch.Tensor, feats, cache, head_valid, in_head, start):
    """Every row's tail, tokens [start[b], its length), on a copy of its head's cache rows under a
    (B, 1, S, Kh + S) mask. -> hidden (B, S, D)."""
    ids, head_of_row = batch["input_ids"], batch["head_of_row"]
    B, T = ids.shape
    lengths = batch["attention_mask"].sum(1)                         # (B,) real tokens of each row
    S = max(int((lengths - start).max()), 1)
    j = torch.arange(S, device=ids.device)[None]                    # (1, S)
    src = (start[:, None] + j).clamp(max=T - 1)                     # (B, S) column of each tail token
    tail_valid = j < (lengths - start)[:, None]
    tail_ids = ids.gather(1, src).masked_fill(~tail_valid, int(batch["pad_id"]))
    tail_pos = pos.gather(2, src[None].expand(3, B, S))
    rows = DynamicCache(ddp_cache_data=[(lay.keys[head_of_row], lay.values[head_of_row])
                                        for lay in cache.layers])  # each row: a copy of its head's
    valid = torch.cat([head_valid[head_of_row], tail_valid], dim=1)  # (B, Kh + S)
    kw = {}
    if feats is not None and not bool(in_head.all()):  # the images of the tails, in row order
        tails = tuple(f for f, h in zip(feats, in_head.tolist()) if not h)
        kw = dict(mm_encoder_outputs={"image": _Pooled(tails)})
    return model.model(input_ids=tail_ids, position_ids=tail_pos, cache=rows, use_cache=True,
                       attention_mask=cache_attention_mask(valid, S), **kw).last_hidden_state


class _Pooled:
    """What Qwen2.5-VL's forward reads from mm_encoder_outputs["image"]: per-image features."""

    def __init__(self, pooler_output: tuple):
        self.pooler_output = pooler_output

"""The trainer's batches: sampled responses and their prompts, right-padded into one batch
(`collate_sequences`, the one pad-id rule), and with share_prompts the prompt heads its rows share
(`prompt_heads`, chosen by a cost model of the CPU forward, KEY_COST), each run once by
vlm.PolicyLogProb. Pure torch tensors; no model code.
"""
from __future__ import annotations

import hashlib

import torch


def image_runs(is_img: torch.Tensor) -> list[tuple[int, int]]:
    """is_img (T,) bool: which tokens are image placeholders -> the runs [a, b) they form, in order
    (one per image: each image's <|image_pad|> tokens are contiguous)."""
    zero = torch.zeros(1, dtype=torch.int, device=is_img.device)
    edges = torch.diff(is_img.int(), prepend=zero, append=zero)
    return list(zip((edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()))


def collate_sequences(prompts: list, responses: list[list[int]], pad_id: int, share_prompts: bool = False,
                      image_token_id: int | None = None) -> dict:
    """Right-pad prompt+response sequences into one batch.

    prompts: objects with input_ids (T_i,) int64, pixel_values (P_i, 1176) or None and
    image_grid_thw (I_i, 3) or None (chat.Prompt). responses: the sampled token ids,
    exactly as the sampler produced them (never re-tokenised text). Returns input_ids and
    targets (B, T) int64 (targets = input_ids on response tokens, -100 elsewhere: padding
    is masked by position, never by comparing with pad_id, which may equal EOS),
    attention_mask (B, T) int64, the images concatenated in row order (pixel_values,
    image_grid_thw) and image_index (I,) int64: the first image with the same pixels and grid
    (PolicyLogProb encodes each distinct image once).

    share_prompts: also group the rows into heads (`prompt_heads`): head_of_row (B,), head_rep (H,)
    (the row whose tokens the head is), head_len (H,) int64, image_row and image_start (I,) int64
    (each image's row and first token), pad_id; PolicyLogProb then runs each head once. Needs
    image_token_id (<|image_pad|>) when a prompt has images; raises ValueError without it.
    """
    seqs = [torch.cat([p.input_ids.long(), torch.tensor(r, dtype=torch.long)]) for p, r in zip(prompts, responses)]
    T = max(len(s) for s in seqs)
    B = len(seqs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    targets = torch.full((B, T), -100, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    for b, (s, p) in enumerate(zip(seqs, prompts)):
        input_ids[b, :len(s)] = s
        attention_mask[b, :len(s)] = 1
        targets[b, len(p.input_ids):len(s)] = s[len(p.input_ids):]
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "targets": targets}
    pv = [p.pixel_values for p in prompts if p.pixel_values is not None]
    digests = []  # per image: (grid, pixel digest)
    if pv:
        batch["pixel_values"] = torch.cat(pv)
        batch["image_grid_thw"] = torch.cat([p.image_grid_thw for p in prompts if p.image_grid_thw is not None])
        offs = [0] + batch["image_grid_thw"].prod(-1).cumsum(0).tolist()
        first: dict[tuple, int] = {}
        index = []
        for i, g in enumerate(batch["image_grid_thw"].tolist()):
            px = batch["pixel_values"][offs[i]:offs[i + 1]].detach().cpu().numpy().tobytes()
            digests.append((tuple(g), hashlib.blake2b(px, digest_size=16).digest()))
            index.append(first.setdefault(digests[-1], i))
        batch["image_index"] = torch.tensor(index, dtype=torch.long)
    if share_prompts:
        if pv and image_token_id is None:
            raise ValueError("collate_sequences(share_prompts=True): prompts with images need image_token_id")
        batch.update(_share(prompts, [len(r) for r in responses], digests, pad_id, image_token_id))
    return batch


def _share(prompts: list, response_lens: list[int], digests: list[tuple], pad_id: int, image_token_id) -> dict:
    """The head fields of collate_sequences(..., share_prompts=True): each prompt's key (its ids,
    every image run replaced by its (grid, pixel digest), so same-size screenshots differ), its
    image runs, then prompt_heads. digests: one per image, in row order."""
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


KEY_COST = 1 / 256  # attention per key as a fraction of a token's other work (measured, tiny:128x4 on CPU)


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


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}

"""Prefix sharing in the sampler's prefill (sampler.Sampler(share_prefix=True), the default, so a default
run imports this module when it samples; sampler.py's plain path prefills each prompt whole in one
left-padded forward). Identical prompts (same ids, same pixels) are prefilled once, and distinct prompts
go into a radix tree over their ids whose every node runs once, its children and samples copying its KV
rows: a step's prompts share the system prompt and often the task, so 8 tasks x 8 samples cost 8
prefills of which the common head runs once. An image's placeholders are keyed by its pixels, so
same-size screenshots never count as shared, and a node never splits an image's placeholder run (each
image is encoded in exactly one forward). Only a speed-up: the same positions and masks as the plain
prefill, in other forwards (tests/test_sampler.py compares the tokens and logprobs with the plain path).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache


@dataclass
class Node:
    """A radix-tree node: prefills tokens [start, end) of prompt `rep` once for all below it."""
    start: int
    end: int
    rep: int                       # index of a distinct prompt through this node
    parent: int                    # node index, -1 for a root
    depth: int
    leaf: int                      # distinct prompt that ends here, or -1


def prefix_tree(keys: list[list[int]], runs: list[list[tuple[int, int]]]) -> list[Node]:
    """Radix tree over `keys` (distinct). A node never splits an image's pad run (runs[u]: [a, b) of
    prompt u), so each image is encoded in exactly one forward; every leaf keeps at least its prompt's
    last token (the logits for the first sample come from it)."""
    nodes: list[Node] = []

    def split(members: list[int], start: int, parent: int, depth: int) -> None:
        if len(members) == 1:
            nodes.append(Node(start, len(keys[members[0]]), members[0], parent, depth, members[0]))
            return
        lcp, cap = start, min(len(keys[u]) for u in members) - 1
        first = keys[members[0]]
        while lcp < cap and all(keys[u][lcp] == first[lcp] for u in members):
            lcp += 1
        end = lcp
        for a, b in runs[members[0]]:          # runs before lcp are the same for all members
            if a < end < b:
                end = a
        if end > start:
            nodes.append(Node(start, end, members[0], parent, depth, -1))
            parent, depth = len(nodes) - 1, depth + 1
        # children agree up to lcp inclusive (or end at lcp + 1), so each recursion advances
        groups: dict[tuple, list[int]] = {}
        for u in members:
            groups.setdefault((tuple(keys[u][end:lcp + 1]), len(keys[u]) == lcp + 1), []).append(u)
        for g in groups.values():
            split(g, end, parent, depth)

    split(list(range(len(keys))), 0, -1, 0)
    return nodes


def prompt_key(p) -> list[int]:
    """A prepared prompt's ids with each image's pad tokens replaced by -(1 + a hash of its pixels and
    grid): two prompts share a prefix only where their pixels agree too."""
    key = list(p.ids)
    for a, b, img, thw in p.images:
        h = hashlib.blake2b(img.detach().float().cpu().numpy().tobytes(), digest_size=16)
        h.update(str(thw.tolist()).encode())
        key[a:b] = [-1 - int.from_bytes(h.digest()[:7], "little")] * (b - a)
    return key


def take_rows(cache: DynamicCache, valid: torch.Tensor, idx: torch.Tensor):
    """A new (cache, valid) holding rows idx (repeats allowed: that is how rows are shared), each
    row's valid slots moved to the front, in order, and the slots no row uses dropped: K' = the
    most valid slots of a row. Each tree level pads its segments to the longest one, so without this
    the cache grows by every level's longest segment and decode attention reads mostly masked slots
    (own-history prompts: ~2,000 slots for ~550 real tokens). Exact: a key carries its rotary
    position and the mask says which slots count, so attention does not depend on slot order."""
    idx = idx.to(valid.device)
    v = valid[idx]                                                          # (n, K)
    width = int(v.sum(1).max())
    if width == v.shape[1] and bool(v.all()):                               # already dense
        return DynamicCache(ddp_cache_data=[(l.keys[idx], l.values[idx]) for l in cache.layers]), v
    order = torch.sort((~v).to(torch.uint8), dim=1, stable=True).indices[:, :width]  # valid slots first
    kvs = []
    for l in cache.layers:                                                  # (B, H, K, D) -> (n, H, K', D)
        H, D = l.keys.shape[1], l.keys.shape[3]
        g = order[:, None, :, None].expand(-1, H, -1, D)
        kvs.append((torch.gather(l.keys[idx], 2, g), torch.gather(l.values[idx], 2, g)))
    return DynamicCache(ddp_cache_data=kvs), torch.gather(v, 1, order)


def cat_rows(parts: list[tuple[DynamicCache, torch.Tensor]]):
    """Stack (cache, valid) parts of different lengths K_i along the batch: shorter ones get
    invalid zero slots at the end (masked, finite, so they cannot turn into NaN)."""
    if len(parts) == 1:
        return parts[0]
    K = max(v.shape[1] for _, v in parts)
    kvs = []
    for i in range(len(parts[0][0].layers)):                               # (B_i, H, K_i, D) -> (B, H, K, D)
        kvs.append((torch.cat([F.pad(c.layers[i].keys, (0, 0, 0, K - v.shape[1])) for c, v in parts]),
                    torch.cat([F.pad(c.layers[i].values, (0, 0, 0, K - v.shape[1])) for c, v in parts])))
    valid = torch.cat([F.pad(v, (0, K - v.shape[1])) for _, v in parts])
    return DynamicCache(ddp_cache_data=kvs), valid


def prefill_shared(extend, prompts: list, ns: list[int]):
    """Prefill `prompts` (sampler._Prompt, ns[i] samples each) sharing what they share.
    extend(cache, valid, [(prompt, start, end), ...]) -> (logits (n, V), valid (n, K)) is the Sampler's
    one prefill forward (row i appends tokens [start, end) of its prompt, left-padded).
    Returns (cache: keys/values (U, nkv, K0, D) per layer, one row per distinct prompt; valid (U, K0)
    bool, each row's real slots first; logits (U, V) of each distinct prompt's first generated token;
    row_prompt: the distinct prompt of each of the sum(ns) sample rows, in prompt order; the U distinct
    prompts)."""
    first: dict[tuple, int] = {}
    distinct, keys, row_prompt = [], [], []
    for p, k in zip(prompts, ns):             # identical ids and pixels -> one distinct prompt
        key = prompt_key(p)
        u = first.setdefault(tuple(key), len(distinct))
        if u == len(distinct):
            distinct.append(p)
            keys.append(key)
        row_prompt += [u] * k
    nodes = prefix_tree(keys, [[(a, b) for a, b, _, _ in p.images] for p in distinct])
    cache = valid = None
    row_of: dict[int, int] = {}
    leaves, leaf_ids = [], []
    for d in range(max(n.depth for n in nodes) + 1):       # level by level, each node once
        level = [i for i, n in enumerate(nodes) if n.depth == d]
        if d > 0:    # each node continues from a copy of its parent's rows
            cache, valid = take_rows(cache, valid, torch.tensor([row_of[nodes[i].parent] for i in level]))
        else:
            cache = DynamicCache()
        logits, valid = extend(cache, valid, [(distinct[nodes[i].rep], nodes[i].start, nodes[i].end) for i in level])
        row_of = {i: r for r, i in enumerate(level)}
        ends = [r for r, i in enumerate(level) if nodes[i].leaf >= 0]
        if ends:
            idx = torch.tensor(ends, device=logits.device)
            leaves.append((*take_rows(cache, valid, idx), logits[idx]))
            leaf_ids += [nodes[level[r]].leaf for r in ends]
    cache, valid = cat_rows([(c, v) for c, v, _ in leaves])
    order = torch.tensor(leaf_ids).argsort().to(valid.device)                   # leaf order -> prompt order
    return (DynamicCache(ddp_cache_data=[(l.keys[order], l.values[order]) for l in cache.layers]),
            valid[order], torch.cat([lg for _, _, lg in leaves])[order], row_prompt, distinct)

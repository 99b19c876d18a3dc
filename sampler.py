"""The sampling engine of the rollouts (docs/method.md §5): batched, KV-cached sampling from a
transformers Qwen2.5-VL policy (or any plain causal LM), n samples per prompt, and the token draw.
The policy is lent to it by vlm.sampling_mode (eval, no_grad, FSDP2 unsharded once).

The sampler, in use:

    sampler = Sampler(model, tokenizer, max_new_tokens=512, temperature=1.0, top_p=1.0, seed=0)
    with sampling_mode(model):                       # eval + no_grad; under FSDP2 unshards once
        outs = sampler.generate(prompts, n=8)        # outs[i][j]: SampleOutput of sample j of prompt i
    outs[0][0].ids, outs[0][0].logprobs, outs[0][0].finish_reason

Engine design (what it does that `model.generate` does not):
  1. Shared prefixes are prefilled once: distinct prompts go into a radix tree over their ids (an
     image's placeholders are keyed by its pixels, so same-size screenshots never count as shared);
     each node runs once, children and samples copy its KV rows (8 tasks x 8 samples: 8 prefills).
  2. Rows may hold gaps (left padding of each node's segment, and between prefill and decoded
     tokens): a per-row validity mask (R, K) and an explicit 4-D attention mask handle them
     exactly; a padding query attends to itself only, so no softmax row is empty (no NaN).
  3. Positions are explicit, per prompt on the unpadded ids: 1-D for text LMs, Qwen2.5-VL's 3-D
     mrope positions from the model's own `get_rope_index`; a decoded token's position is (max
     prompt position + 1 + step). The model's cached `rope_deltas` is never read, and is cleared.
  4. `allowed_weights` is the one place where the ban on vision tokens and top-p form the draw's
     allowed set, before anything is normalised, on every path (docs/method.md §11). The logprobs returned are of the policy the trainer
     scores (vlm.PolicyLogProb): log_softmax(logits / temperature) over the whole vocabulary, one
     fp32 value per returned id, so that pi_old taken from them (--old-logp sampler) is the
     trainer's pi_old; the draw's ban and nucleus change which ids come out, not their scores. The
     trainer trains on `SampleOutput.ids` as returned.
  5. Decoding writes into a preallocated KV buffer (gpt-fast's static cache: nothing is
     re-concatenated per step), and rows that stop leave the batch and the cache that step.
  6. Same inputs + same seed -> same samples. Across batch compositions greedy ids agree; sampled
     ids may not (last-bit logit differences move a draw across a CDF boundary, as in vLLM).
  7. On CUDA one decode step is a CUDA graph, captured once per batch-size bucket and replayed
     (`decode="graph"`, the default there; gpt-fast's decode, without torch.compile): a step of the
     eager loop launches some 15 kernels per layer from Python, and at 64 rows a small model waits
     on those launches, not on memory. A graph needs fixed addresses, shapes and no host sync, so
     `StaticDecode` keeps every decode input in a fixed buffer updated in place (KV cache, validity
     mask, positions, ids, the write slot as a tensor) and runs the rows in power-of-two buckets:
     a stopped row stays as a dead row until the live ones fit the next smaller bucket. The token
     draw stays eager (it reads a host-side random stream per row). `decode="static"` runs the same
     step without capture (how CPU tests check it against the eager loop, the reference).
  8. On CPU a decode step of a Qwen2-style decoder runs `LeanStep`: the same math on the model's
     own weights with q|k|v and gate|up fused into one GEMM each and one attention call per layer,
     about a third of the transformers forward's ops (what a one-token CPU step is bound by). The
     transformers forward stays the prefill and the reference (`lean=False`; tested equal).
  9. The lean eager decode attends over a prompt grid (`CascadeDecode`; cascade attention): the
     samples of one prompt share its prefill KV, read ONCE per step for all of them in one GEMM per
     (prompt, KV head), their own tokens interleaved after it and masked so each row sees its own.
     A row-per-sample cache reads the prompt's K0 keys once per sample (n = 8 rollouts: 8x), and a
     decode step of a small model is bound by that read. When the groups are uneven (after step 0
     semi-online rollouts split by history) and fill at most half the grid's slots, the rows decode on
     per-row caches instead (an empty slot still costs attention); the GEMMs run on the live rows only.
     Static and graph decode keep the per-row layout (fixed buffers, design note 7).
The decode states of notes 5 and 7-9 live in decode.py; this file prefills, loops and draws.
"""
from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache

from decode import CASCADE_LAYOUTS, CascadeDecode, EagerDecode, LeanStep, SlotLayer, StaticDecode, bucket
from cli import check_temperature  # the one temperature rule, the flags' too
from vlm import STOP_TOKENS, VISION_TOKENS, cache_attention_mask, image_runs, pad_token_id

DECODE_MODES = ("auto", "eager", "static", "graph")  # Sampler(decode=...): engine design note 7

# -----------------------------------------------------------------------------
# the sampler engine: KV cache, prefix sharing, sampling



@dataclass
class SampleOutput:
    ids: list[int]              # generated ids; ends with the stop id when finish_reason == "stop"
    text: str                   # ids decoded with special tokens skipped (for reward/history only)
    logprobs: torch.Tensor      # (L,) fp32 log-prob of each id under the policy: log_softmax(logits / T), full vocabulary
    finish_reason: str          # "stop" | "length"
    prompt_index: int


@dataclass
class _Prompt:
    """One distinct prompt, validated, with everything the prefill needs."""
    ids: list[int]
    key: list[int]                 # ids, each image's pad tokens replaced by -(1 + its pixel class)
    pos: torch.Tensor              # (3, T) mrope positions, or (T,) for a text LM
    next_pos: int                  # position of the first generated token
    images: list[tuple[int, int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # images: (start, end) of the pad-token run, pixel rows (P_i, C), grid thw (3,)


@dataclass
class _Node:
    """A radix-tree node: prefills tokens [start, end) of prompt `rep` once for all below it."""
    start: int
    end: int
    rep: int                       # index of a distinct prompt through this node
    parent: int                    # node index, -1 for a root
    depth: int
    leaf: int                      # distinct prompt that ends here, or -1


def _prefix_tree(keys: list[list[int]], runs: list[list[tuple[int, int]]], share: bool) -> list[_Node]:
    """Radix tree over `keys` (distinct). A node never splits an image's pad run, so each image
    is encoded in exactly one forward; every leaf keeps at least its prompt's last token (the
    logits for the first sample come from it)."""
    nodes: list[_Node] = []

    def split(members: list[int], start: int, parent: int, depth: int) -> None:
        if len(members) == 1 or not share:
            for u in members:
                nodes.append(_Node(start, len(keys[u]), u, parent, depth, u))
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
            nodes.append(_Node(start, end, members[0], parent, depth, -1))
            parent, depth = len(nodes) - 1, depth + 1
        # children agree up to lcp inclusive (or end at lcp + 1), so each recursion advances
        groups: dict[tuple, list[int]] = {}
        for u in members:
            groups.setdefault((tuple(keys[u][end:lcp + 1]), len(keys[u]) == lcp + 1), []).append(u)
        for g in groups.values():
            split(g, end, parent, depth)

    split(list(range(len(keys))), 0, -1, 0)
    return nodes


def _take_rows(cache: DynamicCache, valid: torch.Tensor, idx: torch.Tensor):
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


def _cat_rows(parts: list[tuple[DynamicCache, torch.Tensor]]):
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


class Sampler:
    """Batched KV-cached sampler; see the module docstring for the design.

    stop_token_ids: None -> <|im_end|> and <|endoftext|> (those the tokenizer has, else its
    eos); [] -> never stop (every sample runs max_new_tokens). seed: a torch.Generator on the
    model's device seeded with it is used unless generate() gets one; None -> global RNG.
    share_prefix=False prefills every sample's prompt separately (the reference path).
    decode (engine design note 7): "eager" (the reference: rows leave the batch as they stop),
    "static" (fixed buffers and buckets, uncaptured), "graph" (static, each bucket's step a CUDA
    graph; CUDA only), "auto" = graph on CUDA, else eager. lean (engine design note 8): decode
    steps run LeanStep on the model's weights instead of the transformers forward; None = on for a
    CPU model it supports (checked each call: adapters, hooks), True requires support (generate
    raises ValueError otherwise), False never; stats["lean"] says what a call ran. cascade (design note
    9, lean eager decode): "auto" the shared-KV grid when the rows fill more than half of its slots,
    else per-row caches; "grid" every prompt on it, "split" the prompts filling more than half a grid
    row, "rows" none (the per-row reference the benchmark compares with). Raises ValueError
    on an unknown mode or graph without CUDA. After each call `stats` holds prefill/decode token counts and times
    (time_graph_capture: seconds spent capturing, inside time_decode)."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 512, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None, seed: int | None = None,
                 share_prefix: bool = True, decode: str = "auto", lean: bool | None = None, cascade: str = "auto"):
        self.model, self.tokenizer = model, tokenizer
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p  # validated
        self.share_prefix = share_prefix
        self.device = next(model.parameters()).device
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        if decode == "graph" and self.device.type != "cuda":
            raise ValueError(f"decode='graph' needs a CUDA model (this one is on {self.device}); "
                             "'static' runs the same step uncaptured")
        self.decode = ("graph" if self.device.type == "cuda" else "eager") if decode == "auto" else decode
        self.lean_arg = lean
        if cascade not in CASCADE_LAYOUTS:
            raise ValueError(f"cascade must be one of {CASCADE_LAYOUTS}, got {cascade!r}")
        self.cascade = cascade
        self.lean = (self.device.type == "cpu") if lean is None else bool(lean)  # and supported, per call
        self._lean = None                    # the lean step of the call in progress
        cfg = model.config
        text_cfg = cfg.get_text_config()
        if "sliding_attention" in (getattr(text_cfg, "layer_types", None) or []):
            raise ValueError("Sampler supports full-attention models only (no sliding-window layers)")
        # Qwen2.5-VL: 3-D rope positions come from the model's own get_rope_index
        self.rope_index = getattr(getattr(model, "model", None), "get_rope_index", None)
        self.image_token_id = getattr(cfg, "image_token_id", None)
        self.video_token_id = getattr(cfg, "video_token_id", None)
        self.merge = getattr(getattr(cfg, "vision_config", None), "spatial_merge_size", 2)
        vocab = tokenizer.get_vocab()
        banned = {vocab[t] for t in VISION_TOKENS if t in vocab}
        banned |= {getattr(cfg, a, None) for a in ("image_token_id", "video_token_id",
                                                   "vision_start_token_id", "vision_end_token_id")}
        V = text_cfg.vocab_size
        self.banned_ids = torch.tensor(sorted(i for i in banned if i is not None and i < V), dtype=torch.long)
        if stop_token_ids is None:
            stop_token_ids = [vocab[t] for t in STOP_TOKENS if t in vocab] or [tokenizer.eos_token_id]
        self.stop_token_ids = [int(i) for i in stop_token_ids]
        self.pad_id = pad_token_id(tokenizer)                                 # pads are masked; any real id works
        self.generator = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        self.stats: dict = {}

    # temperature and top_p are checked whenever they are set (a caller that changes them for one call,
    # as eval_sop's sampled plays do, meets the same rule as the constructor and the trainer's flags)
    @property
    def temperature(self) -> float:
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        check_temperature(value)
        self._temperature = float(value)

    @property
    def top_p(self) -> float:
        return self._top_p

    @top_p.setter
    def top_p(self, value: float) -> None:
        check_top_p(value)
        self._top_p = float(value)

    # --- prompts

    def _prepare(self, p) -> _Prompt:
        """Validate one prompt (Prompt-like object, dict, or 1-D ids) and compute its positions."""
        if isinstance(p, (torch.Tensor, list, tuple)):
            ids, pv, thw = torch.as_tensor(p), None, None
        else:
            get = p.get if isinstance(p, Mapping) else lambda k: getattr(p, k, None)
            ids, pv, thw = torch.as_tensor(get("input_ids")), get("pixel_values"), get("image_grid_thw")
        ids = ids.reshape(-1).long().cpu()
        T = ids.numel()
        if T == 0:
            raise ValueError("empty prompt")
        if self.video_token_id is not None and bool((ids == self.video_token_id).any()):
            raise ValueError("video prompts are not supported by the sampler")
        is_img = ids == self.image_token_id if self.image_token_id is not None else torch.zeros_like(ids, dtype=torch.bool)
        runs = image_runs(is_img)
        n_img = 0 if thw is None else int(thw.shape[0])
        if len(runs) != n_img or (n_img and pv is None):
            raise ValueError(f"prompt has {len(runs)} image placeholder runs but {n_img} image_grid_thw rows "
                             f"(pixel_values {'missing' if pv is None else tuple(pv.shape)}): placeholders and pixels disagree")
        key, images = ids.tolist(), []
        if n_img:
            thw = torch.as_tensor(thw).long().cpu()
            patches = thw.prod(-1)
            if int(patches.sum()) != pv.shape[0]:
                raise ValueError(f"pixel_values has {pv.shape[0]} rows, image_grid_thw needs {int(patches.sum())}")
            offs = [0] + patches.cumsum(0).tolist()
            for i, (a, b) in enumerate(runs):
                if b - a != int(patches[i]) // self.merge ** 2:
                    raise ValueError(f"image {i}: {b - a} placeholder tokens, grid {thw[i].tolist()} needs "
                                     f"{int(patches[i]) // self.merge ** 2}")
                img = pv[offs[i]:offs[i + 1]]
                images.append((a, b, img, thw[i]))
                if self.share_prefix:     # key the pads by the pixels: same-size screenshots differ
                    h = hashlib.blake2b(img.detach().float().cpu().numpy().tobytes(), digest_size=16)
                    h.update(str(thw[i].tolist()).encode())
                    key[a:b] = [-1 - int.from_bytes(h.digest()[:7], "little")] * (b - a)
        if self.rope_index is not None:
            if n_img:
                mm_types = is_img.int()[None]                                # (1, T): 1 = image token
                pos, _ = self.rope_index(ids[None], mm_token_type_ids=mm_types, image_grid_thw=thw)
                pos = pos[:, 0].cpu()                                        # (3, T)
            else:
                pos = torch.arange(T).expand(3, T)
            next_pos = int(pos.max()) + 1
        else:
            pos, next_pos = torch.arange(T), T
        return _Prompt(ids.tolist(), key, pos, next_pos, images)

    # --- model calls

    def _forward(self, cache, ids, pos, mask, pixel_values=None, image_grid_thw=None):
        """One model call appending ids (R, S) at positions pos ((3, R, S) or (R, S)) to the cache
        rows, attention mask (R, 1, S, K) bool; returns the next-token logits (R, V). A decode step
        (S = 1, no images) takes the lean step when it is on (engine design note 8)."""
        dev = self.device
        if self._lean is not None and ids.shape[1] == 1 and pixel_values is None:
            return self._lean(cache, ids.to(dev), pos.to(dev), mask)
        if self.model.config.get_text_config()._attn_implementation == "eager":    # additive mask
            dtype = next(self.model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=dev).masked_fill(~mask, torch.finfo(dtype).min)
        kw = {}
        if pixel_values is not None:
            kw = dict(pixel_values=pixel_values.to(dev), image_grid_thw=image_grid_thw.to(dev))
        out = self.model(input_ids=ids.to(dev), attention_mask=mask, position_ids=pos.to(dev), cache=cache,
                         use_cache=True, logits_to_keep=1, **kw)
        return out.logits[:, -1]

    def _extend(self, cache, valid, segs: list[tuple[_Prompt, int, int]]):
        """One prefill forward: row r appends tokens [s, e) of its prompt, left-padded.
        Returns (logits (R, V), valid (R, K))."""
        R, S = len(segs), max(e - s for _, s, e in segs)
        ids = torch.full((R, S), self.pad_id, dtype=torch.long)
        seg_valid = torch.zeros(R, S, dtype=torch.bool)
        pos = torch.zeros((3, R, S) if self.rope_index is not None else (R, S), dtype=torch.long)
        pvs, thws = [], []
        for r, (p, s, e) in enumerate(segs):
            L = e - s
            ids[r, S - L:] = torch.tensor(p.ids[s:e])
            seg_valid[r, S - L:] = True
            pos[..., r, S - L:] = p.pos[..., s:e]
            for a, b, img, thw in p.images:       # images in row order: the model scatters them so
                if s <= a and b <= e:
                    pvs.append(img)
                    thws.append(thw)
        self.stats["prefill_tokens"] += R * S
        self.stats["prefill_tokens_real"] += int(seg_valid.sum())
        self.stats["images_encoded"] += len(pvs)
        seg_valid = seg_valid.to(self.device)
        valid = seg_valid if valid is None else torch.cat([valid, seg_valid], dim=1)   # (R, K)
        vision = (torch.cat(pvs), torch.stack(thws)) if pvs else (None, None)
        return self._forward(cache, ids, pos, cache_attention_mask(valid, S), *vision), valid

    def _prefill(self, prompts: list[_Prompt]):
        """Prefill the radix tree of `prompts` level by level. Returns, one row per prompt (in order):
        a DynamicCache with keys/values (U, nkv, K0, D), valid (U, K0) bool (each row's real slots
        first) and the logits of the first generated token (U, V)."""
        runs = [[(a, b) for a, b, _, _ in p.images] for p in prompts]
        nodes = _prefix_tree([p.key for p in prompts], runs, self.share_prefix)
        depth = max(n.depth for n in nodes) + 1
        cache = valid = None
        row_of: dict[int, int] = {}
        leaves, leaf_ids = [], []
        for d in range(depth):
            level = [i for i, n in enumerate(nodes) if n.depth == d]
            if d > 0:    # each node continues from a copy of its parent's rows
                cache, valid = _take_rows(cache, valid, torch.tensor([row_of[nodes[i].parent] for i in level]))
            else:
                cache = DynamicCache()
            logits, valid = self._extend(cache, valid, [(prompts[nodes[i].rep], nodes[i].start, nodes[i].end)
                                                        for i in level])
            row_of = {i: r for r, i in enumerate(level)}
            ends = [r for r, i in enumerate(level) if nodes[i].leaf >= 0]
            if ends:
                idx = torch.tensor(ends, device=logits.device)
                leaves.append((*_take_rows(cache, valid, idx), logits[idx]))
                leaf_ids += [nodes[level[r]].leaf for r in ends]
        cache, valid = _cat_rows([(c, v) for c, v, _ in leaves])
        order = torch.tensor(leaf_ids).argsort().to(valid.device)                   # leaf order -> prompt order
        return (DynamicCache(ddp_cache_data=[(l.keys[order], l.values[order]) for l in cache.layers]),
                valid[order], torch.cat([lg for _, _, lg in leaves])[order])

    def _row_cache(self, cache, valid, rows: torch.Tensor):
        """The per-row decode cache: row r a copy of prompt rows[r]'s KV, plus room for the new
        tokens (SlotLayers sharing one write slot). Returns (cache, valid (R, K0 + max_new_tokens))."""
        slot = torch.tensor([valid.shape[1]], device=valid.device)                  # the first free slot
        pad = (0, 0, 0, self.max_new_tokens)
        return (Cache(layers=[SlotLayer(F.pad(l.keys[rows], pad), F.pad(l.values[rows], pad), slot)
                              for l in cache.layers]), F.pad(valid[rows], (0, self.max_new_tokens)))

    def _draw(self, logits: torch.Tensor, greedy: bool, gen, u: torch.Tensor | None,
              where: Callable[[int], str] = lambda i: f"row {i}"):
        """One token per row from logits (R, V) (ours: edited in place) and its log-probability under
        the policy the trainer scores, log_softmax(logits / T) over the whole vocabulary (engine design
        note 4). The draw is from the allowed set only (`allowed_weights`: banned ids removed and the
        top-p nucleus kept BEFORE anything is normalised, so a banned id far ahead cannot underflow the
        allowed ones to 0); the score is x[tok] - logsumexp(x) over the whole vocabulary, taken from
        the same pass (the allowed mass and the banned logits), finite for every allowed id.
        -> (tok (R,) long, lp (R,) fp32). Raises LogitsError (where(i) naming row i) before any id is
        drawn, greedy or sampled, for a NaN or +inf logit or a row without a finite allowed one."""
        x = logits.float()
        if self.temperature != 1.0:
            x = x.div_(self.temperature)                                       # (R, V) x = z / T
        banned = self.banned_ids.to(x.device)
        if self.top_p < 1.0:     # the nucleus drops ids of the whole vocabulary: its normaliser first
            lse = torch.logsumexp(x, dim=-1)                                   # (R,)
        else:                    # the allowed mass below + the few banned logits give it without a pass
            xb = x.index_select(-1, banned)                                    # (R, n_banned)
        w, m = allowed_weights(x, banned, self.top_p, where)                   # (R, V) exp(x - m), 0 if not allowed
        if greedy:
            tok = x.argmax(dim=-1)                                             # banned ids are -inf in x
            total = w.sum(dim=-1, dtype=torch.float64) if self.top_p == 1.0 else None
        else:
            if u is None:
                u = torch.rand(x.shape[0], generator=gen, device=x.device)
            tok, total = _inverse_cdf(w, u.reshape(-1, 1))                     # an id of weight 0 is never drawn
        if self.top_p == 1.0:    # log sum over the vocabulary = logaddexp(allowed part, banned part)
            lse = torch.logaddexp(m.squeeze(-1).double() + total.log(), torch.logsumexp(xb.double(), dim=-1))
        return tok, (x.gather(-1, tok[:, None]).squeeze(-1).double() - lse.double()).float()

    # --- the loop

    @torch.no_grad()
    def generate(self, prompts, n: int | Sequence[int] = 1, greedy: bool = False,
                 generator: torch.Generator | None = None,
                 seeds: list[int] | None = None) -> list[list[SampleOutput]]:
        """Sample n continuations of every prompt (n an int, or one count per prompt: prompts that
        want different numbers of samples share one call, one prefill and one decode loop).
        Returns outs[i][j] for prompt i, sample j.

        seeds: optional, one int per prompt. Sample j of prompt i then draws its uniforms from its
        own generator seeded with (seeds[i], j): its draws do not depend on which other prompts
        share the batch or which rank runs it (its tokens may still, design note 6).
        A prompt is any object or dict with input_ids (T,) LongTensor (images already expanded
        to <|vision_start|><|image_pad|>*k<|vision_end|>), pixel_values (P, 1176) or None and
        image_grid_thw (I, 3) or None; a plain 1-D id tensor/list is a text prompt.
        Raises ValueError: no prompts, a count < 1 or counts that are not one per prompt;
        len(seeds) != len(prompts); an empty prompt; a
        video prompt; image placeholder runs, image_grid_thw rows and pixel_values rows that
        disagree; temperature <= 0 or top_p outside (0, 1] (the logprobs need them, greedy too)."""
        ns = [n] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
        if not prompts or len(ns) != len(prompts) or min(ns) < 1:
            raise ValueError(f"need at least one prompt and a sample count >= 1 for each, got {len(prompts)} "
                             f"prompts and n={n}")
        gen = generator if generator is not None else self.generator
        model = self.model
        was_training = model.training
        model.eval()
        # the 4-D masks need sdpa or eager; a flash-attention policy computes the same function
        # under sdpa, so it is switched for the call and switched back after
        attn = model.config.get_text_config()._attn_implementation
        if attn not in ("sdpa", "eager"):
            model.set_attn_implementation("sdpa")
        self.stats = dict(prefill_tokens=0, prefill_tokens_real=0, images_encoded=0, decode_tokens=0)
        t0 = time.perf_counter()
        try:
            supported = self.lean and LeanStep.supports(model)
            if self.lean_arg is True and not supported:
                raise ValueError("lean=True: the model is not a Qwen2-style decoder LeanStep computes exactly "
                                 "(see LeanStep.supports)")
            self._lean = LeanStep(model) if supported else None   # this call's weights
            self.stats["lean"] = supported
            # 1. distinct prompts (identical ids and pixels -> one), one row per (prompt, sample)
            prepared = [self._prepare(p) for p in prompts]
            if self.share_prefix:
                first: dict[tuple, int] = {}
                distinct, row_prompt = [], []
                for p, k in zip(prepared, ns):
                    u = first.setdefault(tuple(p.key), len(distinct))
                    if u == len(distinct):
                        distinct.append(p)
                    row_prompt += [u] * k
            else:                       # the reference path: every sample prefilled on its own
                distinct = [p for p, k in zip(prepared, ns) for _ in range(k)]
                row_prompt = list(range(len(distinct)))
            # 2. prefill once per tree node; the decode state: the lean step's prompt grid (cascade
            # attention, design note 9), or each sample a copy of its prompt's rows (static decode:
            # padded to a bucket with copies of row 0)
            R = len(row_prompt)
            cache, valid, first = self._prefill(distinct)
            logits = first[torch.tensor(row_prompt, device=first.device)]          # (R, V) ours to edit
            self.stats["kv_slots"] = valid.shape[1]   # prompt slots per decode row: the longest prompt, when dense
            if self.decode == "eager" and self._lean is not None:
                dec = CascadeDecode(self._lean, cache, valid, row_prompt, [p.next_pos for p in distinct],
                                     self.max_new_tokens, layout=self.cascade)
            else:
                rows = row_prompt + row_prompt[:1] * ((bucket(R) - R) if self.decode != "eager" else 0)
                cache, valid = self._row_cache(cache, valid, torch.tensor(rows, device=valid.device))
                next_pos = torch.tensor([distinct[u].next_pos for u in rows], device=self.device)
                three_d = self.rope_index is not None
                dec = EagerDecode(self._forward, cache, valid, next_pos, three_d) if self.decode == "eager" else \
                    StaticDecode(self._forward, cache, valid, next_pos, R, three_d, self.decode == "graph")
            t1 = time.perf_counter()
            # 3. decode; a row leaves the batch (eager: and the cache) on the step it stops
            out_ids, out_lp = [[] for _ in range(R)], [[] for _ in range(R)]
            reason = ["length"] * R
            active = list(range(R))
            stop = set(self.stop_token_ids)
            row_gens = None
            if seeds is not None:
                if len(seeds) != len(prompts):
                    raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
                row_gens = [torch.Generator().manual_seed((int(seeds[i]) * 1_000_003 + j) % (1 << 63))
                            for i in range(len(prompts)) for j in range(ns[i])]
            owner = [f"prompt {i}, sample {j}" for i in range(len(prompts)) for j in range(ns[i])]  # by row
            for step in range(self.max_new_tokens):
                u = None if row_gens is None else torch.cat([torch.rand(1, generator=row_gens[r]) for r in active])
                tok, lp = self._draw(logits, greedy, gen, u,   # an error names the step and the row's prompt
                                     where=lambda i: f"decode step {step}, row {active[i]} ({owner[active[i]]})")
                keep = []
                for i, (t, l) in enumerate(zip(tok.tolist(), lp.tolist())):
                    r = active[i]
                    out_ids[r].append(t)
                    out_lp[r].append(l)
                    if t in stop:
                        reason[r] = "stop"
                    else:
                        keep.append(i)
                self.stats["decode_tokens"] += len(active)
                if not keep or step == self.max_new_tokens - 1:
                    break
                if len(keep) < len(active):
                    k = torch.tensor(keep, device=self.device)
                    tok, active = tok[k], [active[i] for i in keep]
                    dec.keep(k)
                logits = dec.step(tok)
        finally:
            self._lean = None
            if attn not in ("sdpa", "eager"):
                model.set_attn_implementation(attn)
            if hasattr(getattr(model, "model", None), "rope_deltas"):
                model.model.rope_deltas = None    # nobody may reuse deltas of this batch
            model.train(was_training)
        t2 = time.perf_counter()
        static = dec if isinstance(dec, StaticDecode) else None
        if static is not None and static.error:
            self.decode = "static"            # the capture failed once: do not retry it every call
        self.stats.update(time_prefill=t1 - t0, time_decode=t2 - t1, rows=R, distinct_prompts=len(distinct),
                          decode=self.decode, cascade_grids=dec.grids if isinstance(dec, CascadeDecode) else None,
                          cascade_row_rows=dec.row_rows if isinstance(dec, CascadeDecode) else None,
                          decode_buckets=static.buckets if static else None,
                          time_graph_capture=static.capture_s if static else 0.0,
                          graph_error=static.error if static else None)
        # 4. package: rows are (prompt, sample) in order, whatever the sharing was
        texts = self.tokenizer.batch_decode(out_ids, skip_special_tokens=True)
        first_row = [0, *itertools.accumulate(ns)]
        return [[SampleOutput(out_ids[r], texts[r], torch.tensor(out_lp[r], dtype=torch.float32), reason[r], i)
                 for r in range(first_row[i], first_row[i + 1])] for i in range(len(prompts))]

# -----------------------------------------------------------------------------
# the token draw: temperature, banned tokens, top-p; a two-level inverse CDF


def check_top_p(top_p: float) -> None:
    """top_p must lie in (0, 1]. Raises ValueError otherwise."""
    if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


class LogitsError(ValueError):
    """Logits no token can be drawn from (NaN, +inf, no finite allowed one): a broken forward, not an answer."""


def allowed_weights(x: torch.Tensor, banned_ids: torch.Tensor | None, top_p: float,
                    where: Callable[[int], str] = lambda i: f"row {i}") -> tuple[torch.Tensor, torch.Tensor]:
    """The allowed set of a draw, formed before anything is normalised; the one place every path of
    the draw (Sampler._draw greedy / top-p / inverse CDF, process_logits, sample_from_logits) forms it.

    x: (B, V) fp32 logits already divided by the temperature, EDITED IN PLACE: banned ids -> -inf.
    Returns (w, m): w (B, V) fp32 = exp(x - m) on the allowed ids and 0 elsewhere, m (B, 1) the
    largest allowed logit, so the most likely allowed id has weight exactly 1 and no allowed id
    underflows because a banned one leads (a softmax taken first would put every allowed id at 0
    when a banned id leads by ~100 nats). top_p < 1 then keeps the nucleus of the allowed
    distribution: the smallest set of most likely ids whose mass reaches top_p (Holtzman et al.
    2020; the most likely id always kept); the ids it drops get weight 0 (x is left as is there).
    Raises LogitsError naming where(i) of the first bad row i: a NaN or +inf anywhere in it, banned ids
    included (they enter the log-probs' normaliser), or no finite allowed logit (-inf but for a few allowed
    ids is masking, not an error); one more (B, V) max and one host sync per call, before any id is drawn."""
    hi = x.amax(dim=-1)                                # (B,) NaN / +inf when the row holds one (amax keeps NaN)
    if banned_ids is not None and banned_ids.numel():
        x.index_fill_(-1, banned_ids.to(x.device), float("-inf"))
    m = x.amax(dim=-1, keepdim=True)                                           # (B, 1)
    bad = ~(hi.isfinite() & m.squeeze(-1).isfinite())                         # (B,)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        what = "a NaN logit" if hi[i].isnan() else "a +inf logit" if hi[i] > 0 else \
            "no finite logit among the allowed ids"
        raise LogitsError(f"{where(i)}: {what}; no token can be drawn (the model's forward is broken: NaN/inf in its "
                          "weights or activations)")
    w = (x - m).exp_()                                                         # (B, V) in [0, 1]
    if top_p < 1.0:
        sorted_w, order = w.sort(dim=-1, descending=True)                     # (B, V)
        mass_before = sorted_w.cumsum(dim=-1) - sorted_w    # mass of the strictly more likely ids
        drop_sorted = mass_before >= top_p * sorted_w.sum(dim=-1, keepdim=True)
        w.masked_fill_(torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted), 0.0)
    return w, m


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                   banned_ids: torch.Tensor | None = None, *, normalise: bool = True,
                   where: Callable[[int], str] = lambda i: f"row {i}") -> torch.Tensor:
    """logits (B, V) -> (B, V) fp32 probabilities of the sampling distribution.
    p(v) is proportional to exp(logit_v / temperature) over the allowed tokens (`allowed_weights`:
    not banned, inside the top-p nucleus). The only place temperature is applied to a draw's logits
    (rollout.py, engine design note 4). normalise=False skips the final division (sampling
    normalises through the CDF; the weights are then exp(x - max allowed x)). Raises ValueError:
    temperature not finite or below MIN_TEMPERATURE, top_p outside (0, 1]; LogitsError (where(i)
    names row i): a NaN or +inf logit, or a row without a finite allowed logit (`allowed_weights`)."""
    check_temperature(temperature)
    check_top_p(top_p)
    x = logits.float().clone() if logits.dtype == torch.float32 else logits.float()
    if temperature != 1.0:
        x = x.div_(temperature)
    w, _ = allowed_weights(x, banned_ids, top_p, where)                      # (B, V)
    return w / w.sum(dim=-1, keepdim=True) if normalise else w


_CDF_BLOCK = 1024  # vocab entries per block of the two-level inverse CDF


def _inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (B, V) fp32 >= 0 with a positive sum per row, u (B, 1) in [0, 1) -> (tokens (B,) long,
    total (B,) fp64 = sum of w). Token = the first v with w_0 + ... + w_v > u * total: the
    inverse-CDF draw from p = w / total, in two levels so that no (B, V) cumulative sum is built
    (a flat cumsum cost as much as the softmax): block sums (one read of w) and their cumsum pick
    the block, a cumsum over that block's _CDF_BLOCK entries picks the token. Block sums are fp32
    (an fp64 reduction is ~10x slower on CPU), both cumsums fp64, so the token is that of a flat
    cumsum except where u * total falls within fp32 rounding of a CDF boundary. A token of weight 0
    is never returned: the target is clipped below each level's own total, and the first entry
    whose cumulative sum exceeds it has positive weight."""
    B, V = w.shape
    K = _CDF_BLOCK
    full = V // K * K
    sums = [w[:, :full].view(B, -1, K).sum(-1)] if full else []                          # (B, V // K)
    if full < V:
        sums.append(w[:, full:].sum(-1, keepdim=True))                                   # (B, 1) the tail
    cdf = torch.cat(sums, dim=-1).double().cumsum(dim=-1)                                # (B, nb) fp64
    total = cdf[:, -1:]
    zero = torch.zeros_like(total)
    t = torch.minimum(u.to(total) * total, torch.nextafter(total, zero))                 # (B, 1) < total
    b = torch.searchsorted(cdf, t, right=True).clamp_(max=cdf.shape[-1] - 1)              # (B, 1) block
    t = t - torch.where(b > 0, cdf.gather(-1, (b - 1).clamp_(min=0)), zero)               # offset in the block
    cols = b * K + torch.arange(K, device=w.device)                                      # (B, K)
    seg = w.gather(-1, cols.clamp(max=V - 1)).masked_fill_(cols >= V, 0.0)               # (B, K)
    seg_cdf = seg.to(torch.float64).cumsum(dim=-1)                                       # (B, K)
    t = torch.minimum(t, torch.nextafter(seg_cdf[:, -1:], zero))     # the two sums' rounding may differ
    j = torch.searchsorted(seg_cdf, t, right=True).clamp_(max=K - 1)
    return (b * K + j).squeeze(-1), total.squeeze(-1)


def sample_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                       generator: torch.Generator | None = None, *,
                       banned_ids: torch.Tensor | None = None, greedy: bool = False,
                       u: torch.Tensor | None = None, step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits (B, V) -> (tokens (B,) long, logp (B,) fp32).
    logp is the token's log-probability under process_logits(...), also when greedy. Sampling is
    by inverse CDF with one uniform per row (u (B,) in [0, 1), drawn from `generator` when not
    given; several times cheaper than torch.multinomial on CPU), done in two levels by
    `_inverse_cdf`; a token of zero probability (banned, outside the nucleus) can never be drawn.
    Greedy takes the argmax of the logits with banned ids removed, as generate(do_sample=False,
    suppress_tokens=..) does (not of the probabilities, whose rounding could create ties). The
    Sampler draws through its own _draw (the same allowed set, banned in place, no (B, V) copy).
    Raises ValueError as process_logits; LogitsError (naming `step`, when given, and the row) for a
    NaN or +inf logit, banned ids included, or a row without a finite allowed logit, before any id
    is drawn (greedy and sampled alike)."""
    at = "" if step is None else f"step {step}, "
    w = process_logits(logits, temperature, top_p, banned_ids, normalise=False,
                       where=lambda i: f"{at}row {i}")                       # (B, V) p up to a factor
    if greedy:
        if banned_ids is not None and banned_ids.numel():
            logits = logits.index_fill(-1, banned_ids.to(logits.device), float("-inf"))
        tok = logits.argmax(dim=-1)
        total = w.sum(dim=-1).double()                                        # (B,)
    else:
        if u is None:
            u = torch.rand(w.shape[0], generator=generator, device=w.device)
        tok, total = _inverse_cdf(w, u.reshape(-1, 1))
    logp = w.gather(-1, tok[:, None]).squeeze(-1).double().log() - total.log()
    return tok, logp.float()

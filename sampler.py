"""The sampling engine of the rollouts (docs/method.md §5): batched, KV-cached sampling of n samples per
prompt from a Qwen2.5-VL policy (or any causal LM), and the token draw. vlm.sampling_mode lends the policy:

    sampler = Sampler(model, tokenizer, max_new_tokens=512, temperature=1.0, top_p=1.0, seed=0)
    with sampling_mode(model):
        outs = sampler.generate(prompts, n=8)        # outs[i][j]: SampleOutput of sample j of prompt i

The plain path, the reference the speed-ups are tested against (the engine design notes):
  1. Prefill: every prompt once, in one left-padded forward; its samples copy its KV rows.
  2. Padding: a validity mask (R, K) and an explicit 4-D mask; a padding query attends to itself only.
  3. Positions: explicit, per prompt on the unpadded ids (Qwen2.5-VL's 3-D mrope, `get_rope_index`);
     a decoded token's is max prompt position + 1 + step; the cached rope_deltas is cleared, never read.
  4. The draw (docs/method.md §7 "How this project computes it", §11): banned (vision) ids and the top-p
     cut come before any normalising; logprobs are the trainer's, log_softmax(logits / T) over all ids, fp32.
  5. Decode: one token per live row a step into a DynamicCache; a row that stops leaves the batch.
  6. Same inputs + same seed -> same samples. Across batch compositions greedy ids agree; sampled ids
     may not (last-bit logit differences move a draw across a CDF boundary, as in vLLM).
The speed-ups (extras/shared_prefix.py, lean_step.py, cascade.py, static_decode.py; Sampler's options)
are imported inside the method their option turns on and give the plain path's tokens.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from cli import check_temperature  # the one temperature rule, the flags' too
from vlm import STOP_TOKENS, VISION_TOKENS, cache_attention_mask, image_runs, pad_token_id

DECODE_MODES = ("auto", "eager", "static", "graph")  # Sampler(decode=...); static, graph: extras/static_decode.py

# -----------------------------------------------------------------------------
# the sampler engine: prefill, KV-cached decode loop


@dataclass
class SampleOutput:
    ids: list[int]              # generated ids; ends with the stop id when finish_reason == "stop"
    text: str                   # ids decoded with special tokens skipped (for reward/history only)
    logprobs: torch.Tensor      # (L,) fp32 log-prob of each id under the policy: log_softmax(logits / T), full vocabulary
    finish_reason: str          # "stop" | "length"
    prompt_index: int


@dataclass
class _Prompt:
    """One prompt, validated, with everything the prefill needs."""
    ids: list[int]
    pos: torch.Tensor              # (3, T) mrope positions, or (T,) for a text LM
    next_pos: int                  # position of the first generated token
    images: list[tuple[int, int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # images: (start, end) of the pad-token run, pixel rows (P_i, C), grid thw (3,)


class RowDecode:
    """The plain decode state (design note 5), row r a copy of its prompt's KV. Every decode state
    (extras/ holds the others) answers keep(k), step(tok) -> the live rows' logits, and stats."""

    def __init__(self, forward, cache, valid: torch.Tensor, prompt_of_row: list[int], next_pos: list[int],
                 three_d: bool):
        rows = torch.tensor(prompt_of_row, device=valid.device)
        self.cache = DynamicCache(ddp_cache_data=[(l.keys[rows], l.values[rows]) for l in cache.layers])
        self.valid, self.pos = valid[rows], torch.tensor(next_pos, device=valid.device)[rows]  # (R, K0), (R,)
        self.forward, self.three_d, self.stats = forward, three_d, {}

    def keep(self, k: torch.Tensor) -> None:
        """Keep live rows k (indices into the current live rows)."""
        self.cache.batch_select_indices(k)
        self.valid, self.pos = self.valid[k], self.pos[k]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok (n,) the live rows' new tokens -> their next-token logits (n, V)."""
        self.valid = F.pad(self.valid, (0, 1), value=True)                          # (n, K + 1): the new slot
        pos = self.pos.view(1, -1, 1).expand(3, -1, 1) if self.three_d else self.pos[:, None]
        logits = self.forward(self.cache, tok[:, None], pos, self.valid[:, None, None, :])
        self.pos = self.pos + 1
        return logits


class Sampler:
    """Batched KV-cached sampler (design: the module docstring). stop_token_ids: None -> <|im_end|> and
    <|endoftext|> (else the eos); [] -> never stop. seed: of the draws' generator (None: the global
    RNG). The speed-ups, False / "eager" for the plain path: share_prefix; decode "eager", "static",
    "graph" (CUDA), "auto" = graph on CUDA, else eager; lean None = on for a CPU model LeanStep
    computes exactly, True requires it, False never; cascade (lean eager decode) "auto", "grid",
    "split", "rows" (checked where used). Raises ValueError on an unknown decode mode, graph without
    CUDA, max_new_tokens < 1, a bad temperature or top_p. `stats`: the last call's counts and times."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 512, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None, seed: int | None = None,
                 share_prefix: bool = True, decode: str = "auto", lean: bool | None = None, cascade: str = "auto"):
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self.temperature, self.top_p = temperature, top_p                     # checked by __setattr__
        self.device = next(model.parameters()).device
        if decode not in DECODE_MODES or decode == "graph" and self.device.type != "cuda":
            raise ValueError(f"decode must be one of {DECODE_MODES}, 'graph' with a CUDA model only (this one is "
                             f"on {self.device}; 'static' runs the same step uncaptured), got {decode!r}")
        self.decode = ("graph" if self.device.type == "cuda" else "eager") if decode == "auto" else decode
        self.share_prefix, self.lean, self.cascade = share_prefix, lean, cascade  # cascade: checked by its module
        cfg, text_cfg = model.config, model.config.get_text_config()
        if "sliding_attention" in (getattr(text_cfg, "layer_types", None) or []):
            raise ValueError("Sampler supports full-attention models only (no sliding-window layers)")
        self.rope_index = getattr(getattr(model, "model", None), "get_rope_index", None)  # Qwen2.5-VL's 3-D rope
        self.image_token_id, self.video_token_id = getattr(cfg, "image_token_id", None), getattr(cfg, "video_token_id", None)
        self.merge = getattr(getattr(cfg, "vision_config", None), "spatial_merge_size", 2)
        vocab = tokenizer.get_vocab()
        banned = {vocab[t] for t in VISION_TOKENS if t in vocab} | {getattr(cfg, a, None) for a in (
            "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
        self.banned_ids = torch.tensor(sorted(i for i in banned if i is not None and i < text_cfg.vocab_size),
                                       dtype=torch.long)
        if stop_token_ids is None:
            stop_token_ids = [vocab[t] for t in STOP_TOKENS if t in vocab] or [tokenizer.eos_token_id]
        self.stop_token_ids = [int(i) for i in stop_token_ids]
        self.pad_id = pad_token_id(tokenizer)                                 # pads are masked; any real id works
        self.generator = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        self.stats: dict = {}

    def __setattr__(self, name: str, value) -> None:
        """temperature and top_p are checked whenever set (eval_sop's sampled plays set them per call)."""
        if name in ("temperature", "top_p"):
            (check_temperature if name == "temperature" else check_top_p)(value)
            value = float(value)
        super().__setattr__(name, value)

    # --- the call

    @torch.no_grad()
    def generate(self, prompts, n: int | Sequence[int] = 1, greedy: bool = False,
                 seeds: list[int] | None = None) -> list[list[SampleOutput]]:
        """n samples of every prompt (n an int or one count per prompt) -> outs[i][j], prompt i, sample j.
        A prompt: an object with input_ids (T,) long (image runs expanded), pixel_values (P, 1176)
        and image_grid_thw (I, 3) or None; or 1-D ids (text). seeds: one int per prompt; sample j of
        prompt i then draws from a generator seeded with (seeds[i], j), whatever shares the batch.
        Raises ValueError: no prompts, bad counts or seeds, an empty or video prompt, image runs /
        grid rows / pixel rows that disagree, lean=True on a model LeanStep does not compute."""
        ns = [n] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
        if not prompts or len(ns) != len(prompts) or min(ns) < 1:
            raise ValueError(f"need at least one prompt and a sample count >= 1 for each, got {len(prompts)} "
                             f"prompts and n={n}")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        self.stats = dict(prefill_tokens=0, prefill_tokens_real=0, images_encoded=0, decode_tokens=0)
        t0 = time.perf_counter()
        with self._lent():
            lean = None             # extras/lean_step.py: lean None is on for a CPU model
            if self.lean or self.lean is None and self.device.type == "cpu":
                from extras.lean_step import lean_step
                lean = lean_step(self.model, required=self.lean is True)   # None: a model it cannot run
            dec, logits = self._prefill([self._prepare(p) for p in prompts], ns, lean)
            t1 = time.perf_counter()
            ids, logps, reasons = self._decode(dec, logits, ns, greedy, seeds)
        if dec.stats.get("graph_error"):
            self.decode = "static"            # the capture failed once: do not retry it every call
        self.stats.update(time_prefill=t1 - t0, time_decode=time.perf_counter() - t1, decode=self.decode,
                          lean=lean is not None, **dec.stats)
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        first_row = [0, *itertools.accumulate(ns)]   # rows are (prompt, sample) in order, whatever was shared
        return [[SampleOutput(ids[r], texts[r], torch.tensor(logps[r], dtype=torch.float32), reasons[r], i)
                 for r in range(first_row[i], first_row[i + 1])] for i in range(len(prompts))]

    @contextmanager
    def _lent(self):
        """The model for one call in eval mode under sdpa (the 4-D masks need it); its mode and attention
        restored after, and this batch's rope deltas cleared."""
        model, was_training = self.model, self.model.training
        attn = model.config.get_text_config()._attn_implementation
        model.eval()
        if attn != "sdpa":
            model.set_attn_implementation("sdpa")
        try:
            yield
        finally:
            if attn != "sdpa":
                model.set_attn_implementation(attn)
            if hasattr(getattr(model, "model", None), "rope_deltas"):
                model.model.rope_deltas = None
            model.train(was_training)

    # --- prompts and the prefill

    def _prepare(self, p) -> _Prompt:
        """Validate one prompt (a chat.Prompt-like object, or 1-D ids) and compute its positions."""
        if isinstance(p, (torch.Tensor, list, tuple)):
            ids, pv, thw = p, None, None
        else:
            ids, pv, thw = (getattr(p, k, None) for k in ("input_ids", "pixel_values", "image_grid_thw"))
        ids = torch.as_tensor(ids).reshape(-1).long().cpu()
        T = ids.numel()
        if T == 0:
            raise ValueError("empty prompt")
        if self.video_token_id is not None and bool((ids == self.video_token_id).any()):
            raise ValueError("video prompts are not supported by the sampler")
        is_img = ids == self.image_token_id if self.image_token_id is not None else torch.zeros_like(ids, dtype=torch.bool)
        runs, n_img, images = image_runs(is_img), 0 if thw is None else int(thw.shape[0]), []
        if len(runs) != n_img or (n_img and pv is None):
            raise ValueError(f"prompt has {len(runs)} image placeholder runs but {n_img} image_grid_thw rows "
                             f"(pixel_values {'missing' if pv is None else tuple(pv.shape)}): placeholders and pixels disagree")
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
                images.append((a, b, pv[offs[i]:offs[i + 1]], thw[i]))
        pos = torch.arange(T) if self.rope_index is None else torch.arange(T).expand(3, T)  # (T,) or (3, T)
        if n_img and self.rope_index is not None:                             # Qwen2.5-VL's 3-D mrope
            pos = self.rope_index(ids[None], mm_token_type_ids=is_img.int()[None], image_grid_thw=thw)[0][:, 0].cpu()
        return _Prompt(ids.tolist(), pos, int(pos.max()) + 1, images)

    def _prefill(self, prompts: list[_Prompt], ns: list[int], lean):
        """Prefill (ns[i] samples of prompt i) -> (the call's decode state, first-token logits (R, V))."""
        if self.share_prefix:         # extras/shared_prefix.py: identical prompts, shared prefixes once
            from extras.shared_prefix import prefill_shared
            cache, valid, first, row_prompt, prompts = prefill_shared(self._extend, prompts, ns)
        else:                         # one left-padded forward, each prompt once
            cache, row_prompt = DynamicCache(), [i for i, k in enumerate(ns) for _ in range(k)]
            first, valid = self._extend(cache, None, [(p, 0, len(p.ids)) for p in prompts])   # (U, V), (U, K0)
        self.stats.update(kv_slots=valid.shape[1], distinct_prompts=len(prompts), rows=len(row_prompt))
        logits = first[torch.tensor(row_prompt, device=first.device)]          # (R, V) ours to edit
        state = (cache, valid, row_prompt, [p.next_pos for p in prompts])
        if lean is not None and self.decode == "eager":   # extras/cascade.py: a prompt's KV read once a step
            from extras.cascade import CascadeDecode
            return CascadeDecode(lean, *state, self.max_new_tokens, layout=self.cascade), logits
        if self.decode != "eager":    # extras/static_decode.py: fixed buffers, CUDA graphs
            from extras.static_decode import StaticDecode
            return StaticDecode(self._forward if lean is None else lean, *state, self.max_new_tokens,
                                self.rope_index is not None, self.decode == "graph"), logits
        return RowDecode(self._forward, *state, self.rope_index is not None), logits

    def _extend(self, cache, valid, segs: list[tuple[_Prompt, int, int]]):
        """One prefill forward, row r appending tokens [s, e) of its prompt -> (logits (R, V), valid (R, K))."""
        R, S = len(segs), max(e - s for _, s, e in segs)
        ids = torch.full((R, S), self.pad_id, dtype=torch.long)
        seg_valid = torch.zeros(R, S, dtype=torch.bool)
        pos = torch.zeros((3, R, S) if self.rope_index is not None else (R, S), dtype=torch.long)
        images = []                               # (pixels, grid) in row order: the model scatters them so
        for r, (p, s, e) in enumerate(segs):
            ids[r, S - (e - s):] = torch.tensor(p.ids[s:e])
            seg_valid[r, S - (e - s):] = True
            pos[..., r, S - (e - s):] = p.pos[..., s:e]
            images += [(img, thw) for a, b, img, thw in p.images if s <= a and b <= e]
        self.stats["prefill_tokens"] += R * S
        self.stats["prefill_tokens_real"] += int(seg_valid.sum())
        self.stats["images_encoded"] += len(images)
        seg_valid = seg_valid.to(self.device)
        valid = seg_valid if valid is None else torch.cat([valid, seg_valid], dim=1)   # (R, K)
        vision = (torch.cat([v for v, _ in images]), torch.stack([g for _, g in images])) if images else (None, None)
        return self._forward(cache, ids, pos, cache_attention_mask(valid, S), *vision), valid

    def _forward(self, cache, ids, pos, mask, pixel_values=None, image_grid_thw=None):
        """ids (R, S) at pos ((3, R, S) or (R, S)), mask (R, 1, S, K) bool -> next-token logits (R, V)."""
        kw = {} if pixel_values is None else dict(pixel_values=pixel_values.to(self.device),
                                                  image_grid_thw=image_grid_thw.to(self.device))
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=pos.to(self.device),
                         cache=cache, use_cache=True, logits_to_keep=1, **kw)
        return out.logits[:, -1]

    # --- the decode loop and the draw

    def _decode(self, dec, logits: torch.Tensor, ns: list[int], greedy: bool, seeds):
        """Draw, drop the rows that drew a stop id, step the rest -> per row: ids, logprobs, finish reason."""
        R, stop, owner = len(logits), set(self.stop_token_ids), [(i, j) for i, k in enumerate(ns) for j in range(k)]
        out_ids, out_lp, reason, active = [[] for _ in range(R)], [[] for _ in range(R)], ["length"] * R, list(range(R))
        row_gens = None if seeds is None else \
            [torch.Generator().manual_seed((int(seeds[i]) * 1_000_003 + j) % (1 << 63)) for i, j in owner]
        for step in range(self.max_new_tokens):
            u = None if row_gens is None else torch.cat([torch.rand(1, generator=row_gens[r]) for r in active])
            tok, lp = self._draw(logits, greedy, u,   # an error names the step and the row's prompt
                                 where=lambda i: f"decode step {step}, row {active[i]} "
                                                 "(prompt {}, sample {})".format(*owner[active[i]]))
            keep = []
            for i, (t, l) in enumerate(zip(tok.tolist(), lp.tolist())):
                out_ids[active[i]].append(t)
                out_lp[active[i]].append(l)
                if t in stop:
                    reason[active[i]] = "stop"
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
        return out_ids, out_lp, reason

    def _draw(self, logits: torch.Tensor, greedy: bool, u: torch.Tensor | None, where: Callable[[int], str]):
        """logits (R, V) (edited in place) -> (tok (R,) long from the allowed set, `allowed_weights`;
        lp (R,) fp32 = x[tok] - logsumexp(x) over the whole vocabulary, design note 4, from the same
        pass). u: (R,) uniforms, None: drawn from self.generator. Raises LogitsError (where(i) names
        row i) before any draw, as allowed_weights."""
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
                u = torch.rand(x.shape[0], generator=self.generator, device=x.device)
            tok, total = _inverse_cdf(w, u.reshape(-1, 1))                     # an id of weight 0 is never drawn
        if self.top_p == 1.0:    # log sum over the vocabulary = logaddexp(allowed part, banned part)
            lse = torch.logaddexp(m.squeeze(-1).double() + total.log(), torch.logsumexp(xb.double(), dim=-1))
        return tok, (x.gather(-1, tok[:, None]).squeeze(-1).double() - lse.double()).float()

# -----------------------------------------------------------------------------
# the token draw: temperature, banned tokens, top-p; a two-level inverse CDF


def check_top_p(top_p: float) -> None:
    """top_p must lie in (0, 1]. Raises ValueError otherwise."""
    if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


class LogitsError(ValueError):
    """Logits no token can be drawn from (NaN, +inf, no finite allowed one): a broken forward, not an answer."""


def allowed_weights(x: torch.Tensor, banned_ids: torch.Tensor | None, top_p: float, where: Callable[[int], str]):
    """The allowed set of every draw, formed before anything is normalised (design note 4: else a banned
    id far ahead underflows the allowed ones to 0). x: (B, V) fp32 logits / T, EDITED IN PLACE (banned
    ids -> -inf) -> (w (B, V) fp32 = exp(x - m) on the allowed ids, 0 elsewhere; m (B, 1) the largest
    allowed logit). top_p < 1 keeps the nucleus, the fewest most likely ids whose mass reaches top_p
    (Holtzman et al. 2020; the most likely id always). Raises LogitsError naming where(i) of the first
    bad row i: a NaN or +inf logit (banned ids too: they enter the normaliser), no finite allowed one."""
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
    not banned, inside the top-p nucleus): the distribution Sampler._draw draws from, as a reference
    for tests and tools (engine design note 4). normalise=False skips the final division (sampling
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
    """w (B, V) fp32 >= 0 (positive row sums), u (B, 1) in [0, 1) -> (tokens (B,) long, total (B,)
    fp64 = sum of w): the first v with w_0 + ... + w_v > u * total. Two levels, no (B, V) cumsum (as
    costly as the softmax): fp32 block sums pick the block, an fp64 cumsum of it the token (a flat
    cumsum's token but within fp32 rounding of a boundary). A weight-0 token is never returned."""
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

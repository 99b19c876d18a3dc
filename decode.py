"""The decode step of the sampler (sampler.py's engine design notes 5, 7-9): the states a decode loop
steps through, one token a row at a time, after the prefill.

  EagerDecode    the reference: the transformers forward (or the lean step) over per-row caches of
                 SlotLayers; a row leaves the batch and the cache on the step it stops;
  StaticDecode   the same per-row layout in fixed buffers and power-of-two buckets, so that a step
                 can be captured as a CUDA graph (design note 7);
  LeanStep       one decode step of a Qwen2-style decoder on its own weights, a third of the
                 transformers forward's ops (design note 8): the CPU default;
  CascadeDecode  the lean step over a prompt grid, each prompt's KV read once for all of its samples
                 (cascade attention, design note 9): the CPU default's layout.

Every state answers keep(k) (the live rows that go on) and step(tok) -> the live rows' next logits.
"""
from __future__ import annotations

import time
import warnings

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """Decode-time KV of one layer: keys, values (R, H, K, D) buffers written in place at `slot`,
    a (1,) long tensor shared by all layers and advanced by the decode loop (gpt-fast's static
    cache). Attention reads the whole buffer and the validity mask hides the slots not written yet,
    so a step copies nothing (DynamicLayer re-concatenates all K); the slot being a tensor, not a
    Python int, is what lets a CUDA graph replay the write at every step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.slot = keys, values, slot
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys.index_copy_(2, self.slot, key_states)          # (R, H, 1, D) into slot
        self.values.index_copy_(2, self.slot, value_states)
        return self.keys, self.values


class LeanStep:
    """One decode step of a Qwen2 / Qwen2.5-VL text decoder on its own weights (engine design note 8):
    per layer an RMSNorm, ONE fused q|k|v GEMM, rotary on q and k together, attention, o_proj, an
    RMSNorm, ONE fused gate|up GEMM, SiLU-and-mul, down_proj; then the final norm and the lm_head. The
    transformers forward does the same math through module calls, per-call mask and cache handling and
    mrope's per-section split (~3x the ops of a one-token step; the tiny models' CPU decode is bound by
    them). A decoded token is text, so its three mrope components are equal and mrope reduces to 1-D
    rope at that position. Attention is the caller's: `__call__` attends each row over its own cache
    (the per-row layout of SlotLayer), `CascadeDecode` over its prompt's shared KV (design note 9).

    Built inside one generate call from the weights then (fused copies: an RL update changes them).
    `supports(model)` says whether the model has this shape (Qwen2-style layers, SiLU MLP, default
    rope, no sliding window, plain tensors, not FSDP's DTensors); the Sampler falls back to the
    transformers forward otherwise. Tested against it: same tokens, logprobs within 1e-5 (fp32)."""

    def __init__(self, model):
        text = text_model(model)
        cfg = model.config.get_text_config()
        self.nq, self.nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.nq
        self.H, self.eps = cfg.hidden_size, cfg.rms_norm_eps
        self.embed, self.lm_head = text.embed_tokens.weight, model.lm_head.weight
        self.norm = text.norm.weight
        self.inv_freq, self.scaling = text.rotary_emb.inv_freq.float(), float(text.rotary_emb.attention_scaling)
        self.layers = []
        for layer in text.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm.weight,
                                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),   # (nq+2nkv)D x H
                                torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if a.q_proj.bias is not None else None,
                                a.o_proj.weight, layer.post_attention_layernorm.weight,
                                torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight))  # 2I x H

    @staticmethod
    def supports(model) -> bool:
        """True when the model is a Qwen2-style decoder whose math is exactly what __call__ computes:
        plain nn.Linear projections (not PEFT's adapter layers, whose .weight is the base weight
        alone), RMSNorms, SiLU MLP, default rope, no sliding window, plain (unsharded) tensors, and
        no forward hook on the modules a decode step runs (a hook could change their output; FSDP2's
        own hooks are skipped: sampling_mode has unsharded every weight)."""
        from torch.distributed.fsdp import FSDPModule

        text, cfg = text_model(model), model.config.get_text_config()
        try:
            layers = list(text.layers)
            linears = [getattr(l.self_attn, n) for l in layers for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
                [getattr(l.mlp, n) for l in layers for n in ("gate_proj", "up_proj", "down_proj")] + [model.lm_head]
            norms = [n for l in layers for n in (l.input_layernorm, l.post_attention_layernorm)] + [text.norm]
            rope = (getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
            text.rotary_emb.inv_freq, text.embed_tokens.weight  # noqa: B018  (present)
        except (AttributeError, TypeError):
            return False
        modules = [m for m in (model, *model.modules()) if not isinstance(m, FSDPModule)]
        hooked = any(m._forward_hooks or m._forward_pre_hooks for m in modules) or \
            bool(torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)
        return (bool(layers) and all(type(m) is torch.nn.Linear for m in linears)
                and all(tuple(n.weight.shape) == (cfg.hidden_size,) for n in norms)
                and all(type(p) in (torch.nn.Parameter, torch.Tensor) for p in model.parameters())
                and rope == "default" and cfg.hidden_act == "silu" and not hooked
                and not getattr(cfg, "use_sliding_window", False))

    def run(self, ids: torch.Tensor, pos: torch.Tensor, attend, rows: torch.Tensor | None = None) -> torch.Tensor:
        """ids (R,) long, pos (R,) long (each token's rope position); attend(layer, q (R, nq, D), k, v
        (R, nkv, D)) -> (R, nq D) the attention output of each row (the caller's KV layout). rows: the
        rows whose logits are wanted (None: all). -> logits (n, V) fp32."""
        R, nq, nkv, D = ids.shape[0], self.nq, self.nkv, self.D
        freqs = pos.reshape(R, 1).float() * self.inv_freq.to(pos.device)              # (R, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)                                       # (R, D)
        cos, sin = (emb.cos() * self.scaling)[:, None], (emb.sin() * self.scaling)[:, None]   # (R, 1, D)
        x = F.embedding(ids, self.embed)                                              # (R, H)
        for i, (w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down) in enumerate(self.layers):
            qkv = F.linear(F.rms_norm(x, (self.H,), w_in, self.eps), w_qkv, b_qkv)    # (R, (nq + 2 nkv) D)
            qk = qkv[:, :(nq + nkv) * D].view(R, nq + nkv, D)
            qk = qk * cos + torch.cat([-qk[..., D // 2:], qk[..., :D // 2]], dim=-1) * sin   # rotary, q and k
            x = x + F.linear(attend(i, qk[:, :nq], qk[:, nq:], qkv[:, (nq + nkv) * D:].view(R, nkv, D)), w_o)
            gate, up = F.linear(F.rms_norm(x, (self.H,), w_post, self.eps), w_gu).chunk(2, dim=-1)  # (R, I) each
            x = x + F.linear(F.silu(gate) * up, w_down)
        if rows is not None:
            x = x[rows]
        return F.linear(F.rms_norm(x, (self.H,), self.norm, self.eps), self.lm_head)   # (n, V)

    def __call__(self, cache, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The per-row layout: ids (R, 1) long, pos (3, R, 1) or (R, 1) long, mask (R, 1, 1, K) bool over
        the cache's slots (the new one included); writes each layer's k, v at the cache's slot.
        -> logits (R, V)."""
        R, nkv, g, D = ids.shape[0], self.nkv, self.nq // self.nkv, self.D
        K = mask.shape[-1]
        bias = torch.zeros(R, K, device=ids.device).masked_fill_(~mask.view(R, K), float("-inf"))  # (R, K), all layers
        bias = bias[:, None, None, :].expand(R, nkv, g, K).reshape(R * nkv, g, K)

        def attend(i, q, k, v):
            keys, values = cache.layers[i].update(k[:, :, None], v[:, :, None])      # (R, nkv, K, D)
            # one query per row: two batched GEMVs and a softmax (CPU SDPA's flash kernel is ~10x slower here)
            s = torch.baddbmm(bias, q.reshape(R * nkv, g, D), keys.reshape(R * nkv, K, D).transpose(1, 2),
                              alpha=D ** -0.5)                                        # (R nkv, g, K)
            return torch.bmm(torch.softmax(s, dim=-1), values.reshape(R * nkv, K, D)).reshape(R, -1)

        return self.run(ids[:, 0], (pos[0] if pos.dim() == 3 else pos).reshape(R), attend)


CASCADE_LAYOUTS = ("auto", "grid", "split", "rows")  # CascadeDecode(layout=...), Sampler(cascade=...)


class CascadeDecode:
    """The lean CPU decode with each prompt's KV read once for all of its samples (engine design
    note 9; cascade attention), and with every row whose prompt has few samples on its own cache.

    Grid. Prompts with many samples are laid out on a grid of U prompts x G slots (G = the most
    samples of one prompt); per layer one key and one value buffer (U, nkv, K0 + G T, D) hold the
    prompt's K0 prefill slots, then the decoded tokens time-major: the token of sample j at step t
    sits at slot K0 + t G + j. One step's attention is then, per (prompt, KV head), ONE GEMM of its
    G g queries against the prompt's keys so far, K0 + (t + 1) G of them, with a bias that hides the
    prompt's padding and the other samples' tokens; per-row attention reads the prompt's K0 keys once
    per sample (8 samples: 8x the memory traffic, and decode is bound by it).

    Rows. A grid slot no live row holds still costs its attention (G g queries against K0 + (t + 1) G
    keys: with one prompt of 8 samples and seven of 1, 64 slots for 15 rows, each single-sample prompt
    scoring 8x the decoded keys it needs). Rows off the grid decode on per-row caches (R1, nkv, K0 + T, D),
    as the per-row layout does. `layout`: "grid" puts every prompt on the grid, "rows" none (the per-row
    decode on the lean step; the benchmarks' reference), "split" a prompt whose samples fill more than
    half a grid row (count > G / 2) on the grid and the others' rows on per-row caches, and "auto" (the
    Sampler's) the grid when the rows fill more than half of its U x G slots, else per-row caches: on
    the tiny CPU models a half-empty grid, or a split's second attention path, costs more than the
    prompt reads it saves (bench/bench_step.py's decode_groups; results/LOG.md, 2026-12-05). The
    decoder's GEMMs (q|k|v, o, MLP, lm_head) run on the live rows only, whatever the layout.

    Rows that stop leave the step; when the grid prompts with a live row fall to half the grid's, the
    grid keeps only theirs (one copy of the buffers), and the per-row caches keep only the live rows.
    Exact: the same keys, values and masks as the per-row layout, summed in another order."""

    def __init__(self, lean: LeanStep, cache: DynamicCache, valid: torch.Tensor, prompt_of_row: list[int],
                 next_pos: list[int], max_new_tokens: int, layout: str = "auto"):
        """cache: one layer of keys/values (U, nkv, K0, D) per decoder layer, row u = prompt u;
        valid (U, K0) bool; prompt_of_row: row r's prompt (rows in prompt order, samples adjacent or not);
        next_pos: the rope position of each prompt's first generated token; layout: CASCADE_LAYOUTS.
        Raises ValueError on an unknown layout."""
        if layout not in CASCADE_LAYOUTS:
            raise ValueError(f"layout must be one of {CASCADE_LAYOUTS}, got {layout!r}")
        U0, K0 = valid.shape
        dev = valid.device
        self.lean, self.K0, self.T = lean, K0, max_new_tokens
        count = [0] * U0
        for u in prompt_of_row:
            count[u] += 1
        G = max(count)
        if layout == "auto":  # the grid when the rows fill more than half of its slots
            layout = "grid" if 2 * len(prompt_of_row) > len(count) * G else "rows"
        on_grid = [layout == "grid" or (layout == "split" and 2 * c > G) for c in count]
        grid_prompts = [u for u in range(U0) if on_grid[u]]
        gidx = {u: i for i, u in enumerate(grid_prompts)}
        self.G = G = max([count[u] for u in grid_prompts], default=1)
        U = len(grid_prompts)
        nkv, g, D = lean.nkv, lean.nq // lean.nkv, lean.D
        # each live row, in generate's order: its grid slot (-1: a per-row row) and its next position
        slot, seen, row_prompts = [], [0] * U0, []
        for u in prompt_of_row:
            slot.append(gidx[u] * G + seen[u] if on_grid[u] else -1)
            seen[u] += 1
            if not on_grid[u]:
                row_prompts.append(u)
        self.slot = torch.tensor(slot, dtype=torch.long, device=dev)                   # (R,)
        self.pos = torch.tensor([next_pos[u] for u in prompt_of_row], device=dev)      # (R,) next token's position
        # the grid: U prompts x G slots
        Ktot = K0 + G * max_new_tokens
        sel = torch.tensor(grid_prompts, dtype=torch.long, device=dev)
        self.kv = []
        if U:
            for layer in cache.layers:
                k = layer.keys.new_zeros(U, nkv, Ktot, D)
                v = layer.values.new_zeros(U, nkv, Ktot, D)
                k[:, :, :K0], v[:, :, :K0] = layer.keys[sel], layer.values[sel]
                self.kv.append((k, v))
            bias = torch.full((U, nkv, G, g, Ktot), float("-inf"), device=dev)
            bias[..., :K0] = torch.zeros(U, K0, device=dev).masked_fill_(~valid[sel], float("-inf"))[:, None, None, None]
            self.bias = bias.view(U * nkv, G * g, Ktot)                               # (U nkv, G g, Ktot)
        self.U = U
        # the per-row caches: one row per sample of the prompts off the grid
        rsel = torch.tensor(row_prompts, dtype=torch.long, device=dev)
        pad = (0, 0, 0, max_new_tokens)
        self.rkv = [(F.pad(l.keys[rsel], pad), F.pad(l.values[rsel], pad)) for l in cache.layers] if row_prompts else []
        self.rvalid = F.pad(valid[rsel], (0, max_new_tokens))                          # (R1, K0 + T) bool
        self.t = 0
        self.grids = [U]                                                               # prompts on the grid, per shrink (stats)
        self.row_rows = [len(row_prompts)]                                             # rows on per-row caches (stats)
        self._plan()

    def _plan(self) -> None:
        """The step's plan, once per change of the live rows: which live rows are on the grid (gi, their
        slots gslot) and on per-row caches (ri), and, when each is one block of consecutive rows with the
        grid full and in order (the usual case: generate's rows come in prompt order), the two blocks, so
        that a layer's attention reads views and joins two outputs instead of scattering rows."""
        on_rows = self.slot < 0
        self.gi = (~on_rows).nonzero().squeeze(-1)                                     # live rows on the grid
        self.ri = on_rows.nonzero().squeeze(-1)                                        # live rows on per-row caches
        self.gslot = self.slot[self.gi]

        def block(idx):  # (a, b) when idx == a, a + 1, ..., b - 1
            a = int(idx[0]) if idx.numel() else 0
            ok = bool((idx == torch.arange(a, a + idx.numel(), device=idx.device)).all())
            return (a, a + idx.numel()) if ok else None
        g, r = block(self.gi), block(self.ri)
        full = self.gi.numel() == self.U * self.G and bool((self.gslot == torch.arange(self.gi.numel(),
                                                                                   device=self.gi.device)).all())
        self.blocks = (g, r) if g is not None and r is not None and full else None

    def keep(self, k: torch.Tensor) -> None:
        """Keep live rows k (indices into the current live rows); shrink the grid to the prompts that
        still have a live row once they are at most half of it; the per-row caches to the live rows."""
        was_row = self.slot < 0
        self.slot, self.pos = self.slot[k], self.pos[k]
        on_rows = was_row[k]
        if bool(was_row.any()):
            r_index = torch.cumsum(was_row.long(), 0) - 1                             # row -> its per-row cache row
            keep_r = r_index[k][on_rows]
            if keep_r.numel() < int(was_row.sum()):
                self.rkv = [(k_[keep_r], v_[keep_r]) for k_, v_ in self.rkv]
                self.rvalid = self.rvalid[keep_r]
                self.row_rows.append(keep_r.numel())
        G, U = self.G, self.U
        gs = self.slot[~on_rows]
        live = torch.unique(gs // G)                                                   # (U',) sorted
        if U and not len(live):                      # every grid row has stopped: no grid left
            self.kv, self.U = [], 0
            self.grids.append(0)
        elif U > 1 and 2 * len(live) <= U:
            nkv, g, Ktot = self.lean.nkv, self.lean.nq // self.lean.nkv, self.bias.shape[-1]
            self.kv = [(k_[live], v_[live]) for k_, v_ in self.kv]
            self.bias = self.bias.view(U, nkv * G * g, Ktot)[live].view(len(live) * nkv, G * g, Ktot)
            new = torch.empty(U, dtype=torch.long, device=live.device)
            new[live] = torch.arange(len(live), device=live.device)
            self.slot[~on_rows] = new[gs // G] * G + gs % G
            self.U = len(live)
            self.grids.append(len(live))
        self._plan()

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok (n,) the live rows' new tokens -> their next-token logits (n, V)."""
        G, K0, t, U = self.G, self.K0, self.t, self.U
        nq, nkv, D = self.lean.nq, self.lean.nkv, self.lean.D
        g, n = nq // nkv, tok.shape[0]
        s0, Kt = K0 + t * G, K0 + (t + 1) * G                                         # grid: this step's slots; keys so far
        gi, ri, gslot, blocks = self.gi, self.ri, self.gslot, self.blocks
        if U:
            # each sample sees its own new slot: the diagonal of the (sample, slot) block of step t
            self.bias.view(U * nkv, G, g, -1)[..., s0:Kt].diagonal(dim1=1, dim2=3).fill_(0.0)
            gbias = self.bias[..., :Kt]                                                # (U nkv, G g, Kt)
        m, Kr = ri.numel(), K0 + t + 1
        if m:
            self.rvalid[:, K0 + t] = True
            rbias = torch.zeros(m, Kr, device=tok.device).masked_fill_(~self.rvalid[:, :Kr], float("-inf"))
            rbias = rbias[:, None, None, :].expand(m, nkv, g, Kr).reshape(m * nkv, g, Kr)

        def grid_in(x):  # the grid's rows of x (n, ...) as (U G, ...), zeros in the slots no live row holds
            if blocks is not None:
                return x[blocks[0][0]:blocks[0][1]]
            return x.new_zeros(U * G, *x.shape[1:]).index_copy_(0, gslot, x[gi])

        def rows_in(x):
            return x[blocks[1][0]:blocks[1][1]] if blocks is not None else x[ri]

        def attend(i, q, k, v):
            parts = []
            if U:
                kb, vb = self.kv[i]                                                    # (U, nkv, Ktot, D)
                kb[:, :, s0:Kt] = grid_in(k).view(U, G, nkv, D).transpose(1, 2)
                vb[:, :, s0:Kt] = grid_in(v).view(U, G, nkv, D).transpose(1, 2)
                qg = grid_in(q).view(U, G, nkv, g, D).transpose(1, 2).reshape(U * nkv, G * g, D)   # a prompt's queries
                s = torch.baddbmm(gbias, qg, kb[:, :, :Kt].reshape(U * nkv, Kt, D).transpose(1, 2), alpha=D ** -0.5)
                o = torch.bmm(torch.softmax(s, dim=-1), vb[:, :, :Kt].reshape(U * nkv, Kt, D))   # (U nkv, G g, D)
                parts.append(o.view(U, nkv, G, g, D).transpose(1, 2).reshape(U * G, nq * D))
            if m:
                rk, rv = self.rkv[i]                                                   # (m, nkv, K0 + T, D)
                rk[:, :, K0 + t], rv[:, :, K0 + t] = rows_in(k), rows_in(v)
                s = torch.baddbmm(rbias, rows_in(q).reshape(m * nkv, g, D), rk[:, :, :Kr].reshape(m * nkv, Kr, D).transpose(1, 2),
                                  alpha=D ** -0.5)                                     # (m nkv, g, Kr)
                parts.append(torch.bmm(torch.softmax(s, dim=-1), rv[:, :, :Kr].reshape(m * nkv, Kr, D)).reshape(m, -1))
            if len(parts) == 1 and blocks is not None:
                return parts[0]
            if blocks is not None:   # two blocks of consecutive rows: join them in row order
                return torch.cat(parts if blocks[0][0] == 0 else parts[::-1])
            out = q.new_empty(n, nq * D)
            if U:
                out[gi] = parts[0][gslot]
            if m:
                out[ri] = parts[-1]
            return out

        logits = self.lean.run(tok, self.pos, attend)
        self.pos.add_(1)
        self.t += 1
        return logits


def text_model(model):
    """The decoder stack: Qwen2.5-VL's language_model, or a plain causal LM's model."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", inner)


def bucket(n: int) -> int:
    """The static decode's batch size for n live rows: the smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


class EagerDecode:
    """The reference decode state: the transformers forward (or the lean step, per row) over per-row
    caches (SlotLayers), a row leaving the batch and the cache on the step it stops."""

    def __init__(self, forward, cache: Cache, valid: torch.Tensor, next_pos: torch.Tensor, three_d: bool):
        self.forward, self.cache, self.valid, self.next_pos, self.three_d = forward, cache, valid, next_pos, three_d
        self.slot = cache.layers[0].slot                                              # (1,) long

    def keep(self, k: torch.Tensor) -> None:
        for layer in self.cache.layers:
            layer.batch_select_indices(k)
        self.valid, self.next_pos = self.valid[k], self.next_pos[k]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        pos = self.next_pos.view(1, -1, 1).expand(3, -1, 1) if self.three_d else self.next_pos[:, None]
        self.valid.index_fill_(1, self.slot, True)            # the new token's slot; later ones stay hidden
        logits = self.forward(self.cache, tok[:, None], pos, self.valid[:, None, None, :])
        self.next_pos = self.next_pos + 1
        self.slot.add_(1)
        return logits


class StaticDecode:
    """The decode state in fixed buffers (engine design note 7): every tensor a step reads or writes
    keeps its address for the whole generate call, so the step can be captured once per bucket.

    Buffers, B = bucket(R) rows (rows R..B-1 are copies of row 0 from the prefill, never read):
    the KV cache (B, H, K, D) per layer (the prefill's SlotLayers), valid (B, K) bool, pos
    (3, B, 1) or (B, 1) long (the next token's position), ids (B, 1) long, slot (1,) long.
    `rows` (n,) maps the sampler's live rows to buffer rows; the step runs on the first b =
    bucket rows. A row that stops stays in place (computed, not read) until the live rows fit in
    bucket(n) < b; then they move to the front: at most log2(R) KV copies per call, where the eager
    loop copies the KV of all live rows whenever one stops. graphs=True (CUDA): the first step of
    each bucket runs eagerly (first use of every kernel and cuBLAS handle, which a capture must not
    see), then is captured; later steps replay it. Graphs and buffers live for one generate call:
    the memory goes back to the trainer, and a graph never outlives the weights it reads (under
    FSDP2 the unsharded weights are freed when sampling_mode ends). A failed capture warns and
    decodes uncaptured (the sampler's decode becomes "static")."""

    def __init__(self, forward, cache: Cache, valid: torch.Tensor, next_pos: torch.Tensor, R: int,
                 three_d: bool, graphs: bool):
        B, dev = valid.shape[0], valid.device
        self.forward, self.layers, self.valid = forward, cache.layers, valid
        self.slot = cache.layers[0].slot                                              # (1,) long
        self.pos = next_pos.view(1, B, 1).repeat(3, 1, 1) if three_d else next_pos.view(B, 1).clone()
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self.rows = torch.arange(R, device=dev)
        self.b = bucket(R)
        self.buckets = [self.b]                             # the buckets used, in order (stats)
        self.graphs = {} if graphs else None                # bucket -> (CUDAGraph, its logits buffer)
        self.pool = torch.cuda.graph_pool_handle() if graphs else None   # one memory pool for all buckets
        self.capture_s, self.error = 0.0, None

    def keep(self, k: torch.Tensor) -> None:
        """Keep live rows k (indices into the current live rows), compacting at a bucket edge."""
        self.rows = self.rows[k]
        n = len(self.rows)
        if bucket(n) < self.b:
            for layer in self.layers:        # the right sides are gathers (copies): no overlap
                layer.keys[:n], layer.values[:n] = layer.keys[self.rows], layer.values[self.rows]
            self.valid[:n] = self.valid[self.rows]
            self.pos[..., :n, :] = self.pos[..., self.rows, :]
            self.rows, self.b = torch.arange(n, device=self.rows.device), bucket(n)
            self.buckets.append(self.b)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok (n,) the live rows' new tokens -> their next-token logits (n, V), a fresh tensor."""
        self.ids.index_copy_(0, self.rows, tok[:, None])
        if self.graphs is None:
            out = self._step(self.b)
        elif self.b in self.graphs:
            graph, out = self.graphs[self.b]
            graph.replay()
        else:
            out = self._capture(self.b)
        return out[self.rows]

    def _step(self, b: int) -> torch.Tensor:
        """The step that is captured: mark `slot` valid, run rows [0, b) (their KV lands at slot),
        advance positions and slot. Every index lives in a tensor and nothing syncs with the host.
        Returns the logits (b, V)."""
        self.valid.index_fill_(1, self.slot, True)       # the new token's slot; later ones stay hidden
        cache = Cache(layers=[SlotLayer(layer.keys[:b], layer.values[:b], self.slot) for layer in self.layers])
        logits = self.forward(cache, self.ids[:b], self.pos[..., :b, :], self.valid[:b, None, None, :])
        self.pos.add_(1)
        self.slot.add_(1)
        return logits

    def _capture(self, b: int) -> torch.Tensor:
        """Run this step eagerly on a side stream (the warm-up of torch.cuda.graph's recipe), then
        capture it for bucket b. Returns this step's logits (b, V)."""
        t = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self._step(b)
        torch.cuda.current_stream().wait_stream(side)
        out.record_stream(torch.cuda.current_stream())   # read there next: not reused before that
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):    # records, runs nothing: the state stays
                self.graphs[b] = (graph, self._step(b))
        except RuntimeError as e:   # e.g. a module hook that syncs or forks a stream (see sampling_mode)
            warnings.warn(f"CUDA graph capture of the decode step failed ({e}); decoding uncaptured")
            self.graphs, self.error = None, f"{type(e).__name__}: {e}"
        self.capture_s += time.perf_counter() - t
        return out

"""Cascade attention for the lean CPU decode (sampler.Sampler(cascade=...), the layout of the lean step's
eager decode; "auto", the default, so a default CPU run imports this module when it samples): the samples
of one prompt share its prefill KV, read ONCE per step for all of them in one GEMM per (prompt, KV head),
their own tokens interleaved after it and masked so that each row sees its own. A row-per-sample cache
reads the prompt's K0 keys once per sample (n = 8 rollouts: 8x), and a decode step of a small model is
bound by that read. Only a speed-up: the same keys, values and masks as sampler.py's per-row decode,
summed in another order (tests/test_sampler.py compares the tokens and logprobs of every layout).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from extras.lean_step import LeanStep

CASCADE_LAYOUTS = ("auto", "grid", "split", "rows")  # CascadeDecode(layout=...), Sampler(cascade=...)


class CascadeDecode:
    """The lean CPU decode with each prompt's KV read once for all of its samples (cascade attention,
    this module's docstring), and with every row whose prompt has few samples on its own cache.

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

    @property
    def stats(self) -> dict:
        """For Sampler.stats: prompts on the grid and rows on per-row caches, at the start and per shrink."""
        return dict(cascade_grids=self.grids, cascade_row_rows=self.row_rows)

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


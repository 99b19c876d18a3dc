"""Static decode and CUDA graphs (sampler.Sampler(decode="static" | "graph"); "auto", the default, is
"graph" on CUDA, so a default CUDA run imports this module when it samples; gpt-fast's decode, without
torch.compile). A step of the eager loop launches some 15 kernels per layer from Python, and at 64 rows a
small model waits on those launches, not on memory. A CUDA graph replays a step in one launch but needs
fixed addresses and shapes and no host sync, so `StaticDecode` keeps every decode input in a fixed buffer
updated in place (the KV cache, gpt-fast's static cache, nothing re-concatenated per step; the validity
mask, positions, ids, the write slot as a tensor) and runs the rows in power-of-two buckets: a stopped
row stays as a dead row until the live ones fit the next smaller bucket. The token draw stays eager (it
reads a host-side random stream per row). "static" runs the same step without capture (how the CPU
tests check it against sampler.py's plain decode, the reference). Only a speed-up.
"""
from __future__ import annotations

import time
import warnings

import torch
import torch.nn.functional as F
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


def bucket(n: int) -> int:
    """The static decode's batch size for n live rows: the smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


class StaticDecode:
    """The decode state in fixed buffers (this module's docstring): every tensor a step reads or writes
    keeps its address for the whole generate call, so the step can be captured once per bucket.

    Buffers, B = bucket(R) rows (rows R..B-1 are copies of row 0 from the prefill, never read):
    the KV cache (B, H, K, D) per layer (SlotLayers sharing one write slot), valid (B, K) bool, pos
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

    def __init__(self, forward, cache: Cache, valid: torch.Tensor, prompt_of_row: list[int], next_pos: list[int],
                 max_new_tokens: int, three_d: bool, graphs: bool):
        """forward(cache, ids (b, 1), pos (3, b, 1) or (b, 1), mask (b, 1, 1, K)) -> logits (b, V): the
        Sampler's transformers forward or the lean step; cache: keys/values (U, nkv, K0, D) per layer, row
        u = prompt u, valid (U, K0) bool; prompt_of_row: row r's prompt; next_pos: each prompt's first
        generated token's position. Row r's buffers start as a copy of its prompt's KV, plus
        max_new_tokens empty slots."""
        R = len(prompt_of_row)
        B, dev = bucket(R), valid.device
        rows = torch.tensor(prompt_of_row + prompt_of_row[:1] * (B - R), device=dev)
        self.slot = torch.tensor([valid.shape[1]], device=dev)                      # (1,) the first free slot
        pad = (0, 0, 0, max_new_tokens)
        self.layers = [SlotLayer(F.pad(l.keys[rows], pad), F.pad(l.values[rows], pad), self.slot) for l in cache.layers]
        self.forward, self.valid = forward, F.pad(valid[rows], (0, max_new_tokens))  # (B, K0 + T) bool
        pos = torch.tensor(next_pos, device=dev)[rows]                              # (B,) long
        self.pos = pos.view(1, B, 1).repeat(3, 1, 1) if three_d else pos.view(B, 1).clone()
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self.rows = torch.arange(R, device=dev)
        self.b = B
        self.buckets = [self.b]                             # the buckets used, in order (stats)
        self.graphs = {} if graphs else None                # bucket -> (CUDAGraph, its logits buffer)
        self.pool = torch.cuda.graph_pool_handle() if graphs else None   # one memory pool for all buckets
        self.capture_s, self.error = 0.0, None

    @property
    def stats(self) -> dict:
        """For Sampler.stats: the buckets used, capture seconds (inside time_decode), a failed capture's error."""
        return dict(decode_buckets=self.buckets, time_graph_capture=self.capture_s, graph_error=self.error)

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

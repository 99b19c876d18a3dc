"""Rollouts for semi-online RL (docs/method.md §5; arXiv 2509.11543, section 3).

Map, top to bottom:
  1. the method: `StepRecord` and `semi_online_rollout`, the driver. N rollouts per task walk the
     expert episode with their OWN history; each step, all live rollouts are sampled in one batched
     call, scored against the expert action, and a wrong response is patched or ends its rollout.
  2. the sampler engine (`# --- the sampler engine`): `Sampler`, batched KV-cached sampling from
     a transformers Qwen2.5-VL policy (or any plain causal LM), n samples per prompt;
     the token draw (`process_logits` / `sample_from_logits`) is kernels/sampling.py. The policy is lent to
     it by `kernels.policy_logprob.sampling_mode`, beside the FSDP2 set-up it undoes for a while.

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
  4. `kernels.sampling.process_logits` is the one place where temperature, top-p and the ban on vision tokens are
     applied (docs/method.md §11); the logprobs returned are those of exactly this distribution, one
     fp32 value per returned id, and the trainer trains on `SampleOutput.ids` as returned.
  5. Decoding writes into a preallocated KV buffer (gpt-fast's static cache: nothing is
     re-concatenated per step), and rows that stop leave the batch and the cache that step.
  6. Same inputs + same seed -> same samples. Across batch compositions greedy ids agree; sampled
     ids may not (last-bit logit differences move a draw across a CDF boundary, as in vLLM).
  7. On CUDA one decode step is a CUDA graph, captured once per batch-size bucket and replayed
     (`decode="graph"`, the default there; gpt-fast's decode, without torch.compile): a step of the
     eager loop launches some 15 kernels per layer from Python, and at 64 rows a small model waits
     on those launches, not on memory. A graph needs fixed addresses, shapes and no host sync, so
     `_StaticDecode` keeps every decode input in a fixed buffer updated in place (KV cache, validity
     mask, positions, ids, the write slot as a tensor) and runs the rows in power-of-two buckets:
     a stopped row stays as a dead row until the live ones fit the next smaller bucket. The token
     draw stays eager (it reads a host-side random stream per row). `decode="static"` runs the same
     step without capture (how CPU tests check it against the eager loop, the reference).
"""
from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

import chat
import dataset
import gui
import patch
from kernels.policy_logprob import pad_token_id
from kernels.sampling import process_logits, sample_from_logits

DECODE_MODES = ("auto", "eager", "static", "graph")  # Sampler(decode=...): engine design note 7

# -----------------------------------------------------------------------------
# semi-online rollout driver (docs/method.md §5)

HISTORY_MODES = ("own", "expert")  # own: semi-online RL; expert: the offline-RL baseline


@dataclass
class StepRecord:
    """One sampled response: rollout `rollout_idx` of task `task_idx` at step `step_idx`; the
    contract between the rollout (which fills the first block) and the trainer (the second).

    task_idx: the task's index in `episodes`, or task_ids[index] when the driver is given task_ids.
    prompt: the chat.Prompt it was sampled from (token ids, images, resized_size).
    response_ids: the sampler's ids, exactly (the trainer scores these, never re-tokenised text).
    sampler_logp: (L,) fp32 log-probs under the sampling distribution.
    reward / match / type_match / error: gui.score_response against the expert action (truncated =
    finish_reason != "stop"); error is why the response is malformed (reward 0), else None.
    patched: replaced in the history by a patch (the patch text is never trained on).
    ended: the rollout ended at this step (a wrong step with no patch left, or the last step).
    history: the rollout's history (earlier responses or patches) the prompt was built from.
    Filled by the trainer (None until then), docs/method.md §6: adv, the response's advantage A
    (one float for all its tokens); ret, its discounted step return R;
    old_logp: (L,) fp32 log-probs of response_ids under the policy before the update.
    ref_logp: (L,) fp32 log-probs under the frozen reference (only when the KL term is on).
    """
    task_idx: int
    rollout_idx: int
    step_idx: int
    prompt: Any
    response_ids: list[int]
    sampler_logp: torch.Tensor
    response: str
    finish_reason: str
    reward: float
    match: bool
    type_match: bool
    error: str | None
    patched: bool
    ended: bool
    history: list[str]
    adv: float | None = None
    ret: float | None = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


@dataclass
class _Rollout:
    history: list[str] = field(default_factory=list)
    n_patches: int = 0
    alive: bool = True


@dataclass
class StepPrompt:
    """What the driver hands a policy that never reads its prompt (a sampler whose `reads_prompt`
    is False: the expert replay of eval_sop.py) instead of a chat.Prompt: the step to act on and
    the sizes, no tokens and no pixels. Sizes are (W, H): orig_size of the screenshot,
    resized_size as the model would see it (gui.resized_size under min/max_pixels)."""
    step: dataset.Step
    step_idx: int
    orig_size: tuple[int, int]
    resized_size: tuple[int, int]


def semi_online_rollout(sampler, episodes, tokenizer, image_processor, *, spec: chat.PromptSpec = chat.PromptSpec(),
                        n_rollouts: int = 8, patch_mode: str = "thought-free", patch_threshold: int = 2,
                        history_mode: str = "own", image_root=None, blank_screens=None,
                        match_rules: str = "strict", greedy: bool = False,
                        seed: int | list[int] | None = None, progress: bool = False,
                        task_ids: list[int] | None = None) -> list[StepRecord]:
    """Roll N copies of the policy through each expert episode, with their own history
    (docs/method.md §5): at step t all live rollouts of all tasks are sampled in one batched call
    (identical prompts, as at step 0, are prefilled once) and scored by gui.score_response (§4); a
    wrong response is patched while patch.should_patch(n_patches, patch_threshold) allows, else its
    rollout ends. history_mode "expert", the offline-RL baseline: every step's history is the
    expert's and no rollout ends early. Also evaluation's walker (eval_sop.py, §8): SOP is
    n_rollouts=1, greedy, patch_threshold=0, own history; static the same with "expert".

    sampler: rollout.Sampler or anything with .generate(prompts, n, greedy, seeds) returning outs[i][j]
    with .text, .ids, .logprobs, .finish_reason; if its `reads_prompt` is False it gets StepPrompt
    objects (no tokens built, no screenshot decoded). episodes: list[dataset.Episode].
    seed: an int or one int per task (the trainer gives each task slot its own, so a task drawn twice
    is sampled afresh); a prompt's seed derives from (that seed, episode_id, step, history), so a
    task's rollouts do not depend on which other tasks share the batch or which rank runs it.
    task_ids: each episode's task_idx in the records (the trainer's global task slots; default: its
    index). spec: the prompt contract (chat.step_prompt renders every prompt, as SFT's); match_rules:
    gui.action_match's rules ("strict" or "release").
    Returns the records in (step, task, rollout) order. Raises ValueError on a bad history_mode.
    """
    if history_mode not in HISTORY_MODES:
        raise ValueError(f"history_mode must be one of {HISTORY_MODES}, got {history_mode!r}")
    patch.check_patch_data(patch_mode, episodes)
    reads_prompt = getattr(sampler, "reads_prompt", True)
    task_seeds = [seed] * len(episodes) if isinstance(seed, int) else seed  # one per task, or None
    shots = [[None] * len(ep.steps) for ep in episodes]  # loaded lazily, once per (task, step)

    def shot(k, t):
        if shots[k][t] is None:
            shots[k][t] = dataset.load_screenshot(episodes[k].steps[t], image_root=image_root, blank_screens=blank_screens)
        return shots[k][t]

    def prompt_for(k, t, history, hint=None):
        step = episodes[k].steps[t]
        if not reads_prompt:
            orig = dataset.original_size(step, image_root=image_root, blank_screens=blank_screens)
            return StepPrompt(step, t, orig, gui.resized_size(orig, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels))
        # the prompt reads the last num_images screenshots only; steps are walked in order,
        # so older ones are never needed again: free them
        k_img = spec.num_images
        if t >= k_img:
            shots[k][t - k_img] = None
        return chat.step_prompt(tokenizer, image_processor, spec, goal=episodes[k].goal, step=step, history=history,
                                screenshots=[shot(k, s) if s > t - k_img else None for s in range(t + 1)],
                                hint=hint)

    states = [[_Rollout() for _ in range(n_rollouts)] for _ in episodes]
    records: list[StepRecord] = []
    T = max((len(ep.steps) for ep in episodes), default=0)
    for t in tqdm(range(T), desc="rollout steps", disable=not progress, leave=False):
        live = [(k, i) for k, ep in enumerate(episodes) if t < len(ep.steps)
                for i in range(n_rollouts) if states[k][i].alive]
        if not live:
            break
        # identical (task, history) pairs share one prompt: build once, sample n of it
        groups: dict[tuple, list[int]] = {}
        for k, i in live:
            groups.setdefault((k, tuple(states[k][i].history)), []).append(i)
        keys = list(groups)
        prompts = {key: prompt_for(key[0], t, list(key[1])) for key in keys}
        # one sampler call per group size (usually one or two calls a step)
        outs: dict[tuple[int, int], Any] = {}
        for size in sorted({len(v) for v in groups.values()}):
            ks = [key for key in keys if len(groups[key]) == size]
            seeds = None if seed is None else [_seed(task_seeds[k], episodes[k].episode_id, t, h) for k, h in ks]
            res = sampler.generate([prompts[key] for key in ks], n=size, greedy=greedy, seeds=seeds)
            for key, samples in zip(ks, res):
                for i, s in zip(groups[key], samples):
                    outs[(key[0], i)] = (prompts[key], s)
        # score, then decide: keep, patch or end
        to_patch = []
        for k, i in live:
            prompt, s = outs[(k, i)]
            step = episodes[k].steps[t]
            orig = dataset.original_size(step, image_root=image_root, blank_screens=blank_screens)
            # a response cut at the token cap is malformed under the strict rules (reward 0, a wrong step)
            sc = gui.score_response(s.text, step, resized_size=prompt.resized_size, orig_size=orig, rules=match_rules,
                                    truncated=s.finish_reason != "stop")
            st = states[k][i]
            rec = StepRecord(task_idx=k if task_ids is None else task_ids[k], rollout_idx=i, step_idx=t, prompt=prompt,
                             response_ids=list(s.ids), sampler_logp=s.logprobs, response=s.text,
                             finish_reason=s.finish_reason, reward=sc.reward, match=sc.match, type_match=sc.type_match,
                             error=sc.error, patched=False, ended=False, history=list(st.history))
            records.append(rec)
            if history_mode == "expert":
                st.history.append(gui.expert_response(step, orig, prompt.resized_size, patch.clean_thought(step.thought)))
            elif sc.match:
                st.history.append(s.text)  # build_prompt strips special tokens
            elif patch.should_patch(st.n_patches, patch_threshold):
                rec.patched = True
                st.n_patches += 1
                if patch_mode == "on-policy":
                    to_patch.append((k, i, rec, patch.expert_action_resized(step, orig, prompt.resized_size)))
                    st.history.append(None)  # filled below, after one batched generation
                else:
                    st.history.append(patch.make_patch(patch_mode, response=s.text, step=step, orig_size=orig,
                                                       resized_size=prompt.resized_size,
                                                       episode_id=episodes[k].episode_id))
            else:
                st.alive = False
                rec.ended = True
            if t == len(episodes[k].steps) - 1:
                rec.ended = True
                st.alive = False
        if to_patch:  # on-policy thought: the policy explains the expert action, all at once
            hint_prompts = [prompt_for(k, t, rec.history, hint=patch.on_policy_hint(a)) for k, _, rec, a in to_patch]
            actions = [a for *_, a in to_patch]
            # seeded per (task, rollout) like the samples, so patches do not depend on the batch or rank
            hint_seeds = None if seed is None else [
                _seed(task_seeds[k], episodes[k].episode_id, t, ("patch", i, *rec.history)) for k, i, rec, _ in to_patch]
            gen = lambda ps: [o[0].text for o in sampler.generate(ps, n=1, greedy=greedy, seeds=hint_seeds)]  # noqa: E731
            for (k, i, _, _), text in zip(to_patch, patch.on_policy_patches(hint_prompts, actions, gen)):
                states[k][i].history[-1] = text
    return records


def _seed(seed: int, episode_id: str, t: int, history: tuple) -> int:
    """A sampling seed for one prompt that depends only on the run seed, the task, the step
    and the history (stable across processes: no Python hash randomisation)."""
    h = hashlib.blake2b(repr((seed, episode_id, t, history)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF


# -----------------------------------------------------------------------------
# the sampler engine: KV cache, prefix sharing, sampling

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass
class SampleOutput:
    ids: list[int]              # generated ids; ends with the stop id when finish_reason == "stop"
    text: str                   # ids decoded with special tokens skipped (for reward/history only)
    logprobs: torch.Tensor      # (L,) fp32 log-prob of each id under the sampling distribution
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
    """A new (cache, valid) holding rows idx (repeats allowed: that is how rows are shared)."""
    idx = idx.to(valid.device)
    return DynamicCache(ddp_cache_data=[(l.keys[idx], l.values[idx]) for l in cache.layers]), valid[idx]


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


class _SlotLayer(DynamicLayer):
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


def _bucket(n: int) -> int:
    """The static decode's batch size for n live rows: the smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


class _StaticDecode:
    """The decode state in fixed buffers (engine design note 7): every tensor a step reads or writes
    keeps its address for the whole generate call, so the step can be captured once per bucket.

    Buffers, B = _bucket(R) rows (rows R..B-1 are copies of row 0 from the prefill, never read):
    the KV cache (B, H, K, D) per layer (the prefill's _SlotLayers), valid (B, K) bool, pos
    (3, B, 1) or (B, 1) long (the next token's position), ids (B, 1) long, slot (1,) long.
    `rows` (n,) maps the sampler's live rows to buffer rows; the step runs on the first b =
    bucket rows. A row that stops stays in place (computed, not read) until the live rows fit in
    _bucket(n) < b; then they move to the front: at most log2(R) KV copies per call, where the eager
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
        self.b = _bucket(R)
        self.buckets = [self.b]                             # the buckets used, in order (stats)
        self.graphs = {} if graphs else None                # bucket -> (CUDAGraph, its logits buffer)
        self.pool = torch.cuda.graph_pool_handle() if graphs else None   # one memory pool for all buckets
        self.capture_s, self.error = 0.0, None

    def keep(self, k: torch.Tensor) -> None:
        """Keep live rows k (indices into the current live rows), compacting at a bucket edge."""
        self.rows = self.rows[k]
        n = len(self.rows)
        if _bucket(n) < self.b:
            for layer in self.layers:        # the right sides are gathers (copies): no overlap
                layer.keys[:n], layer.values[:n] = layer.keys[self.rows], layer.values[self.rows]
            self.valid[:n] = self.valid[self.rows]
            self.pos[..., :n, :] = self.pos[..., self.rows, :]
            self.rows, self.b = torch.arange(n, device=self.rows.device), _bucket(n)
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
        cache = Cache(layers=[_SlotLayer(layer.keys[:b], layer.values[:b], self.slot) for layer in self.layers])
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


def _attention_mask(valid: torch.Tensor, S: int) -> torch.Tensor:
    """valid (R, K) bool over cache slots, the last S being this forward's queries ->
    (R, 1, S, K) bool: causal, real keys only, and every query sees itself (no empty rows)."""
    K = valid.shape[1]
    q = torch.arange(K - S, K, device=valid.device)[:, None]                # (S, 1) slot of each query
    k = torch.arange(K, device=valid.device)[None, :]                       # (1, K)
    allowed = ((k <= q)[None] & valid[:, None, :]) | (k == q)[None]         # (R, S, K)
    return allowed[:, None]


class Sampler:
    """Batched KV-cached sampler; see the module docstring for the design.

    stop_token_ids: None -> <|im_end|> and <|endoftext|> (those the tokenizer has, else its
    eos); [] -> never stop (every sample runs max_new_tokens). seed: a torch.Generator on the
    model's device seeded with it is used unless generate() gets one; None -> global RNG.
    share_prefix=False prefills every sample's prompt separately (the reference path).
    decode (engine design note 7): "eager" (the reference: rows leave the batch as they stop),
    "static" (fixed buffers and buckets, uncaptured), "graph" (static, each bucket's step a CUDA
    graph; CUDA only), "auto" = graph on CUDA, else eager. Raises ValueError on an unknown mode
    or graph without CUDA. After each call `stats` holds prefill/decode token counts and times
    (time_graph_capture: seconds spent capturing, inside time_decode)."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 512, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None, seed: int | None = None,
                 share_prefix: bool = True, decode: str = "auto"):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.share_prefix = share_prefix
        process_logits(torch.zeros(1, 2), temperature, top_p)               # validate early
        self.device = next(model.parameters()).device
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        if decode == "graph" and self.device.type != "cuda":
            raise ValueError(f"decode='graph' needs a CUDA model (this one is on {self.device}); "
                             "'static' runs the same step uncaptured")
        self.decode = ("graph" if self.device.type == "cuda" else "eager") if decode == "auto" else decode
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
        # runs of image pad tokens: [a, b)
        edges = torch.diff(is_img.int(), prepend=torch.zeros(1, dtype=torch.int), append=torch.zeros(1, dtype=torch.int))
        starts, ends = (edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()
        n_img = 0 if thw is None else int(thw.shape[0])
        if len(starts) != n_img or (n_img and pv is None):
            raise ValueError(f"prompt has {len(starts)} image placeholder runs but {n_img} image_grid_thw rows "
                             f"(pixel_values {'missing' if pv is None else tuple(pv.shape)}): placeholders and pixels disagree")
        key, images = ids.tolist(), []
        if n_img:
            thw = torch.as_tensor(thw).long().cpu()
            patches = thw.prod(-1)
            if int(patches.sum()) != pv.shape[0]:
                raise ValueError(f"pixel_values has {pv.shape[0]} rows, image_grid_thw needs {int(patches.sum())}")
            offs = [0] + patches.cumsum(0).tolist()
            for i, (a, b) in enumerate(zip(starts, ends)):
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
        rows, attention mask (R, 1, S, K) bool; returns the next-token logits (R, V)."""
        dev = self.device
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
        return self._forward(cache, ids, pos, _attention_mask(valid, S), *vision), valid

    def _prefill(self, prompts: list[_Prompt], rows: list[int]):
        """Prefill the radix tree of `prompts` level by level. Returns the decode state: a cache of
        _SlotLayers whose row r continues prompts[rows[r]] (rows repeat a prompt once per sample),
        valid (R, K0 + max_new_tokens) and the first logits (R, V)."""
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
        logits = torch.cat([lg for _, _, lg in leaves])
        row_of_prompt = torch.empty(len(leaf_ids), dtype=torch.long)
        row_of_prompt[torch.tensor(leaf_ids)] = torch.arange(len(leaf_ids))
        idx = row_of_prompt[torch.tensor(rows)].to(valid.device)
        # decode cache: each sample's copy of its prompt's rows, plus room for the new tokens
        slot = torch.tensor([valid.shape[1]], device=valid.device)                  # the first free slot
        pad = (0, 0, 0, self.max_new_tokens)
        cache = Cache(layers=[_SlotLayer(F.pad(l.keys[idx], pad), F.pad(l.values[idx], pad), slot)
                              for l in cache.layers])
        return cache, F.pad(valid[idx], (0, self.max_new_tokens)), logits[idx]

    # --- the loop

    @torch.no_grad()
    def generate(self, prompts, n: int = 1, greedy: bool = False,
                 generator: torch.Generator | None = None,
                 seeds: list[int] | None = None) -> list[list[SampleOutput]]:
        """Sample n continuations of every prompt. Returns outs[i][j] for prompt i, sample j.

        seeds: optional, one int per prompt. Sample j of prompt i then draws its uniforms from its
        own generator seeded with (seeds[i], j): its draws do not depend on which other prompts
        share the batch or which rank runs it (its tokens may still, design note 6).
        A prompt is any object or dict with input_ids (T,) LongTensor (images already expanded
        to <|vision_start|><|image_pad|>*k<|vision_end|>), pixel_values (P, 1176) or None and
        image_grid_thw (I, 3) or None; a plain 1-D id tensor/list is a text prompt.
        Raises ValueError: no prompts or n < 1; len(seeds) != len(prompts); an empty prompt; a
        video prompt; image placeholder runs, image_grid_thw rows and pixel_values rows that
        disagree; temperature <= 0 or top_p outside (0, 1] (the logprobs need them, greedy too)."""
        if n < 1 or not prompts:
            raise ValueError("need at least one prompt and n >= 1")
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
            # 1. distinct prompts (identical ids and pixels -> one), one row per (prompt, sample)
            prepared = [self._prepare(p) for p in prompts]
            if self.share_prefix:
                first: dict[tuple, int] = {}
                distinct, row_prompt = [], []
                for p in prepared:
                    u = first.setdefault(tuple(p.key), len(distinct))
                    if u == len(distinct):
                        distinct.append(p)
                    row_prompt += [u] * n
            else:                       # the reference path: every sample prefilled on its own
                distinct = [p for p in prepared for _ in range(n)]
                row_prompt = list(range(len(distinct)))
            # 2. prefill once per tree node, then copy each prompt's rows to its samples (static
            # decode: padded to a bucket with copies of row 0)
            R = len(row_prompt)
            pad = row_prompt[:1] * ((_bucket(R) - R) if self.decode != "eager" else 0)
            cache, valid, logits = self._prefill(distinct, row_prompt + pad)
            logits = logits[:R]
            next_pos = torch.tensor([distinct[u].next_pos for u in row_prompt + pad], device=self.device)
            slot = cache.layers[0].slot
            static = None if self.decode == "eager" else _StaticDecode(
                self._forward, cache, valid, next_pos, R, self.rope_index is not None, self.decode == "graph")
            t1 = time.perf_counter()
            # 3. decode; a row leaves the batch (eager: and the cache) on the step it stops
            out_ids, out_lp = [[] for _ in range(R)], [[] for _ in range(R)]
            reason = ["length"] * R
            active = list(range(R))
            stop = set(self.stop_token_ids)
            banned = self.banned_ids.to(self.device)
            row_gens = None
            if seeds is not None:
                if len(seeds) != len(prompts):
                    raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
                row_gens = [torch.Generator().manual_seed((int(seeds[i]) * 1_000_003 + j) % (1 << 63))
                            for i in range(len(prompts)) for j in range(n)]
            for step in range(self.max_new_tokens):
                logits.index_fill_(-1, banned, float("-inf"))       # (R, V), ours to edit
                u = None if row_gens is None else torch.cat([torch.rand(1, generator=row_gens[r]) for r in active])
                tok, lp = sample_from_logits(logits, self.temperature, self.top_p, gen, greedy=greedy, u=u)
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
                    if static is not None:
                        static.keep(k)
                    else:
                        for layer in cache.layers:
                            layer.batch_select_indices(k)
                        valid, next_pos = valid[k], next_pos[k]
                if static is not None:
                    logits = static.step(tok)
                    continue
                pos = next_pos.view(1, -1, 1).expand(3, -1, 1) if self.rope_index is not None else next_pos[:, None]
                valid.index_fill_(1, slot, True)            # the new token's slot; later ones stay hidden
                logits = self._forward(cache, tok[:, None], pos, valid[:, None, None, :])
                next_pos = next_pos + 1
                slot.add_(1)
        finally:
            if attn not in ("sdpa", "eager"):
                model.set_attn_implementation(attn)
            if hasattr(getattr(model, "model", None), "rope_deltas"):
                model.model.rope_deltas = None    # nobody may reuse deltas of this batch
            model.train(was_training)
        t2 = time.perf_counter()
        if static is not None and static.error:
            self.decode = "static"            # the capture failed once: do not retry it every call
        self.stats.update(time_prefill=t1 - t0, time_decode=t2 - t1, rows=R, distinct_prompts=len(distinct),
                          decode=self.decode, decode_buckets=static.buckets if static else None,
                          time_graph_capture=static.capture_s if static else 0.0,
                          graph_error=static.error if static else None)
        # 4. package: rows are (prompt, sample) in order, whatever the sharing was
        texts = self.tokenizer.batch_decode(out_ids, skip_special_tokens=True)
        return [[SampleOutput(out_ids[r], texts[r], torch.tensor(out_lp[r], dtype=torch.float32), reason[r], i)
                 for r in range(i * n, (i + 1) * n)] for i in range(len(prompts))]

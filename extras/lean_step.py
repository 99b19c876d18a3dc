"""The lean decode step (sampler.Sampler(lean=...); on by default for a CPU model it supports, so a
default CPU run imports this module when it samples): one decode step of a Qwen2-style decoder computed
on the model's own weights with q|k|v and gate|up fused into one GEMM each and one attention call per
layer, about a third of the transformers forward's ops, which is what a one-token step on CPU is bound
by. Only a speed-up: the transformers forward (sampler.py's plain path) computes the same function and
is the reference it is tested against (tests/test_sampler.py: same tokens, logprobs to 1e-5 in fp32).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class LeanStep:
    """One decode step of a Qwen2 / Qwen2.5-VL text decoder on its own weights (this module's docstring):
    per layer an RMSNorm, ONE fused q|k|v GEMM, rotary on q and k together, attention, o_proj, an
    RMSNorm, ONE fused gate|up GEMM, SiLU-and-mul, down_proj; then the final norm and the lm_head. The
    transformers forward does the same math through module calls, per-call mask and cache handling and
    mrope's per-section split (~3x the ops of a one-token step; the tiny models' CPU decode is bound by
    them). A decoded token is text, so its three mrope components are equal and mrope reduces to 1-D
    rope at that position. Attention is the caller's: `__call__` attends each row over its own cache
    (the per-row layout: extras/static_decode.py's SlotLayers), extras/cascade.py's `CascadeDecode` over
    its prompt's shared KV.

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
        """The per-row layout, in place of sampler.Sampler._forward for a decode step (the static decode
        runs it): ids (R, 1) long, pos (3, R, 1) or (R, 1) long, mask (R, 1, 1, K) bool over
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



def text_model(model):
    """The decoder stack: Qwen2.5-VL's language_model, or a plain causal LM's model."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", inner)



def lean_step(model, required: bool) -> LeanStep | None:
    """The lean step of one Sampler.generate call, built from the weights now (an RL update changes
    them), or None where LeanStep.supports(model) is False (the transformers forward decodes instead).
    Raises ValueError there when required (Sampler(lean=True))."""
    if LeanStep.supports(model):
        return LeanStep(model)
    if required:
        raise ValueError("lean=True: the model is not a Qwen2-style decoder LeanStep computes exactly "
                         "(see LeanStep.supports)")
    return None

"""The policy's log-prob forward, the thin module beside the fused kernel (kernels/logprob.py):
the Hugging Face model's decoder, then kernels.fused_logprob on the response positions only;
and the batch it reads (collate_sequences: prompt + sampled ids, right-padded).
"""
from __future__ import annotations

import torch


class PolicyLogProb(torch.nn.Module):
    """The Hugging Face model plus the fused lm_head log-prob, as one root module for FSDP.

    forward(batch) -> (logp (N,) fp32, entropy (N,) fp32 or None) over the N target
    positions of the batch (targets != -100), in row-major order. Logits are never
    materialised: the decoder's last hidden states at those positions go through
    kernels.fused_logprob with the (possibly tied) lm_head weight. Calling this module
    (not model.model directly) lets FSDP2's root hooks gather embed/lm_head.
    forward(None) returns None (rollout.sampling_mode's FSDP2 root settling call).
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch: dict | None, temperature: float = 1.0, return_entropy: bool = False):
        from kernels import fused_logprob

        if batch is None:  # no-op: rollout.sampling_mode settles the FSDP2 root with it
            return None

        ids = batch["input_ids"]
        # transformers builds Qwen2.5-VL's 3-D mrope positions only when told which tokens are
        # image tokens; without mm_token_type_ids it silently falls back to 1-D positions, and the
        # trainer would score other positions than the sampler (and generate) used (SPEC 11).
        mm_types = (ids == self.model.config.image_token_id).int()  # (B, T): 1 = image token
        out = self.model.model(input_ids=ids, attention_mask=batch["attention_mask"],
                               pixel_values=batch.get("pixel_values"), image_grid_thw=batch.get("image_grid_thw"),
                               mm_token_type_ids=mm_types, use_cache=False)
        hidden = out.last_hidden_state[:, :-1]  # (B, T-1, H): position p predicts token p+1
        targets = batch["targets"][:, 1:]  # (B, T-1)
        sel = targets != -100
        h = hidden[sel]  # (N, H)
        res = fused_logprob(h, self.model.lm_head.weight, targets[sel], temperature=temperature,
                            return_entropy=return_entropy)
        return res if return_entropy else (res, None)


def collate_sequences(prompts: list, responses: list[list[int]], pad_id: int) -> dict:
    """Right-pad prompt+response sequences into one batch.

    prompts: objects with input_ids (T_i,) int64, pixel_values (P_i, 1176) or None and
    image_grid_thw (I_i, 3) or None (gui.Prompt). responses: the sampled token ids,
    exactly as the sampler produced them (never re-tokenised text). Returns input_ids and
    targets (B, T) int64 (targets = input_ids on response tokens, -100 elsewhere: padding
    is masked by position, never by comparing with pad_id, which may equal EOS),
    attention_mask (B, T) int64, and the images concatenated in row order.
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
    if pv:
        batch["pixel_values"] = torch.cat(pv)
        batch["image_grid_thw"] = torch.cat([p.image_grid_thw for p in prompts if p.image_grid_thw is not None])
    return batch


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}

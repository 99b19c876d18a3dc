"""The peer the sampler is measured and tested against: Hugging Face `model.generate`'s inputs for a batch
of prompts. Used by bench/bench_sampler.py, bench/bench_step.py (the TRL-style step), bench/gpu_sections.py
and tests/test_sampler.py; the product never calls generate (sampler.Sampler does its own decoding).
"""
import torch


def generate_inputs(prompts: list, pad_id: int, image_token_id: int | None, device="cpu", dtype=None) -> dict:
    """Keyword arguments of Hugging Face `model.generate` for a batch of StepPrompts, the reference the
    sampler is compared with: input_ids and attention_mask (B, T) int64, LEFT-padded with pad_id (as
    generate expects); with screenshots, also pixel_values (cast to dtype), image_grid_thw and
    mm_token_type_ids (1 at image_token_id, None for a text-only model: without it Qwen2.5-VL falls back
    to 1-D positions)."""
    T = max(len(p.input_ids) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p.input_ids):] = torch.as_tensor(p.input_ids)
        mask[i, T - len(p.input_ids):] = 1
    kw = dict(input_ids=ids.to(device), attention_mask=mask.to(device))
    images = [p for p in prompts if p.pixel_values is not None]
    if images:
        kw.update(pixel_values=torch.cat([p.pixel_values for p in images]).to(device, dtype),
                  image_grid_thw=torch.cat([p.image_grid_thw for p in images]).to(device),
                  mm_token_type_ids=(ids == image_token_id).int().to(device))
    return kw

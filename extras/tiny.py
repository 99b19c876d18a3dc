"""The tiny presets (--model tiny / tiny:HxL): a Qwen2.5-VL of CPU size with random weights, on the
small retrained tokenizer (assets/tiny_tokenizer, 8,192 tokens). train_sft.py's default and the tests'
models. vlm.load_model and vlm.model_path import this module only for such a name: the RL step's
default start, a checkpoint (--model auto), never builds a model from a preset."""
from __future__ import annotations

import torch


def parse_tiny(name: str) -> tuple[int, int] | None:
    """'tiny' -> (64, 2); 'tiny:HxL' -> (H, L) (hidden size, text layers); anything else None.
    Raises ValueError on a malformed 'tiny:...' or an H that is not a positive multiple of 16."""
    name = str(name)
    if name == "tiny" or not name.startswith("tiny:"):
        return (64, 2) if name == "tiny" else None
    try:
        h, n = (int(v) for v in name[5:].split("x"))
    except ValueError:
        raise ValueError(f"--model {name}: expected tiny:HxL, e.g. tiny:128x4") from None
    if h <= 0 or h % 16 or n <= 0:
        raise ValueError(f"--model {name}: hidden size must be a positive multiple of 16, layers >= 1")
    return h, n


def tiny_config(hidden_size: int = 64, num_layers: int = 2, *, tokenizer, vocab_size: int | None = None):
    """A Qwen2.5-VL config for CPU training: the 7B's architecture (mrope sections summing to
    head_dim / 2, windowed vision tower, tied embedding) at hidden_size x num_layers, max(4, hidden / 32)
    heads. Vocabulary and special-token ids from `tokenizer` (the presets': vlm.load_processor("tiny")[0]);
    vocab_size defaults to its length. Raises ValueError if smaller or a special token is missing."""
    from transformers import Qwen2_5_VLConfig  # (here: vlm.model_path imports this module to parse a name)

    ids = {name: tokenizer.convert_tokens_to_ids(s) for name, s in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("bos_token_id", "<|endoftext|>"))}
    ids["eos_token_id"], ids["pad_token_id"] = tokenizer.eos_token_id, tokenizer.pad_token_id
    vocab = len(tokenizer) if vocab_size is None else int(vocab_size)
    if vocab < len(tokenizer) or None in ids.values():
        raise ValueError(f"tiny_config: vocab_size {vocab} < {len(tokenizer)} tokens, or special tokens missing: {ids}")
    heads = max(4, hidden_size // 32)
    half = hidden_size // heads // 2  # mrope sections (t, h, w) sum to head_dim / 2
    t = half // 4
    section = [t, (half - t) // 2, half - t - (half - t) // 2]
    return Qwen2_5_VLConfig(
        text_config=dict(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=heads, num_key_value_heads=2, vocab_size=vocab,
                         max_position_embeddings=8192, tie_word_embeddings=True, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": 1e6},
                         **{k: ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=hidden_size,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[1]),
        tie_word_embeddings=True, **ids)


def tiny_model(name: str, tokenizer, attn: str, seed: int):
    """vlm.load_model of a preset `name` ('tiny' / 'tiny:HxL'): a Qwen2_5_VLForConditionalGeneration of
    tiny_config on `tokenizer`, fp32 on CPU, attention implementation `attn`, random weights seeded by
    `seed` (the same on every rank). Raises ValueError on a malformed name (parse_tiny)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    size = parse_tiny(name)
    if size is None:
        raise ValueError(f"--model {name}: not a tiny preset ('tiny' or 'tiny:HxL')")
    torch.manual_seed(seed)
    cfg = tiny_config(*size, tokenizer=tokenizer)
    cfg._attn_implementation = attn
    return Qwen2_5_VLForConditionalGeneration(cfg)

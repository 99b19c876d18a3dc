"""--merge (the trainers, with LoRA) and tools/merge_lora.py: a LoRA checkpoint's adapted model
written out as a plain Hugging Face folder, which --model then loads like any other."""
import shutil
from os import PathLike
from pathlib import Path

import vlm


def merge_checkpoint(ckpt: str | PathLike, out: str | PathLike) -> Path:
    """Write LoRA checkpoint `ckpt`'s adapted model (vlm.load_model merges the adapters into their
    base) to `out`: safetensors weights, the tokenizer, and args.json when `ckpt` has one. Returns
    `out`. Raises what vlm.load_model raises for a folder that is not a checkpoint."""
    ckpt, out = Path(ckpt), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vlm.load_model(ckpt).save_pretrained(str(out), safe_serialization=True)
    vlm.load_processor(ckpt)[0].save_pretrained(str(out))
    if (ckpt / "args.json").is_file():
        shutil.copy(ckpt / "args.json", out / "args.json")
    return out

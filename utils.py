"""Plumbing shared by the stages: distributed set-up, seeding, model and processor loading,
checkpoint I/O. Nothing GUI- or method-specific (gui.py, rollout.py, ...); what a script reads
and writes at its edges (flags, input errors, strict-JSON output and the metrics file) is cli.py."""
from __future__ import annotations

import functools
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gui import MAX_PIXELS, MIN_PIXELS

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER_DIR = ASSETS / "qwen2_5_vl_tokenizer"  # the real Qwen2.5-VL tokenizer (151,665 tokens)
TINY_TOKENIZER_DIR = ASSETS / "tiny_tokenizer"  # its small retrained twin for models trained from scratch

# -----------------------------------------------------------------------------
# distributed


@dataclass
class Dist:
    """This process's place in the run (init_distributed); is_main: rank 0."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    is_main = property(lambda self: self.rank == 0)


def init_distributed(device: str = "auto") -> Dist:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; start a process group (nccl on CUDA, gloo
    on CPU) whenever torchrun launched us, `--nproc_per_node=1` included, so one GPU runs the same
    FSDP2 path as eight; a plain `python script.py` runs unsharded. device: "auto", "cpu", "cuda"."""
    rank, world_size, local_rank = (int(os.environ.get(k, v)) for k, v in (("RANK", 0), ("WORLD_SIZE", 1),
                                                                          ("LOCAL_RANK", 0)))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if (world_size > 1 or "RANK" in os.environ) and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world_size, local_rank, dev)


def cleanup_distributed() -> None:
    """Wait for every rank, then end the process group (if any)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def get_rank() -> int:
    """This process's rank: the process group's, else torchrun's RANK (before init), else 0."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def print0(*args, **kwargs) -> None:
    """print on rank 0 only (flushes, so logs interleave sanely with tqdm)."""
    if get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks; a no-op without a process group."""
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory, for the trainers' `peak_mem_bytes`: on CUDA the bytes held by
    tensors since the last torch.cuda.reset_peak_memory_stats (the trainers reset it every step);
    on CPU the peak resident set since the process started (Linux ru_maxrss, in KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every generator's state (python, numpy, torch CPU, each CUDA device) as JSON-able lists."""
    py, np_state = random.getstate(), np.random.get_state()
    state = {"python": [py[0], list(py[1]), py[2]], "torch": torch.get_rng_state().tolist(),
             "numpy": [np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() returned (every generator it holds)."""
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    n = state["numpy"]
    np.random.set_state(("MT19937", np.array(n[0], dtype=np.uint32), n[1], n[2], n[3]))
    if "cuda" in state:
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# -----------------------------------------------------------------------------
# model and processor


def tokenizer_dir(model: str | os.PathLike | None = "tiny") -> Path:
    """Where the tokenizer of `model` lives: 'tiny' / 'tiny:HxL' -> assets/tiny_tokenizer (the
    small vocabulary the tiny preset is built on, tools/build_tiny_tokenizer.py); a folder with
    tokenizer files (a Hugging Face model, any checkpoint this project wrote) -> that folder, so a
    model always meets its own vocabulary; None or a weights-only folder -> the Qwen2.5-VL-7B
    tokenizer in assets/qwen2_5_vl_tokenizer."""
    if model is not None and parse_tiny(str(model)) is not None:
        return TINY_TOKENIZER_DIR
    if model is not None and (Path(model) / "tokenizer_config.json").exists():
        return Path(model)
    return TOKENIZER_DIR


def load_processor(model: str | os.PathLike | None = "tiny", min_pixels: int = MIN_PIXELS,
                   max_pixels: int = MAX_PIXELS):
    """(tokenizer, image_processor) for a Qwen2.5-VL policy `model` (see tokenizer_dir for which
    tokenizer). The image processor is transformers' PIL one (patch 14, merge 2, smart_resize
    between min_pixels and max_pixels, pixels of the original screenshot), built directly: the
    processor class wants a video processor, which needs torchvision."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _tokenizer(str(tokenizer_dir(model)))
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels,
                                               patch_size=14, temporal_patch_size=2, merge_size=2)
    return tokenizer, image_processor


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


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


def tiny_config(hidden_size: int = 64, num_layers: int = 2, tokenizer=None, vocab_size: int | None = None):
    """A Qwen2.5-VL config for CPU training: the 7B's architecture (mrope sections summing to
    head_dim / 2, windowed vision tower, tied embedding) at hidden_size x num_layers. Heads
    max(4, hidden / 32), MLP width 2 x hidden. The vocabulary and the special-token ids (image,
    video, vision start/end, bos, eos, pad) come from `tokenizer` (default: the small tokenizer of
    assets/tiny_tokenizer: 8,192 tokens, so ~1 M of the 1.9 M text parameters at 128 x 4 instead of
    19 M with Qwen's 151,936); vocab_size defaults to len(tokenizer) and must not be smaller."""
    from transformers import Qwen2_5_VLConfig

    tok = tokenizer if tokenizer is not None else load_processor("tiny")[0]
    ids = {name: tok.convert_tokens_to_ids(s) for name, s in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("bos_token_id", "<|endoftext|>"))}
    ids["eos_token_id"], ids["pad_token_id"] = tok.eos_token_id, tok.pad_token_id
    vocab = len(tok) if vocab_size is None else int(vocab_size)
    if vocab < len(tok) or None in ids.values():
        raise ValueError(f"tiny_config: vocab_size {vocab} < {len(tok)} tokens, or special tokens missing: {ids}")
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


def attn_implementation(device: torch.device | str) -> str:
    """flash_attention_2 when flash-attn imports on a CUDA device, else SDPA."""
    if torch.device(device).type != "cuda":
        return "sdpa"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "sdpa"
    return "flash_attention_2"


def load_model(name: str | os.PathLike = "tiny", *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", seed: int = 0):
    """Build or load a Qwen2_5_VLForConditionalGeneration (swap the policy model here). name:
    "tiny" / "tiny:HxL" (tiny_config on the small tokenizer of assets/tiny_tokenizer, random weights
    seeded by `seed`: the same on every rank and run) or a local Hugging Face folder (Qwen2.5-VL-7B-Instruct, a save_checkpoint folder).
    Raises FileNotFoundError when the folder has no config.json: nothing is downloaded."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    attn = attn_implementation(device)
    size = parse_tiny(name)
    if size is not None:
        torch.manual_seed(seed)
        cfg = tiny_config(*size)
        cfg._attn_implementation = attn
        return Qwen2_5_VLForConditionalGeneration(cfg).to(dtype).to(device)
    if not (Path(name) / "config.json").exists():
        raise FileNotFoundError(f"--model {name}: not 'tiny' and no config.json in that directory")
    return Qwen2_5_VLForConditionalGeneration.from_pretrained(str(name), dtype=dtype, attn_implementation=attn).to(device)


# -----------------------------------------------------------------------------
# checkpoints: Hugging Face layout + safetensors, written atomically


def save_checkpoint(out_dir: str | os.PathLike, model, tokenizer, args: dict, *, optimizer=None,
                    extra: dict | None = None, keep: int = 2) -> Path | None:
    """Write out_dir/step_XXXXXX/ (Hugging Face layout, args.json, trainer_state.json = extra with
    "step"; with an optimizer also optimizer.pt and every rank's RNG state), atomically (a finished
    temporary folder renamed into place, then os.replace of out_dir/latest); keep the newest `keep`.
    Collective (plain or FSDP2 model; rank 0 writes). Returns the folder on rank 0, else None."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # unsharded, on CPU
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    rngs = [rng_state()]  # every rank's generators: ranks draw different numbers
    if dist.is_initialized():
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, rng_state())
    if get_rank() != 0:
        return None
    extra, out_dir = dict(extra or {}), Path(out_dir)
    step = int(extra.get("step", 0))
    out_dir.mkdir(parents=True, exist_ok=True)
    final, tmp = out_dir / f"step_{step:06d}", out_dir / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    inner = model if hasattr(model, "save_pretrained") else model.model  # an FSDP root (PolicyLogProb) wraps it
    msd = msd if inner is model else {k.removeprefix("model."): v for k, v in msd.items()}
    if getattr(inner.config, "tie_word_embeddings", False):
        msd.pop("lm_head.weight", None)  # tied to the input embedding (FSDP's state dict lists both)
    inner.save_pretrained(str(tmp), state_dict=msd, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    (tmp / "args.json").write_text(json.dumps(args, indent=2, default=str))
    if osd is not None:
        torch.save(osd, tmp / "optimizer.pt")
        extra["rng"] = rngs  # one rng_state() per rank
    (tmp / "trainer_state.json").write_text(json.dumps(extra, default=str))
    shutil.rmtree(final, ignore_errors=True)  # an older checkpoint of the same step
    os.replace(tmp, final)  # atomic on POSIX: the folder appears complete or not at all
    (out_dir / f".latest.{os.getpid()}").write_text(final.name)
    os.replace(out_dir / f".latest.{os.getpid()}", out_dir / "latest")
    old = sorted(p for p in out_dir.glob("step_*") if p.is_dir() and p != final)
    for p in old[:-keep + 1] if keep > 1 else old:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The folder named by out_dir/latest, or None. Temporary folders are never named."""
    ptr = Path(out_dir) / "latest"
    path = Path(out_dir) / ptr.read_text().strip() if ptr.exists() else None
    return path if path and ((path / "model.safetensors").exists() or (path / "config.json").exists()) else None


def load_checkpoint_state(ckpt: str | os.PathLike, model, optimizer=None) -> dict:
    """Load a save_checkpoint folder into a (possibly FSDP2) model, optimizer and every RNG;
    returns trainer_state.json. Collective. optimizer.pt is read weights_only (nothing unpickled).
    Raises FileNotFoundError (no config.json), ValueError (saved for another number of ranks)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from transformers import Qwen2_5_VLForConditionalGeneration

    ckpt = Path(ckpt)
    if not (ckpt / "config.json").exists():
        raise FileNotFoundError(f"{ckpt}: no config.json (not a checkpoint folder)")
    # read through from_pretrained (on CPU): it maps the Hub's key names back to the module's
    msd = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).state_dict()
    inner = model if hasattr(model, "save_pretrained") else model.model
    msd = msd if inner is model else {"model." + k: v for k, v in msd.items()}
    if getattr(inner.config, "tie_word_embeddings", False):
        msd = {k: v for k, v in msd.items() if k not in ("lm_head.weight", "model.lm_head.weight")}
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, msd, options=opts)
    state = json.loads((ckpt / "trainer_state.json").read_text()) if (ckpt / "trainer_state.json").exists() else {}
    if optimizer is not None and (ckpt / "optimizer.pt").exists():
        osd = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        set_optimizer_state_dict(model, optimizer, osd, options=opts)
    if isinstance(state.get("rng"), list):  # (older checkpoints kept rank 0's only, in another layout)
        rank, n = get_rank(), len(state["rng"])
        if n != (dist.get_world_size() if dist.is_initialized() else 1):
            raise ValueError(f"{ckpt / 'trainer_state.json'}: field 'rng' holds {n} ranks' generators; "
                             f"resume with that many processes")
        set_rng_state(state["rng"][rank])
    return state

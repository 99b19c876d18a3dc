"""Plumbing shared by the stages: distributed set-up, seeding, model and processor
loading, checkpoint I/O and JSONL metrics. Nothing GUI-specific lives here (that is
gui.py) and nothing method-specific (that is rollout.py / patch.py / advantage.py).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

REPO_DIR = Path(__file__).resolve().parent
TOKENIZER_DIR = REPO_DIR / "assets" / "qwen2_5_vl_tokenizer"
MIN_PIXELS = 4 * 28 * 28  # release defaults of Qwen2.5-VL's smart_resize (docs/method.md §3)
MAX_PIXELS = 12800 * 28 * 28

# -----------------------------------------------------------------------------
# distributed


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> Dist:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK and start a process group.

    World size 1 (plain `python script.py`) starts no process group and runs the same
    code. The backend is nccl on CUDA and gloo on CPU. `device` is "auto", "cpu" or "cuda".
    """
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world_size, local_rank, dev)


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def print0(*args, **kwargs) -> None:
    """print on rank 0 only (flushes, so logs interleave sanely with tqdm)."""
    if get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks; a no-op without a process group."""
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -----------------------------------------------------------------------------
# model and processor


def load_processor(path: str | os.PathLike | None = None, min_pixels: int = MIN_PIXELS,
                   max_pixels: int = MAX_PIXELS):
    """Load (tokenizer, image_processor) for Qwen2.5-VL. `path`: a local Hugging Face folder with
    the tokenizer files; None: the real Qwen2.5-VL-7B-Instruct tokenizer shipped in assets/. The
    image processor is transformers' PIL one (the fast one needs torchvision), built directly:
    Qwen2_5_VLProcessor insists on a video processor."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path) if path is not None else TOKENIZER_DIR
    if not (path / "tokenizer_config.json").exists():
        path = TOKENIZER_DIR  # a weights-only model directory: fall back to the shipped tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels,
                                               patch_size=14, temporal_patch_size=2, merge_size=2)
    return tokenizer, image_processor


def tiny_config():
    """A Qwen2.5-VL config small enough for CPU training (~10 M parameters, most of them
    the tied 151,936 x 64 embedding). Same architecture as the 7B: mrope with sections
    summing to head_dim / 2, a windowed vision tower with patch 14 and merge 2."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=151936, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6},
            tie_word_embeddings=True, rms_norm_eps=1e-6),
        vision_config=dict(
            depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
            fullatt_block_indexes=[1]),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
        vision_end_token_id=151653, bos_token_id=151643, eos_token_id=151645, pad_token_id=151643,
        tie_word_embeddings=True,
    )


def attn_implementation(device: torch.device | str) -> str:
    """flash_attention_2 when flash-attn imports on a CUDA device, else SDPA."""
    if torch.device(device).type == "cuda":
        try:
            import flash_attn  # noqa: F401
            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def load_model(name: str | os.PathLike = "tiny", *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", seed: int = 0):
    """Build or load a Qwen2_5_VLForConditionalGeneration (swap the policy model here).
    name: "tiny" builds tiny_config() with random weights (seeded by `seed`, so every rank
    and every run gets the same initial model); anything else is a local Hugging Face
    directory (e.g. Qwen2.5-VL-7B-Instruct, or a checkpoint written by save_checkpoint).
    Raises FileNotFoundError when the directory has no config.json: nothing is downloaded.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    attn = attn_implementation(device)
    if str(name) == "tiny":
        torch.manual_seed(seed)
        cfg = tiny_config()
        cfg._attn_implementation = attn
        model = Qwen2_5_VLForConditionalGeneration(cfg).to(dtype)
    else:
        path = Path(name)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"--model {name}: not 'tiny' and no config.json in that directory")
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(path), dtype=dtype, attn_implementation=attn)
    return model.to(device)


# -----------------------------------------------------------------------------
# checkpoints: Hugging Face layout + safetensors, written atomically


def _hf_model(model):
    """The Hugging Face model inside a training root (kernels.policy_logprob.PolicyLogProb), or model."""
    return model if hasattr(model, "save_pretrained") else model.model


def _full_state_dicts(model, optimizer):
    """Full (unsharded, CPU) model and optimizer state dicts; works for plain modules and
    FSDP2-sharded ones alike. Collective under FSDP: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    return msd, osd


def save_checkpoint(out_dir: str | os.PathLike, model, tokenizer, args: dict, *, optimizer=None,
                    extra: dict | None = None, keep: int = 2) -> Path | None:
    """Write out_dir/step_XXXXXX/ (config.json, model.safetensors, tokenizer files,
    args.json, and with an optimizer: optimizer.pt + trainer_state.json with RNG state),
    then point out_dir/latest at it.

    Atomicity: everything goes to a temporary sibling folder that is renamed into place
    only when complete, and `latest` is replaced with os.replace; a process killed at any
    moment leaves the previous checkpoint and pointer intact. Collective under FSDP (all
    ranks call it; rank 0 writes). Returns the checkpoint path on rank 0, else None.
    `extra` must hold a "step" key.
    """
    msd, osd = _full_state_dicts(model, optimizer)
    if get_rank() != 0:
        return None
    extra = dict(extra or {})
    step = int(extra.get("step", 0))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"step_{step:06d}"
    tmp = out_dir / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    inner = _hf_model(model)
    if inner is not model:  # the FSDP root (PolicyLogProb) wraps the HF model: drop its prefix
        msd = {k.removeprefix("model."): v for k, v in msd.items()}
    if getattr(inner.config, "tie_word_embeddings", False):
        msd.pop("lm_head.weight", None)  # tied to the input embedding (FSDP's state dict lists both)
    inner.save_pretrained(str(tmp), state_dict=msd, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    (tmp / "args.json").write_text(json.dumps(args, indent=2, default=str))
    if osd is not None:
        torch.save(osd, tmp / "optimizer.pt")
        np_state = np.random.get_state()
        extra["rng"] = {"torch": torch.get_rng_state().tolist(), "python": list(random.getstate()[1]),
                        "numpy": [np_state[1].tolist(), int(np_state[2])]}
    (tmp / "trainer_state.json").write_text(json.dumps(extra, default=str))
    shutil.rmtree(final, ignore_errors=True)  # an older checkpoint of the same step
    os.replace(tmp, final)  # atomic on POSIX: the folder appears complete or not at all
    ptr_tmp = out_dir / f".latest.{os.getpid()}"
    ptr_tmp.write_text(final.name)
    os.replace(ptr_tmp, out_dir / "latest")
    old = sorted(p for p in out_dir.glob("step_*") if p.is_dir() and p != final)
    for p in old[:-keep + 1] if keep > 1 else old:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The folder named by out_dir/latest, or None. Temporary folders are never named."""
    ptr = Path(out_dir) / "latest"
    if not ptr.exists():
        return None
    path = Path(out_dir) / ptr.read_text().strip()
    return path if (path / "model.safetensors").exists() or (path / "config.json").exists() else None


def load_checkpoint_state(ckpt: str | os.PathLike, model, optimizer=None) -> dict:
    """Load model (and optimizer) state from a save_checkpoint folder into a possibly
    FSDP2-sharded model; returns trainer_state.json. Collective under FSDP. The optimizer
    file is read with weights_only=True: nothing is unpickled."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    from transformers import Qwen2_5_VLForConditionalGeneration

    ckpt = Path(ckpt)
    if not (ckpt / "config.json").exists():
        raise FileNotFoundError(f"{ckpt}: no config.json (not a checkpoint folder)")
    # save_pretrained writes the Hub's key names; from_pretrained maps them back to the
    # module's names, so the full state dict is read through it (on CPU).
    msd = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).state_dict()
    inner = _hf_model(model)
    if inner is not model:
        msd = {"model." + k: v for k, v in msd.items()}
    if getattr(inner.config, "tie_word_embeddings", False):
        msd.pop("lm_head.weight", None)
        msd.pop("model.lm_head.weight", None)
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, msd, options=opts)
    state = json.loads((ckpt / "trainer_state.json").read_text()) if (ckpt / "trainer_state.json").exists() else {}
    if optimizer is not None and (ckpt / "optimizer.pt").exists():
        osd = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True, strict=False))
    if "rng" in state:
        rng = state["rng"]
        torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
        random.setstate((3, tuple(rng["python"]), None))
        np.random.set_state(("MT19937", np.array(rng["numpy"][0], dtype=np.uint32), rng["numpy"][1], 0, 0.0))
    return state


# -----------------------------------------------------------------------------
# metrics


class MetricsLogger:
    """Write one JSON object per line to `path` (rank 0 only); adds wall time `t`. A new run
    starts the file afresh; a resumed one (append=True) continues it."""

    def __init__(self, path: str | os.PathLike | None, append: bool = False):
        self.path = Path(path) if path is not None else None
        self.t0 = time.time()
        if self.path is not None and get_rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not append:
                self.path.write_text("")

    def log(self, row: dict) -> None:
        if self.path is None or get_rank() != 0:
            return
        row = {**row, "t": round(time.time() - self.t0, 3)}
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")

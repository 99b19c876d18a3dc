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
# Release defaults (Qwen2.5-VL smart_resize): SPEC section 3.
MIN_PIXELS = 4 * 28 * 28
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
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
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


def rng_state() -> dict:
    """This process's global generators (python, numpy, torch CPU, and every CUDA device when
    CUDA is available, used or not yet), as JSON-able lists, for checkpoints."""
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


def load_processor(path: str | os.PathLike | None = None, min_pixels: int = MIN_PIXELS,
                   max_pixels: int = MAX_PIXELS):
    """Load (tokenizer, image_processor) for Qwen2.5-VL.

    `path` is a local Hugging Face directory holding the tokenizer files; None means the
    real Qwen2.5-VL-7B-Instruct tokenizer shipped in assets/. The image processor is
    transformers' PIL implementation (Qwen2VLImageProcessorPil): the fast one needs
    torchvision, and we build the processor parts ourselves rather than going through
    Qwen2_5_VLProcessor (which insists on a video processor).
    """
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path) if path is not None else TOKENIZER_DIR
    if not (path / "tokenizer_config.json").exists():
        path = TOKENIZER_DIR  # a weights-only model directory: fall back to the shipped tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels,
                                               patch_size=14, temporal_patch_size=2, merge_size=2)
    return tokenizer, image_processor


def parse_tiny(name: str) -> tuple[int, int] | None:
    """'tiny' -> (64, 2); 'tiny:HxL' -> (H, L) (hidden size, text layers); anything else None.
    Raises ValueError on a malformed 'tiny:...' or an H that is not a positive multiple of 16."""
    name = str(name)
    if name == "tiny":
        return 64, 2
    if not name.startswith("tiny:"):
        return None
    try:
        h, n = (int(v) for v in name[5:].split("x"))
    except ValueError:
        raise ValueError(f"--model {name}: expected tiny:HxL, e.g. tiny:128x4") from None
    if h <= 0 or h % 16 or n <= 0:
        raise ValueError(f"--model {name}: hidden size must be a positive multiple of 16, layers >= 1")
    return h, n


def tiny_config(hidden_size: int = 64, num_layers: int = 2):
    """A Qwen2.5-VL config small enough for CPU training (~10 M parameters at the default 64 x 2,
    most of them the tied 151,936 x hidden embedding). Same architecture as the 7B: mrope with
    sections summing to head_dim / 2, a windowed vision tower with patch 14 and merge 2.
    Heads: max(4, hidden/32), head_dim 16 or more; MLP width 2 x hidden."""
    from transformers import Qwen2_5_VLConfig

    heads = max(4, hidden_size // 32)
    half = hidden_size // heads // 2  # mrope sections (t, h, w) sum to head_dim / 2
    t = half // 4
    section = [t, (half - t) // 2, half - t - (half - t) // 2]
    return Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
            num_attention_heads=heads, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": 1e6},
            tie_word_embeddings=True, rms_norm_eps=1e-6,
        ),
        vision_config=dict(
            depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=hidden_size,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
            fullatt_block_indexes=[1],
        ),
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
    """Build or load a Qwen2_5_VLForConditionalGeneration.

    name: "tiny" builds tiny_config() with random weights (seeded by `seed`, so every rank
    and every run gets the same initial model), "tiny:HxL" the same with hidden size H and L
    text layers (parse_tiny); anything else is a local Hugging Face
    directory (e.g. Qwen2.5-VL-7B-Instruct, or a checkpoint written by save_checkpoint).
    Raises FileNotFoundError when the directory has no config.json: nothing is downloaded.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    attn = attn_implementation(device)
    size = parse_tiny(name)
    if size is not None:
        torch.manual_seed(seed)
        cfg = tiny_config(*size)
        cfg._attn_implementation = attn
        model = Qwen2_5_VLForConditionalGeneration(cfg).to(dtype)
    else:
        path = Path(name)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"--model {name}: not 'tiny' and no config.json in that directory")
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            str(path), dtype=dtype, attn_implementation=attn)
    return model.to(device)


# -----------------------------------------------------------------------------
# checkpoints: Hugging Face layout + safetensors, written atomically


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
    args.json, and with an optimizer: optimizer.pt + trainer_state.json with every rank's RNG state),
    then point out_dir/latest at it.

    Atomicity: everything goes to a temporary sibling folder that is renamed into place
    only when complete, and `latest` is replaced with os.replace; a process killed at any
    moment leaves the previous checkpoint and pointer intact. Collective under FSDP (all
    ranks call it; rank 0 writes). Returns the checkpoint path on rank 0, else None.
    `extra` must hold a "step" key.
    """
    msd, osd = _full_state_dicts(model, optimizer)
    rngs = [rng_state()]  # every rank's generators: ranks draw different numbers
    if dist.is_initialized():
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, rng_state())
    if get_rank() != 0:
        return None
    extra = dict(extra or {})
    step = int(extra.get("step", 0))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"step_{step:06d}"
    tmp = out_dir / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    inner = model
    if isinstance(model, PolicyLogProb):  # the FSDP root wraps the HF model: drop its prefix
        inner = model.model
        msd = {k.removeprefix("model."): v for k, v in msd.items()}
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
    if final.exists():
        shutil.rmtree(final)
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
    src = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32)
    msd = src.state_dict()
    del src
    inner = model
    if isinstance(model, PolicyLogProb):
        inner = model.model
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
    if isinstance(state.get("rng"), list):  # (older checkpoints kept rank 0's only, in another layout)
        rank, n = get_rank(), len(state["rng"])
        if n != (dist.get_world_size() if dist.is_initialized() else 1):
            raise ValueError(f"{ckpt / 'trainer_state.json'}: field 'rng' holds {n} ranks' generators; "
                             f"resume with that many processes")
        set_rng_state(state["rng"][rank])
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


# -----------------------------------------------------------------------------
# FSDP2 and the policy's log-prob forward (shared by train_sft.py and train_semionline.py)


def apply_fsdp(model, root: torch.nn.Module, dist_info: Dist, mixed_precision: bool):
    """Shard with FSDP2: `fully_shard` each decoder layer and vision block, then `root`
    (which owns the embeddings, lm_head and the rest). bf16 params with fp32 gradient
    reduction when `mixed_precision` (GPU); fp32 otherwise (CPU, gloo). World size 1:
    returns `root` unchanged (no process group, same code path)."""
    if dist_info.world_size == 1:
        return root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(dist_info.device.type, (dist_info.world_size,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if mixed_precision else MixedPrecisionPolicy())
    for layer in model.model.language_model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    for block in model.model.visual.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    return root


class PolicyLogProb(torch.nn.Module):
    """The Hugging Face model plus the fused lm_head log-prob, as one root module for FSDP.

    forward(batch) -> (logp (N,) fp32, entropy (N,) fp32 or None) over the N target
    positions of the batch (targets != -100), in row-major order. Logits are never
    materialised: the decoder's last hidden states at those positions go through
    kernels.fused_logprob with the (possibly tied) lm_head weight. Calling this module
    (not model.model directly) lets FSDP2's root hooks gather embed/lm_head.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch: dict, temperature: float = 1.0, return_entropy: bool = False):
        from kernels import fused_logprob

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

"""The policy model: everything that knows it is Qwen2.5-VL (swap the model here). Loading
(`load_model`, `load_processor`, `model_path`: --model's type; the CPU presets in extras/tiny.py);
checkpoints (`save_checkpoint`; extras/resume.py reads them back); the tokens the sampler never emits
or stops at; the policy as training runs it (`PolicyLogProb` on the batch `collate_sequences` builds);
FSDP2 (`apply_fsdp`, `checkpoint_activations`; `sampling_mode` lends the policy to the sampler, which
reads the model through the transformers interface plus `get_rope_index`)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.utils.rnn import pad_sequence

import utils
from gui import MAX_PIXELS, MIN_PIXELS
from kernels import fused_logprob

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER_DIR = ASSETS / "qwen2_5_vl_tokenizer"  # the real Qwen2.5-VL tokenizer (151,665 tokens)
TINY_TOKENIZER_DIR = ASSETS / "tiny_tokenizer"  # its small retrained twin for models trained from scratch
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")  # the end of an assistant turn; the end of the text

# -----------------------------------------------------------------------------
# loading: the tiny presets and Hugging Face folders

def tokenizer_dir(model: str | os.PathLike | None = "tiny") -> Path:
    """Where `model`'s tokenizer lives: 'tiny' / 'tiny:HxL' -> assets/tiny_tokenizer; a folder with
    tokenizer files -> that folder (a model meets its own vocabulary); else the Qwen2.5-VL tokenizer."""
    if utils.is_tiny(model):
        return TINY_TOKENIZER_DIR
    if model is not None and (Path(model) / "tokenizer_config.json").exists():
        return Path(model)
    return TOKENIZER_DIR


def load_processor(model: str | os.PathLike | None = "tiny", min_pixels: int = MIN_PIXELS,
                   max_pixels: int = MAX_PIXELS):
    """(tokenizer, image_processor) of `model` (tokenizer_dir). The image processor is transformers'
    PIL one (patch 14, merge 2, smart_resize of the original screenshot to [min_pixels, max_pixels]
    pixels), built directly: the processor class would want a video processor, which needs
    torchvision."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _tokenizer(str(tokenizer_dir(model)))
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels,
                                               patch_size=14, temporal_patch_size=2, merge_size=2)
    return tokenizer, image_processor


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


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
    """A Qwen2_5_VLForConditionalGeneration. name: 'tiny' / 'tiny:HxL' (extras/tiny.py, random weights
    seeded by `seed`, the same on every rank), a Hugging Face folder, or a LoRA checkpoint folder (its
    base with the adapters merged). Raises FileNotFoundError without config.json (nothing is downloaded)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    attn = attn_implementation(device)
    if utils.is_tiny(name):  # a preset: built only here, so that a run from a checkpoint never imports it
        from extras.tiny import tiny_model
        return tiny_model(name, load_processor(name)[0], attn, seed).to(dtype).to(device)
    if utils.is_adapter_dir(name):  # a LoRA checkpoint: its base (loaded here) + adapters, merged
        import lora
        return lora.merge_adapter(name, load_model).to(dtype).to(device)
    if not (Path(name) / "config.json").exists():
        raise FileNotFoundError(f"--model {name}: not 'tiny' and no config.json in that directory")
    return Qwen2_5_VLForConditionalGeneration.from_pretrained(str(name), dtype=dtype, attn_implementation=attn).to(device)


def model_path(name: str) -> str:
    """argparse type of --model: 'tiny', 'tiny:HxL', 'auto' and model folders as is; a run folder's
    `latest` pointer -> the checkpoint it names. Raises ValueError (a malformed 'tiny:...') or
    UsageError (anything else unknown), which cli.arg_type reports before a model is loaded."""
    if utils.is_tiny(name):
        from extras.tiny import parse_tiny
        parse_tiny(name)  # a malformed 'tiny:...' raises here, at parse time
        return name
    if name == "auto" or (Path(name) / "config.json").is_file() or utils.is_adapter_dir(name):
        return name
    if not Path(name).exists():
        raise utils.UsageError(f"{name!r}: no such folder (expected 'tiny', a Hugging Face model folder or a checkpoint folder)")
    ckpt = utils.latest_checkpoint(name) if Path(name).is_dir() else None
    if ckpt is None:
        raise utils.UsageError(f"{name!r}: not a model folder (no config.json, no `latest` checkpoint pointer)")
    return str(ckpt)


# -----------------------------------------------------------------------------
# checkpoints: Hugging Face layout + safetensors (a LoRA run's: the adapters in PEFT's), written atomically


def save_checkpoint(out_dir: str | os.PathLike, model, tokenizer, args: dict, *, optimizer=None,
                    extra: dict | None = None, keep: int = 2, adapter=None) -> Path | None:
    """Write out_dir/step_XXXXXX/ (Hugging Face layout, or a LoRA run's `adapter` in PEFT's; args.json;
    trainer_state.json = extra; with an optimizer, optimizer.pt and every rank's RNG state) atomically
    (a temporary folder renamed, then out_dir/latest replaced); keep the newest `keep` (0: all).
    Collective (plain or FSDP2 model; rank 0 writes). Returns the folder on rank 0, else None."""
    from torch.distributed.checkpoint import state_dict as dcp  # (a second to import: only here)

    opts = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)  # unsharded, on CPU
    if adapter is not None:
        import lora
        msd = lora.adapter_state_dict(model)  # the adapters alone (gathered: collective)
    else:
        msd = dcp.get_model_state_dict(model, options=opts)
    osd = dcp.get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    rngs = [utils.rng_state()]  # every rank's generators: ranks draw different numbers
    if dist.is_initialized():
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, utils.rng_state())
    if utils.get_rank() != 0:
        return None
    extra, out_dir = dict(extra or {}), Path(out_dir)
    step = int(extra.get("step", 0))
    out_dir.mkdir(parents=True, exist_ok=True)
    final, tmp = out_dir / f"step_{step:06d}", out_dir / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    inner = model if hasattr(model, "save_pretrained") else model.model  # an FSDP root (PolicyLogProb) wraps it
    if adapter is not None:
        lora.save_adapter(adapter, msd, tmp)
    else:
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
    for p in [] if keep <= 0 else old[:-keep + 1] if keep > 1 else old:
        shutil.rmtree(p, ignore_errors=True)
    return final


# -----------------------------------------------------------------------------
# the trainer's batches: responses and their prompts right-padded into one batch (collate_sequences,
# the one pad-id rule). Pure tensors.


def image_runs(is_img: torch.Tensor) -> list[tuple[int, int]]:
    """is_img (T,) bool -> the runs [a, b) of image placeholders, one per image, in order."""
    zero = torch.zeros(1, dtype=torch.int, device=is_img.device)
    edges = torch.diff(is_img.int(), prepend=zero, append=zero)
    return list(zip((edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()))


def collate_sequences(prompts: list, responses: list[list[int]], pad_id: int) -> dict:
    """Right-pad prompt + response sequences into one batch. prompts: chat.Prompt-like (input_ids
    (T_i,) int64, pixel_values (P_i, 1176) and image_grid_thw (I_i, 3) or None); responses: the sampled
    ids as sampled (never re-tokenised). -> input_ids, targets (-100 off the responses: padding is masked
    by position, never by pad_id, which may be EOS), attention_mask, all (B, T) int64; the images in row
    order and image_index (I,) int64, each image's first identical one (encoded once)."""
    seqs = [torch.cat([p.input_ids.long(), torch.tensor(r, dtype=torch.long)]) for p, r in zip(prompts, responses)]
    targets = [torch.cat([torch.full_like(p.input_ids, -100, dtype=torch.long), s[len(p.input_ids):]])
               for p, s in zip(prompts, seqs)]  # -100 over each prompt, then its response
    batch = {"input_ids": pad_sequence(seqs, batch_first=True, padding_value=pad_id),  # (B, T)
             "attention_mask": pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True),
             "targets": pad_sequence(targets, batch_first=True, padding_value=-100)}
    pv = [p.pixel_values for p in prompts if p.pixel_values is not None]
    if pv:
        batch["pixel_values"] = torch.cat(pv)
        batch["image_grid_thw"] = torch.cat([p.image_grid_thw for p in prompts if p.image_grid_thw is not None])
        first: dict[tuple, int] = {}  # (grid, pixel digest) -> the first image that has it
        index = [first.setdefault(d, i) for i, d in enumerate(image_digests(batch))]
        batch["image_index"] = torch.tensor(index, dtype=torch.long)
    return batch


def image_digests(batch: dict) -> list[tuple]:
    """(grid, 16-byte pixel digest) of each image of a collated batch, in row order."""
    offs = [0] + batch["image_grid_thw"].prod(-1).cumsum(0).tolist()
    return [(tuple(g), hashlib.blake2b(batch["pixel_values"][offs[i]:offs[i + 1]].detach().cpu().numpy().tobytes(),
                                       digest_size=16).digest())
            for i, g in enumerate(batch["image_grid_thw"].tolist())]


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


# -----------------------------------------------------------------------------
# FSDP2, and the policy forward the losses read


def apply_fsdp(model, root: torch.nn.Module, dist_info, mixed_precision: bool):
    """FSDP2: `fully_shard` each decoder layer and vision block, then `root`; dist_info: utils.Dist.
    mixed_precision: bf16 params, fp32 gradient reduction (GPU); else fp32. Without a process group
    returns `root` unchanged; under torchrun it shards even at world size 1."""
    if not torch.distributed.is_initialized():
        return root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(dist_info.device.type, (dist_info.world_size,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if mixed_precision else MixedPrecisionPolicy())
    for layer in [*model.model.language_model.layers, *model.model.visual.blocks]:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    return root


def checkpoint_activations(model) -> None:
    """Activation checkpointing per decoder layer and vision block (--gradient-checkpointing),
    non-reentrant (composes with FSDP2): activations recomputed in the backward; train mode with grad only."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def sampling_mode(model: torch.nn.Module):
    """Lend the policy (the module training calls, e.g. the FSDP root) to the sampler: eval mode and
    no_grad inside. Under FSDP2 every FSDP module is unsharded once on entry (a collective: all ranks
    enter together) and kept so, so decoding issues no collectives; on exit the weights are resharded
    and the mode and reshard settings `apply_fsdp` left are restored. An FSDP root must accept
    `model(None)` as a no-op forward (PolicyLogProb does)."""
    from torch.distributed.fsdp import FSDPModule

    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if isinstance(model, FSDPModule):
                model(None)      # settles the root (and its hooks) before the inner model runs
                # the root keeps FSDP's root role while lent (nothing is gathered): an inner module taking
                # it would fork the streams, which a CUDA graph capture cannot hold (the graph decode)
                state = model._get_fsdp_state()
                state._state_ctx.iter_forward_root = state
            for m in fsdp:
                m.set_reshard_after_forward(False, recurse=False)
                m.unshard()
            yield model
    finally:
        if isinstance(model, FSDPModule):
            model._get_fsdp_state()._state_ctx.iter_forward_root = None
        for m in fsdp:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)
        model.train(was_training)


class PolicyLogProb(torch.nn.Module):
    """The Hugging Face model plus the fused lm_head log-prob, one root module for FSDP2 (whose root
    hooks gather embed / lm_head). forward(batch) -> (logp (N,) fp32, entropy (N,) fp32 or None) over
    the N target positions (targets != -100), row-major; logits are never materialised.
    forward(None) returns None (sampling_mode's root settling call)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch: dict | None, temperature: float = 1.0, return_entropy: bool = False):
        if batch is None:  # no-op: sampling_mode settles the FSDP2 root with it
            return None
        h, targets = self.hidden_at_targets(batch)  # (N, H), (N,)
        res = fused_logprob(h, self.model.lm_head.weight, targets, temperature=temperature,
                            return_entropy=return_entropy)
        return res if return_entropy else (res, None)

    def hidden_at_targets(self, batch: dict):
        """-> (the last hidden state before each target (N, H): position p predicts token p + 1,
        targets (N,) int64), row-major. A batch
        that names its own reader (--share-prompts, extras/shared_prompt.py) is read by it."""
        if "hidden_at_targets" in batch:
            return batch["hidden_at_targets"](self, batch)
        ids = batch["input_ids"]
        # without mm_token_type_ids transformers silently uses 1-D positions, not the sampler's
        # 3-D mrope ones (docs/method.md §11)
        mm_types = (ids == self.model.config.image_token_id).int()  # (B, T): 1 = image token
        kw = dict(pixel_values=batch.get("pixel_values"))
        if "image_index" in batch:  # each distinct screenshot through the vision tower once
            kw = dict(mm_encoder_outputs={"image": self._image_features(batch)})
        out = self.model.model(input_ids=ids, attention_mask=causal_only(batch["attention_mask"]),
                               image_grid_thw=batch.get("image_grid_thw"), mm_token_type_ids=mm_types,
                               use_cache=False, **kw)
        hidden = out.last_hidden_state[:, :-1]  # (B, T-1, H)
        targets = batch["targets"][:, 1:]  # (B, T-1)
        sel = targets != -100
        return hidden[sel], targets[sel]

    def _image_features(self, batch: dict):
        """Vision features of the batch's images in row order, each distinct image encoded once (exact:
        the tower attends within an image; a shared image's gradient is the sum of its uses)."""
        thw, index = batch["image_grid_thw"], batch["image_index"]  # (I, 3), (I,)
        offs = [0] + thw.prod(-1).cumsum(0).tolist()
        first = sorted(set(index.tolist()))
        pv = torch.cat([batch["pixel_values"][offs[i]:offs[i + 1]] for i in first])
        out = self.model.model.get_image_features(pv, thw[first], return_dict=True)
        feats = dict(zip(first, out.pooler_output))
        out.pooler_output = tuple(feats[i] for i in index.tolist())
        return out


def cache_attention_mask(valid: torch.Tensor, S: int) -> torch.Tensor:
    """valid (R, K) bool over cache slots, the last S this forward's queries -> (R, 1, S, K) bool:
    causal, real keys only, each query sees itself (no empty row). The sampler's prefills and
    extras/shared_prompt.py use it."""
    K = valid.shape[1]
    q = torch.arange(K - S, K, device=valid.device)[:, None]                # (S, 1) slot of each query
    k = torch.arange(K, device=valid.device)[None, :]                       # (1, K)
    allowed = ((k <= q)[None] & valid[:, None, :]) | (k == q)[None]         # (R, S, K)
    return allowed[:, None]


def causal_only(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """None when attention_mask (B, T) is right padding, else the mask: SDPA's causal kernel then
    skips the upper triangle (a fifth or more of a CPU forward, results/LOG.md), log-probs bit-identical
    (the pads only follow the scored positions)."""
    if attention_mask is None or attention_mask.shape[1] < 2:
        return attention_mask
    m = attention_mask.bool()
    return None if bool((m[:, 1:] <= m[:, :-1]).all()) else attention_mask


def pad_token_id(tokenizer) -> int:
    """The padding id: the tokenizer's pad id, else EOS, else 0; never <|image_pad|> (Qwen2.5-VL
    counts it to place image features). Padding is masked by position, so any other id is correct."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return 0 if pad is None or pad == tokenizer.get_vocab().get("<|image_pad|>") else int(pad)


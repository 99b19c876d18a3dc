"""Plumbing shared by the stages: distributed set-up, seeding, checkpoint I/O. Nothing GUI-,
model- or method-specific (gui.py, vlm.py, rollout.py, ...); what a script reads and writes at its
edges (flags, input errors, strict-JSON output and the metrics file) is cli.py."""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

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


def all_sum(values: list, proc) -> list[float]:
    """Element-wise sum over ranks of a list of numbers, as floats (fp64 on proc.device: nccl reduces no
    CPU tensors). One process: the values themselves. proc: Dist."""
    x = torch.tensor([float(v) for v in values], dtype=torch.float64, device=proc.device)
    all_reduce_sum(x)
    return x.tolist()


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory, for the trainers' `peak_mem_bytes`: on CUDA the bytes held by
    tensors since the last torch.cuda.reset_peak_memory_stats (the trainers reset it every step);
    on CPU the peak resident set since the process started (Linux ru_maxrss, in KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def adamw(params, lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """The trainers' optimizer: AdamW with the fused kernel on every device. On CUDA the default
    (foreach) holds a model-sized temporary (sqrt of the second moment); on CPU it is a Python loop of
    ~10 elementwise passes per parameter (fused: ~8x faster a step for the tiny model)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=True)


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
# checkpoints: Hugging Face layout + safetensors, written atomically


def save_checkpoint(out_dir: str | os.PathLike, model, tokenizer, args: dict, *, optimizer=None,
                    extra: dict | None = None, keep: int = 2, adapter=None) -> Path | None:
    """Write out_dir/step_XXXXXX/ (Hugging Face layout, args.json, trainer_state.json = extra with
    "step"; with an optimizer also optimizer.pt and every rank's RNG state), atomically (a finished
    temporary folder renamed into place, then os.replace of out_dir/latest); keep the newest `keep` (0: every one).
    adapter: the PeftModel of a LoRA run (lora.apply_lora): the folder then holds the adapter in
    PEFT's layout (lora.save_adapter) instead of the model's weights.
    Collective (plain or FSDP2 model; rank 0 writes). Returns the folder on rank 0, else None."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # unsharded, on CPU
    if adapter is not None:
        import lora
        msd = lora.adapter_state_dict(model)  # the adapters alone (gathered: collective)
    else:
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


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The folder named by out_dir/latest, or None. Temporary folders are never named."""
    ptr = Path(out_dir) / "latest"
    path = Path(out_dir) / ptr.read_text().strip() if ptr.exists() else None
    return path if path and any((path / f).exists() for f in ("model.safetensors", "config.json",
                                                              "adapter_model.safetensors")) else None


def load_checkpoint_state(ckpt: str | os.PathLike, model, optimizer=None) -> dict:
    """Load a save_checkpoint folder into a (possibly FSDP2) model, optimizer and every RNG;
    returns trainer_state.json. Collective. optimizer.pt is read weights_only (nothing unpickled).
    A LoRA checkpoint (lora.is_adapter_dir) loads its adapters into the adapted `model`.
    Raises FileNotFoundError (no config.json), ValueError (saved for another number of ranks)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    import lora
    ckpt = Path(ckpt)
    opts = StateDictOptions(full_state_dict=True, strict=False)
    if lora.is_adapter_dir(ckpt):  # a LoRA run's: the adapters into the (already adapted) model
        lora.load_adapter_state(ckpt, model)
    elif not (ckpt / "config.json").exists():
        raise FileNotFoundError(f"{ckpt}: no config.json (not a checkpoint folder)")
    else:
        # read through the model class's own from_pretrained (on CPU): it maps the Hub's key names back
        inner = model if hasattr(model, "save_pretrained") else model.model
        msd = type(inner).from_pretrained(str(ckpt), dtype=torch.float32).state_dict()
        msd = msd if inner is model else {"model." + k: v for k, v in msd.items()}
        if getattr(inner.config, "tie_word_embeddings", False):
            msd = {k: v for k, v in msd.items() if k not in ("lm_head.weight", "model.lm_head.weight")}
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

"""Resuming a run (--resume in both trainers): a checkpoint folder vlm.save_checkpoint wrote, read back
into the model, the optimizer and every RNG. Imported only when a run resumes; the default RL step
writes checkpoints but never reads one. `check_flags` runs before anything is written, `resume_rl`
continues an RL run (train_semionline.resume), `load_checkpoint_state` reads a checkpoint back and
`trim_metrics` keeps the metrics rows up to it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import utils


def check_flags(cfg) -> None:
    """A trainer's --resume, before --out is written: a LoRA checkpoint's adapters are rebuilt with
    this run's LoRA flags, which must be the checkpoint's (lora.check_resume raises lora.LoraError).
    cfg: the stage's config (out, lora_*)."""
    ckpt = utils.latest_checkpoint(Path(cfg.out) / "ckpt")
    if cfg.lora_r or utils.is_adapter_dir(ckpt):
        import lora
        lora.check_resume(cfg, ckpt)


def resume_rl(run) -> int:
    """train_semionline.py --resume: the latest checkpoint in run.out/ckpt into run.policy,
    run.optimizer and every RNG (load_checkpoint_state). Returns its step, 0 when there is none
    (a fresh start). Raises utils.UsageError when its task schedule (trainer_state.json's field
    'schedule': seed, tasks per step, number of episodes) is not run.schedule: the resumed steps
    would draw other tasks."""
    ckpt = utils.latest_checkpoint(run.out / "ckpt")
    if ckpt is None:
        return 0
    state = load_checkpoint_state(ckpt, run.policy, run.optimizer)
    if state.get("schedule", run.schedule) != run.schedule:
        raise utils.UsageError(f"{ckpt}/trainer_state.json: field 'schedule' {state['schedule']} "
                               f"differs from this run's {run.schedule}; resume with the same --seed, "
                               "--tasks-per-step and data")
    step = int(state.get("step", 0))
    utils.print0(f"resumed from {ckpt} at step {step}")
    return step


def load_checkpoint_state(ckpt: str | os.PathLike, model, optimizer=None) -> dict:
    """Load a vlm.save_checkpoint folder (or a LoRA one's adapters) into a plain or FSDP2 model, the
    optimizer (weights_only) and every RNG; returns trainer_state.json. Collective. Raises
    FileNotFoundError (no config.json), ValueError (saved by another number of ranks)."""
    from torch.distributed.checkpoint import state_dict as dcp

    ckpt = Path(ckpt)
    opts = dcp.StateDictOptions(full_state_dict=True, strict=False)
    if utils.is_adapter_dir(ckpt):  # a LoRA run's: the adapters into the (already adapted) model
        import lora
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
        dcp.set_model_state_dict(model, msd, options=opts)
    state = json.loads((ckpt / "trainer_state.json").read_text()) if (ckpt / "trainer_state.json").exists() else {}
    if optimizer is not None and (ckpt / "optimizer.pt").exists():
        osd = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        dcp.set_optimizer_state_dict(model, optimizer, osd, options=opts)
    if isinstance(state.get("rng"), list):  # (older checkpoints kept rank 0's only, in another layout)
        rank, n = utils.get_rank(), len(state["rng"])
        if n != (dist.get_world_size() if dist.is_initialized() else 1):
            raise ValueError(f"{ckpt / 'trainer_state.json'}: field 'rng' holds {n} ranks' generators; "
                             f"resume with that many processes")
        utils.set_rng_state(state["rng"][rank])
    return state


def trim_metrics(path: str | os.PathLike, step: int) -> int:
    """A resumed run's metrics.jsonl: keep the rows of steps <= step (none when step == 0: no checkpoint
    was found), drop the later ones and a line cut by a kill, so the steps redone after the checkpoint
    appear once. Rewrites the file atomically, on rank 0 only; returns the number of rows kept."""
    path = Path(path)
    if utils.get_rank() != 0 or not path.exists():
        return 0
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut mid-write: the run died here
        if not isinstance(row, dict) or step == 0 or row.get("step", 0) > step:
            break
        keep.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    os.replace(tmp, path)
    return len(keep)

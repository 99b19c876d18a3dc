"""The plumbing the stages share, nothing GUI-, model- or method-specific, and no torch until a
function needs it (the prompt builder and the dataset import this without the model): input errors,
distributed set-up, seeding and generators' state, the optimizer, checkpoint folders, strict JSON
output and the metrics file.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# -----------------------------------------------------------------------------
# input errors; what a trainer prints at its end


class InputError(Exception):
    """Bad input, never a bug: cli.run_script reports it as one line, exit code 2, no traceback. Its
    kinds: UsageError, dataset.DataError and lora.LoraError (ValueErrors too)."""


class UsageError(InputError):
    """A mistake in a flag, file or folder the user gave (an InputError): the message names it and
    what was expected."""


# the evaluation the README's quick start runs (and its table reports): both trainers print it
EVAL_FLAGS = "--protocol sop static --online --online-seeds 13 --online-max-steps 4 --max-new-tokens 64"


def eval_command(data, ckpt, out) -> str:
    """The README's evaluation command for checkpoint folder `ckpt` on test file `data`, results in
    `out`: the same seeds, step limit and token cap as the README's table, so the numbers compare."""
    return f"python eval_sop.py --data {data} --policy model --model {ckpt} {EVAL_FLAGS} --out {out}"


def print_next_steps(out, data, eval_out: str, extra: str = "") -> None:
    """What a trainer prints when it ends (rank 0): its checkpoint and metrics, and the commands to plot
    and to evaluate them (eval_command, on the test file beside a train.jsonl `data`), then `extra` lines."""
    out = Path(out)
    test = Path(data).with_name("test.jsonl") if Path(data).name == "train.jsonl" else Path(data)
    print(f"checkpoint: {latest_checkpoint(out / 'ckpt') or '(none written)'}  metrics: {out / 'metrics.jsonl'}\n"
          f"curves:     python tools/plot_metrics.py {out / 'metrics.jsonl'}\n"
          f"evaluate:   {eval_command(test, out / 'ckpt', eval_out)}" + (f"\n{extra}" if extra else ""), flush=True)


# -----------------------------------------------------------------------------
# distributed, seeding, the optimizer (torch imported where first needed: see the module docstring)


@dataclass
class Dist:
    """This process's place in the run (init_distributed); is_main: rank 0."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    is_main = property(lambda self: self.rank == 0)


def init_distributed(device: str = "auto") -> Dist:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; start a process group (nccl on CUDA, gloo on
    CPU) whenever torchrun launched us, one process included (the same FSDP2 path as eight); a plain
    `python script.py` runs unsharded. device: "auto", "cpu", "cuda"."""
    import torch
    import torch.distributed as dist

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
    dist = sys.modules.get("torch.distributed")  # none started without torch
    if dist is not None and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def get_rank() -> int:
    """This process's rank: the process group's, else torchrun's RANK (before init), else 0."""
    dist = sys.modules.get("torch.distributed")  # none started without torch: the prompt builder's scripts
    return dist.get_rank() if dist is not None and dist.is_initialized() else int(os.environ.get("RANK", 0))


def print0(*args, **kwargs) -> None:
    """print on rank 0 only, flushed (so logs interleave with tqdm)."""
    if get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks; a no-op without a process group."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def all_sum(values: list, proc) -> list[float]:
    """Element-wise sum over ranks of a list of numbers, as floats (fp64 on proc.device: nccl reduces no
    CPU tensors). One process: the values themselves. proc: Dist."""
    import torch

    x = torch.tensor([float(v) for v in values], dtype=torch.float64, device=proc.device)
    all_reduce_sum(x)
    return x.tolist()


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory, for the trainers' `peak_mem_bytes`: on CUDA the bytes held by
    tensors since the last torch.cuda.reset_peak_memory_stats (the trainers reset it every step);
    on CPU the peak resident set since the process started (Linux ru_maxrss, in KiB)."""
    if device.type == "cuda":
        import torch
        return torch.cuda.max_memory_allocated(device)
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def adamw(params, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """The trainers' optimizer: AdamW, fused on every device (the default holds a model-sized
    temporary on CUDA and is ~8x slower on CPU), over the parameters with requires_grad."""
    import torch

    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, weight_decay=weight_decay, fused=True)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every generator's state (python, numpy, torch CPU, each CUDA device) as JSON-able lists."""
    import torch

    py, np_state = random.getstate(), np.random.get_state()
    state = {"python": [py[0], list(py[1]), py[2]], "torch": torch.get_rng_state().tolist(),
             "numpy": [np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() returned (every generator it holds)."""
    import torch

    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    n = state["numpy"]
    np.random.set_state(("MT19937", np.array(n[0], dtype=np.uint32), n[1], n[2], n[3]))
    if "cuda" in state:
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# -----------------------------------------------------------------------------
# checkpoint folders: out_dir/step_XXXXXX/ (vlm.save_checkpoint), out_dir/latest names the newest


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The folder named by out_dir/latest, or None. Temporary folders are never named."""
    ptr = Path(out_dir) / "latest"
    path = Path(out_dir) / ptr.read_text().strip() if ptr.exists() else None
    return path if path and any((path / f).exists() for f in ("model.safetensors", "config.json",
                                                              ADAPTER_FILE)) else None


ADAPTER_FILE = "adapter_model.safetensors"  # a LoRA checkpoint's adapters (lora.py, PEFT's layout)


def is_tiny(name) -> bool:
    """True for --model 'tiny' and 'tiny:...': a preset of extras/tiny.py (random weights, trained
    from scratch), not a folder."""
    return str(name) == "tiny" or str(name).startswith("tiny:")


def is_adapter_dir(path) -> bool:
    """True for a LoRA checkpoint folder (it holds ADAPTER_FILE): a file check, so that a run without
    LoRA imports neither lora nor PEFT. None: False."""
    return path is not None and (Path(path) / ADAPTER_FILE).is_file()


# -----------------------------------------------------------------------------
# output, in strict JSON: no NaN / Infinity in any file or line we write (the metrics file too)


def finite_json(obj, _path: str = "", _bad: dict | None = None):
    """`obj` (dicts, lists, numbers, numpy/torch scalars) with every non-finite float replaced by
    None (RFC 8259 parsers reject NaN); a top-level dict gains "nonfinite": {key path: "nan" |
    "inf" | "-inf"}."""
    top, bad = _bad is None, {} if _bad is None else _bad
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()  # numpy / torch scalar
    if isinstance(obj, float) and not math.isfinite(obj):
        bad[_path or "value"] = "nan" if obj != obj else ("inf" if obj > 0 else "-inf")
        return None
    if isinstance(obj, dict):
        out = {k: finite_json(v, f"{_path}.{k}" if _path else str(k), bad) for k, v in obj.items()}
    elif isinstance(obj, (list, tuple)):
        out = [finite_json(v, f"{_path}[{i}]", bad) for i, v in enumerate(obj)]
    else:
        return obj
    if top and bad and isinstance(out, dict):
        out["nonfinite"] = bad
    return out


def dumps(obj, **kwargs) -> str:
    """json.dumps that never writes NaN/Infinity (finite_json, then allow_nan=False); objects json
    cannot encode become their str()."""
    kwargs.setdefault("default", str)
    return json.dumps(finite_json(obj), allow_nan=False, **kwargs)


class MetricsLogger:
    """One strict-JSON object per line (`dumps`) to `path`, rank 0 only, plus wall time `t`; a new run
    starts the file afresh, append=True continues it (a --resume: extras.resume.trim_metrics has kept
    the rows up to its checkpoint)."""

    def __init__(self, path: str | os.PathLike, append: bool = False):
        self.path, self.t0 = Path(path), time.time()
        if get_rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not append:
                self.path.write_text("")

    def log(self, row: dict) -> dict | None:
        """Append `row` with its wall time `t`; returns the row written (None off rank 0)."""
        if get_rank() != 0:
            return None
        row = {**row, "t": round(time.time() - self.t0, 3)}
        with open(self.path, "a") as f:
            f.write(dumps(row) + "\n")
        return row

    def close(self) -> None:
        """Nothing to end here (the trackers' logger ends their runs)."""

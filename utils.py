"""Plumbing shared by the stages: distributed set-up, seeding, model and processor
loading, checkpoint I/O and JSONL metrics. Nothing GUI-specific lives here (that is
gui.py) and nothing method-specific (that is rollout.py / patch.py / advantage.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
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

    A plain `python script.py` starts no process group and runs the same code unsharded;
    anything torchrun launched (RANK set), `--nproc_per_node=1` included, gets a process group,
    so one GPU runs the same FSDP2 + mixed-precision path as eight. The backend is nccl on
    CUDA and gloo on CPU. `device` is "auto", "cpu" or "cuda".
    """
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if (world_size > 1 or "RANK" in os.environ) and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world_size, local_rank, dev)


def cleanup_distributed() -> None:
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
        extra["rng"] = rngs  # one rng_state() per rank
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
    if isinstance(state.get("rng"), list):  # (older checkpoints kept rank 0's only, in another layout)
        rank, n = get_rank(), len(state["rng"])
        if n != (dist.get_world_size() if dist.is_initialized() else 1):
            raise ValueError(f"{ckpt / 'trainer_state.json'}: field 'rng' holds {n} ranks' generators; "
                             f"resume with that many processes")
        set_rng_state(state["rng"][rank])
    return state


# -----------------------------------------------------------------------------
# command line: one error line per input mistake, --help with defaults and examples


class UsageError(Exception):
    """A mistake in what the user gave (a flag, a file, a folder): reported by `cli` as one line,
    exit code 2, no traceback. The message names the flag or file and what was expected."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every flag's default (unless its help already says it) and keeps the
    docstring's examples as written."""

    def _get_help_string(self, action):
        if "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: `prog: error: message (see --help)`, exit code 2 (argparse
    prints its whole usage block first, which hides the line that matters)."""

    def error(self, message):
        # under torchrun every rank parses the same argv: rank 0 alone says so
        if get_rank() != 0:
            _quiet_exit()
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def make_parser(doc: str, **kwargs) -> Parser:
    """A Parser whose description is the first paragraph of the module docstring `doc` and whose
    epilog is the rest of it (the commands to copy), with defaults shown."""
    first, _, rest = (doc or "").strip().partition("\n\n")
    return Parser(description=first, epilog=rest.strip("\n") or None, formatter_class=HelpFormatter, **kwargs)


def arg_type(fn):
    """Wrap a parser function (str -> value, raising ValueError/UsageError) as an argparse `type=`,
    so argparse itself reports a bad value in one line: `argument --x: <message>`."""
    def convert(text):
        try:
            return fn(text)
        except (ValueError, UsageError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = fn.__name__
    return convert


def input_file(path: str) -> str:
    """argparse type: a readable file. Raises UsageError naming the path otherwise."""
    if not os.path.exists(path):
        raise UsageError(f"no such file: {path!r}")
    if not os.path.isfile(path):
        raise UsageError(f"not a file: {path!r}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"not readable: {path!r}")
    return path


def input_dir(path: str) -> str:
    """argparse type: an existing folder. Raises UsageError naming the path otherwise."""
    if not os.path.isdir(path):
        raise UsageError(f"{'not a folder' if os.path.exists(path) else 'no such folder'}: {path!r}")
    return path


def model_path(name: str) -> str:
    """argparse type for --model: 'tiny' and 'auto' pass through; a Hugging Face folder (config.json)
    as is; a run folder with a `latest` pointer (e.g. out/sft/ckpt) -> the checkpoint it names.
    Raises UsageError for anything else, before a model is loaded."""
    if name in ("tiny", "auto") or (Path(name) / "config.json").is_file():
        return name
    if not Path(name).exists():
        raise UsageError(f"{name!r}: no such folder (expected 'tiny', a Hugging Face model folder or a checkpoint folder)")
    ckpt = latest_checkpoint(name) if Path(name).is_dir() else None
    if ckpt is None:
        raise UsageError(f"{name!r}: not a model folder (no config.json, no `latest` checkpoint pointer)")
    return str(ckpt)


def check_pixels(args) -> None:
    """--min-pixels must be positive and not above --max-pixels (smart_resize's bounds)."""
    if args.min_pixels <= 0 or args.max_pixels < args.min_pixels:
        raise UsageError(f"--min-pixels {args.min_pixels} / --max-pixels {args.max_pixels}: need 0 < min <= max")


def _input_errors() -> tuple:
    """The exception classes that mean bad input, never a bug: ours, the data loader's, the OS's."""
    from gui import DataError

    return (UsageError, DataError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
            UnicodeDecodeError)


def error_line(e: BaseException) -> str:
    """One line for an input error: OS errors as 'path: reason', the rest as their message."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        msg = f"{e.filename}: {e.strerror}"
    elif isinstance(e, UnicodeDecodeError):
        msg = f"not UTF-8 text ({e.reason} at byte {e.start})"
    else:
        msg = str(e) or type(e).__name__
    return " ".join(msg.split())


def cli(main, argv=None):
    """Run `main(argv)` as a script: an input error (UsageError, gui.DataError, a missing or
    unreadable file) prints `<script>: error: <one line>` to stderr and exits with code 2, like
    argparse's own errors; anything else (a bug) keeps its traceback. Under torchrun every rank
    meets the same error: rank 0 prints it, every rank exits 2."""
    try:
        return main(argv)
    except _input_errors() as e:
        if get_rank() != 0:
            _quiet_exit()
        print(f"{os.path.basename(sys.argv[0])}: error: {error_line(e)}", file=sys.stderr, flush=True)
        sys.exit(2)


def _quiet_exit():
    """A non-zero rank's exit on an input error: silent, and a moment late, so that torchrun (which
    stops the other ranks when one exits) does not stop rank 0 before it has printed the line."""
    time.sleep(2.0)
    sys.exit(2)


def checkpoint_args(path: str | os.PathLike) -> dict:
    """The args.json save_checkpoint wrote beside the weights of checkpoint folder `path`, or {} (a
    plain Hugging Face folder, 'tiny'). A malformed file raises UsageError naming it."""
    f = Path(path) / "args.json"
    if str(path) in ("tiny", "auto") or not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{f}: line {e.lineno}: invalid JSON: {e.msg}") from None


def explicit_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The dests the user set on the command line (argv), as opposed to defaults."""
    seen = argparse.Namespace()
    defaults = {a.dest: a.default for a in parser._actions}
    for a in parser._actions:
        a.default = argparse.SUPPRESS
    try:
        parser.parse_known_args(sys.argv[1:] if argv is None else argv, seen)
    finally:
        for a in parser._actions:
            a.default = defaults[a.dest]
    return set(vars(seen))


def adopt_checkpoint_args(args, parser: argparse.ArgumentParser, argv: list[str] | None, model: str,
                          names: tuple[str, ...]) -> dict:
    """Prompt options that must agree between training and evaluation (e.g. num_images, min/max
    pixels) are read from the checkpoint's args.json when the user did not pass them: a flag left
    out cannot silently change what the model sees. An explicit flag that
    disagrees with the checkpoint is kept, with a warning. Returns {name: value} taken; prints one
    line saying what it took (rank 0)."""
    saved = checkpoint_args(model)
    given = explicit_flags(parser, argv)
    taken = {}
    for name in names:
        if name in given:
            if name in saved and saved[name] != getattr(args, name):
                print0(f"warning: --{name.replace('_', '-')} {getattr(args, name)} differs from the checkpoint's "
                       f"{saved[name]} ({model}/args.json)")
            continue
        if name in saved:
            taken[name] = saved[name]
            setattr(args, name, saved[name])
    if taken:
        print0(f"prompt options from {model}/args.json: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in taken.items()))
    return taken


# -----------------------------------------------------------------------------
# strict JSON: no NaN / Infinity in any file or line we write


def finite_json(obj, _path: str = "", _bad: dict | None = None):
    """A copy of `obj` (dicts, lists, tuples, numbers, numpy/torch scalars) with every non-finite
    float replaced by None; a dict at the top level gains "nonfinite": {key path: "nan" | "inf" |
    "-inf"} saying which values were replaced and why. Strict parsers (RFC 8259) reject NaN."""
    top = _bad is None
    bad = {} if top else _bad
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()  # numpy / torch scalar
    if isinstance(obj, float):
        if not math.isfinite(obj):
            bad[_path or "value"] = "nan" if obj != obj else ("inf" if obj > 0 else "-inf")
            return None
        return obj
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


# -----------------------------------------------------------------------------
# metrics


class MetricsLogger:
    """Write one JSON object per line to `path` (rank 0 only); adds wall time `t`. A new run
    starts the file afresh; a resumed one (append=True) continues it. Lines are strict JSON
    (`dumps`: a NaN loss is written null, with "nonfinite": {"loss": "nan"}).

    tensorboard: a folder for TensorBoard event files beside the JSONL (optional; needs the
    `tensorboard` package, else UsageError at construction): every finite number of a row is a
    scalar at x = row["step"] (else the row's index)."""

    def __init__(self, path: str | os.PathLike | None, append: bool = False, tensorboard: str | None = None):
        self.path = Path(path) if path is not None else None
        self.t0 = time.time()
        self.tb = None
        self.n = 0
        if self.path is not None and get_rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not append:
                self.path.write_text("")
        if tensorboard and get_rank() == 0:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UsageError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
            self.tb = SummaryWriter(str(tensorboard))

    def log(self, row: dict) -> None:
        if get_rank() != 0:
            return
        row = {**row, "t": round(time.time() - self.t0, 3)}
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(dumps(row) + "\n")
        if self.tb is not None:
            x = row.get("step", self.n)
            for k, v in finite_json(row).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self.tb.add_scalar(k, v, x)
            self.tb.flush()
        self.n += 1


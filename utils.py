"""The one module the stages share: a script's edges and the plumbing under them. Nothing GUI-,
model- or method-specific (gui.py, vlm.py, rollout.py, lora.py, ...), and no torch until a function
needs it: the prompt builder and the dataset import it without the model.

1. flags and errors: `make_parser` builds a parser whose --help shows defaults and the module
   docstring's examples; the `arg_type` helpers check numbers, files and folders while the flags are
   parsed (--model: vlm.model_path; MiniWob++ task names: envs.miniwob_tasks); `run_script(main)` runs
   a script so that a mistake in its input (an InputError: UsageError, dataset.DataError,
   lora.LoraError; a missing or unreadable file) is one line on stderr and exit code 2, never a traceback;
2. distributed set-up, seeding, every generator's state, the trainers' optimizer;
3. checkpoint folders (`latest_checkpoint`; their weights are written and read by vlm.save_checkpoint /
   vlm.load_checkpoint_state);
4. output: `dumps` (JSON with no NaN / Infinity, for every summary, data and args file) and
   `MetricsLogger` (metrics.jsonl, plus the trackers of --report-to: TensorBoard, Weights & Biases, Trackio).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
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
# flags and one-line input errors


class InputError(Exception):
    """Bad input, never a bug: `run_script` reports it as one line, exit code 2, no traceback. Its kinds:
    UsageError (a flag, a file, a folder), dataset.DataError and lora.LoraError (ValueErrors too)."""


class UsageError(InputError):
    """A mistake in what the user gave (a flag, a file, a folder): reported by `run_script` as one line,
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


def int_at_least(low: int, *, name: str | None = None):
    """argparse type: an integer >= low (e.g. int_at_least(1) for counts and sizes, int_at_least(0)
    where the help says what 0 means). Rejects '1.5', 'ten' and values below low with a message naming
    the bound, so argparse reports `argument --x: ...` in one line."""
    def convert(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v}: must be >= {low}")
        return v
    convert.__name__ = name or ("positive_int" if low == 1 else "non_negative_int" if low == 0 else f"int_at_least_{low}")
    convert.kind, convert.low = "int", low
    return convert


positive_int = int_at_least(1)      # counts, sizes, steps: 0 has no meaning
non_negative_int = int_at_least(0)  # seeds, limits and periods whose help says what 0 means


def finite_float(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False):
    """argparse type: a finite float in [low, high] (an open end with low_open / high_open; None: no
    bound). NaN and +-inf are always refused: no flag of ours means anything by them."""
    def convert(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        lo_ok = low is None or (v > low if low_open else v >= low)
        hi_ok = high is None or (v < high if high_open else v <= high)
        if not (math.isfinite(v) and lo_ok and hi_ok):
            span = f"{'(' if low_open else '['}{'-inf' if low is None else f'{low:g}'}, " \
                   f"{'inf' if high is None else f'{high:g}'}{')' if high_open or high is None else ']'}"
            raise argparse.ArgumentTypeError(f"{text}: must be a finite number in {span}")
        return v
    convert.__name__ = "finite_float"
    convert.kind, convert.low = "float", low
    return convert


positive_float = finite_float(0.0, low_open=True)   # learning rates, scales, timeouts
non_negative_float = finite_float(0.0)              # weights and coefficients where 0 switches a term off
fraction = finite_float(0.0, 1.0)                   # shares in [0, 1]


MIN_TEMPERATURE = 1e-3  # logits of |z| <= ~1e3 stay far inside fp32 (3.4e38) after z / T, exp() and sums


def check_temperature(temperature: float) -> None:
    """The one temperature rule of the sampler (sampler.Sampler, sampler.process_logits), the trainer's
    and the evaluator's flags (`temperature`) and the scorer: finite and >= MIN_TEMPERATURE (greedy
    decoding is greedy=True, not T -> 0). Raises ValueError otherwise."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not (math.isfinite(temperature) and temperature >= MIN_TEMPERATURE):
        raise ValueError(f"temperature must be finite and >= {MIN_TEMPERATURE:g}, got {temperature} "
                         "(below it logits / temperature leave fp32's range; use greedy=True for argmax)")


def temperature(text: str) -> float:
    """argparse type of every --temperature: the sampler's one rule (check_temperature), met at parse
    time by the trainer, the evaluator and the benchmarks alike."""
    try:
        v = float(text)
        check_temperature(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text}: {e}" if "temperature" in str(e) else f"invalid float value: {text!r}") from None
    return v

temperature.kind, temperature.low = "float", None


def names(valid, what: str):
    """argparse type: one name of `valid` (an iterable, or a callable returning one, read when the
    flag is parsed), or 'all' when valid holds it. A misspelling is `argument --x: unknown <what>
    'nmae' (known: ...)`, at parse time rather than after a model loaded."""
    def convert(text: str) -> str:
        known = list(valid() if callable(valid) else valid)
        if text not in known:
            shown = ", ".join(sorted(map(str, known))[:12]) + (", ..." if len(known) > 12 else "")
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r} (known: {shown})")
        return text
    convert.__name__ = "names"
    convert.kind = "name"
    return convert


def name_list(valid, what: str):
    """argparse type: a comma list of names of `valid` (as `names`), returned as the list."""
    one = names(valid, what)

    def convert(text: str) -> list[str]:
        return [one(t.strip()) for t in text.split(",") if t.strip()] or one("")
    convert.__name__ = "name_list"
    convert.kind = "name"
    return convert


def int_list(low: int = 1):
    """argparse type: a comma list of integers >= low, e.g. '4096,16384'."""
    one = int_at_least(low)

    def convert(text: str) -> list[int]:
        return [one(t.strip()) for t in text.split(",")]
    convert.__name__ = "int_list"
    convert.kind, convert.low = "int", low
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


# the exception classes that mean bad input, never a bug: ours (InputError), the OS's
INPUT_ERRORS = (InputError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, UnicodeDecodeError)

def error_line(e: BaseException) -> str:
    """One line for an input error: OS errors as 'path: reason', the rest as their message."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        msg = f"{e.filename}: {e.strerror}"
    elif isinstance(e, UnicodeDecodeError):
        msg = f"not UTF-8 text ({e.reason} at byte {e.start})"
    else:
        msg = str(e) or type(e).__name__
    return " ".join(msg.split())


def run_script(main, argv=None):
    """Run `main(argv)` as a script: an input error (UsageError, dataset.DataError, a missing or
    unreadable file) prints `<script>: error: <one line>` to stderr and exits with code 2, like
    argparse's own errors; anything else (a bug) keeps its traceback. Under torchrun every rank
    meets the same error: rank 0 prints it, every rank exits 2."""
    try:
        return main(argv)
    except INPUT_ERRORS as e:
        if get_rank() != 0:
            _quiet_exit()
        print(f"{os.path.basename(sys.argv[0])}: error: {error_line(e)}", file=sys.stderr, flush=True)
        sys.exit(2)


def _quiet_exit():
    """A non-zero rank's exit on an input error: silent, and a moment late, so that torchrun (which
    stops the other ranks when one exits) does not stop rank 0 before it has printed the line."""
    time.sleep(2.0)
    sys.exit(2)


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


def flag(default, help: str, group: str | None = None, **argparse_kw):
    """A field of a stage's typed config (a dataclass) that `add_config_flags` turns into its flag
    --name-with-dashes: the default, one line of help, the labelled --help group it is listed in (None:
    the first, the flags a user sets first) and add_argument's other keywords (type, choices, action;
    flag="--name" where the flag's name is not the field's)."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group, **argparse_kw})


def add_config_flags(parser: argparse.ArgumentParser, config, groups: list[str]) -> dict:
    """One flag per field of the dataclass `config` (fields made by `flag`), in field order; a field
    with a group goes under that title. The titles of `groups` are created in that order, after the
    first group (argparse lists groups as created). Returns {title: the argparse group}."""
    made = {title: parser.add_argument_group(title) for title in groups}
    for f in dataclasses.fields(config):
        kw = dict(f.metadata)
        title, name = kw.pop("group"), kw.pop("flag", "--" + f.name.replace("_", "-"))
        (parser if title is None else made[title]).add_argument(name, dest=f.name, default=f.default, **kw)
    return made


def parse_config(parser: argparse.ArgumentParser, config, presets: dict[str, dict], argv=None):
    """Parse argv into (the typed config, a Namespace of the flags other modules define: LoRA's, the
    prompt's, --report-to). --preset NAME first sets its fields (any flag's dest); a flag given on
    the command line overrides it. Errors as the parser's: one line, exit 2."""
    ns = parser.parse_args(argv)
    given = explicit_flags(parser, argv) if ns.preset else set()
    for name, value in presets.get(ns.preset, {}).items():
        if name not in given:
            setattr(ns, name, value)
    own = {f.name for f in dataclasses.fields(config)}
    return (config(**{k: v for k, v in vars(ns).items() if k in own}),
            argparse.Namespace(**{k: v for k, v in vars(ns).items() if k not in own}))


def preset_help(presets: dict[str, dict]) -> str:
    """--preset's help: each preset's name and its fields as the flags they stand for."""
    return "; ".join(f"{name}: " + (" ".join(f"--{k.replace('_', '-')} {v}" for k, v in fields.items())
                                    or "the defaults") for name, fields in presets.items())


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
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; start a process group (nccl on CUDA, gloo
    on CPU) whenever torchrun launched us, `--nproc_per_node=1` included, so one GPU runs the same
    FSDP2 path as eight; a plain `python script.py` runs unsharded. device: "auto", "cpu", "cuda"."""
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
    """print on rank 0 only (flushes, so logs interleave sanely with tqdm)."""
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


def adamw(params, lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """The trainers' optimizer: AdamW with the fused kernel on every device. On CUDA the default
    (foreach) holds a model-sized temporary (sqrt of the second moment); on CPU it is a Python loop of
    ~10 elementwise passes per parameter (fused: ~8x faster a step for the tiny model)."""
    import torch

    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=True)


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
                                                              "adapter_model.safetensors")) else None



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


# --report-to: the experiment trackers, named as transformers' and TRL's `report_to` names them; the
# module each one needs (torch.utils.tensorboard imports the tensorboard package)
TRACKERS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "trackio": "trackio"}


class ReportTo(argparse.Action):
    """argparse action of --report-to (nargs="+"): each name one of "none" and TRACKERS, "none" alone,
    and every named tracker importable, checked while the flags are parsed, so a missing package is
    the parser's one-line error (exit 2) before any work starts."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = list(dict.fromkeys(values))
        for name in names:
            if name != "none" and name not in TRACKERS:
                parser.error(f"argument {option_string}: {name!r}: expected none or one or more of {', '.join(TRACKERS)}")
        if "none" in names and len(names) > 1:
            parser.error(f"argument {option_string}: 'none' cannot be combined with {', '.join(n for n in names if n != 'none')}")
        for name in names:
            if name != "none":
                try:
                    importlib.import_module(TRACKERS[name])
                except ImportError:
                    parser.error(f"argument {option_string}: {name} needs the {name} package: pip install {name}")
        setattr(namespace, self.dest, names)


def add_report_to_arg(parser: argparse.ArgumentParser) -> None:
    """--report-to of a trainer: where its metrics go besides metrics.jsonl (MetricsLogger)."""
    parser.add_argument("--report-to", nargs="+", default=["none"], action=ReportTo, metavar="TRACKER",
                        help="also log the metrics to: none, or one or more of tensorboard (OUT/tensorboard), wandb, "
                        "trackio (project: $WANDB_PROJECT / $TRACKIO_PROJECT, else ui-s1; run: the --out folder's name), "
                        "as transformers' report_to names them; each needs its package installed")


class MetricsLogger:
    """One strict-JSON object per line (`dumps`) to `path`, rank 0 only, plus wall time `t`; a
    new run starts the file afresh, append=True continues it.

    report_to: trackers (TRACKERS keys; "none" or empty: none) that also get every finite number of
    a row, bools and text left out, at x = row["step"] (else the row's index): tensorboard as
    scalars in path's folder/tensorboard, wandb and trackio as one run named after path's folder,
    in project $WANDB_PROJECT / $TRACKIO_PROJECT (else "ui-s1"; transformers reads the same
    variables), with `config` (the run's args) attached. Raises UsageError when a tracker's package
    is missing (the trainers' --report-to has already checked, while parsing). close() ends the
    trackers' runs.

    resume_step: a --resume from the checkpoint of that step (0: none found, a new run). The file keeps
    its rows up to it (`resume_at`); TensorBoard gets purge_step = resume_step + 1 (a new run: 0), so the
    steps redone after the checkpoint show once; W&B (same id) and trackio (same name) continue, with
    resume="allow", the run of path's folder/trackers.json, where a new run records its own. W&B's steps
    only grow: it keeps the values it has for the redone steps (its run rewind is a preview feature)."""

    def __init__(self, path: str | os.PathLike, append: bool = False, report_to=(), config: dict | None = None,
                 resume_step: int | None = None):
        self.path, self.t0, self.n = Path(path), time.time(), 0
        self.tb = self.wandb = self.trackio = None
        if get_rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is not None:
                self.resume_at(resume_step)
            elif not append:
                self.path.write_text("")
        names = [n for n in report_to or () if n != "none"] if get_rank() == 0 else []
        modules = {}
        for name in names:
            try:
                modules[name] = importlib.import_module(TRACKERS[name])
            except (ImportError, KeyError):
                raise UsageError(f"--report-to {name} needs the {name} package: pip install {name}") from None
        folder, config, record = self.path.parent, finite_json(dict(config or {})), self.path.parent / "trackers.json"
        runs = json.loads(record.read_text()) if resume_step and record.is_file() else {}
        again = {"resume": "allow"}  # the run a resume continues: W&B by its id, trackio by its name
        if "tensorboard" in modules:
            purge = None if append and resume_step is None else resume_step + 1 if resume_step else 0
            self.tb = modules["tensorboard"].SummaryWriter(str(folder / "tensorboard"), purge_step=purge)
        if "wandb" in modules:
            w = runs.get("wandb") or {"project": os.environ.get("WANDB_PROJECT", "ui-s1")}
            self.wandb = modules["wandb"].init(project=w["project"], name=folder.name, config=config, dir=str(folder),
                                               **({"id": w["id"], **again} if "id" in w else {}))
            runs["wandb"] = {"project": w["project"], "id": self.wandb.id}
        if "trackio" in modules:
            t = runs.get("trackio") or {"project": os.environ.get("TRACKIO_PROJECT", "ui-s1"), "name": folder.name}
            self.trackio, resumed = modules["trackio"], again if "trackio" in runs else {}
            self.trackio.init(project=t["project"], name=t["name"], config=config, **resumed)
            runs["trackio"] = t
        if runs:
            record.write_text(json.dumps(runs, indent=2))

    def resume_at(self, step: int) -> int:
        """A resumed run continues from the checkpoint of `step` and redoes the steps after it: keep the
        rows of steps <= step (none when step == 0: the run starts over) and drop the later ones and a
        line cut by a kill, so no step appears twice. Rewrites the file atomically (rank 0); returns the
        number of rows dropped (0 elsewhere)."""
        if get_rank() != 0 or not self.path.exists():
            return 0
        lines = self.path.read_text(encoding="utf-8").splitlines()
        keep = []
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break                      # a line cut mid-write: the run died here
            if not isinstance(row, dict) or step == 0 or row.get("step", 0) > step:
                break
            keep.append(line)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
        os.replace(tmp, self.path)
        self.n = len(keep)
        return len(lines) - len(keep)

    def log(self, row: dict) -> None:
        if get_rank() != 0:
            return
        row = {**row, "t": round(time.time() - self.t0, 3)}
        with open(self.path, "a") as f:
            f.write(dumps(row) + "\n")
        x = row.get("step", self.n)
        scalars = {k: v for k, v in finite_json(row).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, x)
            self.tb.flush()
        for run in (self.wandb, self.trackio):
            if run is not None:
                run.log(scalars, step=x)
        self.n += 1

    def close(self) -> None:
        """End the trackers' runs (rank 0; a no-op without trackers or elsewhere)."""
        if self.tb is not None:
            self.tb.close()
        for run in (self.wandb, self.trackio):
            if run is not None:
                run.finish()
        self.tb = self.wandb = self.trackio = None

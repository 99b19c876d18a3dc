"""A script's edges, shared by every script: argparse and one-line input errors in, strict JSON out.

`make_parser` builds a parser whose --help shows defaults and the module docstring's examples;
`cli(main)` runs a script so that a mistake in its input (UsageError, dataset.DataError, a missing or
unreadable file) is one line on stderr and exit code 2, never a traceback; the `arg_type` helpers
check files, folders and models while the flags are parsed (the prompt contract's flags and their
adoption from a checkpoint are chat.py's). Out: `dumps` (JSON with no NaN / Infinity, for every
summary, data and args file) and `MetricsLogger` (metrics.jsonl, plus the trackers of --report-to:
TensorBoard, Weights & Biases, Trackio).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path

from utils import get_rank, latest_checkpoint


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
    """argparse type for --model: 'tiny', 'tiny:HxL' and 'auto' pass through; a Hugging Face folder
    (config.json) as is; a run folder with a `latest` pointer (e.g. out/sft/ckpt) -> the checkpoint
    it names. Raises UsageError for anything else, before a model is loaded."""
    import lora  # here, not at the top: the prompt builder imports cli without the model code
    import vlm

    if name.startswith("tiny:"):
        try:
            vlm.parse_tiny(name)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return name
    if name in ("tiny", "auto") or (Path(name) / "config.json").is_file() or lora.is_adapter_dir(name):
        return name
    if not Path(name).exists():
        raise UsageError(f"{name!r}: no such folder (expected 'tiny', a Hugging Face model folder or a checkpoint folder)")
    ckpt = latest_checkpoint(name) if Path(name).is_dir() else None
    if ckpt is None:
        raise UsageError(f"{name!r}: not a model folder (no config.json, no `latest` checkpoint pointer)")
    return str(ckpt)


def _input_errors() -> tuple:
    """The exception classes that mean bad input, never a bug: ours, the data loader's, the OS's."""
    import lora
    from dataset import DataError

    return (UsageError, DataError, lora.LoraError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
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
    """Run `main(argv)` as a script: an input error (UsageError, dataset.DataError, a missing or
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
    trackers' runs."""

    def __init__(self, path: str | os.PathLike, append: bool = False, report_to=(), config: dict | None = None):
        self.path, self.t0, self.n = Path(path), time.time(), 0
        self.tb = self.wandb = self.trackio = None
        if get_rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not append:
                self.path.write_text("")
        names = [n for n in report_to or () if n != "none"] if get_rank() == 0 else []
        modules = {}
        for name in names:
            try:
                modules[name] = importlib.import_module(TRACKERS[name])
            except (ImportError, KeyError):
                raise UsageError(f"--report-to {name} needs the {name} package: pip install {name}") from None
        run_name, config = self.path.parent.name, finite_json(dict(config or {}))
        if "tensorboard" in modules:
            self.tb = modules["tensorboard"].SummaryWriter(str(self.path.parent / "tensorboard"))
        if "wandb" in modules:
            self.wandb = modules["wandb"].init(project=os.environ.get("WANDB_PROJECT", "ui-s1"), name=run_name,
                                               config=config, dir=str(self.path.parent))
        if "trackio" in modules:
            self.trackio = modules["trackio"]
            self.trackio.init(project=os.environ.get("TRACKIO_PROJECT", "ui-s1"), name=run_name, config=config)

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
        if self.wandb is not None:
            self.wandb.log(scalars, step=x)
        if self.trackio is not None:
            self.trackio.log(scalars, step=x)
        self.n += 1

    def close(self) -> None:
        """End the trackers' runs (rank 0; a no-op without trackers or elsewhere)."""
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.trackio is not None:
            self.trackio.finish()
        self.tb = self.wandb = self.trackio = None

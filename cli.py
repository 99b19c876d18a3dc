"""The command line every script shares: `make_parser` (--help with the defaults and the docstring's
examples, one-line errors), the flag types that check a value while the flags are parsed, and
`run_script(main)`: an input error (utils.InputError, a missing file) is one line and exit code 2."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

from utils import InputError, UsageError, get_rank

# -----------------------------------------------------------------------------
# the parser and the flags' types


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every flag's default (unless its help says it) and the examples as written."""

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


def int_at_least(low: int):
    """argparse type: an integer >= low; '1.5', 'ten' and values below low are refused in one line
    (`argument --x: ...`) naming the bound."""
    def convert(text: str) -> int:
        v = int(text)  # 'ten': argparse's own one line, "invalid int value: 'ten'" (it reads __name__)
        if v < low:
            raise argparse.ArgumentTypeError(f"{v}: must be >= {low}")
        return v
    convert.__name__, convert.kind = "int", "int"  # kind: the flag walk's (tests)
    return convert


positive_int = int_at_least(1)      # counts, sizes, steps: 0 has no meaning
non_negative_int = int_at_least(0)  # seeds, limits and periods whose help says what 0 means


def finite_float(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False):
    """argparse type: a finite float in [low, high] (an open end with low_open / high_open; None: no
    bound). NaN and +-inf are always refused: no flag of ours means anything by them."""
    def convert(text: str) -> float:
        v = float(text)  # not a number: argparse's "invalid float value: 'x'" (as int_at_least)
        lo_ok = low is None or (v > low if low_open else v >= low)
        hi_ok = high is None or (v < high if high_open else v <= high)
        if not (math.isfinite(v) and lo_ok and hi_ok):
            span = f"{'(' if low_open else '['}{'-inf' if low is None else f'{low:g}'}, " \
                   f"{'inf' if high is None else f'{high:g}'}{')' if high_open or high is None else ']'}"
            raise argparse.ArgumentTypeError(f"{text}: must be a finite number in {span}")
        return v
    convert.__name__, convert.kind = "float", "float"
    return convert


positive_float = finite_float(0.0, low_open=True)   # learning rates, scales, timeouts
non_negative_float = finite_float(0.0)              # weights and coefficients where 0 switches a term off
fraction = finite_float(0.0, 1.0)                   # shares in [0, 1]


MIN_TEMPERATURE = 1e-3  # logits of |z| <= ~1e3 stay far inside fp32 (3.4e38) after z / T, exp() and sums


def check_temperature(temperature: float) -> None:
    """The one temperature rule of the sampler, the flags (`temperature`) and the scorer: finite and
    >= MIN_TEMPERATURE (greedy decoding is greedy=True, not T -> 0). Raises ValueError otherwise."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not (math.isfinite(temperature) and temperature >= MIN_TEMPERATURE):
        raise ValueError(f"temperature must be finite and >= {MIN_TEMPERATURE:g}, got {temperature} "
                         "(below it logits / temperature leave fp32's range; use greedy=True for argmax)")


def temperature(text: str) -> float:
    """argparse type of every --temperature: check_temperature, met at parse time."""
    try:
        v = float(text)
        check_temperature(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text}: {e}" if "temperature" in str(e) else f"invalid float value: {text!r}") from None
    return v

temperature.kind = "float"


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
    convert.__name__, convert.kind = "int", "int"  # 'x' in the list: "invalid int value"
    return convert


def input_file(path: str) -> str:
    """argparse type: a readable file. Raises UsageError naming the path otherwise."""
    if not os.path.isfile(path):
        raise UsageError(f"{'not a file' if os.path.exists(path) else 'no such file'}: {path!r}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"not readable: {path!r}")
    return path


def input_dir(path: str) -> str:
    """argparse type: an existing folder. Raises UsageError naming the path otherwise."""
    if not os.path.isdir(path):
        raise UsageError(f"{'not a folder' if os.path.exists(path) else 'no such folder'}: {path!r}")
    return path


# -----------------------------------------------------------------------------
# one-line input errors


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
    """Run `main(argv)` as a script: an input error (INPUT_ERRORS) prints `<script>: error: <one
    line>` to stderr (rank 0) and exits 2, like argparse's errors; a bug keeps its traceback."""
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

"""Every script meets each kind of input mistake with ONE line on stderr, `<script>: error: ...`
naming the flag or file, exit code 2 and no traceback: missing or unreadable files, malformed
sizes, a model folder that is not one, flags that contradict each other, data that is not
episodes. The errors fire before any model loads, so each run costs an interpreter start: each case
runs in its own process, forked from one that imported torch and transformers (tests/fork_runner.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent
NOT_A_MODEL = "assets"  # a folder, but no config.json and no `latest` pointer
TRAIN = "data/miniwob/train.jsonl"
TEST = "data/miniwob/test.jsonl"

CASES = [
    # (script and arguments, text the one line must contain)
    (["train_sft.py", "--data", "nope/train.jsonl"], "argument --data: no such file: 'nope/train.jsonl'"),
    (["train_sft.py", "--data", "data"], "argument --data: not a file: 'data'"),
    (["train_sft.py", "--blank-screens", "1080*2400"], "argument --blank-screens: expected a size WxH"),
    (["train_sft.py", "--image-root", "no/shots"], "argument --image-root: no such folder: 'no/shots'"),
    (["train_sft.py", "--model", NOT_A_MODEL], "argument --model: 'assets': not a model folder"),
    (["train_sft.py", "--model", "no/such/model"], "argument --model: 'no/such/model': no such folder"),
    (["train_sft.py", "--batch-size", "5", "--micro-batch-size", "2"], "--batch-size 5 must be a multiple"),
    (["train_sft.py", "--min-pixels", "9000", "--max-pixels", "10"], "--min-pixels 9000 / --max-pixels 10"),
    (["train_sft.py", "--data", "README.md"], "README.md: line 1: field '<json>': invalid JSON"),
    (["train_sft.py", "--max-steps", "ten"], "argument --max-steps: invalid int value: 'ten'"),
    (["train_sft.py", "--preset", "papper"], "argument --preset: invalid choice: 'papper'"),
    (["train_semionline.py", "--preset", "realease"], "argument --preset: invalid choice: 'realease'"),
    (["train_semionline.py", "--data", "nope.jsonl"], "argument --data: no such file: 'nope.jsonl'"),
    (["train_semionline.py", "--blank-screens", "0x5"], "argument --blank-screens: expected a positive size"),
    (["train_semionline.py", "--model", NOT_A_MODEL], "argument --model: 'assets': not a model folder"),
    (["train_semionline.py", "--ref-model", "no/such/model"], "argument --ref-model: 'no/such/model': no such folder"),
    (["train_semionline.py", "--model", "tiny", "--min-pixels", "0"], "argument --min-pixels: 0: must be >= 1"),
    # sampling flags: before any model loads, and before args.json / metrics.jsonl are written
    (["train_semionline.py", "--model", "tiny", "--temperature", "0", "--out", "/tmp/never_rl"],
     "argument --temperature: 0: temperature must be finite and >= 0.001"),
    (["train_semionline.py", "--model", "tiny", "--temperature", "1e-45", "--out", "/tmp/never_rl"], "argument --temperature: 1e-45: temperature must be finite"),
    (["train_semionline.py", "--model", "tiny", "--temperature", "nan", "--out", "/tmp/never_rl"], "argument --temperature: nan: temperature must be finite"),
    (["train_semionline.py", "--model", "tiny", "--top-p", "0", "--out", "/tmp/never_rl"], "argument --top-p: 0: must be a finite number in (0, 1]"),
    (["eval_sop.py", "--data", "nope.jsonl"], "argument --data: no such file: 'nope.jsonl'"),
    (["eval_sop.py", "--data", TEST, "--blank-screens", "1080*2400"], "argument --blank-screens: expected a size WxH"),
    (["eval_sop.py", "--data", TEST, "--policy", "model", "--model", NOT_A_MODEL], "argument --model: 'assets': not a model folder"),
    (["eval_sop.py", "--data", TEST, "--model", "tiny"], "--model tiny is given but --policy is expert"),
    (["eval_sop.py"], "nothing to evaluate: give --data and/or --online"),
    (["eval_sop.py", "--data", TEST, "--max-new-tokens", "0"], "argument --max-new-tokens: 0: must be >= 1"),
    (["eval_sop.py", "--online", "--online-batch", "0"], "argument --online-batch: 0: must be >= 1"),
    (["eval_sop.py", "--data", "README.md"], "README.md: line 1: field '<json>': invalid JSON"),
    (["eval_sop.py", "--data", TEST, "--image-root", "data", "--blank-screens", "9x9"],
     "argument --blank-screens: not allowed with argument --image-root"),
    (["eval_sop.py", "score", "--data", TEST, "--responses", "nope.jsonl", "--out", "/dev/null"],
     "argument --responses: no such file: 'nope.jsonl'"),
    (["eval_sop.py", "score", "--data", TEST, "--responses", "README.md", "--out", "/dev/null"],
     "README.md: line 1: invalid JSON"),
    (["eval_sop.py", "baselines", "--data", TEST, "--image-size", "big"], "argument --image-size: expected a size WxH"),
    (["envs/miniwob_experts.py", "eval", "--tasks", "click-tset"], "unknown MiniWob++ task 'click-tset'"),
    (["envs/miniwob_experts.py", "eval", "--seeds", "0"], "argument --seeds: 0: must be >= 1"),
    (["tools/make_miniwob_data.py", "--tasks", "nope", "--out", "/tmp/never"], "unknown MiniWob++ task 'nope'"),
    (["tools/make_miniwob_data.py", "--train-seed-base", "100000", "--out", "/tmp/never"], "overlap"),
    (["tools/plot_metrics.py", "nope/metrics.jsonl"], "argument metrics: no such file: 'nope/metrics.jsonl'"),
    (["tools/plot_metrics.py", "README.md"], "README.md: line 1: invalid JSON"),
    (["runs/repro_main.py", "--seeds", "x"], "argument --seeds: invalid int value: 'x'"),
    (["runs/repro_ablations.py", "--nope"], "unrecognized arguments: --nope"),
    (["bench/bench_logprob.py", "--n", "x"], "argument --n: invalid int value: 'x'"),
    (["tools/convert_android_control.py", "--src", "data", "--out", "/tmp/never"],
     "--src data: no shards named android_control-*-of-*"),
    # values that once ran (or crashed after loading a model): each refused while the flags are parsed
    (["train_sft.py", "--lr", "-1"], "argument --lr: -1: must be a finite number in (0, inf)"),
    (["train_semionline.py", "--model", "tiny", "--gamma", "-0.5", "--out", "/tmp/never_rl"], "argument --gamma: -0.5"),
    (["train_semionline.py", "--model", "tiny", "--kl-coef", "-1", "--out", "/tmp/never_rl"], "argument --kl-coef: -1"),
    (["eval_sop.py", "--online", "--policy", "model", "--online-tasks", "click-tset"], "unknown MiniWob++ task 'click-tset'"),
    (["eval_sop.py", "--data", TEST, "--limit", "-1"], "argument --limit: -1: must be >= 1"),
    (["eval_sop.py", "--data", TEST, "--per-task-limit", "-2"], "argument --per-task-limit: -2: must be >= 1"),
    (["eval_sop.py", "--online", "--online-max-steps", "0"], "argument --online-max-steps: 0: must be >= 1"),
    (["eval_sop.py", "--online", "--policy", "model", "--samples", "2", "--temperature", "1e-9"], "argument --temperature: 1e-9"),
    (["eval_sop.py", "--online", "--policy", "model", "--samples", "2", "--temperature", "inf"], "argument --temperature: inf"),
    (["runs/dose_response.py", "--start", "data", "--point", "a", "-3", "data", "--out", "/tmp/never"], "STEP -3: must be >= 1"),
    (["bench/bench_step.py", "--system-prompt", "shrot"], "argument --system-prompt: invalid choice: 'shrot'"),
]


@pytest.fixture(scope="module")
def runs():
    """Every case's finished process (returncode, stdout, stderr), keyed by its argv: each case its own
    process, forked from one interpreter that imported torch and transformers once (tests/fork_runner.py;
    an interpreter start is most of a case's cost)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "tests/fork_runner.py"], input=json.dumps([c[0] for c in CASES]), cwd=REPO,
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return {tuple(c[0]): SimpleNamespace(**r) for c, r in zip(CASES, json.loads(p.stdout))}


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_one_line_exit_2(runs, argv, expected):
    p = runs[tuple(argv)]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    assert len(lines) == 1, p.stderr
    script = Path(argv[0]).name
    assert lines[0].startswith(f"{script}") and ": error: " in lines[0], lines[0]
    assert expected in lines[0], lines[0]


# -----------------------------------------------------------------------------
# the flag walk: every script's parser, every numeric and name-like flag, parsed in this process

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import runpy  # noqa: E402


SCRIPTS = sorted({str(p.relative_to(REPO)) for d in ("", "tools", "runs", "bench", "envs") for p in (REPO / d).glob("*.py")
                  if re.search(r"parse_args\(|__main__", p.read_text(encoding="utf-8"))} - {"runs/repro_common.py", "utils.py"})
NAME_LIKE = re.compile(r"(^|_)(task|tasks|policy|protocol|mode|rules|workloads|sections|split|worker)$")


class _Parser(Exception):
    def __init__(self, parser):
        self.parser = parser


def script_parser(path: str) -> argparse.ArgumentParser:
    """The parser a script builds, caught as it starts parsing (so before any model or file is touched):
    the script runs as __main__ with parse_args / parse_known_args replaced by a raise."""
    def caught(self, *a, **k):
        raise _Parser(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv, list(sys.path)
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = caught
    sys.argv = [path]
    sys.path.insert(0, str((REPO / path).parent))  # as `python path` has it
    try:
        runpy.run_path(str(REPO / path), run_name="__main__")
    except _Parser as e:
        return e.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv, sys.path[:] = saved
    raise AssertionError(f"{path} never parsed its flags")


def parsers(path):
    """(subcommand, parser) of the script and of each of its argparse subcommands."""
    top = script_parser(path)
    out = [("", top)]
    for a in top._actions:
        if isinstance(a, argparse._SubParsersAction):
            out += [(name, sub) for name, sub in a.choices.items()]
    return out


def documented(value: str, helptext: str) -> bool:
    """The flag's help says what this accepted value means: '0: ...', '0 = ...', '-1: ...', '<0 ...'."""
    v = value.lstrip("-")
    return bool(re.search(rf"(^|[\s(;,]){re.escape(value)}(\.0)?\s*[:=]", helptext)) or \
        (value.startswith("-") and re.search(r"<\s*0|negative", helptext) is not None) or \
        (v == "0" and re.search(r"\b0(\.0)? (disables|keeps|off)", helptext) is not None)


def refused(parser, argv) -> str | None:
    """The one stderr line if parsing argv exits 2, else None (parsed)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            lines = [x for x in err.getvalue().splitlines() if x.strip()]
            assert e.code == 2 and len(lines) == 1, (argv, e.code, err.getvalue())
            return lines[0]
    return None


@pytest.mark.parametrize("script", SCRIPTS)
def test_flag_walk(script):
    """Every numeric flag meets a negative, a zero and (floats) nan / inf / -inf; every name-like flag a
    misspelling. Each is refused at parse time (one line naming the flag, exit 2) or is a value the
    flag's help gives a meaning. No flag takes a bare int / float: the range is part of its type."""
    problems = []
    for prefix, p in parsers(script):  # prefix: the subcommand, for the report
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            flag = a.option_strings[-1]
            if a.type in (int, float):
                problems.append(f"{script} {prefix} {flag}: bare {a.type.__name__} (use a cli range type)")
                continue
            kind = getattr(a.type, "kind", None)
            values = {"int": ["-1", "0"], "float": ["-1", "0", "nan", "inf", "-inf"]}.get(kind, [])
            if a.choices is not None or kind == "name":
                values.append("clikc-tset")
            elif kind is None and NAME_LIKE.search(a.dest):
                problems.append(f"{script} {prefix} {flag}: a name-like flag without choices or cli.names")
            n = a.nargs if isinstance(a.nargs, int) else 1
            for v in values:
                line = refused(p, [flag, *([v] * n)])
                if line is not None and flag not in line and v not in line:
                    line = None   # refused for another reason (a required argument missing): the value itself passed
                if line is None:
                    if v == "0" and "seed" in a.dest:  # seed 0 is a seed like any other
                        continue
                    if not documented(v, a.help or ""):
                        problems.append(f"{script} {prefix} {flag} {v}: accepted, and its help gives it no meaning")
    assert not problems, "\n".join(problems)


def test_flag_walk_covers_every_script():
    assert len(SCRIPTS) >= 23 and {"train_sft.py", "train_semionline.py", "eval_sop.py", "bench/bench_step.py",
                                   "runs/dose_response.py", "tools/convert_android_control.py"} <= set(SCRIPTS), SCRIPTS

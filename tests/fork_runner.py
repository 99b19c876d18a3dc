"""Runs many short script invocations, each in its own process, for the price of one interpreter start
(not a test module). Started as `python tests/fork_runner.py` from the repo root with a JSON list of argv
lists on stdin (each `[script, *args]`, as after `python`); prints one JSON list of
{"returncode", "stdout", "stderr"}, in the same order.

The runner imports the heavy third-party libraries once (torch, transformers: ~5 s of a start that the
scripts' argument errors never get past), then forks one child per case. The child is the script as
`python script args` runs it: sys.argv and sys.path[0] set as the interpreter sets them, the script run as
__main__, its stdout and stderr the process's own file descriptors, its exit status the one the
interpreter gives (SystemExit's code; a message printed and 1 for a string; a traceback and 1 for an
uncaught exception). Project modules are imported by the child, never by the runner. Two children at once.
"""
import json
import os
import runpy
import shutil
import sys
import tempfile
import traceback

AT_ONCE = 2


def preload(tmp: str) -> tuple[str, str]:
    """Import the heavy libraries; what a fresh interpreter would print while importing them (to stdout,
    stderr) is returned, and put in front of every case's own output."""
    saved = os.dup(1), os.dup(2)
    paths = os.path.join(tmp, "preload.out"), os.path.join(tmp, "preload.err")
    for fd, path in zip((1, 2), paths):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    try:
        import numpy  # noqa: F401
        import PIL.Image  # noqa: F401
        import torch  # noqa: F401
        from transformers import Qwen2_5_VLForConditionalGeneration  # noqa: F401 (the lazy model modules)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    return tuple(open(p, errors="replace").read() for p in paths)


def child(argv: list[str], out_fd: int, err_fd: int) -> None:
    """In the forked process: run argv[0] as __main__ and leave with the interpreter's exit status."""
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python path/script.py` has it
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 (the interpreter's own behaviour)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF)


def main() -> None:
    cases = json.load(sys.stdin)
    results: list[dict | None] = [None] * len(cases)
    running: dict[int, tuple[int, str, str]] = {}
    tmp = tempfile.mkdtemp(prefix="fork_runner_")
    pre_out, pre_err = preload(tmp)

    def reap() -> None:
        pid, status = os.waitpid(-1, 0)
        i, out, err = running.pop(pid)
        results[i] = {"returncode": os.waitstatus_to_exitcode(status),
                      "stdout": pre_out + open(out, errors="replace").read(),
                      "stderr": pre_err + open(err, errors="replace").read()}

    for i, argv in enumerate(cases):
        while len(running) >= AT_ONCE:
            reap()
        out, err = os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")
        out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err_fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(argv, out_fd, err_fd)
        os.close(out_fd)
        os.close(err_fd)
        running[pid] = (i, out, err)
    while running:
        reap()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""The run folder of `eval_sop.py --out DIR`: written as the evaluation goes, so that nothing is lost.

- At the start, run.json holds the flags as given (what --resume compares). result.json is written at
  the end with the full summary (`"complete": true`), or, when the run is stopped by a signal, with
  what it finished (`"complete": false`, `"interrupted": "SIGINT" | "SIGTERM"`): a result.json that
  exists without `"complete": false` is a finished evaluation (runs/repro_common.py relies on it).
- Every finished episode is appended to its protocol's file (episodes.jsonl: SOP, static_steps.jsonl:
  static, every step of an episode in one write, online_episodes.jsonl: online) and flushed, so a run
  stopped by Ctrl-C, SIGTERM or a crash keeps what it finished. At the end each file is rewritten in
  the episodes' order (a temporary file, then os.replace).
- A folder holding another run's files (OUTPUT_FILES) is refused (utils.UsageError, one line, exit 2)
  unless `--overwrite` (those files are deleted first; other files, such as a job runner's cmd.txt and
  log.txt, stay) or `--resume` (the run is continued: the episodes in the files are kept and not played
  again, the others are played; the flags must be the earlier run's, RUN_ONLY flags aside). A last
  line cut by a kill is dropped on resume (that episode is played again); a damaged line elsewhere is
  an error naming the file and line.

SIGTERM is raised in the main thread as KeyboardInterrupt, as SIGINT is (`stop_signals`), so one
handler in eval_sop.main writes the partial result and exits with EXIT_INTERRUPTED (128 + SIGINT).
"""
import contextlib
import json
import os
import signal
import threading

import utils

RESULT, STARTED = "result.json", "run.json"
STREAMS = {"sop": "episodes.jsonl", "static": "static_steps.jsonl", "online": "online_episodes.jsonl"}
OUTPUT_FILES = (RESULT, STARTED, *STREAMS.values(), "report.html", "responses.jsonl")  # all eval_sop writes here
# flags a resumed run may change: where and how it reports, not what it evaluates
RUN_ONLY = ("resume", "overwrite", "json", "log_level", "report", "report_episodes", "out", "max_server_error_share")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C
EXIT_SERVER_FAILED = 3  # more than --max-server-error-share of the requests got no answer


def read_jsonl(path: str, drop_cut_tail: bool = False) -> list[dict]:
    """The objects of a JSONL file, one per non-blank line. Raises utils.UsageError naming the file,
    the line and what is wrong on a line that is not a JSON object, except (drop_cut_tail) a last line
    without its newline, the line a killed writer left half written: it is dropped, and the file cut
    back to the lines before it."""
    rows, good_end = [], 0
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    pos = 0
    for lineno, raw in enumerate(lines, start=1):
        end = pos + len(raw) + (lineno < len(lines))  # + its newline, when it has one
        cut = lineno == len(lines)  # the text after the last newline (b"" for a complete file)
        if raw.strip():
            try:
                row = json.loads(raw)
                if not isinstance(row, dict):
                    raise ValueError(f"expected a JSON object, got {type(row).__name__}")
            except ValueError as e:
                if cut and drop_cut_tail:
                    with open(path, "r+b") as f:
                        f.truncate(good_end)
                    return rows
                msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
                what = "cut or invalid" if cut else "invalid"
                raise utils.UsageError(f"{path}: line {lineno}: {what} JSON: {msg}") from None
            rows.append(row)
        pos = good_end = end
    return rows


def read_result(path: str) -> dict:
    """result.json as a dict; utils.UsageError (one line, naming the file) when it is missing, empty,
    not JSON or not an object."""
    if not os.path.isfile(path):
        raise utils.UsageError(f"{os.path.dirname(path) or '.'}: no {RESULT} (expected an eval_sop.py --out folder)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise utils.UsageError(f"{path}: empty file (the run that writes it was stopped before it started?)")
    try:
        summary = json.loads(text)
    except json.JSONDecodeError as e:
        raise utils.UsageError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(summary, dict):
        raise utils.UsageError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    return summary


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunFolder:
    """An eval_sop --out folder (the module docstring). `done[protocol]`: the records the files held when
    a run was resumed (empty otherwise), in file order; `append` and `finish_stream` write as the run
    goes; `write_result` writes result.json. args: the run's argparse namespace (vars() is saved).
    Raises utils.UsageError on a folder it may not use (the module docstring)."""

    def __init__(self, path: str, args, resume: bool = False, overwrite: bool = False):
        # the flags as given (a resumed run must give the same), and the namespace that setup completes (the
        # prompt contract read from a checkpoint): result.json's "args" is the latter, as it is when written
        self.path, self.ns, self.given = path, args, json.loads(utils.dumps(vars(args)))
        self.done: dict[str, list[dict]] = {k: [] for k in STREAMS}
        self.finished = {k: 0 for k in STREAMS}  # episodes appended by this run, per protocol
        if os.path.exists(path) and not os.path.isdir(path):
            raise utils.UsageError(f"--out {path}: exists and is not a folder")
        held = sorted(os.listdir(path)) if os.path.isdir(path) else []
        ours = [f for f in held if f in OUTPUT_FILES or f in {n + ".tmp" for n in OUTPUT_FILES}]
        if resume:
            self._resume(held)
        elif ours and not overwrite:
            shown = ", ".join(ours[:4]) + " ..." * (len(ours) > 4)
            raise utils.UsageError(f"--out {path}: holds another run ({shown}); pass --resume to continue it, "
                                   "--overwrite to replace it, or another folder")
        for f in ours if overwrite else ():  # eval_sop's files only; anything else (the user's) stays
            os.remove(os.path.join(path, f))
        os.makedirs(path, exist_ok=True)
        self._lock = threading.Lock()  # online episodes may finish in the browsers' threads

    def _resume(self, held: list[str]) -> None:
        """The earlier run's records (read_jsonl, a cut last line dropped), after checking that it is this run."""
        if STARTED not in held:
            raise utils.UsageError(f"--resume: {self.path} holds no {STARTED}: no eval_sop run to continue")
        if RESULT in held and read_result(os.path.join(self.path, RESULT)).get("complete") is not False:
            raise utils.UsageError(f"--resume: the run in {self.path} is complete; nothing to continue "
                                   "(--overwrite to run it again)")
        earlier = read_result(os.path.join(self.path, STARTED))
        before = {k: v for k, v in (earlier.get("args_given") or {}).items() if k not in RUN_ONLY}
        now = {k: v for k, v in self.given.items() if k not in RUN_ONLY}
        differ = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        if differ:
            shown = "; ".join(f"--{k.replace('_', '-')} {before.get(k)!r} then {now.get(k)!r}" for k in differ[:3])
            raise utils.UsageError(f"--resume: the flags differ from the run in {self.path} ({shown}); "
                                   "a resumed run must be the same run")
        for protocol, name in STREAMS.items():
            file = os.path.join(self.path, name)
            if os.path.isfile(file):
                self.done[protocol] = read_jsonl(file, drop_cut_tail=True)

    def start(self) -> None:
        """run.json: the flags as given, before anything is played (a killed run can be resumed)."""
        _atomic_write(os.path.join(self.path, STARTED), utils.dumps({"args_given": self.given}, indent=1))

    def file(self, protocol: str) -> str:
        return os.path.join(self.path, STREAMS[protocol])

    def append(self, protocol: str, records: list[dict]) -> None:
        """Append one episode's records (static: its steps) to the protocol's file in one write, flushed."""
        text = "".join(utils.dumps(r) + "\n" for r in records)
        with self._lock, open(self.file(protocol), "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            self.finished[protocol] += 1

    def finish_stream(self, protocol: str, records: list[dict]) -> None:
        """The protocol's file rewritten with `records`, the whole evaluation in its order."""
        _atomic_write(self.file(protocol), "".join(utils.dumps(r) + "\n" for r in records))

    def write_result(self, summary: dict, complete: bool, **extra) -> str:
        """result.json: {complete, **extra, **summary, args (as the run completed them), args_given (as
        parsed: what --resume compares)}, replaced atomically. Returns its path."""
        path = os.path.join(self.path, RESULT)
        _atomic_write(path, utils.dumps({"complete": complete, **extra, **summary, "args": vars(self.ns),
                                         "args_given": self.given}, indent=1))
        return path


@contextlib.contextmanager
def stop_signals():
    """SIGTERM raised as KeyboardInterrupt("SIGTERM") in the main thread for the duration (SIGINT raises
    KeyboardInterrupt already), so one `except KeyboardInterrupt` saves the partial run either way.
    Nothing is changed outside the main thread (signal handlers can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    kept = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, kept)


@contextlib.contextmanager
def no_interrupts():
    """SIGINT and SIGTERM ignored while the partial result is written (a second Ctrl-C would cut it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in kept.items():
            signal.signal(s, h)


def server_failures(sop_records, static_records, online_res, max_share: float) -> dict:
    """The requests that got no answer (a served model's, after its retries): never the model's malformed
    answers, scored as wrong steps, counted here per protocol and in all. A request is one step's
    answer: SOP and static, each step run; online, each step taken plus the one that got no answer (it
    ends its episode, cause server_error), and with --samples every sampled play's. Reads the records of
    episodes.jsonl (server_errors), static_steps.jsonl (server_error) and the online result (each None:
    not run). Returns {failed, requests, share, max_share, exceeded (share > max_share: exit code
    EXIT_SERVER_FAILED), by_protocol: {protocol: {failed, requests, episodes (hit by a failure)}}}."""
    parts = {}
    if sop_records is not None:
        parts["sop"] = {"failed": sum(r.get("server_errors", 0) for r in sop_records),
                        "requests": sum(len(r["rewards"]) for r in sop_records),
                        "episodes": sum(bool(r.get("server_errors")) for r in sop_records)}
    if static_records is not None:
        parts["static"] = {"failed": sum(bool(r.get("server_error")) for r in static_records),
                           "requests": len(static_records),
                           "episodes": len({r["episode"] for r in static_records if r.get("server_error")})}
    if online_res is not None:
        hit = sum(e["cause"] == "server_error" for e in online_res["episodes"])
        parts["online"] = {"failed": hit, "requests": sum(e["steps"] for e in online_res["episodes"]) + hit,
                           "episodes": hit}
        sampled = online_res.get("sampled")
        if sampled:
            parts["online_sampled"] = {"failed": sampled["server_errors"], "requests": sampled["responses"],
                                       "episodes": sampled["server_errors"]}
    failed, requests = sum(p["failed"] for p in parts.values()), sum(p["requests"] for p in parts.values())
    share = failed / requests if requests else 0.0
    return {"failed": failed, "requests": requests, "share": share, "max_share": max_share,
            "exceeded": share > max_share, "by_protocol": parts}

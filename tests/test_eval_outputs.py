"""eval_sop.py never scores a server's failure as the model's and loses nothing: a step whose request got
no answer is counted apart from malformed answers (SOP, static and online), said above every figure, and
exits 3 past --max-server-error-share; episodes are appended as they finish, Ctrl-C / SIGTERM leave a
partial result.json (exit 130) that --resume finishes to the uninterrupted run's numbers without playing
a finished episode again; a folder holding another run is refused unless --overwrite. report.py: one-line
errors on damaged folders, partial runs named, a paired difference never zero-width (Tango's interval)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

import dataset
import eval_sop
import gui
import report
import utils
from evaluation import online, outputs
from evaluation.served import ServedOutput
from evaluation import stats
from vlm import load_processor

from openai_server import Loopback, completion, dead_port  # tests/ (conftest puts it on the path)

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "miniwob" / "test.jsonl"
# 6 episodes (2 each of click-button, click-button-sequence, click-checkboxes), 2 per generate call
SMALL = ["--data", str(DATA), "--limit", "24", "--per-task-limit", "2", "--max-pixels", "20000",
         "--batch-size", "2", "--report-episodes", "2"]
ENV = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


class Out:
    def __init__(self, text, finish="stop"):
        self.text, self.ids, self.logprobs, self.finish_reason = text, [0] * 3, torch.zeros(3), finish


class Scripted:
    """A sampler: the expert's action, except at step 1 of episodes whose id hashes to 0 mod 3 (a far
    click), and no answer at all (finish_reason "error: ...", what ServedSampler returns after its
    retries) at the steps `fail(goal, t)` names. Raises KeyboardInterrupt at generate call `stop_at`."""

    def __init__(self, tokenizer, fail=lambda goal, t: False, stop_at=None):
        self.model = torch.nn.Linear(1, 1)  # sampling_mode needs a module
        self.tok, self.fail, self.stop_at, self.calls, self.prompts = tokenizer, fail, stop_at, 0, 0
        self.by_goal = {ep.goal: ep for ep in dataset.load_episodes(DATA, limit=24)}  # a shared goal: the last

    def generate(self, prompts, n=1, greedy=True, seeds=None):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        outs = []
        for p in prompts:
            self.prompts += 1
            text = self.tok.decode(p.input_ids.tolist())
            goal = re.search(r"Task goal: (.*)", text).group(1)
            t = text.count("<|im_start|>assistant") - 1
            if self.fail(goal, t):
                outs.append([Out("", "error: no answer from http://127.0.0.1:9/v1: refused")])
                continue
            ep = self.by_goal[goal]
            w, h = p.resized_size
            if t == 1 and zlib.crc32(ep.episode_id.encode()) % 3 == 0:
                outs.append([Out(gui.format_response("far", {"action": "click", "coordinate": [w - 1, h - 1]}))])
                continue
            outs.append([Out(gui.expert_response(ep.steps[t], ep.steps[t].image_size, p.resized_size, "right"))])
        return outs


@pytest.fixture(scope="module")
def tokenizer():
    return load_processor()[0]


def run(monkeypatch, sampler, argv):
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: sampler)
    return eval_sop.main([*SMALL, "--policy", "model", *argv])


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# -----------------------------------------------------------------------------
# server failures are not the model's


def test_steps_without_an_answer_are_server_errors_not_malformed(monkeypatch, tokenizer, tmp_path, capsys):
    """Every step of the click-button episodes gets no answer: they are counted as the server's (SOP 2 episodes,
    static 4 steps), never as malformed; stdout and the report's card say so above the figures; exit 3 at the
    default --max-server-error-share 0 and 0 when the share allowed covers it. At 06de78c all of them were
    malformed responses and the exit code 0."""
    fail = lambda goal, t: goal.startswith('Click on the "')  # noqa: E731 -- the 2 click-button episodes
    assert [fail(ep.goal, 0) for ep in dataset.load_episodes(DATA, limit=24)].count(True) == 8
    s = run(monkeypatch, Scripted(tokenizer, fail), ["--protocol", "sop", "static", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    f = s["server_failures"]
    assert s["malformed_responses"] == 0
    assert f["by_protocol"]["sop"] == {"failed": 2, "requests": s["steps_run"], "episodes": 2}
    assert f["by_protocol"]["static"] == {"failed": 4, "requests": s["static_steps"], "episodes": 2}
    assert f["failed"] == 6 and f["share"] == pytest.approx(6 / (s["steps_run"] + s["static_steps"]))
    assert f["exceeded"] and eval_sop.exit_status(s) == outputs.EXIT_SERVER_FAILED == 3
    eps = read(tmp_path / "o" / "episodes.jsonl")
    assert [e["server_errors"] for e in eps] == [1, 1, 0, 0, 0, 0] and all(e["malformed"] == 0 for e in eps)
    assert "refused" in eps[0]["server_error"]
    steps = read(tmp_path / "o" / "static_steps.jsonl")
    assert sum(r["server_error"] for r in steps) == 4 and not any(r["malformed"] for r in steps)
    lines = out.splitlines()
    said = next(i for i, ln in enumerate(lines) if "server failed on 6 of" in ln)
    assert said < next(i for i, ln in enumerate(lines) if "SOP TSR" in ln) and "exit code 3" in lines[said]
    assert "malformed" not in out
    page = (tmp_path / "o" / "report.html").read_text()
    assert page.index("server failed on 6 of") < page.index("<th>SOP TSR</th>")
    assert "no answer from the server at step 0" in page and "Raw output: <code>(empty)" not in page
    s = run(monkeypatch, Scripted(tokenizer, fail), ["--protocol", "sop", "--max-server-error-share", "0.5"])
    assert not s["server_failures"]["exceeded"] and eval_sop.exit_status(s) == 0


def test_online_step_without_an_answer_ends_its_episode_as_server_error():
    """OnlineModelPolicy: an episode whose request got no answer gets NoAnswer (cause server_error) as its
    action, not the no-op of a malformed answer that runs the episode to its step limit (06de78c)."""
    shot = __import__("PIL.Image", fromlist=["Image"]).new("RGB", (160, 210), "white")

    class Half:  # answers episode seed 0, fails seed 1
        def generate(self, prompts, n=1, greedy=True, seeds=None):
            return [[ServedOutput([], '<think>t</think><action>{"action": "click", "coordinate": [5, 5]}'
                                           '</action>', None, "stop", 0)] if p.seed == 0 else
                    [ServedOutput([], "", None, "error: no answer from http://x/v1: refused", 1)]
                    for p in prompts]

    make = lambda obs, shots, history: type("P", (), {"resized_size": (160, 210), "seed": obs["seed"]})()  # noqa: E731
    pol = online.OnlineModelPolicy(Half(), make, set(), {"responses": 0, "truncated": 0, "server_errors": 0,
                                                           "tokens": 0})
    obs = [{"task": "click-test", "seed": s, "goal": "g", "screenshot": shot, "elements": None} for s in (0, 1)]
    a, b = pol(obs, [0, 0])
    assert a == {"action": "click", "coordinate": [5, 5]}
    assert isinstance(b, online.NoAnswer) and b.cause == "server_error" and "refused" in str(b)
    assert pol.n_malformed == 0 and pol.n_server_errors == 1 and pol.stats["server_errors"] == 1


def test_dead_server_online_is_server_error_and_exit_3(tmp_path):
    """The CLI against a port nobody listens on, online in Chromium: each episode ends at its first step
    with cause server_error (06de78c: step_limit, 'malformed'), stdout says the server failed on 2 of 2
    requests, and the exit code is 3."""
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "eval_sop.py", "--policy", "openai", "--base-url",
                        f"http://127.0.0.1:{dead_port()}/v1", "--served-model", "m", "--retries", "0", "--online",
                        "--online-tasks", "click-test", "--online-seeds", "2", "--online-max-steps", "3",
                        "--max-pixels", "20000", "--out", str(out)],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stderr[-2000:]
    eps = read(out / "online_episodes.jsonl")
    assert [e["cause"] for e in eps] == ["server_error", "server_error"] and all(e["steps"] == 0 for e in eps)
    assert "no answer from" in eps[0]["error"] and eps[0]["malformed"] == 0
    assert "server failed on 2 of 2 requests" in p.stdout and "malformed" not in p.stdout
    res = json.loads((out / "result.json").read_text())
    assert res["online_failures"]["server_error"] == 2 and res["online_failures"]["step_limit"] == 0


# -----------------------------------------------------------------------------
# nothing lost: appended as they finish, a partial result on Ctrl-C, --resume


METRICS = ("sop_pg", "sop_tsr", "static_step_sr", "static_type_acc", "static_grounding_acc", "steps_run",
           "static_steps", "malformed_responses", "per_task", "history_gap", "server_failures")


def test_interrupted_run_resumes_to_the_uninterrupted_numbers(monkeypatch, tokenizer, tmp_path):
    """Ctrl-C (a KeyboardInterrupt from the sampler) at the 3rd generate call: exit 130, result.json marked
    complete false, the SOP episodes of the first chunk (2) already on disk (06de78c: no folder at all).
    --resume plays only what is left (the prompts counted) and ends with the uninterrupted run's numbers
    and byte-identical episode files."""
    argv = ["--protocol", "sop", "static"]
    full = run(monkeypatch, Scripted(tokenizer), argv + ["--out", str(tmp_path / "full")])
    assert 0 < full["sop_pg"] < 1 and 0 < full["static_step_sr"] < 1  # a real comparison
    cut = tmp_path / "cut"
    with pytest.raises(SystemExit) as e:
        run(monkeypatch, Scripted(tokenizer, stop_at=3), argv + ["--out", str(cut)])
    assert e.value.code == outputs.EXIT_INTERRUPTED == 130
    partial = json.loads((cut / "result.json").read_text())
    assert partial["complete"] is False and partial["interrupted"] == "SIGINT" and partial["args"]["out"] == str(cut)
    done = read(cut / "episodes.jsonl")
    assert len(done) == 2 and partial["finished"]["sop"] == 2  # calls 1-2: the first chunk's two steps
    assert "PARTIAL run" in (cut / "report.html").read_text()
    again = Scripted(tokenizer)
    resumed = run(monkeypatch, again, argv + ["--out", str(cut), "--resume"])
    sop = read(tmp_path / "full" / "episodes.jsonl")
    left = sum(len(r["rewards"]) for r in sop[2:]) + full["static_steps"]
    assert again.prompts == left < full["steps_run"] + full["static_steps"]  # the finished 2 were not played
    for k in METRICS:
        assert resumed[k] == full[k], k
    for name in ("episodes.jsonl", "static_steps.jsonl"):
        assert (cut / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    assert json.loads((cut / "result.json").read_text())["complete"] is True
    with pytest.raises(utils.UsageError, match="complete; nothing to continue"):
        run(monkeypatch, Scripted(tokenizer), argv + ["--out", str(cut), "--resume"])


def test_resume_drops_a_cut_last_line_and_refuses_other_flags(monkeypatch, tokenizer, tmp_path):
    """A kill in the middle of a write leaves a line without its newline: --resume drops it and plays that
    episode again; a damaged line before the last is a one-line error naming file and line; a resume with
    other flags is refused."""
    cut = tmp_path / "cut"
    with pytest.raises(SystemExit):
        run(monkeypatch, Scripted(tokenizer, stop_at=3), ["--out", str(cut)])
    f = cut / "episodes.jsonl"
    f.write_text(f.read_text() + '{"episode": 2, "sour')
    with pytest.raises(utils.UsageError, match="flags differ.*--limit 24 then 30"):
        run(monkeypatch, Scripted(tokenizer), ["--out", str(cut), "--resume", "--limit", "30"])
    again = Scripted(tokenizer)
    s = run(monkeypatch, again, ["--out", str(cut), "--resume"])
    kept = sum(len(r["rewards"]) for r in read(f)[:2])  # the 2 whole lines; the cut one's episode is played again
    assert s["episodes"] == 6 and len(read(f)) == 6 and again.prompts == s["steps_run"] - kept and kept == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"a": \n{"a": 2}\n')
    with pytest.raises(utils.UsageError, match=r"bad.jsonl: line 2: invalid JSON"):
        outputs.read_jsonl(str(bad), drop_cut_tail=True)


def slow(gate: Path):
    """A chat-completions server's answer to every request: a click, after 0.5 s, and after 5 s once the run
    folder's first episode is on disk (`gate`): the run cannot end before the test signals it."""
    def answer(req):
        done = gate.is_file() and gate.read_text().count("\n") >= 1
        reply = completion('<think>t</think><action>{"action": "click", "coordinate": [5, 5]}</action>')
        reply.delay = 5.0 if done else 0.5
        return reply
    return answer


def default_sigint():
    """In the child: SIGINT back to its default. A process started with SIGINT ignored keeps ignoring it
    (POSIX; Python then installs no KeyboardInterrupt), and a pytest-xdist worker ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_leaves_a_partial_result_and_exit_130(tmp_path, sig):
    """A served run against a slow loopback server, stopped by a signal once an episode is on disk: exit
    130, result.json complete false naming the signal, the finished episodes kept (06de78c: no folder)."""
    out = tmp_path / "o"
    with Loopback(slow(out / "episodes.jsonl")) as srv:
        proc = subprocess.Popen([sys.executable, "eval_sop.py", *SMALL, "--policy", "openai", "--served-model", "m",
                                 "--base-url", srv.url, "--concurrency", "1", "--out", str(out)], cwd=REPO, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
        try:
            deadline = time.time() + 300
            while not ((out / "episodes.jsonl").is_file() and (out / "episodes.jsonl").read_text().count("\n") >= 1):
                assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
                time.sleep(0.2)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    res = json.loads((out / "result.json").read_text())
    assert res["complete"] is False and res["interrupted"] == sig.name and res["finished"]["sop"] >= 1
    assert "Traceback" not in err and "--resume continues" in err
    assert len(read(out / "episodes.jsonl")) >= 1


def test_out_holding_another_run_is_refused_unless_overwrite(monkeypatch, tokenizer, tmp_path, capsys):
    """A reused --out mixed runs (06de78c: a static-only rerun kept the SOP file and report.py paired it).
    Now it is a one-line error; --overwrite deletes eval_sop's files only (a user's file stays) and the
    static-only rerun leaves no episodes.jsonl, so report.py compares no SOP."""
    out = tmp_path / "o"
    run(monkeypatch, Scripted(tokenizer), ["--protocol", "sop", "--out", str(out)])
    (out / "notes.txt").write_text("mine")
    with pytest.raises(utils.UsageError,
                       match=r"holds another run \(episodes.jsonl, report.html, result.json, run.json\).*--overwrite"):
        run(monkeypatch, Scripted(tokenizer), ["--protocol", "static", "--out", str(out)])
    with pytest.raises(utils.UsageError, match="one or the other"):
        run(monkeypatch, Scripted(tokenizer), ["--out", str(out), "--overwrite", "--resume"])
    run(monkeypatch, Scripted(tokenizer), ["--protocol", "static", "--out", str(out), "--overwrite"])
    assert sorted(os.listdir(out)) == ["notes.txt", "report.html", "result.json", "run.json", "static_steps.jsonl"]
    c = report.main([str(out), str(out), "--names", "a", "b", "--out", str(tmp_path / "c.html")])
    assert set(c["diffs"]["b"]) == {"static_step_sr", "static_type_acc"}


# -----------------------------------------------------------------------------
# report.py: damaged folders, partial runs, intervals


def write_run(folder: Path, online: list[int], complete: bool = True) -> None:
    folder.mkdir()
    (folder / "online_episodes.jsonl").write_text(
        "".join(json.dumps({"task": "t", "seed": s, "success": bool(x)}) + "\n" for s, x in enumerate(online)))
    (folder / "result.json").write_text(json.dumps({
        "complete": complete, "protocols": ["online"], "online_sr": sum(online) / len(online),
        "n_online_episodes": len(online), **({} if complete else {"interrupted": "SIGINT"})}))


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "online_episodes.jsonl").write_text('{"task": "t", "seed": 0, "success": true}\n{"task": "t", "se'),
     r"online_episodes.jsonl: line 2: cut or invalid JSON"),
    (lambda d: (d / "online_episodes.jsonl").write_text('{"task": "t", "success": true}\n'),
     r"online_episodes.jsonl: record 1: missing or invalid field 'seed'"),
    (lambda d: (d / "result.json").write_text(""), r"result.json: empty file"),
    (lambda d: (d / "result.json").write_text('{"complete": tru'), r"result.json: line 1: invalid JSON"),
    (lambda d: (d / "result.json").write_text("[1]"), r"result.json: expected a JSON object, got list"),
    (lambda d: (d / "result.json").unlink(), r"B: no result.json"),
])
def test_report_damaged_folder_is_one_line_error(tmp_path, damage, message):
    """06de78c: a traceback (JSONDecodeError, KeyError) on each of these."""
    write_run(tmp_path / "A", [0, 1])
    write_run(tmp_path / "B", [1, 1])
    damage(tmp_path / "B")
    with pytest.raises(utils.UsageError, match=message) as e:
        report.main([str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(tmp_path / "c.html")])
    assert "\n" not in str(e.value)


def test_report_cli_damaged_file_exits_2_without_traceback(tmp_path):
    write_run(tmp_path / "A", [0, 1])
    write_run(tmp_path / "B", [1, 1])
    (tmp_path / "B" / "result.json").write_text("")
    p = subprocess.run([sys.executable, "report.py", str(tmp_path / "A"), str(tmp_path / "B"), "--out",
                        str(tmp_path / "c.html")], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "result.json: empty file" in p.stderr


def test_partial_run_is_named_and_no_discordant_pair_is_not_zero_width(tmp_path, capsys):
    """Two runs of 40 episodes, the same 25 successes (no discordant pair): 06de78c printed +0.000 [+0.000,
    +0.000]. Tango's interval with b = c = 0 is +-z^2 / (n + z^2) = +-3.8415 / 43.8415 = +-0.0876; the
    second run, stopped early (complete false), is named PARTIAL on stdout and in the page."""
    outcomes = [1] * 25 + [0] * 15
    write_run(tmp_path / "A", outcomes)
    write_run(tmp_path / "B", outcomes, complete=False)
    c = report.main([str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(tmp_path / "c.html")])
    d = c["diffs"]["B"]["online_sr"]["pooled"]
    half = stats.Z95 ** 2 / (40 + stats.Z95 ** 2)
    assert d["diff"] == 0 and d["discordant"] == [0, 0] and d["diff_ci95"] == pytest.approx([-half, half])
    assert f"{half:.4f}" == "0.0876"
    out = capsys.readouterr().out
    assert "+0.000 [-0.088, +0.088] p 1 (40 pairs)" in out and "B is a PARTIAL run" in out
    assert c["partial"] == ["B"] and "B is a PARTIAL run" in (tmp_path / "c.html").read_text()


def test_tango_interval_by_hand():
    """Closed forms (evaluation/stats.py tango_interval): b = c = 0 -> +-z^2/(n + z^2); c = 0 -> [(b - z^2)/(n + z^2),
    Wilson's upper limit of b/n]; swapping b and c mirrors it; at each end the score statistic is z."""
    z2 = stats.Z95 ** 2
    assert stats.tango_interval(0, 0, 52) == pytest.approx((-z2 / (52 + z2), z2 / (52 + z2)))
    assert stats.tango_interval(3, 0, 5) == pytest.approx(((3 - z2) / (5 + z2), stats.wilson(3, 5)[1]))
    assert stats.tango_interval(0, 3, 5) == pytest.approx((-stats.wilson(3, 5)[1], -(3 - z2) / (5 + z2)))
    lo, hi = stats.tango_interval(5, 2, 20)
    assert lo < 0 < 0.15 < hi  # McNemar p 0.45: 0 inside
    with pytest.raises(ValueError):
        stats.tango_interval(3, 3, 5)


def test_online_episodes_are_appended_and_resumed(monkeypatch, tokenizer, tmp_path):
    """Online (miniwob_env.evaluate_online stood in for by one-step episodes, no browser; a click succeeds):
    each episode is on disk as it ends; stopped after 4 of 6, --resume plays the 2 left and ends with the
    uninterrupted run's numbers and file (06de78c: nothing on disk before the end)."""
    from PIL import Image

    from envs import miniwob_env
    played, stop = [], [None]

    def stand_in(policy, tasks, seeds, max_steps=12, batch_size=1, on_episode=None, **kw):
        eps = []
        for task in tasks:
            for seed in seeds:
                if len(played) == stop[0]:
                    raise KeyboardInterrupt
                obs = {"task": task, "seed": seed, "goal": f"reach {task} {seed}", "elements": "", "history": [],
                       "screenshot": Image.new("RGB", (160, 210), "white")}
                a = policy([obs], [0])[0]
                ok = isinstance(a, dict) and a["action"] == "click"
                eps.append({"task": task, "seed": seed, "success": ok, "steps": 1, "seconds": 0.0,
                            "cause": "success" if ok else "wrong_action"})
                played.append((task, seed))
                on_episode(eps[-1])
        return miniwob_env.online_summary(eps, tasks)

    class Clicker:  # clicks unless the seed is 1 mod 3
        model = torch.nn.Linear(1, 1)

        def generate(self, prompts, n=1, greedy=True, seeds=None):
            texts = [tokenizer.decode(p.input_ids.tolist()) for p in prompts]
            seeds = [int(re.search(r"reach \S+ (\d+)", t).group(1)) for t in texts]
            return [[Out(gui.format_response("c", {"action": "click", "coordinate": [5, 5]}) if s % 3 != 1 else "junk")]
                    for s in seeds]

    monkeypatch.setattr(miniwob_env, "evaluate_online", stand_in)
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: Clicker())
    argv = ["--policy", "model", "--online", "--online-tasks", "click-test", "click-button", "--online-seeds", "3",
            "--online-seed-base", "0", "--online-max-steps", "1", "--max-pixels", "20000"]
    full = eval_sop.main(argv + ["--out", str(tmp_path / "full")])
    assert full["online_sr"] == pytest.approx(4 / 6) and full["malformed_responses"] == 2
    played.clear()
    stop[0] = 4
    with pytest.raises(SystemExit) as e:
        eval_sop.main(argv + ["--out", str(tmp_path / "cut")])
    assert e.value.code == 130 and len(read(tmp_path / "cut" / "online_episodes.jsonl")) == 4
    played.clear()
    stop[0] = None
    resumed = eval_sop.main(argv + ["--out", str(tmp_path / "cut"), "--resume"])
    assert played == [("click-button", 1), ("click-button", 2)]
    for k in ("online_sr", "online_sr_ci95", "n_online_episodes", "online_failures", "per_task", "malformed_responses"):
        assert resumed[k] == full[k], k
    assert (tmp_path / "cut" / "online_episodes.jsonl").read_bytes() == \
        (tmp_path / "full" / "online_episodes.jsonl").read_bytes()


def test_a_job_runners_files_are_no_run_and_a_partial_result_is_no_finished_job(monkeypatch, tokenizer, tmp_path):
    """runs/repro_common.py's pool writes cmd.txt and log.txt into an evaluation's --out before it starts:
    that folder is taken. A stopped evaluation's result.json ("complete": false) is not a finished job: the
    pool runs it again with --resume (its run.json exists) instead of skipping it and reading partial figures."""
    sys.path.insert(0, str(REPO / "runs"))
    import repro_common

    out = tmp_path / "eval_x"
    out.mkdir()
    (out / "cmd.txt").write_text("eval_sop.py ...\n")
    (out / "log.txt").write_text("")
    with pytest.raises(SystemExit):
        run(monkeypatch, Scripted(tokenizer, stop_at=2), ["--out", str(out)])
    j = repro_common.job(tmp_path, "x", ["eval_sop.py"], "result.json")
    j = {**j, "done": repro_common.EvalResult(out / "result.json"), "resume": out / "run.json"}
    assert (out / "result.json").is_file() and not j["done"].exists() and j["resume"].exists()
    run(monkeypatch, Scripted(tokenizer), ["--out", str(out), "--resume"])
    assert j["done"].exists() and (out / "cmd.txt").is_file()
    assert isinstance(repro_common.job(tmp_path, "y", ["eval_sop.py"], "result.json")["done"], repro_common.EvalResult)

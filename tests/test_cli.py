"""Command-line plumbing: strict JSON (no NaN in any file we write), the trainers' --report-to trackers, the
plot command, --help with defaults and examples, and prompt options read back from a checkpoint's
args.json by eval_sop.py and train_semionline.py."""

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

import chat
import dataset
import eval_sop
import gui
from evaluation import views
import report
import utils
from configs.common import metrics_logger
from extras import trackers as tracking
from extras.resume import trim_metrics

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import plot_metrics  # noqa: E402

MINIWOB = REPO / "data" / "miniwob"


def strict_loads(text):
    """json.loads that refuses NaN / Infinity, as RFC 8259 parsers do."""
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


# -----------------------------------------------------------------------------
# strict JSON


def test_dumps_replaces_nonfinite_with_null_and_reason():
    import numpy as np
    import torch

    row = {"step": 3, "loss": float("nan"), "kl": np.float32("inf"), "ent": torch.tensor(-math.inf),
           "ok": 1.5, "per_task": {"a": [0.5, float("nan")]}, "flag": True}
    text = utils.dumps(row)
    back = strict_loads(text)
    assert back["loss"] is None and back["kl"] is None and back["ent"] is None
    assert back["ok"] == 1.5 and back["step"] == 3 and back["flag"] is True and back["per_task"]["a"] == [0.5, None]
    assert back["nonfinite"] == {"loss": "nan", "kl": "inf", "ent": "-inf", "per_task.a[1]": "nan"}
    assert "nonfinite" not in strict_loads(utils.dumps({"loss": 1.0}))  # nothing to report: no field
    with pytest.raises(ValueError):  # the check itself can fail: the standard library writes NaN
        strict_loads(json.dumps({"loss": float("nan")}))


def test_metrics_logger_writes_strict_lines(tmp_path):
    m = utils.MetricsLogger(tmp_path / "metrics.jsonl")
    m.log({"step": 1, "loss": float("nan"), "reward_mean": 0.25})
    m.log({"step": 2, "loss": 0.5, "reward_mean": 0.5})
    rows = [strict_loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] is None and rows[0]["nonfinite"] == {"loss": "nan"}
    assert rows[1]["loss"] == 0.5 and "nonfinite" not in rows[1] and "t" in rows[1]


def test_metrics_resume_drops_the_steps_it_redoes(tmp_path):
    """Killed after logging step 4 (and half of step 5) with its last checkpoint at step 2: the resumed
    run keeps steps 0-2 and logs 3, 4, ... once each; a resume from no checkpoint starts the file over."""
    path = tmp_path / "metrics.jsonl"
    m = utils.MetricsLogger(path)
    for step in range(5):
        m.log({"step": step, "loss": 1.0 / (step + 1)})
    with open(path, "a") as f:
        f.write('{"step": 5, "lo')
    assert trim_metrics(path, 2) == 3                   # steps 0-2; 3, 4 and the torn line go
    r = utils.MetricsLogger(path, append=True)
    r.log({"step": 3, "loss": 0.0})
    assert [strict_loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
    assert trim_metrics(path, 0) == 0 and path.read_text() == ""


class Tracker:
    """A stand-in for the three trackers' modules (their packages are not installed here): records
    what MetricsLogger hands each one. init gives a run (itself) with W&B's id and trackio's name."""

    def __init__(self, kind, calls):
        self.kind, self.calls = kind, calls

    def SummaryWriter(self, logdir, purge_step=None):  # torch.utils.tensorboard
        self.calls.append((self.kind, "dir", logdir))
        self.calls.append((self.kind, "purge_step", purge_step))
        return self

    def add_scalar(self, k, v, x):
        self.calls.append((self.kind, k, v, x))

    def init(self, **kw):  # wandb.init / trackio.init
        self.calls.append((self.kind, "init", kw))
        self.id = kw.get("id", f"{self.kind}-new-{len(self.calls)}")  # W&B draws a fresh id per new run
        self.name = kw["name"]
        return self

    def log(self, scalars, step):  # wandb's run.log / trackio.log
        self.calls.extend((self.kind, k, v, step) for k, v in scalars.items())

    def flush(self):
        pass

    def close(self):
        self.calls.append((self.kind, "end"))

    finish = close


def fake_trackers(monkeypatch, names=tuple(tracking.TRACKERS)) -> list:
    """Tracker stand-ins as the modules of `names`; returns the list of their calls."""
    calls = []
    for name in names:
        monkeypatch.setitem(sys.modules, tracking.TRACKERS[name], Tracker(name, calls))
    return calls


@pytest.fixture
def trackers(monkeypatch):
    return fake_trackers(monkeypatch)


def test_report_to_every_tracker_gets_the_same_scalars(tmp_path, trackers, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("TRACKIO_PROJECT", "mine")
    m = tracking.TrackedLogger(tmp_path / "run7" / "m.jsonl", report_to=["tensorboard", "wandb", "trackio"],
                               config={"lr": 1e-3, "bad": float("nan")})
    m.log({"step": 7, "loss": 0.25, "kl": float("nan"), "tasks_kept": 3, "note": "x", "flag": True})
    m.close()
    assert ("tensorboard", "dir", str(tmp_path / "run7" / "tensorboard")) in trackers
    inits = {c[0]: c[2] for c in trackers if c[1] == "init"}
    assert inits["wandb"]["project"] == "ui-s1" and inits["trackio"]["project"] == "mine"
    assert inits["wandb"]["name"] == inits["trackio"]["name"] == "run7"
    assert inits["trackio"]["config"]["lr"] == 1e-3 and inits["trackio"]["config"]["bad"] is None  # strict JSON
    for name in tracking.TRACKERS:
        scalars = {c[1]: c[2:] for c in trackers if c[0] == name and len(c) == 4}
        # NaN, text, bools and the x axis are not curves; t is the logger's wall time
        assert scalars.pop("t")[1] == 7 and scalars == {"loss": (0.25, 7), "tasks_kept": (3, 7)}, name
        assert (name, "end") in trackers


def test_rows_without_a_step_are_drawn_at_their_index_in_the_file(tmp_path, trackers):
    """A row without "step" is plotted at its place among the file's rows (0, 1, 2, ...); a row with
    one at its step."""
    m = tracking.TrackedLogger(tmp_path / "m.jsonl", report_to=["tensorboard"])
    for row in ({"loss": 1.0}, {"loss": 2.0}, {"step": 9, "loss": 3.0}, {"loss": 4.0}):
        m.log(row)
    m.close()
    assert [c[3] for c in trackers if c[1] == "loss"] == [0, 1, 9, 3]


def test_trackers_on_resume_show_each_step_once_in_the_same_run(tmp_path, trackers, monkeypatch):
    """Killed after step 4 with its checkpoint at step 2: the resumed logger gives TensorBoard purge_step 3
    (the killed run's steps 3, 4 hidden, redone once; before: shown twice), and W&B and trackio the run
    of trackers.json with resume="allow". A new run (and a resume that found no checkpoint) is a new run:
    purge_step 0 (the folder's old events hidden, as the file starts over), new W&B id, no resume."""
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    path, every = tmp_path / "run3" / "metrics.jsonl", list(tracking.TRACKERS)
    m = tracking.TrackedLogger(path, report_to=every, config={"lr": 1.0})
    for step in range(1, 5):
        m.log({"step": step, "loss": 1.0 / step})
    m.close()
    first = json.loads((tmp_path / "run3" / "trackers.json").read_text())
    assert ("tensorboard", "purge_step", 0) in trackers
    inits = [c[2] for c in trackers if c[1] == "init"]
    assert all("resume" not in kw and "id" not in kw for kw in inits)
    assert first == {"wandb": {"project": "ui-s1", "id": first["wandb"]["id"]},
                     "trackio": {"project": "ui-s1", "name": "run3"}}
    trackers.clear()
    monkeypatch.setenv("WANDB_PROJECT", "elsewhere")   # the run goes on where it began
    r = metrics_logger(path, report_to=every, config={"lr": 1.0}, resume_step=2)
    r.log({"step": 3, "loss": 0.25})
    r.close()
    assert ("tensorboard", "purge_step", 3) in trackers
    inits = {c[0]: c[2] for c in trackers if c[1] == "init"}
    assert inits["wandb"]["id"] == first["wandb"]["id"] and inits["wandb"]["resume"] == "allow"
    assert inits["wandb"]["project"] == "ui-s1"
    assert inits["trackio"]["name"] == "run3" and inits["trackio"]["resume"] == "allow"
    assert [strict_loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]
    assert json.loads((tmp_path / "run3" / "trackers.json").read_text()) == first
    trackers.clear()
    tracking.TrackedLogger(path, report_to=every, resume_step=0).close()   # no checkpoint found: starts over
    inits = {c[0]: c[2] for c in trackers if c[1] == "init"}
    assert ("tensorboard", "purge_step", 0) in trackers and path.read_text() == ""
    assert "id" not in inits["wandb"] and "resume" not in inits["trackio"]


def test_report_to_none_writes_the_metrics_file_alone(tmp_path, trackers):
    m = metrics_logger(tmp_path / "m.jsonl", report_to=("none",))
    assert type(m) is utils.MetricsLogger  # the plain logger: extras/trackers.py stays unused
    m.log({"step": 1, "loss": 0.5})
    m.close()
    assert trackers == [] and not (tmp_path / "tensorboard").exists()
    assert strict_loads((tmp_path / "m.jsonl").read_text())["loss"] == 0.5


def test_report_to_missing_package_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    with pytest.raises(utils.UsageError, match="pip install tensorboard"):
        metrics_logger(tmp_path / "m.jsonl", report_to=["tensorboard"])


@pytest.mark.parametrize("trainer", ["train_sft", "train_semionline"])
def test_report_to_flag_of_both_trainers(trainer, trackers, monkeypatch, capsys):
    parser = __import__(trainer).parser
    assert parser.parse_args([]).report_to == ("none",)  # transformers' default: no tracker
    assert parser.parse_args(["--report-to", "tensorboard", "wandb"]).report_to == ("tensorboard", "wandb")
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    for argv, message in ((["--report-to", "wandb"], "argument --report-to: wandb needs the wandb package: "
                           "pip install wandb"),
                          (["--report-to", "none", "trackio"], "'none' cannot be combined with trackio"),
                          (["--report-to", "mlflow"], "'mlflow': expected none or one or more of tensorboard")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_missing_tracker_stops_a_trainer_before_any_work(tmp_path):
    """wandb is not installed here: the trainer exits 2 with one line and has written nothing."""
    pytest.importorskip("torch")
    if __import__("importlib").util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    p = subprocess.run([sys.executable, "train_semionline.py", "--report-to", "wandb", "--out", str(tmp_path / "o")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "train_semionline.py: error: argument --report-to: wandb needs the wandb package: pip install wandb (see --help)"]
    assert not (tmp_path / "o").exists()


def test_sft_run_reports_to_tensorboard(tmp_path, monkeypatch):
    """A 1-step tiny SFT run with --report-to tensorboard: the loss of step 1 reaches the writer, in
    OUT/tensorboard, and the writer is closed at the end."""
    trackers = fake_trackers(monkeypatch, ["tensorboard"])  # a fake wandb module would fool accelerate
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    import train_sft
    last = train_sft.main(["--data", str(MINIWOB / "train.jsonl"), "--model", "tiny", "--max-episodes", "2",
                           "--batch-size", "2", "--micro-batch-size", "2", "--eval-every", "0", "--val-frac", "0",
                           "--copy-warmup-steps", "0", "--max-steps", "1", "--max-pixels", "20000",
                           "--report-to", "tensorboard", "--out", str(tmp_path / "sft")])
    assert trackers[0] == ("tensorboard", "dir", str(tmp_path / "sft" / "tensorboard"))
    assert ("tensorboard", "loss", last["loss"], 1) in trackers and trackers[-1] == ("tensorboard", "end")


# -----------------------------------------------------------------------------
# plot command


def test_rolling_mean_by_hand():
    assert plot_metrics.rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert plot_metrics.rolling_mean([2.0, 4.0, 9.0], 5) == [2.0, 3.0, 5.0]


def test_plot_puts_the_method_first_draws_a_redone_step_once_and_titles_apart(tmp_path):
    f = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "tok_s": 100.0 + s, "patch_rate": 0.1, "loss": 1.0 / s, "kl": 0.01 * s, "reward_mean": s / 10}
            for s in (1, 2, 3, 4, 3, 4, 5)]  # killed after step 4, resumed from the step-2 checkpoint
    rows[4]["reward_mean"] = 9.0
    f.write_text("".join(utils.dumps(r) + "\n" for r in rows))
    series = plot_metrics.read_metrics(str(f))
    assert list(series)[:3] == ["reward_mean", "kl", "loss"] and list(series)[3:] == ["tok_s", "patch_rate"]
    assert series["reward_mean"] == ([1, 2, 3, 4, 5], [0.1, 0.2, 9.0, 0.4, 0.5])  # step 3: the resumed run's
    path, fig = plot_metrics.plot(series, tmp_path / "m.png", "a title " * 12, return_fig=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    r = FigureCanvasAgg(fig).get_renderer()
    fig.draw(r)  # the layout as saved
    top = fig._suptitle.get_window_extent(r)
    for ax in fig.axes:
        if ax.get_title():
            assert not top.overlaps(ax.title.get_window_extent(r)), ax.get_title()
    assert path.exists()


def test_plot_writes_png(tmp_path, capsys):
    f = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 1 / s, "reward_mean": s / 30, "note": "text"} for s in range(1, 31)]
    rows[4]["loss"] = float("nan")
    rows[9]["val_loss"] = 0.7
    f.write_text("".join(utils.dumps(r) + "\n" for r in rows))
    series = plot_metrics.read_metrics(str(f))
    assert set(series) == {"loss", "reward_mean", "val_loss"}  # numbers only; step and t are the axes
    assert series["loss"][1][4] is None and series["val_loss"] == ([10], [0.7])
    written = plot_metrics.main([str(f), "--smooth", "3"])
    png = tmp_path / "metrics.png"
    assert written == [str(png)] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with pytest.raises(utils.UsageError, match="no numeric metric kl"):
        plot_metrics.main([str(f), "--keys", "loss", "kl"])


# -----------------------------------------------------------------------------
# --help: defaults and the docstring's examples


@pytest.mark.parametrize("argv, example", [
    (["train_sft.py"], "torchrun --nproc_per_node=2 train_sft.py"),
    (["eval_sop.py"], "python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl --policy expert"),
    (["eval_sop.py", "score"], "--responses responses.jsonl --out scores.jsonl"),
    (["tools/plot_metrics.py"], "python tools/plot_metrics.py out/sft/metrics.jsonl"),
    (["report.py"], "python report.py out/eval/sft out/eval/semionline"),
    (["train_sft.py"], "--report-to TRACKER"),
])
def test_help_shows_defaults_and_examples(argv, example):
    p = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert example in p.stdout and "(default: " in p.stdout
    assert "(default: all) (default:" not in p.stdout  # a help text that names its default is not repeated


# -----------------------------------------------------------------------------
# prompt options stored with the checkpoint


class _Out:
    def __init__(self, text):
        self.text, self.ids, self.logprobs, self.finish_reason = text, [0], None, "stop"


class ExpertSampler:
    """Answers every prompt with the expert's action and keeps the decoded prompts."""

    def __init__(self, tokenizer, episodes):
        import torch

        self.model = torch.nn.Linear(1, 1)
        self.tok, self.by_goal, self.prompts = tokenizer, {e.goal: e for e in episodes}, []

    def generate(self, prompts, n=1, greedy=False, seeds=None):
        outs = []
        for p in prompts:
            text = self.tok.decode(p.input_ids.tolist())
            self.prompts.append(text)
            ep = next(e for g, e in self.by_goal.items() if f"Task goal: {g}" in text)
            t = text.count("<|im_start|>assistant") - 1
            outs.append([_Out(gui.expert_response(ep.steps[t], ep.steps[t].image_size, p.resized_size))])
        return outs


@pytest.fixture()
def checkpoint(tmp_path):
    """A checkpoint folder as save_checkpoint leaves it, as far as eval reads it before the weights."""
    ckpt = tmp_path / "ckpt" / "step_000010"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "args.json").write_text(json.dumps({"num_images": 1, "min_pixels": 3136, "max_pixels": 20000,
                                                "max_prompt_tokens": None, "step_instruction": False, "lr": 0.1}))
    (tmp_path / "ckpt" / "latest").write_text("step_000010")
    return tmp_path / "ckpt"


def run_eval(monkeypatch, data, argv):
    from vlm import load_processor

    sampler = ExpertSampler(load_processor()[0], dataset.load_episodes(str(data)))

    def load_sampler(args, tok):  # decode with the tokenizer eval chose for the model (vlm.tokenizer_dir)
        sampler.tok = tok
        return sampler
    monkeypatch.setattr(eval_sop, "load_sampler", load_sampler)
    s = eval_sop.main(["--data", str(data), "--image-root", str(MINIWOB), "--limit", "2", "--policy", "model",
                       "--protocol", "static", "--out", str(data.parent / "eval"), *argv])
    return s, sampler, json.loads((data.parent / "eval" / "result.json").read_text())["args"]


@pytest.fixture()
def data(tmp_path):
    lines = [ln for ln in (MINIWOB / "test.jsonl").read_text().splitlines() if "enter-text-100000" in ln]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "eps.jsonl").write_text(lines[0] + "\n")
    return tmp_path / "d" / "eps.jsonl"


def test_eval_reads_prompt_options_from_checkpoint(monkeypatch, capsys, checkpoint, data):
    s, sampler, args = run_eval(monkeypatch, data, ["--model", str(checkpoint)])
    out = capsys.readouterr().out
    assert f"prompt contract from {checkpoint}/step_000010/args.json" in out and "num_images=1" in out
    assert args["num_images"] == 1 and args["max_pixels"] == 20000 and args["max_prompt_tokens"] is None
    assert args["elements"] is True  # training always shows the element list; so does eval by default
    assert s["static_step_sr"] == 1.0  # the expert's answers in pixels of the 20000-pixel image: all match
    later = [p for p in sampler.prompts if p.count("<|im_start|>assistant") > 1]
    assert later and all(p.count("<|vision_start|>") == 1 for p in later)  # --num-images 1 from the checkpoint
    assert all("UI elements on screen:" in p for p in sampler.prompts)


def test_eval_explicit_flag_wins_with_a_warning(monkeypatch, capsys, checkpoint, data):
    s, sampler, args = run_eval(monkeypatch, data, ["--model", str(checkpoint), "--num-images", "2", "--no-elements"])
    out = capsys.readouterr().out
    assert "warning: --num-images 2 differs from the checkpoint's 1" in out
    assert args["num_images"] == 2 and args["max_pixels"] == 20000 and args["elements"] is False
    later = [p for p in sampler.prompts if p.count("<|im_start|>assistant") > 1]
    assert later and all(p.count("<|vision_start|>") == 2 for p in later)
    assert not any("UI elements on screen:" in p for p in sampler.prompts)


def test_train_semionline_adopts_sft_prompt_options(checkpoint):
    import train_semionline as ts

    argv = ["--model", str(checkpoint), "--max-pixels", "50176"]
    args = ts.parser.parse_args(argv)
    assert args.model == str(checkpoint / "step_000010")  # the `latest` pointer is followed
    said = []
    spec = chat.resolve_spec(args, args.model, say=said.append)
    assert said == ["warning: --max-pixels 50176 differs from the checkpoint's 20000 (" + args.model + "/args.json)",
                    "prompt contract from " + args.model + "/args.json: num_images=1, min_pixels=3136, "
                    "max_prompt_tokens=None, step_instruction=False"]
    assert spec.max_pixels == 50176 and spec.num_images == 1 and args.prompt["num_images"] == 1


# -----------------------------------------------------------------------------
# report labels: what happened, and frames coloured by it


def test_outcome_labels_by_hand():
    assert views.sop_outcome(3, 3, False) == "success: all 3 steps right"
    assert views.sop_outcome(1, 4, False) == "wrong action at step 1: 1/4 steps right before it"
    assert views.sop_outcome(0, 4, True) == "no valid action at step 0: 0/4 steps right before it"
    ok = {"steps": 2, "cause": "success", "success": True}
    term = {"steps": 2, "cause": "wrong_action", "terminated": True, "raw_reward": 0.0}
    page = {"steps": 3, "cause": "wrong_action", "terminated": False, "raw_reward": -1.0}
    limit = {"steps": 12, "cause": "step_limit"}
    err = {"steps": 1, "cause": "policy_error", "error": "KeyError: 'x'"}
    assert views.online_outcome(ok) == ("success in 2 steps", None)
    assert views.online_outcome(term) == ("terminated early: terminate at step 1 before the task was done", 1)
    assert views.online_outcome(page) == ("wrong action at step 2: the page ended the episode (raw reward -1.00)", 2)
    assert views.online_outcome(limit) == ("step limit: not done after 12 steps", None)
    assert views.online_outcome(err) == ("policy error at step 1: KeyError: 'x'", None)


def test_online_report_frames_follow_the_outcome(monkeypatch, tmp_path):
    """A terminated-early episode's frames are not green: the last one is red (the step that ended
    it), the others grey; a success's are green; a malformed response is red."""
    from PIL import Image

    from envs import miniwob_env

    click = gui.format_response("t", {"action": "click", "coordinate": [10, 10]})
    stop = gui.format_response("t", {"action": "terminate", "status": "success"})
    answers = {("click-test", 1): [click, stop], ("click-test", 2): [click, stop], ("click-test", 3): ["junk", click]}
    ends = {1: {"cause": "success", "success": True}, 2: {"cause": "wrong_action", "success": False, "terminated": True},
            3: {"cause": "step_limit", "success": False}}

    def fake_evaluate(policy, tasks, seeds, max_steps, batch_size):
        assert policy.batched and batch_size == 3
        eps = []
        for task in tasks:  # all seeds of a task in flight together, as evaluate_online plays them
            for t in range(2):
                policy([{"task": task, "seed": seed, "goal": f"goal {seed}", "elements": "",
                         "screenshot": Image.new("RGB", (168, 224), "white")} for seed in seeds], [t] * len(seeds))
            eps += [{"task": task, "seed": seed, "steps": 2, **ends[seed]} for seed in seeds]
        return {"episodes": eps, "per_task": {}, "overall": {}}

    monkeypatch.setattr(miniwob_env, "evaluate_online", fake_evaluate)
    prompt = types.SimpleNamespace(resized_size=(168, 224))

    class Model:  # a sampler: answers[(task, seed)][t], t = the history's length
        def generate(self, prompts, n=1, greedy=False):
            return [[types.SimpleNamespace(text=answers[(p.task, p.seed)][p.t], ids=[0], finish_reason="stop")]
                    for p in prompts]
    model = Model()

    def make_prompt(obs, shots, history):
        return types.SimpleNamespace(resized_size=prompt.resized_size, task=obs["task"], seed=obs["seed"], t=len(history))

    args = types.SimpleNamespace(report_episodes=8, online_max_steps=2, online_batch=3)
    res, shown = eval_sop.run_online(model, make_prompt, ["click-test"], [1, 2, 3], args)
    by_seed = {int(s["title"].split()[-1]): s for s in shown}
    assert by_seed[1]["outcome"] == "success in 2 steps" and by_seed[1]["first_wrong"] is None
    assert [v["cls"] for v in by_seed[1]["steps"]] == ["", ""]
    assert by_seed[2]["outcome"].startswith("terminated early: terminate at step 1") and by_seed[2]["first_wrong"] == 1
    assert [v["cls"] for v in by_seed[2]["steps"]] == ["neutral", "wrong"]
    assert by_seed[2]["steps"][1]["verdict"] == "terminate before the task was done"
    assert by_seed[3]["outcome"] == "step limit: not done after 2 steps"
    assert [v["cls"] for v in by_seed[3]["steps"]] == ["wrong", "neutral"]  # junk, then a click of a failed episode
    assert res["malformed"] == 1
    page = tmp_path / "r.html"
    report.write_report(str(page), "t", {}, [("Online", "", shown)])
    html = page.read_text()
    assert html.count("class='step neutral'") == 2 and html.count("class='step wrong first'") == 1
    assert "terminated early" in html and "Step 1: terminate before the task was done" in html

"""Command-line plumbing: strict JSON (no NaN in any file we write), the TensorBoard option, the
plot command, --help with defaults and examples, and prompt options read back from a checkpoint's
args.json by eval_sop.py and train_semionline.py."""

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

import eval_sop
import gui
import plot_metrics
import utils

REPO = Path(__file__).resolve().parent.parent
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


def test_tensorboard_scalars(tmp_path, monkeypatch):
    calls = []

    class Writer:
        def __init__(self, logdir):
            calls.append(("dir", logdir))

        def add_scalar(self, k, v, x):
            calls.append((k, v, x))

        def flush(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    m = utils.MetricsLogger(tmp_path / "m.jsonl", tensorboard=str(tmp_path / "tb"))
    m.log({"step": 7, "loss": 0.25, "kl": float("nan"), "tasks_kept": 3, "note": "x", "flag": True})
    scalars = {c[0]: c[1:] for c in calls[1:]}
    assert calls[0] == ("dir", str(tmp_path / "tb"))
    assert scalars["loss"] == (0.25, 7) and scalars["tasks_kept"] == (3, 7)
    assert not {"kl", "note", "flag", "step", "nonfinite"} & set(scalars)  # NaN, text, bools, the x axis: not curves


def test_tensorboard_missing_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    with pytest.raises(utils.UsageError, match="pip install tensorboard"):
        utils.MetricsLogger(tmp_path / "m.jsonl", tensorboard=str(tmp_path / "tb"))


# -----------------------------------------------------------------------------
# plot command


def test_rolling_mean_by_hand():
    assert plot_metrics.rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert plot_metrics.rolling_mean([2.0, 4.0, 9.0], 5) == [2.0, 3.0, 5.0]


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
    (["plot_metrics.py"], "python plot_metrics.py out/sft/metrics.jsonl"),
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
        self.text, self.ids, self.finish_reason = text, [0], "stop"


class ExpertSampler:
    """Answers every prompt with the expert's action and keeps the decoded prompts."""

    def __init__(self, tokenizer, episodes):
        import torch

        self.model = torch.nn.Linear(1, 1)
        self.tok, self.by_goal, self.prompts = tokenizer, {e.goal: e for e in episodes}, []

    def generate(self, prompts, n=1, greedy=False):
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
    from utils import load_processor

    sampler = ExpertSampler(load_processor()[0], gui.load_episodes(str(data)))
    monkeypatch.setattr(eval_sop, "load_sampler", lambda args, tok: sampler)
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
    assert f"prompt options from {checkpoint}/step_000010/args.json" in out and "--num-images 1" in out
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
    taken = utils.adopt_checkpoint_args(args, ts.parser, argv, args.model, ts.PROMPT_ARGS)
    assert taken == {"num_images": 1, "min_pixels": 3136, "max_prompt_tokens": None}
    assert args.max_pixels == 50176 and args.num_images == 1

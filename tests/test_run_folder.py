"""A failed run never touches the last good one's records, and never spins: a tiny SFT run finishes into
a folder, then runs that fail (a flag out of range, data that is not episodes, a train split shorter than
one micro-batch, an RL resume of a run that is not there) are pointed at the same folder: each is one line
and exit 2, and every file in the folder is byte for byte what the finished run left. RL without an SFT
checkpoint is a one-line error unless the untrained model is asked for by name; both trainers print the
README's evaluation command."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import utils  # noqa: E402

PY = sys.executable
ENV = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
SFT = ["train_sft.py", "--data", "data/miniwob_click/train.jsonl", "--model", "tiny:32x1", "--max-episodes", "6",
       "--batch-size", "2", "--micro-batch-size", "2", "--max-steps", "2", "--eval-every", "0", "--val-frac", "0.2",
       "--copy-warmup-steps", "0", "--max-pixels", "20000"]


def run(argv, timeout=600):
    return subprocess.run([PY, *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "sft"
    p = run([*SFT, "--out", str(out)])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return out, p.stdout


FAILING = [
    (["--max-steps", "-5"], "argument --max-steps: -5: must be >= 0"),
    (["--lr", "-1e-3"], "argument --lr"),
    (["--micro-batch-size", "0"], "argument --micro-batch-size: 0: must be >= 1"),
    (["--data", "README.md"], "README.md: line 1"),
    # fewer training examples than one micro-batch (a big --val-frac): refused, never an endless loop
    (["--val-frac", "0.9", "--batch-size", "8", "--micro-batch-size", "8"], "the train split has"),
    (["--max-episodes", "1", "--val-frac", "0", "--batch-size", "64", "--micro-batch-size", "64"], "fewer than --micro-batch-size 64"),
]


@pytest.mark.parametrize("flags, says", FAILING, ids=[" ".join(f[0]) for f in FAILING])
def test_failing_run_leaves_the_finished_folder_as_it_was(finished, flags, says):
    out, _ = finished
    before = snapshot(out)
    assert {"args.json", "metrics.jsonl"} <= set(before) and before["metrics.jsonl"]
    p = run([*SFT, "--out", str(out), *flags], timeout=120)   # a run that spun would time out here
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("train_sft.py: error: "), p.stderr[-2000:]
    assert says in lines[0], lines[0]
    assert snapshot(out) == before


def test_trainers_print_the_readmes_eval_command(finished):
    _, stdout = finished
    readme = (REPO / "README.md").read_text()
    rl = utils.eval_command("data/miniwob_click/test.jsonl", "out/semionline/ckpt", "out/eval/semionline")
    assert rl in readme  # the quick start's command, as the RL trainer prints it for its defaults
    line = next(x for x in stdout.splitlines() if x.startswith("evaluate:"))
    assert utils.EVAL_FLAGS in line and "--data data/miniwob_click/test.jsonl" in line
    src = (REPO / "train_semionline.py").read_text()
    assert 'utils.print_next_steps(out, cfg.data, "out/eval/semionline")' in src


def test_rl_without_sft_checkpoint_is_one_line(tmp_path):
    out = tmp_path / "rl"
    p = run(["train_semionline.py", "--sft-dir", str(tmp_path / "no_sft"), "--out", str(out)], timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert "--model auto: no SFT checkpoint in" in lines[0] and "--model tiny" in lines[0]
    assert not out.exists()


def test_rl_failing_flags_write_nothing(finished):
    out, _ = finished
    before = snapshot(out)
    for flags in (["--gamma", "-0.5"], ["--kl-coef", "-1"], ["--keep-checkpoints", "-1"], ["--save-every", "-2"],
                  ["--temperature", "1e-9"], ["--resume", "--tasks-per-step", "3", "--nproc-wrong"]):
        p = run(["train_semionline.py", "--model", "tiny", "--out", str(out), *flags], timeout=120)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode == 2 and len(lines) == 1, (flags, p.stderr[-2000:])
    assert snapshot(out) == before

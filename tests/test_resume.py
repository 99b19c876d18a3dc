"""train_semionline.py --resume's own checks (extras/resume.py), on hand-made checkpoint folders:

- resume_rl: no checkpoint in --out is a fresh start (step 0, nothing loaded); a checkpoint continues
  at its step; one written with another task schedule (seed, tasks per step, number of episodes) is
  refused with a message naming trainer_state.json's field 'schedule' and both values, before the
  first step (the resumed steps would otherwise draw other tasks);
- check_flags: without a checkpoint nothing is checked; a LoRA checkpoint's flags must be the run's
  (lora.check_resume's one-line error).
The resumed numbers themselves: tests/test_train.py::test_semionline_resume_matches_uninterrupted.
"""
import json
from types import SimpleNamespace

import pytest

import utils
from extras import resume

SCHEDULE = {"seed": 0, "tasks_per_step": 4, "n_episodes": 12}


def checkpoint(out, step: int, files=("config.json",)):
    """A checkpoint folder as vlm.save_checkpoint names it (out/ckpt/step_N, out/ckpt/latest)."""
    folder = out / "ckpt" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    for f in files:
        (folder / f).write_text("{}")
    (out / "ckpt" / "latest").write_text(folder.name)
    return folder


def stub_run(out):
    return SimpleNamespace(out=out, policy="policy", optimizer="optimizer", schedule=dict(SCHEDULE))


def test_resume_rl_continues_the_same_schedule(tmp_path, monkeypatch):
    loaded = []

    def load(ckpt, model, optimizer=None):
        loaded.append((ckpt.name, model, optimizer))
        return {"step": 3, "schedule": dict(SCHEDULE)}

    monkeypatch.setattr(resume, "load_checkpoint_state", load)
    assert resume.resume_rl(stub_run(tmp_path)) == 0 and loaded == []  # nothing to resume: step 0
    checkpoint(tmp_path, 3)
    assert resume.resume_rl(stub_run(tmp_path)) == 3
    assert loaded == [("step_000003", "policy", "optimizer")]


@pytest.mark.parametrize("field,value", [("seed", 1), ("tasks_per_step", 8), ("n_episodes", 11)])
def test_resume_rl_refuses_another_schedule(tmp_path, monkeypatch, field, value):
    saved = {**SCHEDULE, field: value}
    monkeypatch.setattr(resume, "load_checkpoint_state",
                        lambda ckpt, model, optimizer=None: {"step": 2, "schedule": saved})
    checkpoint(tmp_path, 2)
    with pytest.raises(utils.UsageError) as e:
        resume.resume_rl(stub_run(tmp_path))
    msg = str(e.value)
    assert "trainer_state.json: field 'schedule'" in msg and str(saved) in msg and str(SCHEDULE) in msg


def test_check_flags_compares_a_lora_checkpoints_flags(tmp_path):
    cfg = SimpleNamespace(out=str(tmp_path), lora_r=4, lora_alpha=None, lora_targets=None,
                          lora_dropout=0.0, lora_vision=False)
    resume.check_flags(cfg)  # no checkpoint: nothing to compare
    ckpt = checkpoint(tmp_path, 1, files=(utils.ADAPTER_FILE,))
    (ckpt / "args.json").write_text(json.dumps({**vars(cfg), "lora_r": 8}))
    with pytest.raises(ValueError, match="--lora-r 4 differs from the checkpoint's 8"):
        resume.check_flags(cfg)
    (ckpt / "args.json").write_text(json.dumps(vars(cfg)))
    resume.check_flags(cfg)  # the same flags: resumable

"""The RL run's held-out evaluation (extras/heldout.py, train_semionline.py --eval-data): when it runs
(step 0, every --eval-every steps, the last step) and how its counts become the heldout_* metrics,
with the three walks stubbed by hand-chosen counts. Its numbers in a real run: the "varied" seeded run
of tests/test_train.py::test_semionline_metrics_as_before."""
from types import SimpleNamespace

import torch

import utils
from extras import heldout

COUNTS = {"greedy_match": 3.0, "greedy_steps": 4.0, "sampled_match": 5.0, "sampled_steps": 8.0,
          "sop_pg_sum": 1.5, "sop_solved": 1.0, "episodes": 2.0}


def stub_run(eval_every: int, max_steps: int = 5):
    cfg = SimpleNamespace(eval_every=eval_every, max_steps=max_steps, eval_samples=3, seed=7,
                          image_root=None, blank_screens=None)
    return SimpleNamespace(cfg=cfg, proc=utils.Dist(0, 1, 0, torch.device("cpu")),
                           policy=torch.nn.Linear(1, 1), sampler="sampler", heldout=["e0", "e1"],
                           tokenizer=None, image_processor=None, spec=None)


def test_heldout_runs_when_due_and_turns_counts_into_rates(monkeypatch):
    calls = []

    def walks(sampler, episodes, tokenizer, image_processor, spec, *, samples, seed, **kw):
        calls.append((episodes, samples, seed))
        return dict(COUNTS)

    monkeypatch.setattr(heldout, "greedy_vs_sampled", walks)
    run = stub_run(eval_every=2)
    due = [step for step in range(6) if heldout.evaluate_heldout(run, step)]
    assert due == [0, 2, 4, 5]  # the start, every 2 steps, the last step (5)
    assert calls[-1] == (["e0", "e1"], 3, 7 + 5)  # this rank's share (all of it), seed + step
    got = heldout.evaluate_heldout(run, 0)
    assert got == {"heldout_greedy_step_acc": 3 / 4, "heldout_sampled_step_acc": 5 / 8,
                   "heldout_sop_pg": 1.5 / 2, "heldout_sop_tsr": 1 / 2, "heldout_episodes": 2}
    calls.clear()
    never = stub_run(eval_every=0)
    assert [step for step in range(6) if heldout.evaluate_heldout(never, step)] == [0, 5]
    assert len(calls) == 2


def test_no_heldout_episodes_give_zero_rates_not_a_division_error(monkeypatch):
    run = stub_run(eval_every=1)
    run.heldout = []
    got = heldout.evaluate_heldout(run, 1)  # the real walks: nothing to walk
    assert got == {"heldout_greedy_step_acc": 0.0, "heldout_sampled_step_acc": 0.0,
                   "heldout_sop_pg": 0.0, "heldout_sop_tsr": 0.0, "heldout_episodes": 0}

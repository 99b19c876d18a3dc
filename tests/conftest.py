"""Test-wide settings. TRITON_INTERPRET must be set before triton is first imported, so the
Triton kernels can run on CPU in the interpreter (tests force them with UIS1_FORCE_TRITON=1).

Under pytest-xdist (`-n 2 --dist loadfile`, the README's test command: one worker per core, a file's
tests on one worker, so a module fixture is built once) each worker computes on one thread, and so do
the processes it starts that do not set their own: two workers at torch's default of one thread per
core would ask for twice the cores there are."""
import os
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
DEFAULT_THREADS = None  # torch's own thread count, where a worker lowered it
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch
    DEFAULT_THREADS = torch.get_num_threads()  # read before OMP_NUM_THREADS=1 reaches it
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # rl_checkpoint, openai_server


@pytest.fixture(scope="session")
def rl_checkpoint_dir(tmp_path_factory):
    """The step folder of tests/rl_checkpoint.py's fitted tiny model (its rollouts' rewards vary), built
    once for every test that reads it: test_train's seeded RL runs, test_policies' served comparisons."""
    import torch
    from rl_checkpoint import make_checkpoint
    # fitted at torch's default thread count, as in a serial run: the fit's float sums depend on it, and
    # test_train compares seeded runs from this model with stored metrics to 1e-6
    lowered = torch.get_num_threads()
    torch.set_num_threads(DEFAULT_THREADS or lowered)
    try:
        return make_checkpoint(tmp_path_factory.mktemp("rl_ckpt"))[0]
    finally:
        torch.set_num_threads(lowered)

"""Test-wide settings. TRITON_INTERPRET must be set before triton is first imported, so the
Triton kernels can run on CPU in the interpreter (tests force them with UIS1_FORCE_TRITON=1)."""
import os
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # rl_checkpoint, openai_server


@pytest.fixture(scope="session")
def rl_checkpoint_dir(tmp_path_factory):
    """The step folder of tests/rl_checkpoint.py's fitted tiny model (its rollouts' rewards vary), built
    once for every test that reads it: test_train's seeded RL runs, test_policies' served comparisons."""
    from rl_checkpoint import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("rl_ckpt"))[0]

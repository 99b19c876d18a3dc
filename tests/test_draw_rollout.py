"""The rollout picture's caption explains its one right step with a negative advantage, with the numbers
docs/method.md's worked example gives (A^S +0.287, A^E -0.677 for y_3,1), computed by advantage.py."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import advantage  # noqa: E402
from tools import draw_rollout  # noqa: E402


def test_caption_explains_the_negative_right_step():
    adv = advantage.compute_advantages(draw_rollout.example_records(), gamma=draw_rollout.GAMMA)
    line = draw_rollout.why_negative(adv)
    assert "y_3,1" in line and "A^S = +0.287" in line and "A^E = -0.677" in line, line


def test_caption_is_empty_when_no_right_step_is_negative():
    adv = advantage.compute_advantages(draw_rollout.example_records(), gamma=draw_rollout.GAMMA)
    adv.adv[:] = adv.adv.abs()  # every step positive: nothing to explain
    assert draw_rollout.why_negative(adv) == ""

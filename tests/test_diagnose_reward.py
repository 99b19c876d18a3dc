"""runs/diagnose_reward.py in a real headless Chromium: the reward's verdict on a click against the
click's effect in MiniWob++, on a hand-checked episode (click-button-100000 shows two 'No' buttons;
the page's script ends the episode with success on either, the expert's box holds the first)."""
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runs"))
import dataset  # noqa: E402
import diagnose_reward  # noqa: E402


def _episode():
    ep = next(e for e in dataset.load_episodes(str(REPO / "data/miniwob/test.jsonl"))
              if e.episode_id == "click-button-100000")
    assert ep.steps[0].action == {"action": "click", "coordinate": [18, 73]}
    return ep


def test_second_matching_button_is_a_false_negative_and_a_div_a_true_negative():
    rows = diagnose_reward.judge_clicks([_episode()])
    by_point = {tuple(r["point"]): r for r in rows}
    expert, twin, div = by_point[(18, 73)], by_point[(18, 169)], by_point[(80, 57)]
    assert expert["reward_match"] and expert["env_same"]                 # true positive
    assert twin["label"] == "button 'No'" and not twin["reward_match"] and twin["env_same"]   # false negative
    assert not div["reward_match"] and not div["env_same"]              # true negative
    table = diagnose_reward.confusion(rows)["click-button"]
    assert table["fn"] == 1 and table["fp"] == 0 and table["steps_with_fn"] == 1
    assert table["tp"] + table["fp"] + table["fn"] + table["tn"] == len(rows)


def test_a_box_that_covers_a_neighbour_gives_a_false_positive():
    """A hand-made too-wide expert box (6.6 % of the screen, so the strict rule uses it) holding the
    'No' button and the edge of the div above it: a click on the div does nothing in the page (the
    episode then fails), yet the reward calls it a match."""
    ep = _episode()
    step = dataclasses.replace(ep.steps[0], candidate_bbox=[[2, 52, 80, 84]])
    ep = dataclasses.replace(ep, steps=[step] + ep.steps[1:])
    rows = diagnose_reward.judge_clicks([ep])
    div = next(r for r in rows if tuple(r["point"]) == (80, 57))
    assert div["reward_match"] and not div["env_same"]
    assert diagnose_reward.confusion(rows)["click-button"]["fp"] >= 1

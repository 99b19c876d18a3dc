"""The published step protocols' match rules (evaluation.protocols.androidcontrol_match, aitw_match), passed
to reward.action_match as the evaluator passes them, at each rule's edges, computed by hand on a 1000 x 2000
(W x H) screen; AITW's every pair of action types against google-research android_in_the_wild
action_matching.py (non-dual-point types compare the type alone; taps never match swipes; swipes by main axis)."""
import pytest

import cli
import reward
from evaluation import protocols

SIZE = (1000, 2000)  # W, H: 0.04 x max(W, H) = 80 px; 0.14 of the screen = 140 px across, 280 px down


def ac(pred, expert, boxes=()):
    return reward.action_match(pred, expert, list(boxes), SIZE, rules=protocols.androidcontrol_match)


def aitw(pred, expert, boxes=()):
    return reward.action_match(pred, expert, list(boxes), SIZE, rules=protocols.aitw_match)


def click(x, y, kind="click"):
    return {"action": kind, "coordinate": [x, y]}


def swipe(x1, y1, x2, y2):
    return {"action": "swipe", "coordinate": [x1, y1], "coordinate2": [x2, y2]}


# --- AndroidControl: 0.04 x the longer side in pixels, or any candidate box x1.2; containment for text

def test_androidcontrol_click_distance_is_pixels_of_the_longer_side():
    e = click(500, 1000)
    assert ac(click(580, 1000), e) == (True, True)    # 80 px = 0.04 x 2000 (strict: 80/1000 = 0.08, no)
    assert ac(click(581, 1000), e) == (False, True)
    assert reward.action_match(click(580, 1000), e, [], SIZE, rules="strict") == (False, True)
    assert ac(click(500, 1080), e) == (True, True)
    assert ac(click(500, 1000, "long_press"), e) == (False, False)  # another type


def test_androidcontrol_click_any_box_enlarged_1_2():
    e, box = click(500, 1000), [100, 100, 200, 200]  # x1.2 about (150, 150): 90..210
    assert ac(click(210, 150), e, [box]) == (True, True)
    assert ac(click(211, 150), e, [box]) == (False, True)
    assert ac(click(150, 90), e, [[0, 0, 10, 10], box]) == (True, True)  # any box, not only the target's


def test_androidcontrol_open_by_text_or_click_on_the_first_box():
    e = {"action": "open", "text": "Google Chrome"}
    assert ac({"action": "open", "text": "chrome "}, e) == (True, True)   # contained, case and spaces folded
    assert ac({"action": "open", "text": "Chrome browser"}, e) == (False, True)
    assert ac({"action": "open", "text": ""}, e) == (True, True)          # "" is in every text (as the source)
    icon = [0, 0, 100, 100]  # x1.2: -10..110; centre (50, 50)
    assert ac(click(110, 50), e, [icon]) == (True, True)
    assert ac(click(200, 50), e, [icon]) == (False, True)   # 150 px from the centre > 80, outside the box
    assert ac(click(50, 130), e, [icon]) == (True, True)    # outside the box, 80 px from its centre
    assert ac(click(50, 50), e, []) == (False, False)       # no box: the source has nothing to click


def test_androidcontrol_swipe_direction_ties_vertical_and_other_types():
    e = swipe(500, 1500, 500, 500)  # finger up
    assert ac(swipe(500, 1500, 400, 1400), e) == (True, True)    # |dx| = |dy|: vertical, up
    assert ac(swipe(500, 1500, 399, 1400), e) == (False, True)   # left
    assert ac({"action": "system_button", "button": " back"}, {"action": "system_button", "button": "Back"}) == (True, True)
    assert ac({"action": "wait"}, {"action": "wait", "time": 2}) == (True, True)
    assert ac({"action": "type", "text": "hello"}, {"action": "type", "text": "hello world"}) == (True, True)


# --- AITW: taps within 0.14 (normalised (y, x)) or both in one box grown by 1.4x its size; swipes by axis

def test_aitw_tap_distance_014():
    e = click(500, 1000)
    assert aitw(click(500, 1280), e) == (True, True)    # dy = 280 / 2000 = 0.14
    assert aitw(click(500, 1281), e) == (False, True)
    assert aitw(click(640, 1000), e) == (True, True)    # dx = 140 / 1000 = 0.14
    assert aitw(click(500, 1000, "long_press"), e) == (True, True)  # AITW has one tap kind


def test_aitw_same_box_grown_by_1_4():
    # box x 400..600, y 900..1100 -> normalised left .4, top .45, w .2, h .1; grown by 1.4x: left .26,
    # top .38, w .48, h .24 -> x .26...74, y .38...62 (the expert (.5, .5) is inside)
    e, box = click(500, 1000), [400, 900, 600, 1100]
    assert aitw(click(739.9, 1239.9), e, [box]) == (True, True)   # 0.27 away, inside the grown box
    assert aitw(click(740.1, 1239.9), e, [box]) == (False, True)
    assert aitw(click(739.9, 1240.1), e, [box]) == (False, True)
    assert aitw(click(739.9, 1239.9), click(10, 10), [box]) == (False, True)  # the expert outside it


def test_aitw_short_swipe_is_a_tap_and_swipes_by_axis():
    e = click(500, 1000)
    assert aitw(swipe(500, 1000, 500, 1080), e) == (True, True)   # 0.04 of the screen: a tap
    assert aitw(swipe(500, 1000, 500, 1081), e) == (False, False)  # a swipe: another kind
    up = swipe(500, 1500, 500, 500)
    assert aitw(swipe(500, 1500, 300, 1100), up) == (True, True)   # dy -.2, dx -.2: tie -> y axis, up
    assert aitw(swipe(500, 1500, 299, 1100), up) == (False, True)  # x axis
    assert aitw(swipe(500, 500, 500, 1500), up) == (True, True)    # down: the source compares the main axis only
    # no text check in AITW's matcher: the type alone
    assert aitw({"action": "type", "text": "a"}, {"action": "type", "text": "hello"}) == (True, True)
    assert aitw({"action": "open", "text": "a"}, {"action": "type", "text": "a"}) == (False, False)


@pytest.mark.parametrize("rules", [protocols.androidcontrol_match, protocols.aitw_match])
def test_protocol_rules_never_raise_on_a_bad_prediction(rules):
    assert reward.action_match({"action": "click"}, click(1, 1), [], SIZE, rules=rules) == (False, True)
    assert reward.action_match(None, click(1, 1), [], SIZE, rules=rules) == (False, False)


# --- the protocols by name (eval_sop --protocol): the expert replay is right under every rule set

ANDROID = "data/android_control/android_control_test_uis1.jsonl"


@pytest.mark.parametrize("name,rules,variant", [("androidcontrol-high", "androidcontrol", "high"),
                                                ("androidcontrol-low", "androidcontrol", "low"),
                                                ("aitw", "aitw", "high")])
def test_named_protocol_is_static_under_its_rules(name, rules, variant, capsys):
    import eval_sop
    res = eval_sop.main(["--data", ANDROID, "--limit", "20", "--blank-screens", "1080x2400", "--protocol", name])
    assert res["named_protocol"] == name and res["match_rules"] == rules and res["protocols"] == ["static"]
    assert res["static_variant"] == variant and res["static_step_sr"] == 1.0 and res["static_type_acc"] == 1.0


@pytest.mark.parametrize("argv", [["--protocol", "aitw", "--match-rules", "strict"],
                                  ["--protocol", "androidcontrol-high", "androidcontrol-low"],
                                  ["--protocol", "androidcontrol-high", "--step-instruction"],
                                  ["--policy", "openai"], ["--base-url", "http://x/v1"],
                                  ["--policy", "openai", "--base-url", "http://x/v1", "--served-model", "m",
                                   "--concurrency", "0"]])
def test_named_protocol_and_served_flag_conflicts_are_usage_errors(argv, capsys):
    import eval_sop
    with pytest.raises(SystemExit) as e:
        cli.run_script(eval_sop.main, ["--data", ANDROID, "--blank-screens", "1080x2400", *argv])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


# --- AITW against its source, every pair of action types (android_in_the_wild/action_matching.py)

AITW_ACTIONS = {  # name -> our action on the 1000 x 2000 screen; all points at or near (500, 1000)
    "click": click(500, 1000), "long_press": click(500, 1000, "long_press"),
    "short swipe": swipe(500, 1000, 500, 1079),   # 0.0395 of the screen: a tap there
    "swipe up": swipe(500, 1500, 500, 500), "swipe down": swipe(500, 500, 500, 1500),
    "swipe left": swipe(800, 1000, 200, 1000),
    "type": {"action": "type", "text": "hello"}, "Back": {"action": "system_button", "button": "Back"},
    "Home": {"action": "system_button", "button": "Home"}, "Enter": {"action": "system_button", "button": "Enter"},
    "Menu": {"action": "system_button", "button": "Menu"},
    "done": {"action": "terminate", "status": "success"}, "infeasible": {"action": "terminate", "status": "failure"},
    "wait": {"action": "wait"}, "open": {"action": "open", "text": "Maps"},
}
# AITW's types, by hand: DUAL_POINT taps (one group: the same point), DUAL_POINT drags by main axis, and
# the non-dual-point types (TYPE, PRESS_BACK, PRESS_HOME, PRESS_ENTER, STATUS_TASK_COMPLETE,
# STATUS_TASK_IMPOSSIBLE; Menu, wait and open have none there: each only itself)
AITW_GROUPS = [{"click", "long_press", "short swipe"}, {"swipe up", "swipe down"}, {"swipe left"}, {"type"}, {"Back"},
               {"Home"}, {"Enter"}, {"Menu"}, {"done"}, {"infeasible"}, {"wait"}, {"open"}]
DRAGS = {"swipe up", "swipe down", "swipe left"}


@pytest.mark.parametrize("a", list(AITW_ACTIONS))
@pytest.mark.parametrize("b", list(AITW_ACTIONS))
def test_aitw_every_action_type_pair_as_the_source(a, b):
    same = any(a in g and b in g for g in AITW_GROUPS)
    both_drags = a in DRAGS and b in DRAGS  # AITW's type is the same (DUAL_POINT, not a tap); the axis differs
    assert aitw(AITW_ACTIONS[a], AITW_ACTIONS[b]) == (same, same or both_drags)


def test_aitw_swipe_main_axis_only_with_ties_on_y():
    up = swipe(500, 1500, 500, 500)
    assert aitw(swipe(500, 500, 500, 1500), up) == (True, True)        # opposite along y: the source has no sign
    assert aitw(swipe(200, 1000, 800, 1000), swipe(800, 1000, 200, 1000)) == (True, True)  # right vs left
    assert aitw(swipe(500, 1000, 700, 1400), up) == (True, True)      # dx .2, dy .2: a tie is y (argmax's first)
    assert aitw(swipe(500, 1000, 701, 1400), up) == (False, True)     # dx .201 > dy .2: x


# --- androidcontrol-low needs the step instructions it is named after

def test_androidcontrol_low_without_step_instructions_is_a_usage_error(tmp_path, capsys):
    import json

    import eval_sop
    lines = open(ANDROID, encoding="utf-8").read().splitlines()[:3]
    rows = [json.loads(x) for x in lines]
    for r in rows:
        for s in r["steps"]:
            s.pop("step_instruction", None)
    data = tmp_path / "no_instructions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        cli.run_script(eval_sop.main, ["--data", str(data), "--blank-screens", "1080x2400", "--protocol",
                                       "androidcontrol-low", "--out", str(tmp_path / "low")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "androidcontrol-low" in err and "no step instructions" in err and str(data) in err
    assert len(err.strip().splitlines()) == 1
    res = eval_sop.main(["--data", str(data), "--blank-screens", "1080x2400", "--protocol", "androidcontrol-high",
                         "--out", str(tmp_path / "high")])
    assert res["static_variant"] == "high" and res["static_step_sr"] == 1.0

"""Action space, parsing/formatting, coordinates, and the rule reward (docs/method.md §3-§4).

Every expectation below is computed by hand in the comment next to it."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gui
import reward
from dataset import Step
from gui import format_response, parse_response, scale_action, smart_resize
from reward import action_match, score_response

# -----------------------------------------------------------------------------
# parse / format


def test_parse_release_format():
    p = parse_response('<think>\nTap search.\n</think>\n<action>\n{"action": "click", "coordinate": [12, 34]}\n</action>')
    assert p.thought == "Tap search."
    assert p.action == {"action": "click", "coordinate": [12, 34]}


def test_parse_tolerates_whitespace_and_trailing_tokens():
    p = parse_response('  <think>  a  </think><action>   {"action":"wait","time":2}  </action><|im_end|>\n')
    assert p.thought == "a" and p.action == {"action": "wait", "time": 2} and p.error is None
    p = parse_response('<action>{"action": "terminate", "status": "success"}</action>')  # no think block
    assert p.thought is None and p.action == {"action": "terminate", "status": "success"}


def test_parse_action_quoted_in_thought_is_not_the_answer():
    text = ('<think>maybe <action>{"action": "wait"}</action> no</think>\n'
            '<action>{"action": "click", "coordinate": [1, 2]}</action>')
    assert parse_response(text).action == {"action": "click", "coordinate": [1, 2]}


@pytest.mark.parametrize("text", [
    "", "hello", "<think>x</think>", "<action></action>", "<action>{not json}</action>",
    '<action>["click"]</action>', '<action>{"action": "fly"}</action>', '<action>{"coordinate": [1, 2]}</action>',
    '<action>{"action": "click"}</action>', '<action>{"action": "click", "coordinate": [1]}</action>',
    '<action>{"action": "click", "coordinate": [NaN, 2]}</action>',
    '<action>{"action": "click", "coordinate": [true, 2]}</action>',
    '<action>{"action": "click", "coordinate": [1e999, 2]}</action>',
    '<action>{"action": "click", "coordinate": [0, 2.7e307]}</action>',  # finite, but inf once scaled
    '<action>{"action": "click", "coordinate": [1000001, 2]}</action>',
    '<action>{"action": "click", "coordinate": "[1, 2]"}</action>',
    '<action>{"action": "swipe", "coordinate": [1, 2]}</action>', '<action>{"action": "type", "text": 5}</action>',
    '<action>{"action": "system_button"}</action>', "<action>" + "[" * 100000 + "</action>",
    '<action>{"action": "click", "coordinate": [1, 2]}',  # unterminated block
])
def test_parse_malformed_gives_no_action(text):
    assert parse_response(text).action is None


WAIT = '<think>t</think>\n<action>\n{"action": "wait"}\n</action>'


@pytest.mark.parametrize("text, error", [
    (WAIT, None), (WAIT + "\n \t", None), (WAIT + "<|im_end|>", None), (WAIT + "<|endoftext|>\n", None),
    (WAIT + "\n" + WAIT, "text after </action>"),                       # looping: the action again
    (WAIT + '<action>{"action": "click", "coordinate": [1, 2]}</action>', "text after </action>"),  # a 2nd action
    (WAIT + " done.", "text after </action>"),
    ("<think>t</think>", "no action block"), ('<action>{"action": "wait"}', "no action block"),
    ("<action>{bad</action>", "invalid action"), (None, "no action block"),
])
def test_parse_error_a_response_must_end_after_its_action(text, error):
    p = parse_response(text)
    assert p.error == error
    if error == "text after </action>":
        assert p.action == {"action": "wait"}  # the first action is still read (reports, history summaries)


def test_parse_drops_ill_typed_optional_arguments():
    assert parse_response('<action>{"action": "wait", "time": "2"}</action>').action == {"action": "wait"}
    assert parse_response('<action>{"action": "terminate", "status": 1}</action>').action == {"action": "terminate"}


def test_parse_non_string():
    assert parse_response(None).action is None and parse_response(b"<action>{}</action>").action is None


@pytest.mark.parametrize("action", [
    {"action": "click", "coordinate": [3, 4]}, {"action": "long_press", "coordinate": [3, 4], "time": 2},
    {"action": "swipe", "coordinate": [1, 2], "coordinate2": [3, 4]}, {"action": "type", "text": "héllo \"x\""},
    {"action": "answer", "text": "42"}, {"action": "key", "text": "Enter"},
    {"action": "system_button", "button": "Back"}, {"action": "open", "text": "Zoho Meeting"},
    {"action": "wait", "time": 2}, {"action": "terminate", "status": "failure"},
])
def test_format_parse_round_trip(action):
    text = format_response("why", action)
    assert text == f"<think>\nwhy\n</think>\n<action>\n{json.dumps(action, ensure_ascii=False)}\n</action>"
    assert parse_response(text).action == action
    assert parse_response(format_response(None, action)).thought == ""  # thought-free patch: empty think


def test_check_action_strict_rounds_and_checks_buttons():
    assert gui.check_action({"action": "click", "coordinate": [540.0, 389.835], "bbox": [1, 2, 3, 4]}, strict=True) \
        == {"action": "click", "coordinate": [540, 390]}
    assert gui.check_action({"action": "system_button", "button": "back"}, strict=True)["button"] == "Back"
    with pytest.raises(ValueError, match="button"):
        gui.check_action({"action": "system_button", "button": "Recents"}, strict=True)
    # model output: any button string parses (a wrong one is a type-only match)
    assert gui.check_action({"action": "system_button", "button": "Recents"})["button"] == "Recents"


# -----------------------------------------------------------------------------
# smart_resize and coordinate mapping


def test_smart_resize_by_hand():
    # 2400/28 = 85.7 -> 86*28 = 2408; 1080/28 = 38.6 -> 39*28 = 1092; 2.63 M pixels within [3136, 10.0 M]
    assert smart_resize(2400, 1080) == (2408, 1092)
    assert gui.resized_size((1080, 2400)) == (1092, 2408)  # (W, H) order
    # max branch: beta = sqrt(2400*1080 / 50176) = 7.187; floor(2400/7.187/28) = 11 -> 308; floor(1080/7.187/28) = 5 -> 140
    assert smart_resize(2400, 1080, max_pixels=50176) == (308, 140)
    # min branch: 5x5 -> beta = sqrt(3136/25) = 11.2 -> ceil(56/28)*28 = 56
    assert smart_resize(5, 5) == (56, 56)
    # a side that rounds to 0 (10/28 -> 0) with min_pixels 0 would stay 0 upstream; ours is 28
    assert smart_resize(10, 1000, min_pixels=0) == (28, 1008)
    with pytest.raises(ValueError):
        smart_resize(0, 100)
    with pytest.raises(ValueError):
        smart_resize(10, 2500)  # aspect 250 > 200


@pytest.mark.parametrize("max_pixels", [gui.MAX_PIXELS, 50176, 28 * 28 * 4])
def test_smart_resize_agrees_with_transformers_and_never_zero(max_pixels):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as hf_resize,
    )
    for h in (1, 13, 14, 27, 100, 333, 1080, 2400, 4000):
        for w in (1, 15, 28, 99, 720, 1080, 3000):
            if max(h, w) / min(h, w) > 200:
                continue
            rh, rw = smart_resize(h, w, max_pixels=max_pixels)
            assert (rh, rw) == hf_resize(h, w, 28, gui.MIN_PIXELS, max_pixels)
            assert rh >= 28 and rw >= 28 and rh % 28 == 0 and rw % 28 == 0


def test_parse_size_and_expert_response_defaults():
    assert gui.parse_size("1080x2400") == (1080, 2400) and gui.parse_size("160X210") == (160, 210)
    for bad in ("1080", "0x5", "axb", "1x2x3"):
        with pytest.raises(ValueError):
            gui.parse_size(bad)
    step = Step(screenshot=None, action={"action": "click", "coordinate": [540, 1200]})
    # resized defaults to smart_resize(orig): (1092, 2408); 540*1092/1080 = 546, 1200*2408/2400 = 1204
    assert gui.expert_response(step, (1080, 2400)) == format_response(None, {"action": "click", "coordinate": [546, 1204]})
    # with max_pixels 50176 -> (140, 308): 540*140/1080 = 70, 1200*308/2400 = 154
    assert gui.parse_response(gui.expert_response(step, (1080, 2400), max_pixels=50176)).action["coordinate"] == [70, 154]


def test_scale_action():
    # x: 100 * 500/1000 = 50; y: 1000 * 500/2000 = 250 (a (h, w) swap would give 25, 500)
    a = scale_action({"action": "click", "coordinate": [100, 1000]}, (1000, 2000), (500, 500))
    assert a == {"action": "click", "coordinate": [50, 250]}
    s = scale_action({"action": "swipe", "coordinate": [540, 1800], "coordinate2": [540, 600]}, (1080, 2400), (140, 308))
    # 540*140/1080 = 70; 1800*308/2400 = 231; 600*308/2400 = 77
    assert s["coordinate"] == [70, 231] and s["coordinate2"] == [70, 77]
    assert scale_action({"action": "wait", "time": 2}, (1, 1), (2, 2)) == {"action": "wait", "time": 2}


# -----------------------------------------------------------------------------
# match rules, one action type at a time (pred and expert in the same pixel space)

SIZE = (1000, 2000)


def click(x, y, kind="click"):
    return {"action": kind, "coordinate": [x, y]}


def test_click_inside_enlarged_box():
    box = [[100, 200, 300, 400]]  # centre (200, 300), 200x200 -> enlarged 240x240: [80, 180, 320, 420]
    expert = click(200, 300)
    assert action_match(click(81, 181), expert, box, SIZE) == (True, True)   # outside the box, inside enlarged
    assert action_match(click(320, 420), expert, box, SIZE) == (True, True)  # on the enlarged corner
    # (79, 300): left of the enlarged box; distance 121/1000 = 0.121 > 0.04
    assert action_match(click(79, 300), expert, box, SIZE) == (False, True)


def test_click_distance_rule_is_normalised_euclidean():
    expert = click(500, 1000)  # no boxes, image 1000 x 2000
    assert action_match(click(530, 1000), expert, [], SIZE)[0]       # 30/1000 = 0.03
    assert action_match(click(540, 1000), expert, [], SIZE)[0]       # 0.04 exactly
    assert not action_match(click(541, 1000), expert, [], SIZE)[0]   # 0.041
    assert action_match(click(500, 1079), expert, [], SIZE)[0]       # 79/2000 = 0.0395 (height-normalised)
    assert not action_match(click(500, 1081), expert, [], SIZE)[0]  # 0.0405
    assert action_match(click(528, 1056), expert, [], SIZE)[0]       # hypot(0.028, 0.028) = 0.0396
    assert not action_match(click(529, 1058), expert, [], SIZE)[0]  # hypot(0.029, 0.029) = 0.0410
    assert not action_match(click(1e300, -1e300), expert, [], SIZE)[0]  # absurd, no overflow


def test_click_several_boxes_and_long_press():
    boxes = [[0, 0, 10, 10], [600, 1500, 700, 1600]]  # 2nd enlarged: [590, 1490, 710, 1610]
    expert = click(650, 1550, "long_press")  # the target is the 2nd box (the only one holding the expert point)
    assert action_match(click(705, 1605, "long_press"), expert, boxes, SIZE) == (True, True)
    assert action_match(click(5, 5, "long_press"), expert, boxes, SIZE) == (False, True)  # another box: no longer
    assert action_match(click(705, 1605, "click"), expert, boxes, SIZE) == (False, False)  # wrong type
    assert action_match(click(300, 300, "long_press"), expert, boxes, SIZE) == (False, True)


def swipe(x1, y1, x2, y2):
    return {"action": "swipe", "coordinate": [x1, y1], "coordinate2": [x2, y2]}


def test_swipe_dominant_finger_direction():
    up = swipe(540, 1800, 540, 600)  # finger moves up (content scrolls down)
    assert action_match(swipe(500, 2000, 520, 100), up, [], SIZE) == (True, True)
    assert action_match(swipe(540, 600, 540, 1800), up, [], SIZE) == (False, True)   # down
    assert action_match(swipe(100, 900, 900, 500), up, [], SIZE) == (False, True)   # |dx| 800 > |dy| 400: right
    assert action_match(swipe(5, 5, 5, 5), up, [], SIZE) == (False, True)           # no direction
    assert gui.swipe_direction([0, 0], [10, -10]) == "up"   # tie goes vertical (release)
    assert gui.swipe_direction([0, 0], [-11, 10]) == "left"


def test_text_token_f1_rule():
    expert = {"action": "type", "text": "Birthday Song "}
    t = lambda s, kind="type": {"action": kind, "text": s}  # noqa: E731
    assert action_match(t("  BIRTHDAY song"), expert, [], SIZE) == (True, True)
    assert action_match(t("birthday"), expert, [], SIZE) == (True, True)             # F1 2/3
    assert action_match(t("Happy birthday song!"), expert, [], SIZE) == (True, True)  # F1 0.8
    assert action_match(t("song birthday"), expert, [], SIZE) == (True, True)         # same tokens
    assert action_match(t("a"), expert, [], SIZE) == (False, True)                    # containment is gone
    assert action_match(t("  "), expert, [], SIZE) == (False, True)
    assert action_match(t("Birthday Song", "answer"), expert, [], SIZE) == (False, False)
    assert action_match(t("Chrome", "open"), {"action": "open", "text": "Google Chrome"}, [], SIZE) == (True, True)
    assert action_match(t("zoho meeting", "open"), {"action": "open", "text": "Zoho Meet"}, [], SIZE) == (True, True)  # F1 0.5
    assert action_match(t("zoho mail", "open"), {"action": "open", "text": "Zoho Meet Pro"}, [], SIZE) == (False, True)  # F1 0.4


def test_buttons_case_insensitive_and_type_only_actions():
    back = {"action": "system_button", "button": "Back"}
    assert action_match({"action": "system_button", "button": " back"}, back, [], SIZE) == (True, True)
    assert action_match({"action": "system_button", "button": "Home"}, back, [], SIZE) == (False, True)
    assert action_match({"action": "wait"}, {"action": "wait", "time": 2}, [], SIZE) == (True, True)
    assert action_match({"action": "terminate", "status": "failure"}, {"action": "terminate", "status": "success"},
                        [], SIZE) == (True, True)  # docs/method.md §4: type alone
    assert action_match(None, back, [], SIZE) == (False, False)


# -----------------------------------------------------------------------------
# reward: 0.1 * format + 0.9 * action

ORIG, RESIZED = (1080, 2400), (140, 308)  # smart_resize(2400, 1080, max_pixels=50176) -> (308, 140)
STEP = Step(screenshot=None, action=click(540, 2273), candidate_bbox=[[456, 2211, 624, 2337]])


def resp(action, thought="t"):
    return format_response(thought, action)


@pytest.mark.parametrize("text, reward, match, type_match, format_ok", [
    (resp(click(70, 291)), 1.0, True, True, True),                 # full match, think non-empty: 0.1 + 0.9
    (resp(click(70, 291), thought=""), 0.9, True, True, False),    # empty think: 0.9 * 1.0
    (resp(click(10, 10)), 0.55, False, True, True),                # type only: 0.1 + 0.9 * 0.5
    (resp(click(10, 10), thought=None), 0.45, False, True, False),
    (resp({"action": "wait"}), 0.19, False, False, True),          # wrong type: 0.1 + 0.9 * 0.1
    (resp({"action": "wait"}, thought=""), 0.09, False, False, False),
    ("<think>a real thought</think><action>oops</action>", 0.0, False, False, True),  # unparseable: 0
    ("no tags at all", 0.0, False, False, False),
])
def test_reward_by_hand(text, reward, match, type_match, format_ok):
    s = score_response(text, STEP, resized_size=RESIZED, orig_size=ORIG)
    assert s.reward == pytest.approx(reward) and (s.match, s.type_match, s.format_ok) == (match, type_match, format_ok)


def test_malformed_responses_score_zero():
    good = resp(click(70, 291))
    assert score_response(good, STEP, resized_size=RESIZED, orig_size=ORIG).reward == pytest.approx(1.0)
    cases = [(good, True, "cut at the token cap"),                       # a full action, but cut at the cap
             (good + "\n" + good, False, "text after </action>"),        # looping until stopped
             (good + "\n" + resp({"action": "wait"}), False, "text after </action>")]  # a second, wrong action
    for text, truncated, error in cases:
        s = score_response(text, STEP, resized_size=RESIZED, orig_size=ORIG, truncated=truncated)
        assert (s.reward, s.match, s.type_match, s.error) == (0.0, False, False, error)
        assert s.action == click(540, 2268)  # what it said, for the report


def test_score_maps_resized_to_original_pixels():
    # resized (70, 291) -> original (70*1080/140, 291*2400/308) = (540, 2267.5 -> 2268): inside the box
    s = score_response(resp(click(70, 291)), STEP, resized_size=RESIZED, orig_size=ORIG)
    assert s.action == click(540, 2268) and s.match
    # the same point read as ORIGINAL pixels would be far off: the mapping is what makes it match
    assert not action_match(click(70, 291), STEP.action, STEP.candidate_bbox, ORIG)[0]


def test_expert_response_replays_to_full_match_for_every_type():
    actions = [click(540, 2273), click(5, 7, "long_press") | {"time": 2}, swipe(540, 1800, 540, 600),
               swipe(270, 1200, 810, 1200), {"action": "type", "text": "x"}, {"action": "answer", "text": "y"},
               {"action": "key", "text": "Enter"}, {"action": "system_button", "button": "Home"},
               {"action": "open", "text": "Maps"}, {"action": "wait", "time": 2},
               {"action": "terminate", "status": "success"}]
    assert {a["action"] for a in actions} == set(gui.action_types())
    for a in actions:
        step = Step(screenshot=None, action=a)
        s = score_response(gui.expert_response(step, ORIG, RESIZED, thought="because"), step,
                           resized_size=RESIZED, orig_size=ORIG)
        assert s.match and s.reward == pytest.approx(1.0), a


# -----------------------------------------------------------------------------
# property test: arbitrary output never raises, reward stays in [0, 1]

_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                       max_leaves=8)
_action_json = st.builds(
    lambda kind, extra: json.dumps({"action": kind, **extra}, allow_nan=True),
    st.sampled_from(gui.action_types() + ("fly", "")),
    st.dictionaries(st.sampled_from(["coordinate", "coordinate2", "text", "button", "time", "status"]),
                    _values | st.lists(st.integers(-10**30, 10**30) | st.floats(), min_size=2, max_size=2), max_size=4))
_texts = st.one_of(
    st.text(),
    st.builds(lambda a, b: f"<think>{a}</think><action>{b}</action>", st.text(), st.text()),
    st.builds(lambda a, b: f"<think>\n{a}\n</think>\n<action>\n{b}\n</action>", st.text(max_size=30), _action_json),
)
_experts = [STEP, Step(None, swipe(540, 1800, 540, 600)), Step(None, {"action": "type", "text": "abc"}),
            Step(None, {"action": "system_button", "button": "Back"}), Step(None, {"action": "wait", "time": 2})]


@settings(max_examples=400, deadline=None)
@given(text=_texts, k=st.integers(0, len(_experts) - 1), rules=st.sampled_from(reward.MATCH_RULES),
       truncated=st.booleans())
def test_reward_never_raises_and_is_bounded(text, k, rules, truncated):
    s = score_response(text, _experts[k], resized_size=RESIZED, orig_size=ORIG, rules=rules, truncated=truncated)
    assert 0.0 <= s.reward <= 1.0 and not math.isnan(s.reward)
    assert (s.reward == 0.0) == (s.error is not None)  # malformed <=> 0 (a well-formed response earns >= 0.09)
    if rules == "strict":
        assert s.reward == 0.0 or (s.action is not None and not truncated)

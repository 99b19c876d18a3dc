"""Reward-rule integrity (docs/method.md §4): trivial policies score near zero on the shipped
AndroidControl test file, legitimate near-hits still match, loader and `score` are strict."""

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

import dataset
import eval_sop
import gui
import policies
import reward

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "android_control")
TEST = os.path.join(DATA, "android_control_test_uis1.jsonl")
SIZE = (1080, 2400)


@pytest.fixture(scope="module")
def floors():
    eps = dataset.load_episodes(TEST)
    sizes = policies.step_sizes(eps, blank_screens=SIZE)
    return {r: policies.run_baselines(eps, sizes, r)["rates"] for r in reward.MATCH_RULES}


def test_trivial_policies_score_near_zero(floors):
    r = floors["strict"]
    assert r["click centre"]["click"] <= 0.05 and r["click uniform random"]["click"] <= 0.04
    for c in ("a", "e", "the", ""):
        assert r[f"text {c!r}"]["type"] <= 0.02 and r[f"text {c!r}"]["open"] <= 0.02
    # the release's rules, as it ran, are farmable: the containment of "a" matches most type steps
    assert floors["release"]["text 'a'"]["type"] > 0.5


def test_legitimate_near_hits():
    expert = {"action": "click", "coordinate": [540, 1200]}
    box = [[440, 1150, 640, 1250]]  # the target's own small box (0.8% of the screen)
    pred = {"action": "click", "coordinate": [630, 1240]}  # inside, 0.085 from the expert point (normalised)
    assert reward.action_match(pred, expert, box, SIZE) == (True, True)
    assert reward.action_match(pred, expert, box, SIZE, rules="release") == (False, True)  # distance only
    # a whole-screen container holding the point is not a target
    assert not reward.action_match(pred, expert, [[0, 0, 1080, 2400]], SIZE)[0]
    t = lambda s: {"action": "open", "text": s}  # noqa: E731
    assert reward.action_match(t("Chrome"), t("Google Chrome"), [], SIZE)[0]
    assert reward.action_match(t("  CHROME "), t("chrome"), [], SIZE)[0]


@pytest.mark.parametrize("pred, expert", [("Audiomack", "Audio\u00admack"), ("Don't", "Don\u2019t"),
                                          ("Don't", "Don\u00b4t"), ("\uff21BC", "abc"), ("x\u200by", "xy")])
def test_unicode_variants_match(pred, expert):
    assert reward.normalize_text(pred) == reward.normalize_text(expert)
    assert reward.action_match({"action": "type", "text": pred}, {"action": "type", "text": expert}, [], SIZE)[0]


def test_empty_expert_text_matches_only_empty():
    e = {"action": "type", "text": ""}
    assert not reward.action_match({"action": "type", "text": "anything"}, e, [], SIZE)[0]
    assert reward.action_match({"action": "type", "text": " "}, e, [], SIZE)[0]


def test_release_rules_any_swipe_and_unknown_rules():
    up = {"action": "swipe", "coordinate": [540, 1800], "coordinate2": [540, 600]}
    down = {"action": "swipe", "coordinate": [540, 600], "coordinate2": [540, 1800]}
    assert reward.action_match(down, up, [], SIZE) == (False, True)
    assert reward.action_match(down, up, [], SIZE, rules="release") == (True, True)
    with pytest.raises(ValueError, match="rules"):
        reward.action_match(down, up, [], SIZE, rules="lenient")
    # a misspelt rules name is an error even when the response is malformed (no silent reward 0)
    for text in ("no action at all", "<think>t</think><action>" + json.dumps(down) + "</action>"):
        with pytest.raises(ValueError, match="rules"):
            reward.score_response(text, dataset.Step(None, up), resized_size=SIZE, orig_size=SIZE,
                                  rules="strickt")


def test_swipe_conventions_train_and_thought_pair():
    """The same episode: the train example stores 'down' (scroll), the thought file 'up' (finger)."""
    train = dataset.load_episodes(os.path.join(DATA, "android_control_train_example_uis1.jsonl"))
    [thought] = dataset.load_episodes(os.path.join(DATA, "thought_example_uis1.jsonl"))
    dirs = lambda eps: [gui.swipe_direction(s.action["coordinate"], s.action["coordinate2"])  # noqa: E731
                        for e in eps for s in e.steps if s.action["action"] == "swipe"]
    assert dirs(train) == ["up"] * 19 and dirs([thought]) == ["up"] * 4


def write(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def ep(step, **extra):
    return {"goal": "g", "steps": [step], **extra}


SWIPE = {"action_content": {"action": "swipe", "coordinate": [540, 600], "coordinate2": [540, 1800]}}


def test_unknown_swipe_convention_is_an_error(tmp_path):
    p = write(tmp_path, "a.jsonl", [ep(SWIPE)])
    with pytest.raises(ValueError, match=r"a.jsonl: line 1: field 'swipe_convention'"):
        dataset.load_episodes(p)
    [e] = dataset.load_episodes(p, swipe_convention="scroll")
    assert gui.swipe_direction(e.steps[0].action["coordinate"], e.steps[0].action["coordinate2"]) == "up"
    [e] = dataset.load_episodes(write(tmp_path, "b.jsonl", [ep(SWIPE, swipe_convention="finger")]))
    assert gui.swipe_direction(e.steps[0].action["coordinate"], e.steps[0].action["coordinate2"]) == "down"
    with pytest.raises(ValueError, match=r"swipe_convention: expected one of .* got 'Scroll'"):
        dataset.load_episodes(p, swipe_convention="Scroll")  # a caller's typo: never read as "finger"


@pytest.mark.parametrize("step, match", [
    ({"action_content": {"action": "swipe", "coordinate": [5, 5], "coordinate2": [5, 5]}},
     r"line 1: field 'steps\[0\].action_content': zero-length swipe"),
    ({"action_content": {"action": "click", "coordinate": [5, 5]}, "candidate_bbox": [[10, 10, 0, 20]]},
     r"line 1: field 'steps\[0\].candidate_bbox\[0\]': reversed corners"),
    ({"action_content": {"action": "click", "coordinate": [1000, 100]}, "image_size": [400, 1080]},
     r"\(H, W\)-swapped"),
])
def test_loader_strictness(tmp_path, step, match):
    with pytest.raises(ValueError, match=match):
        dataset.load_episodes(write(tmp_path, "x.jsonl", [ep(step, swipe_convention="finger")]))


def test_native_detection_message(tmp_path):
    p = tmp_path / "n.json"
    p.write_text(json.dumps([{"image": "episode_1-screenshot_0.png", "task": "t"}]))
    with pytest.raises(ValueError, match="row 0: field 'gt'"):
        dataset.load_episodes(str(p))
    p.write_text(json.dumps([{"foo": 1}]))
    with pytest.raises(ValueError, match=r"unknown format.*saw \['foo'\]"):
        dataset.load_episodes(str(p))


def test_original_size_one_answer(tmp_path):
    Image.new("RGB", (540, 1200)).save(tmp_path / "s.png")
    step = lambda size: dataset.Step(screenshot="s.png", action={"action": "wait"}, image_size=size,  # noqa: E731
                                 root=str(tmp_path), where="f.jsonl: line 3: steps[0]")
    assert dataset.original_size(step(None)) == (540, 1200) == dataset.original_size(step((541, 1200)))
    with pytest.raises(ValueError, match=r"f.jsonl: line 3: steps\[0\]: field 'image_size': recorded 1080x2400"):
        dataset.original_size(step((1080, 2400)))
    with pytest.raises(ValueError, match=r"\(H, W\)-swapped"):
        dataset.original_size(step((1200, 540)))
    missing = dataset.Step(screenshot="no.png", action={"action": "wait"}, root=str(tmp_path))
    assert dataset.original_size(missing, blank_screens=SIZE) == SIZE
    with pytest.raises(FileNotFoundError):
        dataset.original_size(missing)


def test_score_coverage(tmp_path):
    train = os.path.join(DATA, "android_control_train_example_uis1.jsonl")
    r = tmp_path / "r.jsonl"
    r.write_text(json.dumps({"episode_id": "line-1", "step": 0, "response": "x"}) + "\n")
    args = ["score", "--data", train, "--responses", str(r), "--out", str(tmp_path / "o.jsonl"),
            "--image-size", "1080x2400"]
    with pytest.raises(ValueError, match=r"205 of 206 steps .* have no response \(episode:step line-1:1"):
        eval_sop.main(args)
    r.write_text("")
    with pytest.raises(ValueError, match="no responses"):
        eval_sop.main(args + ["--subset"])
    eps = dataset.load_episodes(train)
    r.write_text("".join(json.dumps({"episode_id": e.episode_id, "step": t, "response": "x"}) + "\n"
                         for e in eps for t in range(len(e.steps)) for _ in range(2)))
    s = eval_sop.main(args)
    assert s["steps_scored"] == 206 and s["responses_per_step_max"] == 2 and s["responses"] == 412


def test_baselines_command_last_line_json(capsys):
    res = eval_sop.main(["baselines", "--data", os.path.join(DATA, "thought_example_uis1.jsonl")])
    out = capsys.readouterr().out.strip().splitlines()
    assert "click centre" in "\n".join(out) and json.loads(out[-1]) == res
    assert res["counts"]["swipe"] == 4 and res["rates"]["swipe up"]["swipe"] == 1.0


# -----------------------------------------------------------------------------
# the strict text rule: function words carry no name


@pytest.mark.parametrize("pred, expert, f1, match", [
    ("the", "The Weather Channel", 0.0, False),         # over all tokens 0.5, a match: a function word named nothing
    ("my", "My Files", 0.0, False),
    ("of the", "Bank of America", 0.0, False),
    ("Chrome", "Google Chrome", 2 / 3, True),            # content {chrome} vs {google, chrome}: P 1, R 1/2
    ("weather", "The Weather Channel", 2 / 3, True),
    ("the weather channel app", "The Weather Channel", 0.8, True),  # P 2/3, R 1
    ("bank america", "Bank of America", 1.0, True),
    ("for her app", "For Her", 0.8, True),               # the expert is stop words only: all tokens, P 2/3, R 1
    ("her", "For Her", 2 / 3, True),
])
def test_text_rule_ignores_function_words(pred, expert, f1, match):
    assert reward.text_f1(pred, expert) == pytest.approx(f1)
    assert reward.action_match({"action": "open", "text": pred}, {"action": "open", "text": expert}, [], SIZE) == (match, True)
    assert reward.action_match({"action": "open", "text": "the"}, {"action": "open", "text": "The"}, [], SIZE)[0]  # equal


def test_constant_the_matches_nothing_on_the_test_file(floors):
    # measured before the stop words: "the" matched 1 of 533 type steps and 6 of 513 open steps
    assert floors["strict"]["text 'the'"] == {"type": 0.0, "open": 0.0}


# -----------------------------------------------------------------------------
# --match-rules release: the release's parse and check, its exceptions included (extras/release.py)

R = gui.resized_size(SIZE)  # (1092, 2408): the expert point (540, 1200) is (546, 1204) there
CLICK = {"action": "click", "coordinate": [540, 1200]}
TYPE = {"action": "type", "text": "Hello"}
BACK = {"action": "system_button", "button": "Back"}
SWIPE_UP = {"action": "swipe", "coordinate": [540, 1800], "coordinate2": [540, 600]}
WAIT = {"action": "wait", "time": 2}


def act(body, thought="t"):
    return f"<think>{thought}</think>\n<action>\n{body}\n</action>"


@pytest.mark.parametrize("text, expert, expected", [
    # (type_match, match), or "raises": the release's try/except then zeroes the episode
    (act('{"action": "click", "coordinate": [546, 1204]}'), CLICK, (True, True)),
    (act('{"action": "click", "coordinate": [589, 1204]}'), CLICK, (True, True)),    # 589/1092 - 0.5 = 0.0394
    (act('{"action": "click", "coordinate": [590, 1204]}'), CLICK, (True, False)),   # 0.0403 > 0.04
    (act('{"action": "click", "coordinate": [546, 1204, 0]}'), CLICK, (True, True)),  # extra entries ignored
    (act('{"action": "click", "coordinate": [NaN, 1204]}'), CLICK, (True, False)),   # loads; never close
    (act('{"action": "click", "coordinate": null}'), CLICK, "raises"),
    (act('{"action": "click", "coordinate": "546, 1204"}'), CLICK, "raises"),
    (act('{"action": "click", "coordinate": [546]}'), CLICK, "raises"),
    (act('{"action": "click", "coordinate": ["546", 1204]}'), CLICK, "raises"),
    (act('{"action": "click", "coordinate": [1' + "0" * 400 + ', 1204]}'), CLICK, "raises"),  # int / W overflows
    (act('{"action": "click"}'), CLICK, "raises"),
    (act('{"coordinate": [546, 1204]}'), CLICK, "raises"),                        # no "action"
    (act('["click", 546, 1204]'), CLICK, "raises"),                               # not an object
    (act('"click"'), CLICK, "raises"),
    (act("{bad json"), CLICK, "raises"),
    ('<think>t</think><action>{"action": "click", "coordinate": [546, 1204]}', CLICK, "raises"),  # cut: no </action>
    (act('{"action": "wait", "coordinate": null}'), CLICK, "raises"),  # normalised before the type is looked at
    (act('{"action": "tap", "coordinate": [546, 1204]}'), CLICK, (False, False)),  # unknown type: wrong, no raise
    (act('{"action": "type", "text": null}'), CLICK, (False, False)),  # a text of another type is never read
    (act('{"action": "type", "text": "ell"}'), TYPE, (True, True)),    # containment
    (act('{"action": "type", "text": ""}'), TYPE, (True, True)),       # "" is in everything
    (act('{"action": "type", "text": null}'), TYPE, "raises"),
    (act('{"action": "type", "text": 5}'), TYPE, "raises"),
    (act('{"action": "system_button", "button": " BACK "}'), BACK, (True, True)),
    (act('{"action": "system_button", "button": null}'), BACK, "raises"),
    (act('{"action": "system_button"}'), BACK, "raises"),
    (act('{"action": "swipe"}'), SWIPE_UP, (True, True)),                # any swipe, no coordinates needed
    (act('{"action": "swipe", "coordinate": null}'), SWIPE_UP, "raises"),
    (act('{"action": "wait"}'), WAIT, (True, True)),
    (act('{"action": "wait", "coordinate": null}'), WAIT, "raises"),      # the extra "coordinate": null
    (act('{"action": "wait", "coordinate": [1, 2]}'), WAIT, (True, True)),
    (act('{"action": "click", "coordinate": [546, 1204]}'), {"action": "open", "text": "Maps"}, (False, False)),
    (act('{"action": "terminate", "status": "success"}'), {"action": "terminate", "status": "failure"}, (True, True)),
    # the first <action> anywhere, a quoted one in the thought too
    (act('{"action": "click", "coordinate": [546, 1204]}', thought='not <action>{"action": "wait"}</action>'),
     CLICK, (False, False)),
    (act('{"action": "click", "coordinate": [546, 1204]}', thought="I write <action>...</action> blocks"),
     CLICK, "raises"),
])
def test_release_parse_and_check(text, expert, expected):
    s = reward.score_response(text, dataset.Step(None, expert), resized_size=R, orig_size=SIZE, rules="release")
    if expected == "raises":
        assert s.error is not None and (s.reward, s.match, s.type_match) == (0.0, False, False)
    else:
        assert s.error is None and (s.type_match, s.match) == expected
    # the release ignores the finish reason: a response cut at the cap is read like any other
    assert reward.score_response(text, dataset.Step(None, expert), resized_size=R, orig_size=SIZE, rules="release",
                              truncated=True) == s



def test_release_rules_are_imported_only_when_asked():
    """extras/release.py stays off the strict path: scoring and matching under the strict rules (and a
    rule function) leave it unimported; the first call under rules="release" imports it, and its check
    is the one score_response uses (a wait with a null coordinate raises in the release's code)."""
    code = ("import sys, dataset, reward\n"
            "step = dataset.Step(None, {'action': 'wait'})\n"
            "text = '<think>t</think><action>{\"action\": \"wait\", \"coordinate\": null}</action>'\n"
            "s = reward.score_response(text, step, resized_size=(100, 100), orig_size=(100, 100))\n"
            "reward.action_match({'action': 'wait'}, step.action, [], (100, 100), rules=lambda *a: (True, True))\n"
            "print('extras.release' in sys.modules, s.match)\n"
            "s = reward.score_response(text, step, resized_size=(100, 100), orig_size=(100, 100), rules='release')\n"
            "print('extras.release' in sys.modules, s.match, s.error is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["False True", "True False True"], out.stdout

def test_strict_rules_on_the_release_cases():
    """The same responses under the strict rules: a quoted action is not the answer, an extra
    null key on a wait is ignored, [x, y, 0] is malformed."""
    strict = lambda text, expert: reward.score_response(text, dataset.Step(None, expert), resized_size=R,  # noqa: E731
                                                     orig_size=SIZE)
    s = strict(act('{"action": "click", "coordinate": [546, 1204]}', thought='not <action>{"action": "wait"}</action>'),
               CLICK)
    assert s.match and s.error is None
    assert strict(act('{"action": "wait", "coordinate": null}'), WAIT).match
    assert strict(act('{"action": "click", "coordinate": [546, 1204, 0]}'), CLICK).error == "invalid action"
    assert strict(act('{"action": "swipe"}'), SWIPE_UP).error == "invalid action"


def test_partial_credit_is_one_function_and_leaves_the_match(monkeypatch):
    """The README's reward fork: a partial-credit click is a change to reward.action_score alone.
    Here a click of the right type earns 1 - d / 0.2 of the action term (d the normalised distance,
    eq. 4.3); the reward moves, the match (patching, returns, SOP) stays the strict rule's."""
    step = dataset.Step(screenshot="s.png", action={"action": "click", "coordinate": [540, 1200]},
                        candidate_bbox=[], image_size=SIZE)
    near = '<think>t</think><action>{"action": "click", "coordinate": [540, 1320]}</action>'  # d = 0.05
    kw = dict(resized_size=SIZE, orig_size=SIZE)
    base = reward.score_response(near, step, **kw)
    assert (base.match, base.type_match) == (False, True)
    assert base.reward == pytest.approx(0.1 + 0.9 * 0.5)

    def partial(pred, expert, candidate_bbox, image_size, *, match, type_match):
        if match or not type_match or expert["action"] != "click":
            return reward.SCORE_MATCH if match else (reward.SCORE_TYPE_ONLY if type_match else reward.SCORE_WRONG_TYPE)
        w, h = image_size
        d = ((pred["coordinate"][0] - expert["coordinate"][0]) / w) ** 2 + ((pred["coordinate"][1] - expert["coordinate"][1]) / h) ** 2
        return max(0.0, 1 - d ** 0.5 / 0.2)

    monkeypatch.setattr(reward, "action_score", partial)
    forked = reward.score_response(near, step, **kw)
    assert forked.reward == pytest.approx(0.1 + 0.9 * 0.75)
    assert (forked.match, forked.type_match) == (False, True)
    assert reward.action_match(forked.action, step.action, [], SIZE) == (False, True)


def test_a_point_off_the_screenshot_is_malformed_even_within_the_click_distance():
    """A click 2 px below a 1092x2408 screenshot, 2 px from an expert point on its bottom edge, would pass the
    0.04 distance rule; it is no touch the device can make, so it scores 0 as a malformed answer (and a point
    on the edge itself still matches)."""
    from gui import format_response

    size = (1092, 2408)
    step = dataset.Step(None, {"action": "click", "coordinate": [546, 2408]}, candidate_bbox=[], image_size=size)
    off = reward.score_response(format_response("t", {"action": "click", "coordinate": [546, 2410]}), step,
                                resized_size=size, orig_size=size)
    assert (off.reward, off.match) == (0.0, False) and "off the screenshot" in off.error
    edge = reward.score_response(format_response("t", {"action": "click", "coordinate": [546, 2408]}), step,
                                 resized_size=size, orig_size=size)
    assert edge.match and edge.reward == 1.0
    swipe = {"action": "swipe", "coordinate": [546, 1200], "coordinate2": [546, -5]}
    assert reward.score_response(format_response("t", swipe), step, resized_size=size, orig_size=size).error

"""Episode loading (UI-S1 JSONL, AndroidControl native JSON, MiniWob) and screenshot resolution."""

import json
from pathlib import Path

import pytest
from PIL import Image

import dataset
import gui
from extras import android_control

DATA = Path(__file__).resolve().parent.parent / "data" / "android_control"
TEST_UIS1 = DATA / "android_control_test_uis1.jsonl"
TRAIN_UIS1 = DATA / "android_control_train_example_uis1.jsonl"
THOUGHT_UIS1 = DATA / "thought_example_uis1.jsonl"
TEST_NATIVE = DATA / "android_control_test_native_steps.json"


@pytest.fixture(scope="module")
def real():
    return {p.name: dataset.load_episodes(p) for p in (TEST_UIS1, TRAIN_UIS1, THOUGHT_UIS1, TEST_NATIVE)}


# -----------------------------------------------------------------------------
# the real files: every row loads


@pytest.mark.parametrize("name, episodes, steps, longest", [
    ("android_control_test_uis1.jsonl", 1262, 6903, 24),
    ("android_control_train_example_uis1.jsonl", 32, 206, 13),
    ("thought_example_uis1.jsonl", 1, 11, 11),
    # 6434 rows (6903 - 463 wait - 6 long_press); 225 episodes skip step numbers or start at 1: cut at their
    # first gap, 835 rows dropped (extras/android_control.native_episodes)
    ("android_control_test_native_steps.json", 1262, 5599, 24),
])
def test_real_files_load_completely(real, name, episodes, steps, longest):
    eps = real[name]
    assert len(eps) == episodes
    assert sum(len(e.steps) for e in eps) == steps
    assert max(len(e.steps) for e in eps) == longest
    for e in eps:
        assert isinstance(e.goal, str) and e.episode_id and e.source.endswith(name)
        for s in e.steps:
            assert s.action["action"] in gui.action_types()
            for k in ("coordinate", "coordinate2"):
                if k in s.action:
                    assert all(type(c) is int for c in s.action[k])
    # native episode 3496 records no instruction at all, so no goal can be composed for it
    assert [e.episode_id for e in eps if not e.goal] == (["3496"] if "native" in name else [])


def test_real_file_details(real):
    test, train, thought = (real["android_control_test_uis1.jsonl"], real["android_control_train_example_uis1.jsonl"],
                            real["thought_example_uis1.jsonl"])
    s = test[0].steps[1]  # first line of the file, step 1 (hand-read)
    assert test[0].episode_id == "8193" and s.action == {"action": "click", "coordinate": [540, 2273]}
    assert s.candidate_bbox == [[456, 2211, 624, 2337], [0, 473, 1080, 2337]]
    assert s.step_instruction == "click on create tab"
    # train file: no episode_id (line number instead); one bbox on the action; float coordinates rounded
    assert train[0].episode_id == "line-1"
    assert train[0].steps[2].action == {"action": "click", "coordinate": [540, 390]}  # 389.835 -> 390
    assert train[0].steps[2].candidate_bbox == [[360, 327, 695, 466]]
    assert all(e.steps[-1].action["action"] == "terminate" for e in train)
    assert all(s.thought for s in thought[0].steps)


def test_swipe_conventions_of_both_formats(real):
    """Native scroll direction is the content's; we store finger swipes. Joined by episode id and
    step, vertical swipes of the two formats agree; horizontal ones disagree because the release
    converted only up/down: read under its declared "mixed" convention, all 956 agree."""
    # every native row, those the loader drops after a step gap included (android_control.native_episodes)
    native = {}
    for i, row in enumerate(json.loads(TEST_NATIVE.read_text())):
        ep, k = android_control.IMAGE_RE.search(row["image"]).groups()
        action = android_control.row_action(row["gt"], dataset.ANDROID_CONTROL_SIZE)
        native.setdefault(ep, {})[int(k)] = dataset.Step(screenshot=row["image"], action=action)
    agree = {"vertical": 0, "horizontal": 0}
    disagree = {"vertical": 0, "horizontal": 0}
    for e in real["android_control_test_uis1.jsonl"]:
        for k, s in enumerate(e.steps):
            if s.action["action"] != "swipe":
                continue
            n = native[e.episode_id][k]
            d_uis1 = gui.swipe_direction(s.action["coordinate"], s.action["coordinate2"])
            d_native = gui.swipe_direction(n.action["coordinate"], n.action["coordinate2"])
            axis = "vertical" if d_uis1 in ("up", "down") else "horizontal"
            (agree if d_uis1 == d_native else disagree)[axis] += 1
    assert agree == {"vertical": 823, "horizontal": 133}
    assert disagree == {"vertical": 0, "horizontal": 0}


# -----------------------------------------------------------------------------
# native format: every action type, grouping, goals


def write(tmp_path, name, obj):
    p = tmp_path / name
    if isinstance(obj, list) and name.endswith(".jsonl"):
        p.write_text("".join(json.dumps(o) + "\n" for o in obj))
    else:
        p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def native_row(ep, k, gt, task="do it"):
    return {"image": f"episode_{ep}-screenshot_{k}.png", "gt": gt, "task": task}


def test_native_action_mapping(tmp_path):
    gts = [
        ({"action_type": "click", "x": 334, "y": 2268}, {"action": "click", "coordinate": [334, 2268]}),
        ({"action_type": "long_press", "x": 5.6, "y": 7}, {"action": "long_press", "coordinate": [6, 7], "time": 2}),
        # content scrolls down -> the finger moves up, from (W/2, 3H/4) to (W/2, H/4) of 1080 x 2400
        ({"action_type": "scroll", "direction": "down"}, {"action": "swipe", "coordinate": [540, 1800], "coordinate2": [540, 600]}),
        ({"action_type": "scroll", "direction": "up"}, {"action": "swipe", "coordinate": [540, 600], "coordinate2": [540, 1800]}),
        ({"action_type": "scroll", "direction": "right"}, {"action": "swipe", "coordinate": [810, 1200], "coordinate2": [270, 1200]}),
        ({"action_type": "scroll", "direction": "left"}, {"action": "swipe", "coordinate": [270, 1200], "coordinate2": [810, 1200]}),
        ({"action_type": "input_text", "text": "hi"}, {"action": "type", "text": "hi"}),
        ({"action_type": "open_app", "app_name": "Etsy"}, {"action": "open", "text": "Etsy"}),
        ({"action_type": "navigate_back"}, {"action": "system_button", "button": "Back"}),
        ({"action_type": "navigate_home"}, {"action": "system_button", "button": "Home"}),
        ({"action_type": "keyboard_enter"}, {"action": "system_button", "button": "Enter"}),
        ({"action_type": "wait"}, {"action": "wait", "time": 2}),
        ({"action_type": "status", "goal_status": "complete"}, {"action": "terminate", "status": "success"}),
        ({"action_type": "status", "goal_status": "infeasible"}, {"action": "terminate", "status": "failure"}),
        ({"action_type": "answer", "text": "42"}, {"action": "answer", "text": "42"}),
    ]
    rows = [native_row(7, k, gt) for k, (gt, _) in enumerate(gts)]
    [ep] = dataset.load_episodes(write(tmp_path, "n.json", rows))
    assert [s.action for s in ep.steps] == [want for _, want in gts]


def test_native_scroll_uses_recorded_size(tmp_path):
    row = native_row(1, 0, {"action_type": "scroll", "direction": "down"}) | {"image_size": [720, 1600]}
    [ep] = dataset.load_episodes(write(tmp_path, "n.json", [row]))
    assert ep.steps[0].action["coordinate"] == [360, 1200] and ep.steps[0].image_size == (720, 1600)


def test_native_grouping_order_and_goal(tmp_path):
    rows = [native_row(5, 2, {"action_type": "navigate_back"}, "c."), native_row(9, 0, {"action_type": "wait"}, "x"),
            native_row(5, 0, {"action_type": "open_app", "app_name": "A"}, "a."),
            native_row(5, 1, {"action_type": "click", "x": 1, "y": 2}, "b.")]
    eps = dataset.load_episodes(write(tmp_path, "n.json", rows))
    assert [e.episode_id for e in eps] == ["5", "9"]
    assert [s.step_instruction for s in eps[0].steps] == ["a.", "b.", "c."]  # sorted by screenshot index
    assert eps[0].goal == "a. b. c."  # no goal recorded: the joined step instructions
    rows[0]["goal"] = "The real goal"
    assert dataset.load_episodes(write(tmp_path, "n2.json", rows))[0].goal == "The real goal"


def test_native_step_gaps_are_never_joined(tmp_path, caplog):
    wait, back = {"action_type": "wait"}, {"action_type": "navigate_back"}
    rows = [native_row(7, k, wait, f"s{k}.") for k in (0, 1, 2, 4, 5)]  # step 3 missing
    rows += [native_row(8, k, back, f"t{k}.") for k in (1, 2)]         # step 0 missing
    rows += [native_row(9, k, wait) for k in (0, 1)]                    # complete
    with caplog.at_level("WARNING", logger="gui"):
        e7, e8, e9 = dataset.load_episodes(write(tmp_path, "gaps.json", rows))
    # 7: cut at its first gap (steps 0-2 kept; 4 and 5 do not follow 2); the goal still reads the whole task
    assert [s.step_instruction for s in e7.steps] == ["s0.", "s1.", "s2."] and e7.goal == "s0. s1. s2. s4. s5."
    assert e7.meta | {"format": None, "swipe_convention": None} == {
        "format": None, "swipe_convention": None, "steps_recorded": [0, 1, 2, 4, 5], "first_step": 0, "steps_dropped": 2}
    # 8: starts at its first recorded step; nothing after it is missing
    assert [s.step_instruction for s in e8.steps] == ["t1.", "t2."] and e8.meta["first_step"] == 1
    assert e8.meta["steps_dropped"] == 0
    assert len(e9.steps) == 2 and "steps_recorded" not in e9.meta
    assert "2 of 3 episodes skip step numbers" in caplog.text and "episode 7: steps 0-2, 4-5" in caplog.text
    assert "2 rows dropped" in caplog.text


def test_empty_step_instructions_are_absent(tmp_path):
    rows = [native_row(1, 0, {"action_type": "wait"}, "  "), native_row(1, 1, {"action_type": "wait"}, ""),
            native_row(1, 2, {"action_type": "wait"}, "go")]
    [e] = dataset.load_episodes(write(tmp_path, "ws.json", rows))
    assert [s.step_instruction for s in e.steps] == [None, None, "go"] and e.goal == "go"
    line = {"goal": "g", "steps": [{"action_content": {"action": "wait"}, "step_instruction": " \t\n"},
                                   {"action_content": {"action": "wait"}, "step_instruction": "tap"}]}
    [e] = dataset.load_episodes(write(tmp_path, "ws.jsonl", [line]))
    assert [s.step_instruction for s in e.steps] == [None, "tap"]


@pytest.mark.parametrize("rows, match", [
    ([native_row(1, 0, {"action_type": "teleport"})], r"row 0: field 'gt.action_type': unknown native action 'teleport'"),
    ([native_row(1, 0, {"action_type": "click"}), ], r"row 0: field 'gt.x/gt.y'"),
    ([native_row(1, 0, {"action_type": "wait"}), native_row(1, 1, {"action_type": "scroll", "direction": "in"})],
     r"row 1: field 'gt.direction'"),
    ([{"image": "shot.png", "gt": {"action_type": "wait"}}], r"row 0: field 'image'"),
    ([native_row(1, 0, {"action_type": "wait"}), native_row(1, 0, {"action_type": "wait"})], r"row 1: .*duplicate"),
])
def test_native_errors_name_file_row_and_field(tmp_path, rows, match):
    p = write(tmp_path, "bad.json", rows)
    with pytest.raises(dataset.DataError, match=match) as e:  # one error type for every data file
        dataset.load_episodes(p)
    assert str(p) in str(e.value)


# -----------------------------------------------------------------------------
# UI-S1 format errors

GOOD = {"goal": "g", "steps": [{"action_content": {"action": "wait", "time": 2}, "screenshot": "a.png"}]}


@pytest.mark.parametrize("line2, match", [
    ("{not json", r"line 2: field '<json>': invalid JSON"),
    (json.dumps({"steps": GOOD["steps"]}), r"line 2: field 'goal'"),
    (json.dumps({"goal": "g", "steps": []}), r"line 2: field 'steps'"),
    (json.dumps({"goal": "g", "steps": [{"action_content": {"action": "fly"}}]}),
     r"line 2: field 'steps\[0\].action_content': .*unknown action type 'fly'"),
    (json.dumps({"goal": "g", "steps": [GOOD["steps"][0], {"action_content": {"action": "click"}}]}),
     r"line 2: field 'steps\[1\].action_content': coordinate: missing"),
    (json.dumps({"goal": "g", "steps": [{"screenshot": "a.png"}]}), r"line 2: field 'steps\[0\].action_content': missing"),
    (json.dumps({"goal": "g", "steps": [{"action_content": {"action": "click", "coordinate": [1, 2]},
                                         "check_options": {"candidate_bbox": [[1, 2, 3]]}}]}),
     r"line 2: field 'steps\[0\].check_options.candidate_bbox\[0\]'"),
    (json.dumps(GOOD | {"image_size": [0, 5]}), r"line 2: field 'image_size'"),
])
def test_uis1_errors_name_file_line_and_field(tmp_path, line2, match):
    p = write(tmp_path, "bad.jsonl", json.dumps(GOOD) + "\n" + line2 + "\n")
    with pytest.raises(ValueError, match=match) as e:
        dataset.load_episodes(p)
    assert str(p) in str(e.value)


def test_a_json_list_is_read_as_native_rows(tmp_path):
    """A JSON list file is AndroidControl's native layout: a list of UI-S1 episodes is told to be JSONL,
    invalid JSON names its line, and an empty list holds no episode."""
    with pytest.raises(ValueError, match=r"uis1.json: row 0: unknown format: .*one per line in a JSONL "
                                         r"file; saw \['goal', 'steps'\]"):
        dataset.load_episodes(write(tmp_path, "uis1.json", [GOOD]))
    with pytest.raises(ValueError, match=r"cut.json: line 2: invalid JSON"):
        dataset.load_episodes(write(tmp_path, "cut.json", '[{"image": "a.png",\n'))
    assert dataset.load_episodes(write(tmp_path, "empty.json", [])) == []


def test_duplicate_episode_ids_and_limit(tmp_path):
    p = write(tmp_path, "dup.jsonl", [GOOD | {"episode_id": 3}, GOOD | {"episode_id": "3"}])
    with pytest.raises(ValueError, match="duplicate episode id '3'"):
        dataset.load_episodes(p)
    assert len(dataset.load_episodes(TEST_UIS1, limit=5)) == 5
    assert len(dataset.load_episodes(TEST_NATIVE, limit=5)) == 5


# -----------------------------------------------------------------------------
# MiniWob-style files and screenshots


def test_miniwob_format_and_relative_screenshots(tmp_path):
    (tmp_path / "shots").mkdir()
    Image.new("RGB", (160, 210), (255, 0, 0)).save(tmp_path / "shots" / "0.png")
    ep = {"goal": "Click the button.", "episode_id": "click-button-0", "task": "click-button", "seed": 0,
          "image_size": [160, 210],
          "steps": [{"action_content": {"action": "click", "coordinate": [80, 100]}, "screenshot": "shots/0.png",
                     "thought": "The button is in the middle.",
                     "elements": [{"role": "button", "text": "OK", "box": [60, 90, 100, 110]}],
                     "candidate_bbox": [[60, 90, 100, 110]]},
                    {"action_content": {"action": "terminate", "status": "success"}, "screenshot": "shots/1.png"}]}
    p = write(tmp_path, "train.jsonl", [ep])
    [e] = dataset.load_episodes(p)
    assert e.meta == {"task": "click-button", "seed": 0, "image_size": [160, 210]}
    s0, s1 = e.steps
    assert s0.image_size == (160, 210) and s0.thought.startswith("The button")
    assert s0.elements == '{"role": "button", "text": "OK", "box": [60, 90, 100, 110]}'
    assert s0.candidate_bbox == [[60, 90, 100, 110]]
    # relative path resolves against the jsonl's folder, whatever the working directory
    assert dataset.load_screenshot(s0).getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(FileNotFoundError, match="--blank-screens"):
        dataset.load_screenshot(s1)
    blank = dataset.load_screenshot(s1, blank_screens=(1080, 2400))
    assert blank.size == (160, 210) and blank.mode == "RGB"  # the recorded size wins over the blank size


def test_screenshot_resolution_with_image_root(tmp_path):
    (tmp_path / "imgs").mkdir()
    Image.new("L", (30, 40)).save(tmp_path / "imgs" / "8193_0.png")
    step = dataset.Step(screenshot="/datasets/AndroidControl/images/8193_0.png", action={"action": "wait"})
    with pytest.raises(FileNotFoundError, match="8193_0.png"):
        dataset.load_screenshot(step)
    im = dataset.load_screenshot(step, image_root=str(tmp_path / "imgs"))  # found by file name under the root
    assert im.size == (30, 40) and im.mode == "RGB"
    assert dataset.load_screenshot(step, blank_screens=(108, 240)).size == (108, 240)  # no recorded size


def test_native_loader_is_imported_only_for_a_native_file(tmp_path):
    """extras/android_control.py stands off the RL path: loading a UI-S1 file leaves it unimported, a
    native file imports it (and its rows load)."""
    import subprocess
    import sys

    native = write(tmp_path, "n.json", [native_row(3, 0, {"action_type": "wait"})])
    code = ("import sys, dataset\n"
            f"dataset.load_episodes({str(THOUGHT_UIS1)!r})\n"
            "print('extras.android_control' in sys.modules)\n"
            f"print(len(dataset.load_episodes({str(native)!r})), 'extras.android_control' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(dataset.__file__).parent, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "1", "True"]

"""Patch modes and the patch threshold (docs/method.md §5) against texts written out by hand.

The step's screenshot is 1080 x 2400 (W, H) as stored and 540 x 1200 as the model
saw it, so the expert click [500, 1000] (original pixels) must appear in every patch
as [250, 500] (resized pixels).
"""

import pytest

import dataset
import gui
from patch import (
    PATCH_MODES,
    check_patch_data,
    extract_thought,
    make_patch,
    on_policy_hint,
    on_policy_patches,
    clean_thought,
    should_patch,
)

ORIG, RESIZED = (1080, 2400), (540, 1200)
CLICK_RESIZED = '{"action": "click", "coordinate": [250, 500]}'

# the policy's wrong response: it clicked elsewhere; its thought is kept by thought-free
WRONG = '<think>\nI should open the settings menu.\n</think>\n<action>\n{"action": "click", "coordinate": [10, 20]}\n</action>'


def step(thought=None, action=None):
    return dataset.Step(
        screenshot="s0.png",
        action=action or {"action": "click", "coordinate": [500, 1000]},
        thought=thought,
        candidate_bbox=[[400, 900, 600, 1100]],
        image_size=ORIG,
    )


def episode(thoughts, eid="ep-42"):
    return dataset.Episode(goal="turn on wifi", episode_id=eid, steps=[step(t) for t in thoughts], source="data/x.jsonl")


# -----------------------------------------------------------------------------
# the four modes


def test_thought_free_keeps_policy_thought():
    out = make_patch("thought-free", response=WRONG, step=step(), orig_size=ORIG, resized_size=RESIZED)
    assert out == "<think>\nI should open the settings menu.\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>"


def test_thought_free_unparseable_response_gives_empty_thought():
    out = make_patch("thought-free", response="click somewhere", step=step(), orig_size=ORIG, resized_size=RESIZED)
    assert out == "<think>\n\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>"


def test_clean_thought_drops_think_tags_and_leaves_special_tokens_to_the_prompt():
    """Stray think tags would break the patch's think block; special tokens are chat.strip_special's, which
    chat.build_prompt applies to every history entry (tests/test_prompt.py), so the one stripper decides."""
    assert clean_thought("  scroll <think>down</think>\n") == "scroll down"
    assert clean_thought(None) == "" and clean_thought("") == ""
    wrong = "<think>\nscroll <|image_pad|>down\n</think>\n<action>\n{}\n</action>"
    out = make_patch("thought-free", response=wrong, step=step(), orig_size=ORIG, resized_size=RESIZED)
    assert out == "<think>\nscroll <|image_pad|>down\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>"


def test_empty_thought():
    out = make_patch("empty-thought", response=WRONG, step=step("expert says"), orig_size=ORIG, resized_size=RESIZED)
    assert out == "<think>\n\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>"


def test_off_policy_uses_dataset_thought():
    s = step("The Wi-Fi toggle is in the middle of the screen.")
    out = make_patch("off-policy", response=WRONG, step=s, orig_size=ORIG, resized_size=RESIZED)
    assert out == (
        "<think>\nThe Wi-Fi toggle is in the middle of the screen.\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>"
    )


def test_off_policy_missing_thought_names_episode():
    with pytest.raises(ValueError, match="ep-42"):
        make_patch("off-policy", response=WRONG, step=step(None), orig_size=ORIG, resized_size=RESIZED, episode_id="ep-42")
    with pytest.raises(ValueError, match="ep-42"):
        make_patch("off-policy", response=WRONG, step=step("  "), orig_size=ORIG, resized_size=RESIZED, episode_id="ep-42")
    # the up-front check names the episode, its file and the step
    check_patch_data("off-policy", [episode(["a", "b"], eid="ok")])
    with pytest.raises(ValueError, match=r"'ep-7' \(from data/x.jsonl\) has no thought at step 1"):
        check_patch_data("off-policy", [episode(["a", "b"], eid="ok"), episode(["a", None], eid="ep-7")])
    # other modes do not need thoughts
    check_patch_data("thought-free", [episode([None])])
    with pytest.raises(ValueError, match="patch mode"):
        check_patch_data("offpolicy", [])


def test_on_policy_from_generated_thought():
    gen = '<think>\nThe toggle is right there; tap it.\n</think>\n<action>\n{"action": "click", "coordinate": [1, 1]}\n</action>'
    want = "<think>\nThe toggle is right there; tap it.\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>"
    # the generated action is discarded: only the thought is kept, with the expert action; a bare thought too
    act = {"action": "click", "coordinate": [250, 500]}
    assert on_policy_patches(["p"], [act], lambda prompts: [gen]) == [want]
    assert on_policy_patches(["p"], [act], lambda prompts: ["The toggle is right there; tap it."]) == [want]
    with pytest.raises(ValueError, match="on_policy_patches"):  # made only by the batched path
        make_patch("on-policy", response=WRONG, step=step(), orig_size=ORIG, resized_size=RESIZED)


def test_on_policy_batched_generation_and_hint():
    a1 = {"action": "click", "coordinate": [250, 500]}
    a2 = {"action": "type", "text": "wifi"}
    assert on_policy_hint(a1) == (
        'Hint: the correct action for this step is {"action": "click", "coordinate": [250, 500]}. '
        "Think about why this action is the right next step toward the goal, "
        "then answer in the required format with exactly this action."
    )

    calls = []

    def generate(prompts):  # a scripted sampler: one call, one text per prompt
        calls.append(list(prompts))
        return ["<think>\nTap the toggle.\n</think>\n<action>\n{}\n</action>", "Type the name.<action>x</action>"]

    out = on_policy_patches(["p1", "p2"], [a1, a2], generate)
    assert calls == [["p1", "p2"]]
    assert out == [
        "<think>\nTap the toggle.\n</think>\n<action>\n" + CLICK_RESIZED + "\n</action>",
        '<think>\nType the name.\n</think>\n<action>\n{"action": "type", "text": "wifi"}\n</action>',
    ]
    assert on_policy_patches([], [], generate) == [] and len(calls) == 1  # nothing to patch: no call
    with pytest.raises(ValueError):
        on_policy_patches(["p1"], [a1], lambda prompts: [])
    with pytest.raises(ValueError):
        on_policy_patches(["p1"], [a1, a2], generate)


def test_extract_thought():
    assert extract_thought("<think>\n  a b \n</think><action>{}</action>") == "a b"
    assert extract_thought("plain text thought") == "plain text thought"
    assert extract_thought("before<action>{}</action>") == "before"


def test_swipe_patch_scales_both_points():
    s = step("swipe up", action={"action": "swipe", "coordinate": [540, 2000], "coordinate2": [540, 400]})
    out = make_patch("off-policy", response=WRONG, step=s, orig_size=ORIG, resized_size=RESIZED)
    assert out == (
        '<think>\nswipe up\n</think>\n<action>\n{"action": "swipe", "coordinate": [270, 1000], '
        '"coordinate2": [270, 200]}\n</action>'
    )
    # the patch parses back to the expert action in resized pixels
    assert gui.parse_response(out).action == {"action": "swipe", "coordinate": [270, 1000], "coordinate2": [270, 200]}


def test_unknown_mode():
    assert set(PATCH_MODES) == {"thought-free", "empty-thought", "off-policy", "on-policy"}
    with pytest.raises(ValueError, match="patch mode"):
        make_patch("expert", response=WRONG, step=step(), orig_size=ORIG, resized_size=RESIZED)


# -----------------------------------------------------------------------------
# threshold semantics


def test_should_patch_threshold_zero_never():
    assert [should_patch(n, 0) for n in range(3)] == [False, False, False]


def test_should_patch_threshold_one_once():
    assert [should_patch(n, 1) for n in range(3)] == [True, False, False]
    assert [should_patch(n, 2) for n in range(3)] == [True, True, False]  # release script: 2


def test_should_patch_unlimited():
    assert all(should_patch(n, -1) for n in (0, 1, 5, 1000))


def test_should_patch_rollout_walk():
    # a rollout wrong at every step of a 4-step episode: how many steps does it get, how many patches?
    def walk(threshold, n_steps=4):
        patches, steps = 0, 0
        for _ in range(n_steps):
            steps += 1
            if not should_patch(patches, threshold):
                break  # the rollout ends at this wrong step
            patches += 1
        return steps, patches

    assert walk(0) == (1, 0)
    assert walk(1) == (2, 1)
    assert walk(-1) == (4, 4)


def test_should_patch_bad_arguments():
    with pytest.raises(ValueError):
        should_patch(0, -2)
    with pytest.raises(ValueError):
        should_patch(-1, 1)

"""The UI-S1 release's SOP scoring as it ran (`--match-rules release`; docs/method.md §4): its parse,
its check and the exceptions its evaluation loop turned into progress 0, so that a figure can be put
next to the release's. Behind the flag: reward.action_match, reward.score_response and eval_sop
import this module only when rules == "release" (training with --match-rules release, or the
evaluator's), so the strict rules a learner reads stay alone on the RL path.
"""
from __future__ import annotations

import json

import numpy as np

from gui import _ACTION_RE, _THINK_RE  # the tags' patterns; the release searches them anywhere in the text
from gui import check_action, scale_action

RELEASE_TEXT_TYPES = ("type", "answer", "key", "open")  # checked by containment (answer, key: ours, see below)


def think_block(text) -> str | None:
    """The release's format check: the stripped text of the FIRST think block anywhere in `text`
    (None when there is none or `text` is not a string)."""
    m = _THINK_RE.search(text) if isinstance(text, str) else None
    return m.group(1).strip() if m else None


# The release's SOP scoring, as it ran (`--match-rules release`; docs/method.md §4). Read from the
# UI-S1 release's evaluation code (its SOP script and its action check) and written anew here:
# - parse: the FIRST <action>...</action> anywhere in the response, inside the thought too;
#   no closing tag or bad JSON raises;
# - check: the prediction's coordinate, coordinate2 (and candidate_bbox) keys are divided by the
#   resized screenshot's size whatever the action type, so any such key that is not a list of
#   numbers raises (an extra "coordinate": null on a wait); entries past the second are ignored
#   ([x, y, 0] is a point). Then by the expert's type: wait, swipe: the type alone (a swipe needs no
#   coordinates); system_button: same button, lower-cased and stripped; type, open: lower-cased,
#   stripped texts, one contained in the other; click, long_press: normalised distance <= 0.04.
#   Boxes are never used: the script replaced each step's check options by the expert action with
#   an empty box list (its evaluation file has no step-level boxes). A JSON that is not an object,
#   a missing "action", a missing or non-string button/text of the matching type, a missing
#   coordinate of a matching click raises;
# - the SOP loop runs each episode inside try/except: anything raised sets its progress to 0.
# The release's check has no rule for expert terminate, answer or key (it raises
# NotImplementedError; AndroidControl has none): here terminate is the type alone and answer/key
# containment, as type, so that MiniWob++ files can be scored at all.

class ReleaseError(ValueError):
    """A response on which the release's evaluation code raises: its SOP loop then sets the
    episode's progress to 0. The message says what the code trips on."""


def release_parse(text):
    """The release's parse: json.loads of the first <action>...</action> block anywhere in `text`
    (stripped). Returns the JSON value as is (any type). Raises ReleaseError: no closed block, bad JSON."""
    m = _ACTION_RE.search(text) if isinstance(text, str) else None
    if m is None:
        raise ReleaseError("no <action>...</action> block (no closing tag: the release's json.loads(None) raises)")
    try:
        return json.loads(m.group(1).strip())  # NaN and Infinity load, as in the release
    except (ValueError, RecursionError) as e:
        raise ReleaseError(f"invalid JSON in the action block: {e}") from None


def _release_div(v, size, name: str) -> list[float]:
    """[v[0] / size[0], v[1] / size[1], ...]: the release's normalisation of a point or box, which
    raises unless v is a list of (at least len(size)) numbers; bools are numbers there (True / W)."""
    if not isinstance(v, list) or len(v) < len(size):
        raise ReleaseError(f"{name}: {v!r} is not a list of {len(size)} numbers (the release indexes and divides it)")
    out = []
    for c, s in zip(v, size):
        if not isinstance(c, (int, float)):
            raise ReleaseError(f"{name}: {c!r} is not a number (the release divides it by {s})")
        try:
            out.append(c / s)
        except OverflowError:  # a JSON integer past the float range
            raise ReleaseError(f"{name}: {c!r} / {s} overflows a float") from None
    return out


def _release_str(raw: dict, key: str) -> str:
    if key not in raw:
        raise ReleaseError(f"no {key!r} key (the release reads it)")
    if not isinstance(raw[key], str):
        raise ReleaseError(f"{key}: {raw[key]!r} is not a string (the release lower-cases it)")
    return raw[key]


def release_check(raw, expert: dict, pred_size: tuple[int, int], expert_size: tuple[int, int],
                  distance: float) -> tuple[bool, bool]:
    """(type_match, match) of the release's SOP check (the comment above) for `raw`, the predicted
    action's JSON value as release_parse returns it, in pixels of an image of pred_size (W, H) (the
    resized screenshot), against the canonical expert action in pixels of expert_size (W, H); a
    click matches within normalised distance `distance` (reward.POINT_DISTANCE, 0.04, eq. 4.3).
    Raises ReleaseError exactly where the release's check raises."""
    if not isinstance(raw, dict):
        raise ReleaseError(f"the action JSON is a {type(raw).__name__}, not an object (the release indexes it by 'action')")
    pts = {}
    for key in ("coordinate", "coordinate2"):  # normalised first, whatever the action type
        if key in raw:
            pts[key] = _release_div(raw[key], pred_size, key)
    if "candidate_bbox" in raw:  # the release normalises a prediction's boxes too
        boxes = raw["candidate_bbox"]
        if isinstance(boxes, (str, dict)) and not boxes:  # iterates to nothing
            boxes = []
        if not isinstance(boxes, list):
            raise ReleaseError(f"candidate_bbox: {boxes!r} is not a list of boxes")
        for b in boxes:
            _release_div(b, (*pred_size, *pred_size), "candidate_bbox")
    if "action" not in raw:
        raise ReleaseError("no 'action' key (the release reads it)")
    kind = expert["action"]
    if raw["action"] != kind:  # (release: a click on an `open` step is checked against its boxes: none)
        return False, False
    if kind in ("wait", "swipe", "terminate"):
        return True, True
    if kind == "system_button":
        return True, _release_str(raw, "button").lower().strip() == expert["button"].lower().strip()
    if kind in RELEASE_TEXT_TYPES:
        p, e = _release_str(raw, "text").lower().strip(), expert["text"].lower().strip()
        return True, p in e or e in p  # "" is contained in everything
    if kind not in ("click", "long_press"):  # an action type the release never knew (a fork's new one)
        raise ReleaseError(f"no rule for expert action {kind!r} (the release raises NotImplementedError)")
    if "coordinate" not in raw:
        raise ReleaseError("no 'coordinate' key (the release reads it)")
    px, py = pts["coordinate"]
    ex, ey = expert["coordinate"][0] / expert_size[0], expert["coordinate"][1] / expert_size[1]
    return True, bool(np.linalg.norm([ex - px, ey - py]) <= distance)  # the release's norm, to the bit


def release_match(pred, expert: dict, image_size: tuple[int, int], distance: float) -> tuple[bool, bool]:
    """(match, type_match) of reward.action_match under rules="release": release_check with the
    prediction and the expert in the same pixels (image_size, (W, H)); `pred` is the raw JSON (any
    value), and one on which the release's code raises is (False, False)."""
    if not isinstance(pred, dict):
        return False, False
    try:
        type_match, match = release_check(pred, expert, image_size, image_size, distance)
    except ReleaseError:
        return False, False
    return match, type_match


def release_score(text: str, expert: dict, resized_size: tuple[int, int], orig_size: tuple[int, int],
                  distance: float) -> tuple[bool, dict | None, bool, bool, str | None]:
    """What reward.score_response needs of a response under rules="release": (format_ok, pred, match,
    type_match, error). format_ok: a non-empty first think block anywhere (think_block); pred: the
    action in original pixels where it is one of ours (gui.check_action; [x, y, 0] is not), else None;
    error: what the release's code trips on (ReleaseError's message; match and type_match False, pred
    None), else None. Truncation is not looked at: the release read the first action whatever followed."""
    format_ok = bool(think_block(text))
    try:
        raw = release_parse(text)
        type_match, match = release_check(raw, expert, resized_size, orig_size, distance)
    except ReleaseError as e:
        return format_ok, None, False, False, str(e)
    try:  # for reports: the action in original pixels
        pred = scale_action(check_action(raw), resized_size, orig_size)
    except (ValueError, TypeError):
        pred = None
    return format_ok, pred, match, type_match, None


def release_progress(progress: dict, records) -> dict:
    """The release's exception rule for SOP: its try/except around each episode's loop gave a rollout
    with a response on which its code raised (StepRecord.error under --match-rules release) progress
    0, however many steps were right before it. progress: rollout.sop_progress's, returned so ruled."""
    raised = {(r.task_idx, r.rollout_idx) for r in records if getattr(r, "error", None) is not None}
    return {key: (0 if key in raised else c, n) for key, (c, n) in progress.items()}

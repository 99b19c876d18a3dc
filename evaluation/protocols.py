"""The published step protocols' match rules (`eval_sop.py --protocol androidcontrol-high|-low|aitw`,
`--match-rules androidcontrol|aitw`): the rules other papers' tables were scored under, so a model's figure
can be set beside them. They live on the evaluator's side: the trainer's reward (reward.py) never reads
them; the evaluator passes a rule function to reward.score_response / reward.action_match (rules_of).

Each rule takes (pred, expert, candidate_bbox, image_size): both actions, the candidate boxes (x1, y1, x2, y2)
and the image size (W, H) in ONE pixel space, and returns (match, type_match) like reward.action_match.
- androidcontrol_match: the AndroidControl static check of the UI-S1 release's evaluation code (the check
  AgentCPM-GUI's evaluator and the Qwen2.5-VL report use for AndroidControl-High/-Low).
- aitw_match: google-research android_in_the_wild `action_matching.check_actions_match`, case for case
  (read from the source and written anew; its constants below).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import reward
import utils
from gui import action_types, swipe_direction


def _guarded(rule: Callable) -> Callable:
    """`rule` made safe on a bad prediction, as reward.action_match requires of a rule function: a
    pred without an "action" is (False, False), one on which the rule raises (a hand-made pred
    missing its fields) a mismatch of its type."""
    @functools.wraps(rule)
    def match(pred, expert, candidate_bbox, image_size) -> tuple[bool, bool]:
        if not isinstance(pred, dict) or "action" not in pred:
            return False, False
        try:
            return rule(pred, expert, candidate_bbox or [], image_size)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return False, pred.get("action") == expert["action"]
    return match


# -----------------------------------------------------------------------------
# AndroidControl

AC_BBOX_ENLARGE = 1.2     # AndroidControl: candidate boxes enlarged 1.2x about their centre
AC_POINT_DISTANCE = 0.04  # AndroidControl: pixel distance <= 0.04 x the image's LONGER side


def _contains(pred: str, expert: str) -> bool:
    """The AndroidControl text check: lower-cased, stripped, one contained in the other ("" in all)."""
    p, e = pred.lower().strip(), expert.lower().strip()
    return p in e or e in p


def _in_box(x, y, box, enlarge=1.0) -> bool:
    x1, y1, x2, y2 = box
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    hw, hh = (x2 - x1) * enlarge / 2, (y2 - y1) * enlarge / 2
    return cx - hw <= x <= cx + hw and cy - hh <= y <= cy + hh


def _ac_click(pt, boxes, expert_pt, image_size) -> bool:
    """Inside ANY candidate box enlarged AC_BBOX_ENLARGE, or within AC_POINT_DISTANCE x max(W, H) pixels."""
    if any(_in_box(pt[0], pt[1], b, AC_BBOX_ENLARGE) for b in boxes):
        return True
    return expert_pt is not None and math.hypot(pt[0] - expert_pt[0], pt[1] - expert_pt[1]) <= \
        AC_POINT_DISTANCE * max(image_size)


@_guarded
def androidcontrol_match(pred: dict, expert: dict, candidate_bbox, image_size) -> tuple[bool, bool]:
    """(match, type_match) under the AndroidControl step rules of the UI-S1 release's static
    evaluator (its `evaluate_android_control_action`; docs/method.md §8):
    - click, long_press: same type; the point inside any of the step's candidate boxes enlarged 1.2x
      about its centre, or within 0.04 x max(W, H) pixels of the expert point;
    - open: `open` with the texts one contained in the other (lower-cased, stripped), or a click on
      the first candidate box (the app icon) under the click rule, its centre as the point;
    - type (and answer, key, which the source has not): containment;  system_button: same button;
    - swipe: same dominant finger direction (ties vertical; a zero-length swipe is "up", as there);
    - wait, terminate: the type alone.
    Never raises: a prediction missing its fields is a mismatch (_guarded)."""
    kind, pk = expert["action"], pred["action"]
    if kind == "open" and pk == "click":
        if not candidate_bbox:
            return False, False
        b = candidate_bbox[0]
        return _ac_click(pred["coordinate"], candidate_bbox, ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2), image_size), True
    if pk != kind:
        return False, False
    if kind in action_types("point"):
        return _ac_click(pred["coordinate"], candidate_bbox, expert["coordinate"], image_size), True
    if kind in action_types("text"):
        return _contains(pred["text"], expert["text"]), True
    if kind == "system_button":
        return pred["button"].lower().strip() == expert["button"].lower().strip(), True
    if kind == "swipe":
        d = lambda a: swipe_direction(a["coordinate"], a["coordinate2"]) or "up"  # noqa: E731
        return d(pred) == d(expert), True
    return True, True  # wait, terminate


# -----------------------------------------------------------------------------
# AITW (google-research android_in_the_wild/action_matching.py and action_type.py)

AITW_TAP_DISTANCE = 0.14    # _TAP_DISTANCE_THRESHOLD: taps within 0.14 of the screen (normalised (y, x))
AITW_BOX_AUGMENT = 1.4      # ANNOTATION_{WIDTH,HEIGHT}_AUGMENT_FRACTION: a box grows by 1.4x its size (to 2.4x)
AITW_SWIPE_DISTANCE = 0.04  # _SWIPE_DISTANCE_THRESHOLD: a touch-to-lift move of at most 0.04 is a tap
# our system buttons -> AITW's action types (action_type.ActionType); Menu has none there
_AITW_BUTTONS = {"back": "PRESS_BACK", "home": "PRESS_HOME", "enter": "PRESS_ENTER"}


def aitw_action(action: dict) -> tuple[str, tuple, tuple]:
    """(AITW action type, touch (x, y), lift (x, y)) of one of our actions, points in its pixels:
    click, long_press, swipe -> DUAL_POINT (a click's lift is its touch); type -> TYPE; system_button
    Back / Home / Enter -> PRESS_BACK / PRESS_HOME / PRESS_ENTER; terminate -> STATUS_TASK_COMPLETE, or
    STATUS_TASK_IMPOSSIBLE with status "failure". AITW has no wait, open, answer, key or Menu: each is its
    own type (lower-case name), so it matches only itself, as any non-dual-point type does there."""
    kind = action["action"]
    if kind in action_types("point") or kind == "swipe":
        touch = tuple(action["coordinate"])
        return "DUAL_POINT", touch, tuple(action["coordinate2"]) if kind == "swipe" else touch
    if kind == "type":
        return "TYPE", (-1, -1), (-1, -1)
    if kind == "system_button":
        b = action["button"].strip().lower()
        return _AITW_BUTTONS.get(b, f"press_{b}"), (-1, -1), (-1, -1)
    if kind == "terminate":
        failed = action.get("status") == "failure"
        return ("STATUS_TASK_IMPOSSIBLE" if failed else "STATUS_TASK_COMPLETE"), (-1, -1), (-1, -1)
    return kind, (-1, -1), (-1, -1)


def _aitw_box(box, image_size):
    """A candidate box (x1, y1, x2, y2) in pixels -> AITW's enlarged box (top, left, height, width),
    normalised: grown by AITW_BOX_AUGMENT x its height and width about its centre, the top-left
    clipped at 0 and the height and width capped at 1, as the source's _resize_annotation_bounding_boxes."""
    w, h = image_size
    top, left, bh, bw = box[1] / h, box[0] / w, (box[3] - box[1]) / h, (box[2] - box[0]) / w
    dh, dw = AITW_BOX_AUGMENT * bh, AITW_BOX_AUGMENT * bw
    return max(0.0, top - dh / 2), max(0.0, left - dw / 2), min(1.0, bh + dh), min(1.0, bw + dw)


def _delta(a, b, image_size) -> tuple[float, float]:
    """(dy, dx) from pixel point a to b, normalised by (H, W) (differences first: the edges stay exact)."""
    return (b[1] - a[1]) / image_size[1], (b[0] - a[0]) / image_size[0]


def _is_tap(touch, lift, image_size) -> bool:
    return math.hypot(*_delta(touch, lift, image_size)) <= AITW_SWIPE_DISTANCE


@_guarded
def aitw_match(pred: dict, expert: dict, candidate_bbox, image_size) -> tuple[bool, bool]:
    """(match, type_match) of AITW's check_actions_match (Rawles et al. 2023; docs/method.md §8), in
    normalised (y, x) (aitw_action maps our actions to its types):
    - either action not DUAL_POINT: the AITW types alone (Home is not Back, a failed terminate is not a
      successful one, a typed text is never compared); type_match = match;
    - a tap (touch-to-lift <= 0.04) against a swipe: no match, type_match False;
    - tap vs tap: both touches inside one element box grown by 1.4x (_aitw_box), or within 0.14;
    - swipe vs swipe: the same main axis (argmax of |dy|, |dx|; a tie is y, as numpy's argmax): the
      source compares no sign, so opposite swipes along one axis match.
    Steps without element boxes compare taps by distance alone (the source's max over no box is undefined).
    Never raises: a prediction missing its fields is a mismatch (_guarded)."""
    tp, p_touch, p_lift = aitw_action(pred)
    te, e_touch, e_lift = aitw_action(expert)
    if tp != "DUAL_POINT" or te != "DUAL_POINT":
        return tp == te, tp == te
    tap = _is_tap(p_touch, p_lift, image_size)
    if tap != _is_tap(e_touch, e_lift, image_size):
        return False, False
    if tap:
        if math.hypot(*_delta(p_touch, e_touch, image_size)) <= AITW_TAP_DISTANCE:
            return True, True
        (w, h) = image_size
        for top, left, bh, bw in (_aitw_box(b, image_size) for b in candidate_bbox):
            inside = lambda p: top <= p[1] / h <= top + bh and left <= p[0] / w <= left + bw  # noqa: E731
            if inside(p_touch) and inside(e_touch):
                return True, True
        return False, True
    axis = lambda t, l: int(abs(_delta(t, l, image_size)[0]) < abs(_delta(t, l, image_size)[1]))  # noqa: E731
    return axis(p_touch, p_lift) == axis(e_touch, e_lift), True


# -----------------------------------------------------------------------------
# the rule sets by name, as eval_sop and report take them

PROTOCOL_RULES = {"androidcontrol": androidcontrol_match, "aitw": aitw_match}
MATCH_RULES = reward.MATCH_RULES + tuple(PROTOCOL_RULES)  # every --match-rules name of the evaluator


def rules_of(name: str) -> str | Callable:
    """What reward.score_response / reward.action_match take as `rules` for a --match-rules name: the
    reward's own names ("strict", "release") as they are, a protocol's name as its rule function.
    Raises ValueError on an unknown name."""
    if name in PROTOCOL_RULES:
        return PROTOCOL_RULES[name]
    if name not in reward.MATCH_RULES:
        raise ValueError(f"rules: expected one of {MATCH_RULES}, got {name!r}")
    return name


def check_protocol_data(named_protocol: str | None, episodes, paths) -> None:
    """Raises utils.UsageError when a named protocol cannot run as named on the loaded episodes:
    androidcontrol-low on data without any step instruction would run as High and be labelled Low."""
    if named_protocol == "androidcontrol-low" and not any((s.step_instruction or "").strip()
                                                          for ep in episodes for s in ep.steps):
        raise utils.UsageError(f"--protocol androidcontrol-low: {', '.join(map(str, paths))} has no step "
                               "instructions (steps[].step_instruction): -Low shows them; use androidcontrol-high")

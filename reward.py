"""The rule reward of one step (docs/method.md §4): the one module a forker changes to change the reward.

score_response: the reward (eq. 4.1-4.2); action_match: "is the step right", THE match of patching,
returns and SOP, one strict rule per kind of argument (RULES, named by gui.ACTIONS); action_score:
the action term given that match; shaped_reward: what the trainer adds. The release's rules
(--match-rules release) are extras/release.py; the published protocols' are passed in as a function
(evaluation/protocols.py). Pure Python, no torch.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from gui import ACTIONS, outside_point, parse_response, scale_action, swipe_direction

# eq. 4.1: r = FORMAT_WEIGHT * s_format + ACTION_WEIGHT * s_action (paper and release: 0.1, 0.9)
FORMAT_WEIGHT = 0.1
ACTION_WEIGHT = 0.9
# eq. 4.2: s_action of a full match, of the right type with wrong arguments, of a wrong type (release)
SCORE_MATCH = 1.0
SCORE_TYPE_ONLY = 0.5
SCORE_WRONG_TYPE = 0.1
BBOX_ENLARGE = 1.2          # release: candidate boxes enlarged 1.2x about their centre
POINT_DISTANCE = 0.04       # release: normalised distance threshold for clicks (eq. 4.3)

# Two rule sets, one function (action_match). "strict" (the default everywhere: reward, patching,
# returns, SOP, static metrics) is built so that trivial policies score near zero while legitimate
# near-hits still match; "release" reproduces the UI-S1 release's SOP scoring as it ran, exceptions
# included (extras/release.py), so a figure can be put next to the paper's. Why each strict rule:
# - clicks: the release accepts a point inside ANY candidate box enlarged 1.2x, and whole-screen
#   containers are candidate boxes, so a constant centre click matches. Strict keeps only the
#   TARGET's box, the smallest candidate box holding the expert point, and only if it covers
#   <= MAX_BOX_FRACTION of the screen (a full-width list row of 240 px on a 1080x2400 phone still
#   counts); else distance alone.
# - texts: containment lets a one-letter text match most type steps. Strict compares texts after
#   Unicode normalisation (normalize_text) by token F1 >= TEXT_F1 over lower-cased whitespace tokens
#   with edge punctuation stripped (an e-mail address or URL is ONE token, so "com" cannot farm
#   them): "Chrome" for "Google Chrome" is F1 2/3, a match; an empty expert text matches only an
#   empty prediction. Function words name nothing (the constant "the" has F1 0.5 against "The
#   Weather Channel"), so the F1 is over CONTENT tokens (STOP_WORDS removed), falling back to all
#   tokens only when the expert text has no content token ("For Her").
# - the end of a response: only the first action is read, so a response that repeats its right
#   action until the token cap, or adds a second one, would earn the full reward and put its junk in
#   the history: strict requires a response to end after its action (score_response, truncated).
# The floors these rules give on the shipped test files: `python eval_sop.py baselines --data FILE`
# (README "Reward rules and floors"; how the rules came about, with figures: results/LOG.md).

MATCH_RULES = ("strict", "release")  # by name; the published step protocols' rules: evaluation/protocols.py
MAX_BOX_FRACTION = 0.10     # strict: a target box covering more of the screen than this is not used
TEXT_F1 = 0.5               # strict: token F1 threshold for type/answer/key/open

# typographic variants folded before NFKC (NFKC alone keeps curly quotes and turns the acute accent
# U+00B4, used as an apostrophe in AndroidControl texts, into a space and a combining accent)
_QUOTE_FOLD = str.maketrans(dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u00b4\u0060\u02bc\u02b9\uff07", "'")
                            | dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb\uff02", '"'))


def normalize_text(text: str) -> str:
    """The form in which texts are compared: quote variants folded to ' and ", NFKC, invisible format
    characters (Unicode category Cf: soft hyphen, zero-width, bidi marks) removed, lower-cased,
    whitespace collapsed and stripped. 'Audio\\u00admack' -> 'audiomack'."""
    t = unicodedata.normalize("NFKC", text.translate(_QUOTE_FOLD))
    t = "".join(c for c in t if unicodedata.category(c) != "Cf")
    return " ".join(t.lower().split())


def text_tokens(text: str) -> list[str]:
    """Word tokens of normalize_text(text): whitespace-separated, punctuation and symbols (Unicode P*,
    S*) stripped at their edges, empty ones dropped ("Hello, world!" -> ["hello", "world"];
    "a.b@c.com" stays one)."""
    out = []
    for w in normalize_text(text).split():
        w = w.strip("".join(c for c in w if unicodedata.category(c)[0] in "PS"))  # the word's own P*, S*
        if w:
            out.append(w)
    return out


# Function words (English): articles, the commonest prepositions and conjunctions, possessive
# determiners. Alone they name nothing, so the strict text rule scores content tokens only. Kept
# small on purpose: every word here is one a real name may also hold ("Bank of America" still
# matches on "bank america").
STOP_WORDS = frozenset(("a", "an", "the", "of", "to", "in", "on", "at", "for", "from", "with", "by",
                        "into", "as", "and", "or", "my", "your", "his", "her", "its", "our", "their",
                        "this", "that"))


def content_tokens(text: str) -> list[str]:
    """text_tokens(text) without STOP_WORDS ("The Weather Channel" -> ["weather", "channel"])."""
    return [t for t in text_tokens(text) if t not in STOP_WORDS]


def text_f1(pred: str, expert: str) -> float:
    """SQuAD-style token F1 (multiset overlap) of pred against expert, in [0, 1], over CONTENT
    tokens, or over all tokens when the expert's are all stop words ("for her app" against "For
    Her": 0.8). Texts with no word tokens score 1.0 when their normalised forms are equal, else 0.0:
    so equal normalised forms always score 1.0, and an empty text scores 0.0 against any other."""
    p, e = text_tokens(pred), text_tokens(expert)
    if not p or not e:
        return float(normalize_text(pred) == normalize_text(expert))
    e_content = [t for t in e if t not in STOP_WORDS]
    if e_content:  # a prediction of stop words alone has no content token: F1 0
        p, e = [t for t in p if t not in STOP_WORDS], e_content
    common = sum((Counter(p) & Counter(e)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(e)
    return 2 * prec * rec / (prec + rec)


def _in_box(x, y, box, enlarge=1.0) -> bool:
    x1, y1, x2, y2 = box
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    hw, hh = (x2 - x1) * enlarge / 2, (y2 - y1) * enlarge / 2
    return cx - hw <= x <= cx + hw and cy - hh <= y <= cy + hh


def target_box(expert_pt, candidate_bbox, image_size: tuple[int, int]) -> list | None:
    """The strict rules' target: the smallest candidate box (x1, y1, x2, y2) that contains the
    expert point, if it covers at most MAX_BOX_FRACTION of the image (W, H); else None."""
    inside = [b for b in candidate_bbox or () if _in_box(expert_pt[0], expert_pt[1], b)]
    if not inside:
        return None
    box = min(inside, key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))
    w, h = image_size
    return box if (box[2] - box[0]) * (box[3] - box[1]) <= MAX_BOX_FRACTION * w * h else None


def action_match(pred: dict | None, expert: dict, candidate_bbox, image_size: tuple[int, int], *,
                 rules: str | Callable = "strict") -> tuple[bool, bool]:
    """(match, type_match) of a predicted action against the expert's: THE match of reward,
    patching, returns, SOP and static metrics (docs/method.md §4). Actions, candidate boxes
    (x1, y1, x2, y2) and image_size (W, H) in the SAME pixel space. rules "strict": the expert
    type's rule in RULES (a hand-made pred missing its fields: a mismatch); "release": the release's
    check (extras/release.py; pred: its raw JSON); or a function of these four arguments that never
    raises on a bad pred, None included (evaluation/protocols.py). Raises ValueError on unknown rules."""
    if rules == "release":  # the release's check: an optional module, imported only when asked
        from extras.release import release_match
        return release_match(pred, expert, image_size, POINT_DISTANCE)
    if callable(rules):
        return rules(pred, expert, candidate_bbox or [], image_size)
    if rules != "strict":
        raise ValueError(f"rules: expected one of {MATCH_RULES} or a rule function, got {rules!r}")
    if pred is None or pred.get("action") != expert["action"]:
        return False, False
    try:  # KeyError too: an expert type no longer registered (a fork's) matches nothing
        ok = RULES[ACTIONS[expert["action"]].rule](pred, expert, candidate_bbox, image_size)
    except (KeyError, TypeError, ValueError, AttributeError):  # a hand-made pred dict missing its fields
        ok = False
    return bool(ok), True



# The strict rules, one per kind of argument (gui.ACTIONS[kind].rule names one). Each takes the
# predicted and expert actions (same type), the candidate boxes and the image size (W, H), all in
# the same pixel space, and returns the full match. A new rule is a function here and a RULES entry.

def rule_type(pred, expert, candidate_bbox, image_size) -> bool:
    """wait, terminate: the type alone."""
    return True


def rule_button(pred, expert, candidate_bbox, image_size) -> bool:
    """system_button: the same button, case-insensitive."""
    return pred["button"].strip().lower() == expert["button"].strip().lower()


def rule_text(pred, expert, candidate_bbox, image_size) -> bool:
    """type, answer, key, open: content-token F1 >= TEXT_F1 (text_f1: equal normalised forms
    match; an empty expert text matches only an empty prediction)."""
    return text_f1(pred["text"], expert["text"]) >= TEXT_F1


def rule_direction(pred, expert, candidate_bbox, image_size) -> bool:
    """swipe: the same dominant finger direction (a zero-length swipe has none)."""
    d = swipe_direction(pred["coordinate"], pred["coordinate2"])
    return d is not None and d == swipe_direction(expert["coordinate"], expert["coordinate2"])


def rule_point(pred, expert, candidate_bbox, image_size) -> bool:
    """click, long_press: eq. 4.3 distance, or inside the target box enlarged BBOX_ENLARGE."""
    (x, y), e, (w, h) = pred["coordinate"], expert["coordinate"], image_size
    if math.hypot((x - e[0]) / w, (y - e[1]) / h) <= POINT_DISTANCE:  # hypot: no overflow on absurd points
        return True
    box = target_box(e, candidate_bbox, image_size)
    return box is not None and _in_box(x, y, box, BBOX_ENLARGE)


RULES = {"type": rule_type, "button": rule_button, "text": rule_text, "direction": rule_direction,
         "point": rule_point}


def action_score(pred: dict | None, expert: dict, candidate_bbox, image_size: tuple[int, int], *,
                 match: bool, type_match: bool) -> float:
    """s_action of eq. 4.2, in [0, 1], of a well-formed response given action_match's verdict (match,
    type_match; the other arguments as its, in original pixels; pred None under the release's parse).
    The one place for partial credit (e.g. by a click's distance): the reward changes, the match not."""
    return SCORE_MATCH if match else (SCORE_TYPE_ONLY if type_match else SCORE_WRONG_TYPE)


@dataclass
class Score:
    reward: float       # 0.1 * format + 0.9 * action score; 0 when the response is malformed
    match: bool         # full match: the step is "right"
    type_match: bool
    format_ok: bool     # non-empty think block
    action: dict | None  # the parsed action in ORIGINAL pixels (None when nothing valid parsed)
    error: str | None = None  # why the response is malformed (reward 0); None when well-formed


def score_response(text: str, step, *, resized_size: tuple[int, int], orig_size: tuple[int, int],
                   rules: str | Callable = "strict", truncated: bool = False) -> Score:
    """The rule reward of one step (docs/method.md §4), the one function used everywhere. text: a
    response in pixels of the resized screenshot (W, H) = resized_size; the step's expert action and
    boxes in original pixels, orig_size = (W, H); truncated: the sampler stopped at its token cap.
    Malformed (reward 0, match False, error says why): under the strict rules (or a rule function) a
    response that does not END after its action (truncated, or text after the first </action>) or
    has a point off the resized screenshot; under "release", one on which the release's code raises
    (extras/release.py). Never raises on a response; ValueError for unknown rules."""
    if not callable(rules) and rules not in MATCH_RULES:
        raise ValueError(f"rules: expected one of {MATCH_RULES} or a rule function, got {rules!r}")
    if rules == "release":  # the release's parse and check: an optional module, imported only when asked
        from extras.release import release_score
        format_ok, pred, match, type_match, error = release_score(text, step.action, resized_size, orig_size,
                                                                  POINT_DISTANCE)
        if error is not None:
            return Score(0.0, False, False, format_ok, None, error)
    else:
        p = parse_response(text)
        format_ok = bool(p.thought)
        pred = None if p.action is None else scale_action(p.action, resized_size, orig_size)
        error = "cut at the token cap" if truncated else p.error
        off = outside_point(p.action, resized_size) if error is None else None  # no error: an action parsed
        if off is not None:  # no click at the screen's edge: a point the device cannot touch is malformed
            error = f"a point off the screenshot: {off} outside {resized_size[0]}x{resized_size[1]} (resized pixels)"
        if error is not None:
            return Score(0.0, False, False, format_ok, pred, error)
        match, type_match = action_match(pred, step.action, step.candidate_bbox, orig_size, rules=rules)
    act = action_score(pred, step.action, step.candidate_bbox, orig_size, match=match, type_match=type_match)
    return Score(FORMAT_WEIGHT * float(format_ok) + ACTION_WEIGHT * act, match, type_match, format_ok, pred)


# -----------------------------------------------------------------------------
# Reward shaping: what the trainer adds to score_response's reward (nothing by default)

def shaped_reward(reward: float, length: int, *, max_new_tokens: int, overlong_buffer: int = 0) -> float:
    """The reward the trainer's returns use for one response of `length` tokens (stop token
    included): score_response's `reward` (eq. 4.1) plus every shaping term; a reward fork that is not
    a match rule goes here. Today DAPO's soft overlong penalty (Yu et al. 2025, eq. 13;
    --overlong-buffer B > 0): 0 up to max_new_tokens - B tokens, then linearly down to -1 at the cap."""
    if overlong_buffer <= 0 or length <= max_new_tokens - overlong_buffer:
        return reward
    return reward + max(-1.0, (max_new_tokens - overlong_buffer - length) / overlong_buffer)

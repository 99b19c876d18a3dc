"""The GUI agent's action interface: what every stage needs to talk about screens and actions.

1. the action space and the response format of docs/method.md §3 (parse_response never raises);
2. coordinates: Qwen2.5-VL smart_resize, mapping actions between original and resized pixels;
3. the match and rule reward of docs/method.md §4: action_match / score_response, the ONE function
   that decides "wrong step" in rollout, patching, returns and SOP, under the strict rules or the
   release's (`--match-rules release`).
Episodes and screenshots are dataset.py; how a step becomes a prompt is chat.py.

Conventions (read these before touching coordinates):
- sizes are always (W, H); smart_resize alone keeps Qwen's (height, width) order, as upstream.
- an action dict is the release's JSON, e.g. {"action": "click", "coordinate": [x, y]}. Expert
  actions (dataset.Step.action) are in ORIGINAL screenshot pixels; model responses are in pixels of
  the RESIZED screenshot the model saw (chat.Prompt.resized_size). score_response maps between the two.
- swipe: coordinate -> coordinate2 is the path of the FINGER. AndroidControl's native `scroll`
  `direction` is the direction the *content* moves, i.e. opposite to the finger: a native
  "scroll down" becomes a finger swipe upwards when loaded. The UI-S1 release files already store
  finger swipes. (The release converted only up/down; its horizontal swipes keep the native
  direction, so its 133 left/right test swipes disagree with our native conversion. Each file is
  self-consistent, which is all a match needs.)
"""

from __future__ import annotations

import json
import logging
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

# -----------------------------------------------------------------------------
# Action space (docs/method.md §3)

ACTION_TYPES = ("click", "long_press", "swipe", "type", "answer", "key", "system_button", "open", "wait", "terminate")
SYSTEM_BUTTONS = ("Back", "Home", "Menu", "Enter")
TEXT_ACTIONS = ("type", "answer", "key", "open")
BBOX_ENLARGE = 1.2          # release: candidate boxes enlarged 1.2x about their centre
POINT_DISTANCE = 0.04       # release: normalised distance threshold for clicks
MIN_PIXELS = 4 * 28 * 28        # release defaults for smart_resize
MAX_PIXELS = 12800 * 28 * 28
MAX_COORD = 1e6             # |coordinate| beyond this is malformed output (it would overflow int() once scaled)

# required arguments per action type: (name, kind)
_ARGS = {
    "click": (("coordinate", "point"),),
    "long_press": (("coordinate", "point"),),
    "swipe": (("coordinate", "point"), ("coordinate2", "point")),
    "type": (("text", "str"),), "answer": (("text", "str"),), "key": (("text", "str"),), "open": (("text", "str"),),
    "system_button": (("button", "str"),),
    "wait": (), "terminate": (),
}
# optional arguments kept when present and well-typed
_OPTIONAL = {"long_press": (("time", "num"),), "wait": (("time", "num"),), "terminate": (("status", "str"),)}


def as_number(v):
    """A finite float from a JSON number (bools and huge ints rejected), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def check_action(action, *, strict: bool = False) -> dict:
    """Validate an action dict and return its canonical copy (only the known keys). Raises ValueError
    naming the bad field. strict=True (used for dataset actions) also requires a known system button
    and rounds coordinates to int pixels; model outputs keep their numbers and any button string
    (a wrong button is a type-only match, 0.5, as in the release)."""
    if not isinstance(action, dict):
        raise ValueError(f"action: expected a JSON object, got {type(action).__name__}")
    kind = action.get("action")
    if kind not in ACTION_TYPES:
        raise ValueError(f"action: unknown action type {kind!r} (known: {', '.join(ACTION_TYPES)})")
    out = {"action": kind}
    for name, typ in _ARGS[kind] + _OPTIONAL.get(kind, ()):
        required = (name, typ) in _ARGS[kind]
        if name not in action:
            if required:
                raise ValueError(f"{name}: missing for action {kind!r}")
            continue
        v = action[name]
        if typ == "point":
            xy = [as_number(c) for c in v] if isinstance(v, (list, tuple)) and len(v) == 2 else None
            if xy is None or None in xy or max(abs(c) for c in xy) > MAX_COORD:
                raise ValueError(f"{name}: expected [x, y] numbers within +-{MAX_COORD:g}, got {v!r}")
            out[name] = [int(round(c)) for c in xy] if strict else list(v)
        elif typ == "str" and isinstance(v, str):
            out[name] = v
        elif typ == "num" and as_number(v) is not None:
            out[name] = v
        elif required:  # an ill-typed optional argument (wait time "2") is dropped, not fatal
            raise ValueError(f"{name}: expected a {'string' if typ == 'str' else 'number'}, got {v!r}")
    if strict and kind == "system_button":
        match = [b for b in SYSTEM_BUTTONS if b.lower() == out["button"].strip().lower()]
        if not match:
            raise ValueError(f"button: expected one of {SYSTEM_BUTTONS}, got {out['button']!r}")
        out["button"] = match[0]
    return out


# -----------------------------------------------------------------------------
# Parsing and formatting of model responses

@dataclass
class Parsed:
    thought: str | None  # the think block's text, stripped; None when there is no think block
    action: dict | None  # canonical action dict; None when nothing valid parsed
    error: str | None = None  # why the response is malformed under the strict rules; None: well-formed


_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL)
# what may follow the action block of a well-formed response: whitespace, and the stop tokens written
# out (a recorded response may keep them; the sampler's text has special tokens skipped)
_END_RE = re.compile(r"(?:\s|<\|im_end\|>|<\|endoftext\|>)*\Z")


def parse_response(text) -> Parsed:
    """Parse `<think>\\n...\\n</think>\\n<action>\\n{json}\\n</action>`. Never raises: anything
    malformed (no action block, bad JSON, unknown type, missing or ill-typed argument) gives
    action=None. Whitespace around tags and JSON is tolerated; the action block is looked for after
    the think block, so an <action> quoted inside the thought is not taken for the answer.

    error: None for a well-formed response (the strict rules' reward needs one), else why not:
    "no action block", "invalid action" (bad JSON, unknown type, missing or ill-typed argument), or
    "text after </action>": a response must END after its action (whitespace and written-out stop
    tokens aside), so one that loops, or adds a second action, is malformed even though its first
    action parsed (action keeps that first action, for reports and history summaries)."""
    if not isinstance(text, str):
        return Parsed(None, None, "no action block")
    think = _THINK_RE.search(text)
    thought = think.group(1).strip() if think else None
    m = _ACTION_RE.search(text, think.end() if think else 0)
    if m is None:
        return Parsed(thought, None, "no action block")
    try:
        action = check_action(json.loads(m.group(1).strip()))
    except (ValueError, TypeError, RecursionError):  # JSONDecodeError is a ValueError
        return Parsed(thought, None, "invalid action")
    return Parsed(thought, action, None if _END_RE.match(text, m.end()) else "text after </action>")


def format_response(thought: str | None, action: dict) -> str:
    """The model-response text of an action (SFT targets, patches, expert replay). A None thought
    writes an empty think block, as the release does for thought-free patches."""
    body = json.dumps(action, ensure_ascii=False)
    return f"<think>\n{(thought or '').strip()}\n</think>\n<action>\n{body}\n</action>"


# -----------------------------------------------------------------------------
# Coordinates: smart_resize and mapping between original and resized pixels

def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Qwen2.5-VL's resize rule, (height, width) in and out as upstream: both sides multiples of
    `factor`, pixel count within [min_pixels, max_pixels], aspect ratio kept as far as possible.
    Unlike a naive round, no side can become 0 (docs/method.md §11)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"smart_resize: non-positive size (height={height}, width={width})")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"smart_resize: aspect ratio over 200 (height={height}, width={width})")
    h_bar = round(height / factor) * factor  # may be 0 here: then the min_pixels branch scales up
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return max(factor, h_bar), max(factor, w_bar)  # upstream's result, guarded for min_pixels ~ 0


def resized_size(size: tuple[int, int], *, factor: int = 28, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(W, H) of an image of size (W, H) as the model sees it (smart_resize in (W, H) order)."""
    h, w = smart_resize(size[1], size[0], factor, min_pixels, max_pixels)
    return w, h


def scale_action(action: dict, src_size: tuple[int, int], dst_size: tuple[int, int]) -> dict:
    """Map coordinate/coordinate2 from an image of src_size (W, H) to one of dst_size (W, H),
    rounding to int pixels. Other keys are copied."""
    sx, sy = dst_size[0] / src_size[0], dst_size[1] / src_size[1]
    out = dict(action)
    for k in ("coordinate", "coordinate2"):
        if k in out:
            x, y = out[k]
            out[k] = [int(round(x * sx)), int(round(y * sy))]
    return out


def expert_response(step, orig_size: tuple[int, int], resized: tuple[int, int] | None = None,
                    thought: str | None = None, *, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> str:
    """The expert action of `step` written as a model response in pixels of the resized screenshot
    (W, H) = resized, or, when it is None, of smart_resize(orig_size) under min/max_pixels."""
    if resized is None:
        resized = resized_size(orig_size, min_pixels=min_pixels, max_pixels=max_pixels)
    return format_response(thought, scale_action(step.action, orig_size, resized))


def parse_size(text) -> tuple[int, int]:
    """'WxH' (e.g. '1080x2400', as --blank-screens and --image-size take it) -> (W, H); a (W, H)
    pair parsed already passes through. Raises ValueError naming the text."""
    try:
        w, h = (int(v) for v in (text if isinstance(text, (tuple, list)) else str(text).lower().split("x")))
    except ValueError:
        raise ValueError(f"expected a size WxH such as 1080x2400, got {text!r}") from None
    if w <= 0 or h <= 0:
        raise ValueError(f"expected a positive size WxH, got {text!r}")
    return w, h


# -----------------------------------------------------------------------------
# Match and rule reward (docs/method.md §4)
#
# Two rule sets, one function (action_match). "strict" (the default everywhere: reward, patching,
# returns, SOP, static metrics) is built so that trivial policies score near zero on the shipped
# AndroidControl test file while legitimate near-hits still match; "release" reproduces the UI-S1
# release's SOP scoring as it ran, exceptions included (release_check, below), so a figure can be
# put next to the paper's. Measured on the
# 1,262 test episodes (`python eval_sop.py baselines --data FILE`, README "Reward rules and
# trivial-policy floors"):
# - clicks. The release accepts a point inside ANY candidate box enlarged 1.2x; 26% of those boxes
#   cover > 10% of the screen (whole-screen containers), so an always-centre click matched 26.1% of
#   click steps and a uniform random one 22.6%. Strict keeps only the TARGET's box, the smallest
#   candidate box that contains the expert point, and only if it covers <= 10% of the screen
#   (a full-width list row of 240 px on a 1080x2400 phone still counts); else distance alone.
#   Centre 3.9%, random 3.1%; distance alone (the release's rules) gives 2.5% and 0.5%.
# - texts. Containment let the constant "a" match 81% of type steps. Strict compares texts after
#   Unicode normalisation (normalize_text) by token F1 >= 0.5 over lower-cased whitespace tokens
#   with edge punctuation stripped (an e-mail address or URL is ONE token, so "com" cannot farm
#   them): "Chrome" for "Google Chrome" is F1 2/3, a match; an empty expert text matches only an
#   empty prediction. Function words carry no name: over all tokens the constant "the" had F1 0.5
#   against three-word names ("The Weather Channel") and matched 1.2% of the test file's `open`
#   steps (5.3% on held-back episodes), so the F1 is over CONTENT tokens (STOP_WORDS removed; now
#   0.0%), falling back to all tokens only when the expert text has no content token ("For Her").
# - the end of a response. Only the first action is read, so a response that repeated its right
#   action until the token cap, or added a second one, earned the full reward and put its junk in
#   the history: strict requires a response to end after its action (score_response, truncated).

MATCH_RULES = ("strict", "release")
MAX_BOX_FRACTION = 0.10     # strict: a target box covering more of the screen than this is not used
TEXT_F1 = 0.5               # strict: token F1 threshold for type/answer/key/open

# typographic variants folded before NFKC (NFKC alone keeps curly quotes and turns the acute accent
# U+00B4, used as an apostrophe in AndroidControl texts, into a space and a combining accent)
_QUOTE_FOLD = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
                             "\u0060": "'", "\u02bc": "'", "\u02b9": "'", "\uff07": "'",
                             "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
                             "\u00ab": '"', "\u00bb": '"', "\uff02": '"'})


def normalize_text(text: str) -> str:
    """The form in which texts are compared: quote and apostrophe variants folded to ' and ",
    NFKC (full-width forms, ligatures, non-breaking spaces), invisible format characters removed
    (soft hyphen, zero-width spaces and joiners, BOM, bidi marks: Unicode category Cf), lower-cased,
    runs of whitespace collapsed to one space, stripped. 'Audio\\u00admack' -> 'audiomack'."""
    t = unicodedata.normalize("NFKC", text.translate(_QUOTE_FOLD))
    t = "".join(c for c in t if unicodedata.category(c) != "Cf")
    return " ".join(t.lower().split())


def text_tokens(text: str) -> list[str]:
    """Word tokens of normalize_text(text): whitespace-separated, leading/trailing punctuation
    stripped, empty tokens dropped ("Hello, world!" -> ["hello", "world"]; "a.b@c.com" stays one)."""
    out = []
    for w in normalize_text(text).split(" "):
        i, j = 0, len(w)
        while i < j and unicodedata.category(w[i])[0] in "PS":
            i += 1
        while j > i and unicodedata.category(w[j - 1])[0] in "PS":
            j -= 1
        if i < j:
            out.append(w[i:j])
    return out


# Function words (English): articles, the commonest prepositions and conjunctions, possessive
# determiners. Alone they name nothing, so the strict text rule scores content tokens only. Kept
# small on purpose: every word here is one a real name may also hold ("Bank of America" still
# matches on "bank america").
STOP_WORDS = frozenset((
    "a", "an", "the",
    "of", "to", "in", "on", "at", "for", "from", "with", "by", "into", "as",
    "and", "or",
    "my", "your", "his", "her", "its", "our", "their", "this", "that",
))


def content_tokens(text: str) -> list[str]:
    """text_tokens(text) without STOP_WORDS ("The Weather Channel" -> ["weather", "channel"])."""
    return [t for t in text_tokens(text) if t not in STOP_WORDS]


def text_f1(pred: str, expert: str) -> float:
    """SQuAD-style token F1 (multiset overlap) of pred against expert, in [0, 1], over CONTENT
    tokens (content_tokens: stop words removed), so "the" scores 0 against "The Weather Channel"
    and "Chrome" 2/3 against "Google Chrome". An expert text whose tokens are all stop words is
    compared over all its tokens ("for her app" against "For Her" is 0.8). Texts with no word tokens
    (empty, or punctuation only) score 1.0 when their normalised forms are equal, else 0.0."""
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


def swipe_direction(start, end) -> str | None:
    """Dominant direction of the finger moving from start to end; ties go vertical (release);
    a zero-length swipe has no direction (the release called it 'up')."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    if dx == 0 and dy == 0:
        return None
    if abs(dx) > abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def _text_match(pred: str, expert: str) -> bool:
    """The strict text rule: normalize_text forms equal, or content-token F1 >= TEXT_F1."""
    p, e = normalize_text(pred), normalize_text(expert)
    if p == e:
        return True
    if not e or not p:  # an empty expert text matches only an empty prediction, and vice versa
        return False
    return text_f1(pred, expert) >= TEXT_F1


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


def _point_match(pt, expert_pt, candidate_bbox, image_size) -> bool:
    x, y = pt
    w, h = image_size
    # math.hypot: no overflow on absurd coordinates from a model
    if math.hypot((x - expert_pt[0]) / w, (y - expert_pt[1]) / h) <= POINT_DISTANCE:
        return True
    box = target_box(expert_pt, candidate_bbox, image_size)
    return box is not None and _in_box(x, y, box, BBOX_ENLARGE)


def action_match(pred: dict | None, expert: dict, candidate_bbox, image_size: tuple[int, int], *,
                 rules: str = "strict") -> tuple[bool, bool]:
    """(match, type_match) of a predicted action against the expert's: THE match function of reward,
    patching, returns, SOP and static metrics. Both actions, the candidate boxes (x1, y1, x2, y2) and
    image_size (W, H) are in the SAME pixel space; swipes are finger paths.
    rules="strict" (default):
    - wait, terminate: the type alone;  system_button: same button, case-insensitive;
    - type/answer/key/open: normalize_text forms equal, or content-token F1 >= TEXT_F1 (0.5,
      text_f1: stop words alone match nothing); an empty expert text matches only an empty prediction;
    - swipe: same dominant finger direction;
    - click/long_press: normalised Euclidean distance to the expert point <= 0.04, or inside the
      target box (target_box: smallest box holding the expert point, <= 10% of the screen)
      enlarged 1.2x about its centre.
    rules="release": release_check, the UI-S1 release's SOP check as it ran (docs/method.md §4):
    clicks by distance alone, texts by containment, any swipe; `pred` is its raw JSON (any dict),
    and a prediction on which the release's code raises is (False, False) here (score_response
    reports it as Score.error, the SOP walk zeroes the episode's progress).
    Raises ValueError on unknown rules."""
    if rules not in MATCH_RULES:
        raise ValueError(f"rules: expected one of {MATCH_RULES}, got {rules!r}")
    if rules == "release":
        if not isinstance(pred, dict):
            return False, False
        try:
            type_match, match = release_check(pred, expert, image_size, image_size)
        except ReleaseError:
            return False, False
        return match, type_match
    if pred is None or pred.get("action") != expert["action"]:
        return False, False
    kind = expert["action"]
    try:
        if kind in ("wait", "terminate"):
            ok = True
        elif kind == "system_button":
            ok = pred["button"].strip().lower() == expert["button"].strip().lower()
        elif kind in TEXT_ACTIONS:
            ok = _text_match(pred["text"], expert["text"])
        elif kind == "swipe":
            d = swipe_direction(pred["coordinate"], pred["coordinate2"])
            ok = d is not None and d == swipe_direction(expert["coordinate"], expert["coordinate2"])
        elif kind in ("click", "long_press"):
            ok = _point_match(pred["coordinate"], expert["coordinate"], candidate_bbox, image_size)
        else:
            ok = False
    except (KeyError, TypeError, ValueError, AttributeError):  # a hand-made pred dict missing its fields
        ok = False
    return bool(ok), True


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


def release_check(raw, expert: dict, pred_size: tuple[int, int], expert_size: tuple[int, int]) -> tuple[bool, bool]:
    """(type_match, match) of the release's SOP check (the comment above) for `raw`, the predicted
    action's JSON value as release_parse returns it, in pixels of an image of pred_size (W, H) (the
    resized screenshot), against the canonical expert action in pixels of expert_size (W, H).
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
    if kind in TEXT_ACTIONS:
        p, e = _release_str(raw, "text").lower().strip(), expert["text"].lower().strip()
        return True, p in e or e in p  # "" is contained in everything
    if "coordinate" not in raw:  # click, long_press
        raise ReleaseError("no 'coordinate' key (the release reads it)")
    px, py = pts["coordinate"]
    ex, ey = expert["coordinate"][0] / expert_size[0], expert["coordinate"][1] / expert_size[1]
    return True, bool(np.linalg.norm([ex - px, ey - py]) <= POINT_DISTANCE)  # the release's norm, to the bit


@dataclass
class Score:
    reward: float       # 0.1 * format + 0.9 * action score; 0 when the response is malformed
    match: bool         # full match: the step is "right"
    type_match: bool
    format_ok: bool     # non-empty think block
    action: dict | None  # the parsed action in ORIGINAL pixels (None when nothing valid parsed)
    error: str | None = None  # why the response is malformed (reward 0); None when well-formed


def score_response(text: str, step, *, resized_size: tuple[int, int], orig_size: tuple[int, int],
                   rules: str = "strict", truncated: bool = False) -> Score:
    """The rule reward of one step (docs/method.md §4), the one function used everywhere.
    `text` is a model response with coordinates in pixels of the resized screenshot (W, H) =
    resized_size; the step's expert action and boxes are in original pixels, orig_size = (W, H)
    (original_size(step) decides it). truncated: the sampler stopped at its token cap instead of a
    stop token (rollout: SampleOutput.finish_reason != "stop"; `score`: a recorded finish_reason).

    rules="strict": a response is well-formed only if it ENDS after its action: not truncated, and
    nothing but whitespace after the first </action> (parse_response's error). A malformed response
    scores 0 with match False, error saying why; so looping to the cap, or a second action after
    the first, earns nothing. rules="release": the release's parse and check (release_parse,
    release_check); truncation is not looked at (the release read the first action whatever
    followed); a response on which the release's code raises scores 0 with error = what it trips
    on (eval_sop then sets the episode's SOP progress to 0, as the release did). Never raises."""
    if rules == "release":
        think = _THINK_RE.search(text) if isinstance(text, str) else None  # the release: first anywhere
        format_ok = bool(think and think.group(1).strip())
        try:
            raw = release_parse(text)
            type_match, match = release_check(raw, step.action, resized_size, orig_size)
        except ReleaseError as e:
            return Score(0.0, False, False, format_ok, None, str(e))
        try:  # for reports: the action in original pixels, where it is one of ours ([x, y, 0] is not)
            pred = scale_action(check_action(raw), resized_size, orig_size)
        except (ValueError, TypeError):
            pred = None
    else:
        if rules not in MATCH_RULES:
            raise ValueError(f"rules: expected one of {MATCH_RULES}, got {rules!r}")
        p = parse_response(text)
        format_ok = bool(p.thought)
        pred = None if p.action is None else scale_action(p.action, resized_size, orig_size)
        error = "cut at the token cap" if truncated else p.error
        if error is not None:
            return Score(0.0, False, False, format_ok, pred, error)
        match, type_match = action_match(pred, step.action, step.candidate_bbox, orig_size, rules=rules)
    act = 1.0 if match else (0.5 if type_match else 0.1)
    return Score(0.1 * float(format_ok) + 0.9 * act, match, type_match, format_ok, pred)

"""The GUI agent's interface: everything every stage needs to talk about screens and actions.

One module, used by train_sft.py, rollout.py, patch.py, train_semionline.py and eval_sop.py:

1. the action space and the response format of docs/method.md §3 (parse_response never raises);
2. coordinates: Qwen2.5-VL smart_resize, mapping actions between original and resized pixels;
3. the match and rule reward of docs/method.md §4: action_match / score_response, the ONE function
   that decides "wrong step" in rollout, patching, returns and SOP;
4. episodes: the UI-S1 JSONL format and AndroidControl's native per-step JSON, screenshots;
5. prompts: the Qwen2.5-VL chat template with image pads expanded, history as text, the last K
   screenshots as images, and a token budget that summarises the oldest turns instead of failing.

Conventions (read these before touching coordinates):
- sizes are always (W, H); smart_resize alone keeps Qwen's (height, width) order, as upstream.
- an action dict is the release's JSON, e.g. {"action": "click", "coordinate": [x, y]}. Expert
  actions (Step.action) are in ORIGINAL screenshot pixels; model responses are in pixels of the
  RESIZED screenshot the model saw (Prompt.resized_size). score_response maps between the two.
- swipe: coordinate -> coordinate2 is the path of the FINGER. AndroidControl's native `scroll`
  `direction` is the direction the *content* moves, i.e. opposite to the finger: a native
  "scroll down" becomes a finger swipe upwards when loaded. The UI-S1 release files already store
  finger swipes. (The release converted only up/down; its horizontal swipes keep the native
  direction, so its 133 left/right test swipes disagree with our native conversion. Each file is
  self-consistent, which is all a match needs.)

Why one module of about 1,000 lines, past the 700 a stage file aims at: the five parts above are
one contract. Parsing, the coordinate maps, the match and the prompt must agree to the pixel with
the episodes' conventions, and every stage imports them together; split, the conventions would
have to be restated in each part. The largest part, episode loading (two file formats, errors that
name file, line and field), is the one to move to its own module if this one grows further.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

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
ANDROID_CONTROL_SIZE = (1080, 2400)  # (W, H) of AndroidControl phones where a native row records no size

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


def _num(v):
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
            xy = [_num(c) for c in v] if isinstance(v, (list, tuple)) and len(v) == 2 else None
            if xy is None or None in xy or max(abs(c) for c in xy) > MAX_COORD:
                raise ValueError(f"{name}: expected [x, y] numbers within +-{MAX_COORD:g}, got {v!r}")
            out[name] = [int(round(c)) for c in xy] if strict else list(v)
        elif typ == "str" and isinstance(v, str):
            out[name] = v
        elif typ == "num" and _num(v) is not None:
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


def expert_response(step: "Step", orig_size: tuple[int, int], resized: tuple[int, int] | None = None,
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


def score_response(text: str, step: "Step", *, resized_size: tuple[int, int], orig_size: tuple[int, int],
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


# -----------------------------------------------------------------------------
# Episodes

@dataclass
class Step:
    screenshot: str | None                 # path as recorded (absolute, or relative to the data file's folder)
    action: dict                           # expert action, ORIGINAL pixels, canonical (check_action strict)
    step_instruction: str | None = None    # low-level instruction (AndroidControl-Low)
    thought: str | None = None             # expert thought (off-policy-thought patches)
    candidate_bbox: list[list[int]] = field(default_factory=list)  # (x1, y1, x2, y2) original pixels
    image_size: tuple[int, int] | None = None  # (W, H) original, if recorded
    elements: str | None = None            # element list text (accessibility tree), if recorded
    root: str | None = None                # folder of the data file: relative screenshots resolve here
    where: str | None = None               # "file: line N: steps[k]" (or "file: row N"), for error messages


@dataclass
class Episode:
    goal: str
    episode_id: str
    steps: list[Step]
    source: str                            # data file path
    meta: dict = field(default_factory=dict)  # other episode-level fields (MiniWob: task, seed, ...)


_NATIVE_IMAGE_RE = re.compile(r"episode_(\w+?)-screenshot_(\d+)\.\w+$")


class DataError(ValueError):
    """A data file that cannot be read as episodes, or a step whose recorded size disagrees with its
    screenshot: the message names file, line (or row) and field. Scripts report it in one line."""


class _Where:
    """Error context: file and line (JSONL) or row index (JSON list)."""

    def __init__(self, path, kind, idx):
        self.path, self.kind, self.idx = path, kind, idx

    def error(self, fld, msg) -> DataError:
        return DataError(f"{self.path}: {self.kind} {self.idx}: field {fld!r}: {msg}")

    def __str__(self):
        return f"{self.path}: {self.kind} {self.idx}"


def _size(v, where, fld):
    if v is None:
        return None
    ok = isinstance(v, (list, tuple)) and len(v) == 2
    if not ok or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in v):
        raise where.error(fld, f"expected [W, H] positive ints, got {v!r}")
    return (v[0], v[1])


def _boxes(v, where, fld):
    if v is None:
        return []
    if isinstance(v, (list, tuple)) and len(v) == 4 and all(_num(c) is not None for c in v):
        v = [v]  # a single box (the release's `len(...) == 4` case)
    if not isinstance(v, (list, tuple)):
        raise where.error(fld, f"expected a list of [x1, y1, x2, y2] boxes, got {v!r}")
    out = []
    for i, b in enumerate(v):
        if not isinstance(b, (list, tuple)) or len(b) != 4 or any(_num(c) is None for c in b):
            raise where.error(f"{fld}[{i}]", f"expected [x1, y1, x2, y2] numbers, got {b!r}")
        if b[2] < b[0] or b[3] < b[1]:  # such a box can never contain a point: no step could match on it
            raise where.error(f"{fld}[{i}]", f"reversed corners (x2 < x1 or y2 < y1): {b!r}")
        if b[2] == b[0] or b[3] == b[1]:
            raise where.error(f"{fld}[{i}]", f"empty box (zero width or height): {b!r}")
        out.append(list(b))
    return out


def _text(v, where, fld):
    if v is None or isinstance(v, str):
        return v
    raise where.error(fld, f"expected a string, got {v!r}")


def _instruction(v, where, fld):
    """A step instruction: a string, or None; an empty or whitespace-only one is absent (None), so no
    prompt gets an empty "Step instruction:" line."""
    v = _text(v, where, fld)
    return v if v is not None and v.strip() else None


def _elements(v, where, fld):
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):  # one element per line: role, text, box as the producer wrote them
        return "\n".join(e if isinstance(e, str) else json.dumps(e, ensure_ascii=False) for e in v)
    raise where.error(fld, f"expected a string or a list, got {type(v).__name__}")


# How a UI-S1-format file stores swipes (coordinate -> coordinate2), per data source:
# - "finger": the finger's path (our convention; thought_example_uis1.jsonl: "Swipe up to scroll down");
# - "scroll": the scroll direction, opposite to the finger on both axes (android_control_train_example:
#   19/19 vertical swipes "down" where the same episode in the thought file swipes up);
# - "mixed": vertical swipes as the finger, horizontal ones as the scroll direction (the release's
#   AndroidControl evaluation file: it reversed only up/down of the native rows; read this way, all
#   956 of its swipes agree with the native file's).
# Loaded actions are always finger paths. A file with swipes must declare its convention (argument,
# or a "swipe_convention" field per episode) unless it is one of the shipped files below (sha256).
SWIPE_CONVENTIONS = ("finger", "scroll", "mixed")
KNOWN_SWIPE_CONVENTIONS = {
    "d2b3b7607dd6a312d173867ab38c5f5575b43b2f361b2d450ba4cd31919a1de3": "mixed",   # android_control_test_uis1.jsonl
    "d59eec2c0d32d60f6d2e1f2eca6c23ec3477c31be6849f906dd336399785350e": "scroll",  # android_control_train_example_uis1
    "0b9ad0200432b372c1544b08bd9f2857333fe1626bbdfa35446e65a94aa5f00a": "finger",  # thought_example_uis1.jsonl
}


def _to_finger(action: dict, convention: str) -> dict:
    """A stored swipe -> the finger's path under `convention` (reversing the path flips its direction)."""
    d = swipe_direction(action["coordinate"], action["coordinate2"])
    if convention == "scroll" or (convention == "mixed" and d in ("left", "right")):
        return {**action, "coordinate": action["coordinate2"], "coordinate2": action["coordinate"]}
    return action


def _check_points(action: dict, size, where, fld):
    """Expert points must lie in the recorded image (W, H) (1 px slack); one that lies outside but
    inside (H, W) means image_size was written (H, W)."""
    if size is None:
        return
    w, h = size
    for k in ("coordinate", "coordinate2"):
        if k in action:
            x, y = action[k]
            if not (-1 <= x <= w + 1 and -1 <= y <= h + 1):
                hint = ("; image_size looks (H, W)-swapped: write [W, H]"
                        if -1 <= x <= h + 1 and -1 <= y <= w + 1 else "")
                raise where.error(f"{fld}.{k}", f"point {[x, y]} lies outside the recorded image_size "
                                  f"{w}x{h} (W x H){hint}")


def _uis1_episode(obj, where, path, root, default_id, swipe_convention=None) -> Episode:
    """One episode of the UI-S1 release format (also MiniWob's, which adds task/seed/image_size and
    per-step thought/elements). swipe_convention: the file's, None if undeclared."""
    if not isinstance(obj, dict):
        raise where.error("<episode>", f"expected a JSON object, got {type(obj).__name__}")
    if "steps" not in obj and ("gt" in obj or "image" in obj):
        raise where.error("steps", f"missing: this line looks like a native AndroidControl step (keys {sorted(obj)}); "
                          "native files are one JSON list of such rows")
    goal = obj.get("goal")
    if not isinstance(goal, str):
        raise where.error("goal", f"expected a string, got {goal!r}")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise where.error("steps", "expected a non-empty list")
    ep_size = _size(obj.get("image_size"), where, "image_size")
    declared = obj.get("swipe_convention")
    if declared is not None and declared not in SWIPE_CONVENTIONS:
        raise where.error("swipe_convention", f"expected one of {SWIPE_CONVENTIONS}, got {declared!r}")
    convention = swipe_convention or declared
    out = []
    for k, s in enumerate(steps):
        f = f"steps[{k}]"
        if not isinstance(s, dict):
            raise where.error(f, "expected a JSON object")
        if "action_content" not in s:
            raise where.error(f"{f}.action_content", "missing")
        raw = s["action_content"]
        try:
            action = check_action(raw, strict=True)
        except ValueError as e:
            raise where.error(f"{f}.action_content", str(e)) from None
        if action["action"] == "swipe":
            if action["coordinate"] == action["coordinate2"]:
                raise where.error(f"{f}.action_content", f"zero-length swipe {action['coordinate']} -> "
                                  f"{action['coordinate2']}: it has no direction, no prediction could match it")
            if convention is None:
                raise where.error("swipe_convention", "the file stores swipes but declares no convention: pass "
                                  f"swipe_convention (eval_sop.py --swipe-convention) one of {SWIPE_CONVENTIONS}, or "
                                  "add \"swipe_convention\" to each episode (see gui.SWIPE_CONVENTIONS)")
            action = _to_finger(action, convention)
        size = _size(s.get("image_size"), where, f"{f}.image_size") or ep_size
        _check_points(action, size, where, f"{f}.action_content")
        check = s.get("check_options") or {}
        if not isinstance(check, dict):
            raise where.error(f"{f}.check_options", "expected a JSON object")
        if "candidate_bbox" in s:
            boxes = _boxes(s["candidate_bbox"], where, f"{f}.candidate_bbox")
        elif "candidate_bbox" in check:
            boxes = _boxes(check["candidate_bbox"], where, f"{f}.check_options.candidate_bbox")
        else:  # the train file puts one box on the action itself
            boxes = _boxes(raw.get("bbox") if isinstance(raw, dict) else None, where, f"{f}.action_content.bbox")
        shot = s.get("screenshot")
        if shot is not None and not isinstance(shot, str):
            raise where.error(f"{f}.screenshot", f"expected a path string, got {shot!r}")
        out.append(Step(
            screenshot=shot, action=action,
            step_instruction=_instruction(s.get("step_instruction"), where, f"{f}.step_instruction"),
            thought=_text(s.get("thought"), where, f"{f}.thought"),
            candidate_bbox=boxes, image_size=size,
            elements=_elements(s.get("elements"), where, f"{f}.elements"),
            root=root, where=f"{where}: {f}"))
    ep_id = obj.get("episode_id", default_id)
    if isinstance(ep_id, bool) or not isinstance(ep_id, (str, int)):
        raise where.error("episode_id", f"expected a string or int, got {ep_id!r}")
    meta = {k: v for k, v in obj.items() if k not in ("goal", "steps", "episode_id")}
    if convention is not None:
        meta["swipe_convention"] = convention
    return Episode(goal=goal, episode_id=str(ep_id), steps=out, source=path, meta=meta)


def _native_action(gt, where, size) -> dict:
    """AndroidControl's native action -> our action space. Scroll direction is the CONTENT's
    direction; the finger moves the opposite way (see module docstring)."""
    if not isinstance(gt, dict):
        raise where.error("gt", "expected a JSON object")
    kind = gt.get("action_type")
    w, h = size

    def pt():
        x, y = _num(gt.get("x")), _num(gt.get("y"))
        if x is None or y is None:
            raise where.error("gt.x/gt.y", f"expected numbers for {kind!r}, got x={gt.get('x')!r} y={gt.get('y')!r}")
        return [int(round(x)), int(round(y))]

    def txt(key):
        v = gt.get(key)
        if not isinstance(v, str):
            raise where.error(f"gt.{key}", f"expected a string for {kind!r}, got {v!r}")
        return v

    if kind == "click":
        return {"action": "click", "coordinate": pt()}
    if kind == "long_press":
        return {"action": "long_press", "coordinate": pt(), "time": 2}
    if kind == "scroll":
        d = gt.get("direction")
        # finger path for each content direction; the release's points (W/2, H/4) <-> (W/2, 3H/4)
        top, bottom = [w // 2, h // 4], [w // 2, 3 * h // 4]
        left, right = [w // 4, h // 2], [3 * w // 4, h // 2]
        paths = {"down": (bottom, top), "up": (top, bottom), "right": (right, left), "left": (left, right)}
        if d not in paths:
            raise where.error("gt.direction", f"expected up/down/left/right, got {d!r}")
        a, b = paths[d]
        return {"action": "swipe", "coordinate": a, "coordinate2": b}
    if kind == "input_text":
        return {"action": "type", "text": txt("text")}
    if kind == "open_app":
        return {"action": "open", "text": txt("app_name")}
    if kind == "navigate_back":
        return {"action": "system_button", "button": "Back"}
    if kind == "navigate_home":
        return {"action": "system_button", "button": "Home"}
    if kind == "keyboard_enter":
        return {"action": "system_button", "button": "Enter"}
    if kind == "wait":
        return {"action": "wait", "time": 2}
    if kind == "answer":
        return {"action": "answer", "text": txt("text")}
    if kind == "status":  # AndroidWorld-style terminal action
        s = gt.get("goal_status")
        if s not in ("complete", "infeasible", "successful", "success", "failure"):
            raise where.error("gt.goal_status", f"unknown status {s!r}")
        return {"action": "terminate", "status": "success" if s in ("complete", "successful", "success") else "failure"}
    raise where.error("gt.action_type", f"unknown native action {kind!r}")


def _native_episodes(rows, path, root) -> list[Episode]:
    """AndroidControl native rows (one per step, image episode_<id>-screenshot_<k>.png) grouped into
    episodes in order of first appearance, steps sorted by k. The file records no episode goal: the
    goal is the episode's step instructions joined, those of rows dropped at a gap included (so it
    reads like AndroidControl-Low's plan of the whole task).

    Step gaps. An episode is walked (SOP, static, rollouts) step after step, each step's screen the
    result of the one before, so steps are never joined across a missing number: an episode is the
    run of consecutive step numbers from its first recorded one, and the rows after its first gap
    are dropped (episode 1364 of the shipped test file, steps 0-4, 6, 7, keeps 0-4: no policy can be
    asked for step 5, and step 6's screen does not follow step 4's). An episode whose first recorded
    step is not 0 starts there. Its meta records what happened: "steps_recorded" (the step numbers
    in the file), "first_step", "steps_dropped" (rows after the gap); one warning per file counts
    them. The shipped test file: 225 of 1,262 episodes affected (9 start at step 1), 835 of 6,434
    rows dropped; expert replay stays PG = TSR = 1.0 on what is kept. (Every number it misses is a
    wait or long_press step, which that export lacks; the UI-S1 file of the same episodes has them.)"""
    groups: dict[str, dict[int, Step]] = {}
    goals: dict[str, str] = {}  # a goal, where a row carries one (other exports of the format do)
    for i, row in enumerate(rows):
        where = _Where(path, "row", i)
        if not isinstance(row, dict):
            raise where.error("<row>", f"expected a JSON object, got {type(row).__name__}")
        img = row.get("image")
        m = _NATIVE_IMAGE_RE.search(img) if isinstance(img, str) else None
        if m is None:
            raise where.error("image", f"expected a name like episode_<id>-screenshot_<k>.png, got {img!r}")
        size = _size(row.get("image_size", row.get("img_size")), where, "image_size")
        action = _native_action(row.get("gt"), where, size or ANDROID_CONTROL_SIZE)
        _check_points(action, size, where, "gt")
        ep, k = m.group(1), int(m.group(2))
        if k in groups.setdefault(ep, {}):
            raise where.error("image", f"duplicate step {k} of episode {ep}")
        groups[ep][k] = Step(screenshot=img, action=action, step_instruction=_instruction(row.get("task"), where, "task"),
                             candidate_bbox=_boxes(row.get("candidate_bbox"), where, "candidate_bbox"),
                             image_size=size, root=root, where=str(where))
        if isinstance(row.get("goal"), str) and row["goal"]:
            goals.setdefault(ep, row["goal"])
    out, gapped = [], []
    for ep, by_k in groups.items():
        ks = sorted(by_k)
        run = 1
        while run < len(ks) and ks[run] == ks[run - 1] + 1:
            run += 1
        steps = [by_k[k] for k in ks[:run]]
        meta = {"format": "android_control_native", "swipe_convention": "native scroll direction"}
        if run < len(ks) or ks[0] != 0:
            meta.update(steps_recorded=ks, first_step=ks[0], steps_dropped=len(ks) - run)
            gapped.append((ep, ks, len(ks) - run))
        # the goal is the whole task's, as a recorded goal would be: every recorded row's instruction
        goal = goals.get(ep) or " ".join(by_k[k].step_instruction.strip() for k in ks if by_k[k].step_instruction)
        out.append(Episode(goal=goal, episode_id=ep, steps=steps, source=path, meta=meta))
    if gapped:
        ep, ks, _ = gapped[0]
        logger.warning("%s: %d of %d episodes skip step numbers or start after step 0 (e.g. episode %s: steps %s); "
                       "each is cut at its first gap, %d rows dropped (gui._native_episodes)", path, len(gapped),
                       len(out), ep, _ranges(ks), sum(n for *_, n in gapped))
    return out


def _ranges(ks: list[int]) -> str:
    """Sorted ints as runs: [0, 1, 2, 3, 4, 6, 7] -> '0-4, 6-7'."""
    runs, start = [], ks[0]
    for a, b in zip(ks, ks[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else f"{a}")
            start = b
    return ", ".join(runs)


def load_episodes(path: str, *, limit: int | None = None, swipe_convention: str | None = None) -> list[Episode]:
    """Load episodes from a UI-S1 JSONL file (one episode per line; MiniWob files too), a JSON list
    of such episodes, or AndroidControl's native per-step JSON list (rows with image/gt/task).
    Any malformed line or unknown action raises DataError (a ValueError) naming file, line (or row) and field:
    also boxes with reversed corners, zero-length expert swipes, expert points outside a recorded
    image_size (with a hint when it looks (H, W)-swapped), and swipes in a file whose swipe
    convention is neither given (swipe_convention, one of SWIPE_CONVENTIONS; it overrides a
    per-episode "swipe_convention" field), declared per episode, nor known (KNOWN_SWIPE_CONVENTIONS).
    Swipes are returned as finger paths. Episodes without an episode_id get "line-<n>"."""
    path = str(path)
    if swipe_convention is not None and swipe_convention not in SWIPE_CONVENTIONS:
        raise ValueError(f"swipe_convention: expected one of {SWIPE_CONVENTIONS}, got {swipe_convention!r}")
    root = os.path.dirname(os.path.abspath(path))
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: byte {e.start}: not UTF-8 text (a JSONL or JSON episode file was expected)") from None
    if swipe_convention is None:
        swipe_convention = KNOWN_SWIPE_CONVENTIONS.get(hashlib.sha256(raw).hexdigest())
    episodes: list[Episode] = []
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None
        first = rows[0] if rows else None
        if isinstance(first, dict) and ("gt" in first or "image" in first) and "steps" not in first:
            episodes = _native_episodes(rows, path, root)
        elif first is None or (isinstance(first, dict) and "steps" in first):
            episodes = [_uis1_episode(r, _Where(path, "row", i), path, root, f"row-{i}", swipe_convention)
                        for i, r in enumerate(rows)]
        else:
            seen = sorted(first) if isinstance(first, dict) else type(first).__name__
            raise DataError(f"{path}: row 0: unknown format: expected a UI-S1 episode (goal, steps) or a native "
                             f"AndroidControl step (image, gt, task); saw {seen}")
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = _Where(path, "line", n)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise where.error("<json>", f"invalid JSON: {e.msg} (column {e.colno})") from None
            episodes.append(_uis1_episode(obj, where, path, root, f"line-{n}", swipe_convention))
            if limit is not None and len(episodes) >= limit:
                break
    seen = set()
    for ep in episodes:
        if ep.episode_id in seen:
            raise DataError(f"{path}: field 'episode_id': duplicate episode id {ep.episode_id!r}")
        seen.add(ep.episode_id)
    return episodes[:limit] if limit is not None else episodes


# -----------------------------------------------------------------------------
# Screenshots

def screenshot_candidates(step: Step, image_root: str | None = None) -> list[str]:
    """Where a step's screenshot may lie, in the order tried. With image_root: the recorded path
    under it (leading '/' dropped), then its file name under it. Without: an absolute path as is,
    a relative one against the data file's folder."""
    p = step.screenshot
    if not p:
        return []
    if image_root is not None:
        return [os.path.join(image_root, p.lstrip("/\\")), os.path.join(image_root, os.path.basename(p))]
    if os.path.isabs(p):
        return [p]
    return [os.path.join(step.root or ".", p)]


def _screenshot_file(step: Step, image_root: str | None) -> str | None:
    return next((p for p in screenshot_candidates(step, image_root) if os.path.isfile(p)), None)


def original_size(step: Step, *, image_root: str | None = None,
                  blank_screens: tuple[int, int] | None = None) -> tuple[int, int]:
    """(W, H) of the step's ORIGINAL screenshot: the pixel space of its expert action and boxes, and
    the ONE answer rollout, SFT and evaluation use. Reads only the image header (PIL opens lazily),
    never decodes pixels.
    - a file found: its size. A recorded image_size must agree within 1 px (rounding); one equal to
      the file's (H, W) raises "looks (H, W)-swapped", any other disagreement raises too (a 540x1200
      file recorded as 1080x2400 would put every expert point at twice its place);
    - no file: the recorded image_size, else blank_screens (the blank stand-in's size);
    - neither: FileNotFoundError, as load_screenshot.
    Errors name the step's file and line (Step.where)."""
    path = _screenshot_file(step, image_root)
    rec = step.image_size
    if path is not None:
        with Image.open(path) as im:
            size = im.size
        if rec is not None and (abs(rec[0] - size[0]) > 1 or abs(rec[1] - size[1]) > 1):
            swapped = (abs(rec[0] - size[1]) <= 1 and abs(rec[1] - size[0]) <= 1)
            raise DataError(f"{step.where or step.screenshot}: field 'image_size': recorded {rec[0]}x{rec[1]} (W x H) "
                             f"but {path} is {size[0]}x{size[1]}"
                             + ("; the record looks (H, W)-swapped: write [W, H]" if swapped else ""))
        return size
    if rec is not None:
        return rec
    if blank_screens is not None:
        return int(blank_screens[0]), int(blank_screens[1])
    raise FileNotFoundError(_missing_message(step, image_root))


def _missing_message(step: Step, image_root: str | None) -> str:
    tried = screenshot_candidates(step, image_root)
    return (f"screenshot {step.screenshot!r} not found (tried: {', '.join(tried) or 'nothing recorded'}); "
            "pass --image-root DIR, or --blank-screens WxH for blank stand-ins")


def load_screenshot(step: Step, *, image_root: str | None = None,
                    blank_screens: tuple[int, int] | None = None) -> Image.Image:
    """The step's screenshot as an RGB image of size original_size(step, ...) (which also checks a
    recorded size against the file). A missing file is an error unless blank_screens=(W, H) is
    given: then a black image of the step's recorded size, else of blank_screens, stands in."""
    size = original_size(step, image_root=image_root, blank_screens=blank_screens)
    p = _screenshot_file(step, image_root)
    if p is not None:
        with Image.open(p) as im:
            return im.convert("RGB")
    if blank_screens is None:
        raise FileNotFoundError(_missing_message(step, image_root))
    return Image.new("RGB", size)


# -----------------------------------------------------------------------------
# Prompts (docs/method.md §3: system prompt, goal, per step the screenshot and earlier responses)

SYSTEM_PROMPT = """You are a GUI agent operating a device. You are given a task goal, the screenshots of the steps so far and your own earlier responses. Perform the next action to complete the task.

## Action space
Write one action as a JSON object with the action and its arguments at the same level:
- {"action": "click", "coordinate": [x, y]}: tap the point (x, y).
- {"action": "long_press", "coordinate": [x, y], "time": 2}: press the point for `time` seconds.
- {"action": "swipe", "coordinate": [x, y], "coordinate2": [x2, y2]}: move a finger from (x, y) to (x2, y2); swiping up scrolls the content down.
- {"action": "type", "text": "..."}: type the text into the focused input box.
- {"action": "answer", "text": "..."}: give the answer to the user's question.
- {"action": "key", "text": "..."}: send a key event (adb keyevent syntax).
- {"action": "system_button", "button": "Back"}: press a system button: Back, Home, Menu or Enter.
- {"action": "open", "text": "app name"}: open the app.
- {"action": "wait", "time": 2}: wait `time` seconds for the screen to change.
- {"action": "terminate", "status": "success"}: end the task with status success or failure.
Coordinates are integer pixels of the latest screenshot, from its left and top edges.

## Output format
<think>
your reasoning
</think>
<action>
{"action": "...", ...}
</action>"""


@dataclass
class Prompt:
    input_ids: "torch.LongTensor"           # (T,) with <|image_pad|> expanded; ends with the assistant header
    pixel_values: "torch.FloatTensor | None"  # (P, C * temporal_patch * patch * patch) = (P, 1176)
    image_grid_thw: "torch.LongTensor | None"  # (I, 3)
    resized_size: tuple[int, int]          # (W, H) of the LAST screenshot as the model sees it
    n_dropped_turns: int                   # oldest history turns replaced by the summary line
    image_steps: list[int] = field(default_factory=list)  # step index of each image, in order


def special_tokens(tokenizer) -> list[str]:
    """All special-token strings of the tokenizer (<|im_end|>, <|image_pad|>, ...)."""
    toks = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for t in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(t, "special", False):
            toks.add(t.content)
    return sorted(toks, key=len, reverse=True)


def strip_special(text: str, tokens: list[str]) -> str:
    """Remove special-token strings from free text. A response sampled with <|im_end|> or
    <|image_pad|> in it would otherwise break the chat structure or the image pad count."""
    for t in tokens:
        text = text.replace(t, "")
    return text


def _summary_line(i: int, response: str) -> str:
    a = parse_response(response).action
    return f"Step {i + 1}: " + (json.dumps(a, ensure_ascii=False) if a is not None else "(no valid action)")


def build_prompt(tokenizer, image_processor, *, goal: str, screenshots: list, history: list[str],
                 step_instruction: str | None = None, elements: str | None = None, num_images: int = 2,
                 min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS,
                 max_prompt_tokens: int | None = None, pixels: bool = True) -> Prompt:
    """Model inputs for step t = len(screenshots) - 1 (screenshots: original images of steps 0..t,
    only the last num_images are read, so earlier entries may be None; with pixels=False an entry
    may also be a (W, H) size, no pixel is processed and pixel_values is None: for policies that
    never look at the image, e.g. expert replay and recorded responses;
    history: the assistant responses of steps 0..t-1, as text).

    Layout (the release's multi-turn form): system prompt; then per step a user turn (the goal in
    the first one; the screenshot if it is among the last `num_images`, else a note that it is not
    shown) followed by that step's response as an assistant turn; the current user turn adds the
    step instruction and the element list; the generation prompt ends the ids.

    Budget: if the prompt is longer than max_prompt_tokens, the oldest turns are dropped (their
    images with them: pads and pixels always agree) and summarised by one action-only line each;
    once only turns with screenshots are left, the oldest summary lines go before such a turn does.
    A logged warning says what went; a prompt that cannot fit even so (the current screenshot
    alone is too big) is returned with a warning, never an exception."""
    import torch

    t = len(screenshots) - 1
    if t < 0:
        raise ValueError("build_prompt: no screenshots")
    if len(history) != t:
        raise ValueError(f"build_prompt: {len(screenshots)} screenshots need {t} history responses, got {len(history)}")
    if num_images < 1:
        raise ValueError("build_prompt: num_images must be >= 1")
    patch, merge = int(image_processor.patch_size), int(image_processor.merge_size)
    factor = patch * merge

    specials = special_tokens(tokenizer)
    clean = lambda s: strip_special(s, specials) if s else s  # noqa: E731
    goal, step_instruction, elements = clean(goal), clean(step_instruction), clean(elements)
    history = [clean(h) for h in history]

    # resize the kept screenshots ourselves so resized sizes (and coordinates) are known exactly
    image_steps_all = list(range(max(0, t + 1 - num_images), t + 1))
    resized = {}
    for i in image_steps_all:
        w, h = screenshots[i] if isinstance(screenshots[i], tuple) else screenshots[i].size
        resized[i] = resized_size((w, h), factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    n_pad = {i: (resized[i][0] // patch) * (resized[i][1] // patch) // merge**2 for i in image_steps_all}
    pad_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def render(drop: int, n_summary: int):
        """Token ids (pads not yet expanded) and the image steps, with turns 0..drop-1 summarised
        (their last n_summary summary lines kept)."""
        first = f"Task goal: {goal}"
        if drop > 0:
            lines = [_summary_line(i, history[i]) for i in range(drop - n_summary, drop)]
            shown = "actions only" if n_summary == drop else f"actions of the last {n_summary} only"
            first += f"\nEarlier steps: {drop} (screenshots not shown; {shown}):" + "".join("\n" + s for s in lines)
        messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}]
        steps_with_image = []
        for i in range(drop, t + 1):
            content = [{"type": "text", "text": first + "\n"}] if i == drop else []
            if i in resized:
                content += [{"type": "text", "text": f"Step {i + 1} screenshot:"}, {"type": "image"}]
                steps_with_image.append(i)
            else:
                content.append({"type": "text", "text": f"Step {i + 1} (screenshot not shown)."})
            if i == t:
                if step_instruction and step_instruction.strip():  # never an empty "Step instruction:" line
                    content.append({"type": "text", "text": f"\nStep instruction: {step_instruction}"})
                if elements:
                    content.append({"type": "text", "text": f"\nUI elements on screen:\n{elements}"})
            messages.append({"role": "user", "content": content})
            if i < t:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": history[i]}]})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids, steps_with_image

    def length(ids, steps_with_image):
        return len(ids) + sum(n_pad[i] - 1 for i in steps_with_image)

    drop, n_summary = 0, 0
    ids, steps_with_image = render(0, 0)
    n_full = length(ids, steps_with_image)
    if max_prompt_tokens is not None and n_full > max_prompt_tokens:
        # the first (drop, n_summary) that fits, in order of preference: the oldest turns summarised,
        # one action line each, until the turns left carry screenshots; then the oldest summary lines
        # go (binary search: length grows with n_summary); only then turns with a screenshot.
        def fits(d, k):
            r = render(d, k)
            return length(*r) <= max_prompt_tokens, r

        first_image = image_steps_all[0]
        for drop in range(1, t + 1):
            ok, r = fits(drop, drop)
            if ok:
                n_summary, (ids, steps_with_image) = drop, r
                break
            if drop not in (first_image, t):
                continue
            ok, r = fits(drop, 0)
            if not ok:
                continue
            lo, hi, best = 0, drop, r  # fits with lo lines, not with hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                ok, r = fits(drop, mid)
                lo, hi, best = (mid, hi, r) if ok else (lo, mid, best)
            n_summary, (ids, steps_with_image) = lo, best
            break
        else:  # nothing fits: everything but the current turn goes, and we say so
            drop, n_summary = t, 0
            ids, steps_with_image = render(drop, n_summary)
        n_now = length(ids, steps_with_image)
        logger.warning("prompt of %d tokens over the budget of %d: summarised the oldest %d of %d turns "
                       "(%d summary lines kept) -> %d tokens%s", n_full, max_prompt_tokens, drop, t, n_summary,
                       n_now, "; STILL OVER BUDGET" if n_now > max_prompt_tokens else "")

    # expand each <|image_pad|> to its image's token count, in order of appearance
    if ids.count(pad_id) != len(steps_with_image):
        raise RuntimeError(f"prompt has {ids.count(pad_id)} image pads for {len(steps_with_image)} images")
    out, k = [], 0
    for tok in ids:
        if tok == pad_id:
            out.extend([pad_id] * n_pad[steps_with_image[k]])
            k += 1
        else:
            out.append(tok)

    pixel_values = grid = None
    if steps_with_image and not pixels:  # the grid the image processor would report, no pixels touched
        grid = torch.tensor([[1, resized[i][1] // patch, resized[i][0] // patch] for i in steps_with_image],
                            dtype=torch.long)
    elif steps_with_image:
        images = []
        for i in steps_with_image:
            im = screenshots[i]
            im = im if im.mode == "RGB" else im.convert("RGB")
            if im.size != resized[i]:
                im = im.resize(resized[i], Image.BICUBIC)
            images.append(im)
        feats = image_processor(images=images, do_resize=False, return_tensors="pt")
        pixel_values, grid = feats["pixel_values"], feats["image_grid_thw"].long()  # (P, 1176), (I, 3)
        for i, g in zip(steps_with_image, grid.tolist()):
            if g != [1, resized[i][1] // patch, resized[i][0] // patch]:
                raise RuntimeError(f"image processor grid {g} disagrees with the resized size {resized[i]} (W, H)")
    return Prompt(input_ids=torch.tensor(out, dtype=torch.long), pixel_values=pixel_values, image_grid_thw=grid,
                  resized_size=resized[t], n_dropped_turns=drop, image_steps=steps_with_image)

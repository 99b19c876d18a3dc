"""The GUI agent's action interface (docs/method.md §3): the action registry (ACTIONS: each type's
arguments, match rule and prompt line, declared once), the response format (parse_response never
raises), and coordinates (Qwen2.5-VL smart_resize, actions mapped between pixel spaces).

Conventions (read these before touching coordinates):
- sizes are always (W, H); smart_resize alone keeps Qwen's (height, width) order, as upstream.
- an action dict is the release's JSON, e.g. {"action": "click", "coordinate": [x, y]}. Expert
  actions (dataset.Step.action) are in ORIGINAL screenshot pixels; model responses are in pixels of
  the RESIZED screenshot the model saw (chat.Prompt.resized_size). score_response maps between the two.
- swipe: coordinate -> coordinate2 is the path of the FINGER in every loaded action (the loaders
  convert files that store scroll directions).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

# -----------------------------------------------------------------------------
# Action space (docs/method.md §3)

@dataclass(frozen=True)
class ActionSpec:
    """One action type, declared once (README "How to fork"). args / optional: (name, kind) of its
    required and optional arguments, kind "point" ([x, y] pixels; named coordinate or coordinate2,
    the two keys scale_action and outside_point map), "str" or "num"; rule: its strict
    match rule in reward.RULES; prompt: its line of the system prompt's action list."""
    args: tuple
    rule: str
    prompt: str
    optional: tuple = ()


_PT, _TXT = ("coordinate", "point"), ("text", "str")
ACTIONS = {  # docs/method.md §3: the release's action space, in its prompt's order
    "click": ActionSpec((_PT,), "point", '{"action": "click", "coordinate": [x, y]}: tap the point (x, y).'),
    "long_press": ActionSpec((_PT,), "point", '{"action": "long_press", "coordinate": [x, y], "time": 2}: press the '
                             'point for `time` seconds.', optional=(("time", "num"),)),
    "swipe": ActionSpec((_PT, ("coordinate2", "point")), "direction", '{"action": "swipe", "coordinate": [x, y], '
                        '"coordinate2": [x2, y2]}: move a finger from (x, y) to (x2, y2); swiping up scrolls the content down.'),
    "type": ActionSpec((_TXT,), "text", '{"action": "type", "text": "..."}: type the text into the focused input box.'),
    "answer": ActionSpec((_TXT,), "text", '{"action": "answer", "text": "..."}: give the answer to the user\'s question.'),
    "key": ActionSpec((_TXT,), "text", '{"action": "key", "text": "..."}: send a key event (adb keyevent syntax).'),
    "system_button": ActionSpec((("button", "str"),), "button", '{"action": "system_button", "button": "Back"}: press '
                                'a system button: Back, Home, Menu or Enter.'),
    "open": ActionSpec((_TXT,), "text", '{"action": "open", "text": "app name"}: open the app.'),
    "wait": ActionSpec((), "type", '{"action": "wait", "time": 2}: wait `time` seconds for the screen to change.',
                       optional=(("time", "num"),)),
    "terminate": ActionSpec((), "type", '{"action": "terminate", "status": "success"}: end the task with status '
                            'success or failure.', optional=(("status", "str"),)),
}


def action_types(rule: str | None = None) -> tuple[str, ...]:
    """The registered action types in ACTIONS order, or those whose match rule is `rule` ("point": the
    types grounding accuracy counts; "text": the typed ones). Read from ACTIONS at each call, so a type
    registered at run time (tests/test_toy_action.py) counts at once."""
    return tuple(k for k, a in ACTIONS.items() if rule is None or a.rule == rule)


SYSTEM_BUTTONS = ("Back", "Home", "Menu", "Enter")
MIN_PIXELS = 4 * 28 * 28        # release defaults for smart_resize
MAX_PIXELS = 12800 * 28 * 28
MAX_COORD = 1e6             # |coordinate| beyond this is malformed output (it would overflow int() once scaled)


def action_prompt_lines() -> str:
    """The system prompt's action list, one "- " line per registered action (ACTIONS order)."""
    return "\n".join(f"- {a.prompt}" for a in ACTIONS.values())


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
    naming the bad field. strict (dataset actions): a known system button, coordinates rounded to
    int pixels; a model's action keeps its numbers and any button (a wrong one is a type-only match)."""
    if not isinstance(action, dict):
        raise ValueError(f"action: expected a JSON object, got {type(action).__name__}")
    kind = action.get("action")
    if not isinstance(kind, str) or kind not in ACTIONS:
        raise ValueError(f"action: unknown action type {kind!r} (known: {', '.join(ACTIONS)})")
    out, spec = {"action": kind}, ACTIONS[kind]
    for name, typ in spec.args + spec.optional:
        required = (name, typ) in spec.args
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
    """Parse `<think>...</think><action>{json}</action>` (whitespace around tags and JSON
    tolerated); never raises. The action block is the first AFTER the think block. error: None when
    well-formed, else "no action block", "invalid action" (bad JSON, or check_action refused it; action None) or
    "text after </action>" (stop tokens aside; action kept, for reports)."""
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


def outside_point(action: dict, size: tuple[int, int]) -> list | None:
    """The first of the action's points (coordinate, coordinate2) off an image of size (W, H), in
    its pixels (a model's action: the resized screenshot it saw; 0 <= x <= W and 0 <= y <= H lie on
    it), or None; the strict reward makes such a point a malformed answer."""
    for key in ("coordinate", "coordinate2"):
        pt = action.get(key)
        if pt is not None and not (0 <= pt[0] <= size[0] and 0 <= pt[1] <= size[1]):
            return list(pt)
    return None


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



def swipe_direction(start, end) -> str | None:
    """Dominant direction of the finger moving from start to end; ties go vertical (release);
    a zero-length swipe has no direction (the release called it 'up')."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    if dx == 0 and dy == 0:
        return None
    if abs(dx) > abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"

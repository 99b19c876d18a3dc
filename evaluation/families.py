"""Model families' answer formats (`eval_sop.py --action-format`, `eval_sop.py score --action-format`).

Each family has a system prompt, a parser of its answers into the evaluator's action (pixels of the
RESIZED screenshot the model saw, the frame of gui.parse_response) and a writer of the evaluator's
history turns in its own format. The formats, coordinate frames and thresholds below were read from each
family's own repository (prompts, READMEs, evaluation code) and are written anew here:

- uis1: the project's own `<think>..</think><action>{json}</action>`, absolute pixels of the resized image.
- qwen25vl (Qwen2.5-VL, QwenLM/Qwen2.5-VL cookbooks, mobile_use): `<tool_call>{"name": "mobile_use",
  "arguments": {"action": "click", "coordinate": [x, y]}}</tool_call>`, absolute pixels of the resized image.
- uitars (UI-TARS v1, bytedance/UI-TARS README "Prompt template for mobile"): `Thought: ..\\nAction:
  click(start_box='(x,y)')`, 0-1000 relative (x/1000 of the width). Mobile scroll is a finger move
  `scroll(start_box=.., end_box=..)`; the desktop form `scroll(start_box=.., direction='down')` and the
  form UI-S1's own UI-TARS evaluation asks for, `scroll(direction='down')` with no box (from the screen's
  centre, as that evaluation does), name the direction the CONTENT moves: the finger moves the other way.
- uitars15 (UI-TARS-1.5, bytedance/UI-TARS codes/ui_tars/action_parser.py and its mobile prompt):
  `click(point='<point>x y</point>')`, `drag(start_point=.., end_point=..)`, absolute pixels of the
  smart-resized image the model saw (the source divides by the smart-resized size), which is the resized
  screenshot the evaluator sends (a Qwen2.5-VL server leaves a smart-resized image as it is).
- agentcpm (AgentCPM-GUI, OpenBMB/AgentCPM-GUI eval/utils/evaluator.py and schema_for_extraction.json):
  one JSON object `{"thought": .., "POINT": [x, y], ...}`, 0-1000 relative; "to" is the direction the
  finger moves (or an end point); "duration" in ms, 200 when absent (the schema's default): a POINT with a
  duration above 200 is a long press, else a tap (its evaluator's action_map).

String arguments are read as their family writes them: JSON strings (qwen25vl, agentcpm, uis1) by json, the
UI-TARS calls as Python literals (ast), so `type(content='I\\'m home')`, `\\"` and `\\n` read right; an
unescaped quote inside a lone argument (`type(content='I'm home')`) is read up to the call's last quote, as
UI-TARS's own parser tolerates it. Any coordinate outside the image (after the family's conversion:
0 <= x <= W, 0 <= y <= H) makes the answer malformed (`outside_image`), never a click at the edge.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Callable

import gui


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _rel_to_px(x, y, size) -> list[float]:
    """0-1000 relative (x, y) -> pixels of an image of size (W, H)."""
    return [x * size[0] / 1000, y * size[1] / 1000]


def _px_to_rel(pt, size) -> list[int]:
    """Pixels of an image of size (W, H) -> 0-1000 relative, rounded."""
    return [round(pt[0] * 1000 / size[0]), round(pt[1] * 1000 / size[1])]


def _finger(direction: str, start, size, frac: float = 0.3) -> list[float]:
    """The end of a finger move of `frac` of the screen from `start` towards `direction`, kept on the screen
    (the end point is ours, not the model's: a scroll near an edge stays a scroll)."""
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
    return [min(max(start[0] + dx * frac * size[0], 0), size[0]), min(max(start[1] + dy * frac * size[1], 0), size[1])]


_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


def outside_response(thought: str | None, pt, size) -> str:
    """A malformed evaluator response that says why: its action type `outside_image` is no registered type,
    so gui.parse_response rejects it (reward 0) and the report shows the point and the image size."""
    action = {"action": "outside_image", "coordinate": [round(c, 1) for c in pt], "image": list(size)}
    return f"<think>\n{thought or ''}\n</think>\n<action>\n{json.dumps(action)}\n</action>"


# -----------------------------------------------------------------------------
# Qwen2.5-VL native tool call

QWEN_SYSTEM_PROMPT = """You are a helpful assistant.

# Tools

You may call one function to assist with the user query. The function is described here:
<tools>
{"type": "function", "function": {"name": "mobile_use", "description": "Use a touchscreen to interact with a mobile device. Coordinates are pixels of the latest screenshot.", "parameters": {"properties": {"action": {"description": "key, click, long_press, swipe, type, system_button, open, wait, terminate", "enum": ["key", "click", "long_press", "swipe", "type", "system_button", "open", "wait", "terminate"], "type": "string"}, "coordinate": {"description": "(x, y): the point to click, press or start a swipe from", "type": "array"}, "coordinate2": {"description": "(x, y): where a swipe ends", "type": "array"}, "text": {"description": "for key, type and open", "type": "string"}, "time": {"description": "seconds, for long_press and wait", "type": "number"}, "button": {"description": "Back, Home, Menu or Enter", "enum": ["Back", "Home", "Menu", "Enter"], "type": "string"}, "status": {"description": "success or failure", "enum": ["success", "failure"], "type": "string"}}, "required": ["action"], "type": "object"}}}
</tools>

Think first, then return the call as a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [x, y]}}
</tool_call>"""  # noqa: E501

_TOOL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_THINKING_RE = re.compile(r"<think(?:ing)?>(.*?)</think(?:ing)?>", re.S)


def qwen_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels of the resized image) of a Qwen2.5-VL tool-call answer (the first
    <tool_call> block); the thought is the text before it (a <think> or <thinking> block's content where
    there is one)."""
    m = _TOOL_RE.search(text)
    if m is None:
        return text.strip(), None
    head = _THINKING_RE.search(text[:m.start()])  # <think> or <thinking> (the cookbook's history prompt)
    thought = head.group(1).strip() if head else text[:m.start()].strip()
    try:
        call = json.loads(m.group(1).strip())
        return thought, gui.check_action(call["arguments"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return thought, None


def qwen_write(thought: str, action: dict, size) -> str:
    call = json.dumps({"name": "mobile_use", "arguments": action}, ensure_ascii=False)
    return f"{thought}\n<tool_call>\n{call}\n</tool_call>"


# -----------------------------------------------------------------------------
# UI-TARS (v1, 0-1000 relative) and UI-TARS-1.5 (absolute pixels of the smart-resized image)

UITARS_SYSTEM_PROMPT = """You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space
click(start_box='<|box_start|>(x1,y1)<|box_end|>')
long_press(start_box='<|box_start|>(x1,y1)<|box_end|>', time='')
type(content='')
scroll(start_box='<|box_start|>(x1,y1)<|box_end|>', end_box='<|box_start|>(x3,y3)<|box_end|>')
press_home()
press_back()
finished(content='') # Submit the task regardless of whether it succeeds or fails.

## Note
- Use English in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part."""  # noqa: E501

UITARS15_SYSTEM_PROMPT = """You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space

click(point='<point>x1 y1</point>')
long_press(point='<point>x1 y1</point>')
type(content='') #If you want to submit your input, use "\\n" at the end of `content`.
scroll(point='<point>x1 y1</point>', direction='down or up or right or left')
open_app(app_name=\'\')
drag(start_point='<point>x1 y1</point>', end_point='<point>x2 y2</point>')
press_home()
press_back()
finished(content='xxx') # Use escape characters \\', \\", and \\n in content part to ensure we can parse the content in normal python string format.


## Note
- Use English in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part."""  # noqa: E501

_LOOSE_CALL_RE = re.compile(r"\s*(\w+)\(\s*(\w+)\s*=\s*(['\"])(.*)\3\s*\)\s*", re.S)
# the source's own renaming: 1.5's point names read as v1's box names
_POINT_NAMES = {"point": "start_box", "start_point": "start_box", "end_point": "end_box"}


def parse_call(text: str) -> tuple[str, dict] | None:
    """(name, {keyword: value as str}) of one Python-style call `name(k='v', ...)`, its literals read as
    Python reads them (so \\' \\" \\n inside a string are a quote, a double quote, a newline); None where
    `text` is not one such call. A lone argument holding an unescaped quote of its own kind
    (`type(content='I'm home')`) is read up to the call's last quote, as UI-TARS's parser does."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        m = _LOOSE_CALL_RE.fullmatch(text)
        return (m.group(1), {m.group(2): m.group(4)}) if m else None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    kw = {}
    for k in node.keywords:
        if k.arg is None or not isinstance(k.value, ast.Constant) or isinstance(k.value.value, bool) \
                or not isinstance(k.value.value, (str, int, float)):
            return None
        kw[k.arg] = str(k.value.value)
    return node.func.id, kw


def _numbers(v: str) -> list[float] | None:
    """The numbers of a box or point string: '(x,y)', '<|box_start|>(x,y)<|box_end|>', '<point>x y</point>',
    '[x1, y1, x2, y2]'; a 4-number box is its centre. None unless 2 or 4 numbers."""
    nums = [_num(n) for n in re.findall(r"-?\d+(?:\.\d+)?", v)]
    if len(nums) not in (2, 4) or None in nums:
        return None
    return nums if len(nums) == 2 else [(nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2]


def _tars_parse(text: str, size, to_px: Callable) -> tuple[str, dict | None]:
    """Both UI-TARS generations: `Thought: ..\\nAction: call(...)`; to_px maps the call's (x, y) to pixels."""
    head, sep, call_text = text.rpartition("Action:")
    thought = re.sub(r"^\s*Thought:\s*", "", head if sep else text).strip()
    call = parse_call(call_text) if sep else None
    if call is None:
        return thought, None
    name, raw = call
    kw = {_POINT_NAMES.get(k, k): v for k, v in raw.items()}
    pts = {k: _numbers(kw[k]) for k in ("start_box", "end_box") if k in kw}
    if None in pts.values():
        return thought, None
    start = to_px(*pts["start_box"]) if "start_box" in pts else None
    end = to_px(*pts["end_box"]) if "end_box" in pts else None
    if name in ("click", "long_press"):
        return thought, ({"action": name, "coordinate": start} if start else None)
    if name in ("scroll", "drag") and start and end:  # v1 mobile scroll and drag: the finger's path
        return thought, {"action": "swipe", "coordinate": start, "coordinate2": end}
    if name == "scroll" and kw.get("direction", "").strip().lower() in _OPPOSITE:  # content down = finger up
        start = start or [size[0] / 2, size[1] / 2]  # no box: the screen's centre, as UI-S1's evaluation
        return thought, {"action": "swipe", "coordinate": start,
                         "coordinate2": _finger(_OPPOSITE[kw["direction"].strip().lower()], start, size)}
    simple = {"type": ("type", "content"), "open_app": ("open", "app_name"), "press_home": ("system_button", "Home"),
              "press_back": ("system_button", "Back"), "press_enter": ("system_button", "Enter")}
    if name in simple:
        kind, arg = simple[name]
        if kind == "system_button":
            return thought, {"action": kind, "button": arg}
        return thought, ({"action": kind, "text": kw[arg]} if arg in kw else None)
    if name == "wait":
        return thought, {"action": "wait"}
    if name == "finished":  # 1.5's AndroidControl form: finished(content='successful|infeasible')
        failed = kw.get("content", "").strip().lower() == "infeasible"
        return thought, {"action": "terminate", "status": "failure" if failed else "success"}
    return thought, None


def uitars_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels) of a UI-TARS v1 answer, coordinates 0-1000 relative."""
    return _tars_parse(text, size, lambda x, y: _rel_to_px(x, y, size))


def uitars15_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels) of a UI-TARS-1.5 answer, coordinates absolute pixels of the image."""
    return _tars_parse(text, size, lambda x, y: [x, y])


def _q(s: str) -> str:
    """A Python single-quoted literal's body: backslash, quote and newline escaped (UI-TARS's prompt asks so)."""
    return s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")


def _tars_write(thought: str, action: dict, size, v15: bool) -> str | None:
    a, kind = action, action["action"]
    if v15:
        pt = lambda p: "'<point>%d %d</point>'" % (round(p[0]), round(p[1]))  # noqa: E731
        names = ("point", "start_point", "end_point")
    else:
        pt = lambda p: "'(%d,%d)'" % tuple(_px_to_rel(p, size))  # noqa: E731
        names = ("start_box", "start_box", "end_box")
    if kind in ("click", "long_press"):
        call = f"{kind}({names[0]}={pt(a['coordinate'])})"
    elif kind == "swipe" and v15:
        d = gui.swipe_direction(a["coordinate"], a["coordinate2"]) or "up"
        call = f"scroll({names[0]}={pt(a['coordinate'])}, direction='{_OPPOSITE[d]}')"
    elif kind == "swipe":  # v1 mobile: the finger's path
        call = f"scroll({names[1]}={pt(a['coordinate'])}, {names[2]}={pt(a['coordinate2'])})"
    elif kind in ("type", "open"):
        call = f"type(content='{_q(a['text'])}')" if kind == "type" else f"open_app(app_name='{_q(a['text'])}')"
    elif kind == "system_button" and a["button"].lower() in ("home", "back", "enter"):
        call = f"press_{a['button'].lower()}()"
    elif kind == "wait":
        call = "wait()"
    elif kind == "terminate":
        call = "finished(content='%s')" % ("infeasible" if a.get("status") == "failure" else "successful")
    else:
        return None
    return f"Thought: {thought}\nAction: {call}"


def uitars_write(thought: str, action: dict, size) -> str | None:
    return _tars_write(thought, action, size, v15=False)


def uitars15_write(thought: str, action: dict, size) -> str | None:
    return _tars_write(thought, action, size, v15=True)


# -----------------------------------------------------------------------------
# AgentCPM-GUI

AGENTCPM_SYSTEM_PROMPT = """# Role
You are an agent operating a smartphone. Given the task and the screenshot, output the next action as ONE JSON object.

# Actions (coordinates are relative, 0-1000 across the width and down the height)
{"thought": "...", "POINT": [x, y]}                      tap
{"thought": "...", "POINT": [x, y], "duration": 1000}    long press (milliseconds)
{"thought": "...", "POINT": [x, y], "to": "up"}          swipe: the finger moves up, down, left or right (or "to": [x, y])
{"thought": "...", "TYPE": "text"}                       type into the focused box
{"thought": "...", "PRESS": "HOME"}                      press HOME, BACK or ENTER
{"thought": "...", "duration": 1000}                     wait
{"thought": "...", "STATUS": "finish"}                   the task is done"""  # noqa: E501

AGENTCPM_DURATION = 200  # ms: the schema's default duration; its evaluator: a POINT held longer is a long press
AGENTCPM_STOP = {"finish": "success", "satisfied": "success", "impossible": "failure", "interrupt": "failure",
                 "need_feedback": "failure"}  # the statuses its evaluator reads as the end of the task


def agentcpm_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels) of an AgentCPM-GUI answer: the first JSON object in the text, read in
    the order of its evaluator's action_map: a stop STATUS; TYPE; POINT (held > AGENTCPM_DURATION ms: a long
    press; with "to": a swipe; else a tap); PRESS; a lone duration (a wait). Its evaluator sends a POINT held
    under 200 ms to its wait branch; a touch shorter than the default is still a tap, so it is a click here."""
    i = text.find("{")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[i:]) if i >= 0 else (None, 0)
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        return text.strip(), None
    thought = str(obj.get("thought", "")).strip()
    duration = _num(obj.get("duration", AGENTCPM_DURATION))
    if duration is None or duration < 0:
        return thought, None
    status = obj.get("STATUS")
    if isinstance(status, str) and status in AGENTCPM_STOP:
        return thought, {"action": "terminate", "status": AGENTCPM_STOP[status]}
    if isinstance(obj.get("TYPE"), str):
        return thought, {"action": "type", "text": obj["TYPE"]}
    pt, to = obj.get("POINT"), obj.get("to")
    if "POINT" in obj:
        if not (isinstance(pt, list) and len(pt) == 2 and None not in (_num(pt[0]), _num(pt[1]))):
            return thought, None
        start = _rel_to_px(_num(pt[0]), _num(pt[1]), size)
        if duration > AGENTCPM_DURATION:
            return thought, {"action": "long_press", "coordinate": start}
        if isinstance(to, str) and to in _OPPOSITE:
            return thought, {"action": "swipe", "coordinate": start, "coordinate2": _finger(to, start, size)}
        if isinstance(to, list) and len(to) == 2 and None not in (_num(to[0]), _num(to[1])):
            return thought, {"action": "swipe", "coordinate": start,
                             "coordinate2": _rel_to_px(_num(to[0]), _num(to[1]), size)}
        return thought, ({"action": "click", "coordinate": start} if to is None else None)
    if isinstance(obj.get("PRESS"), str) and obj["PRESS"].upper() in ("HOME", "BACK", "ENTER"):
        return thought, {"action": "system_button", "button": obj["PRESS"].capitalize()}
    if "duration" in obj:
        return thought, {"action": "wait"}
    return thought, None


def agentcpm_write(thought: str, action: dict, size) -> str | None:
    a, kind, out = action, action["action"], {"thought": thought}
    if kind in ("click", "long_press", "swipe"):
        out["POINT"] = _px_to_rel(a["coordinate"], size)
        if kind == "long_press":
            out["duration"] = 1000
        if kind == "swipe":
            out["to"] = _px_to_rel(a["coordinate2"], size)
    elif kind == "type":
        out["TYPE"] = a["text"]
    elif kind == "system_button" and a["button"].upper() in ("HOME", "BACK", "ENTER"):
        out["PRESS"] = a["button"].upper()
    elif kind == "wait":
        out["duration"] = 1000
    elif kind == "terminate":
        out["STATUS"] = "impossible" if a.get("status") == "failure" else "finish"
    else:
        return None  # open: AgentCPM-GUI opens an app by tapping its icon
    return json.dumps(out, ensure_ascii=False)


# -----------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Adapter:
    """One model family's conventions. system_prompt: replaces the contract's (None: keep it);
    parse(text, (W, H)) -> (thought, action dict in pixels of the resized image, or None when the
    answer is malformed; None: the answer is already the evaluator's format); write(thought, action,
    (W, H)) -> the family's text of an action given in pixels (None: the family has no such action; the
    history turn is then left as it is)."""
    name: str
    about: str
    system_prompt: str | None
    parse: Callable | None
    write: Callable | None

    def to_response(self, raw: str, size: tuple[int, int]) -> str:
        """The family's answer `raw` as an evaluator response (gui.format_response, pixels of the resized
        image of `size` (W, H)); a malformed answer comes back unchanged, and so scores as malformed; an
        answer with a point outside the image comes back as outside_response (malformed, saying why)."""
        if self.parse is None:  # the evaluator's own format: kept as written, so served == in process (the
            return raw          # strict rules read its end, and reward.score_response refuses a point off the image)
        try:  # a parser's slip on an odd answer is a malformed answer, never a crash
            thought, action = self.parse(raw, size)
            action = gui.check_action(action) if action is not None else None
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, MemoryError):
            thought, action = None, None
        if action is None:
            return raw
        pt = gui.outside_point(action, size)
        return gui.format_response(thought or "", action) if pt is None else outside_response(thought, pt, size)

    def from_response(self, text: str, size: tuple[int, int]) -> str:
        """An evaluator response (a history turn) in the family's format; left as is where it has no
        parsable action or the family no such action."""
        if self.write is None:
            return text
        p = gui.parse_response(text)
        out = self.write(p.thought or "", p.action, size) if p.action is not None else None
        return text if out is None else out


ADAPTERS = {
    "uis1": Adapter("uis1", "the project's own: <think>..</think><action>{json}</action>, resized pixels",
                    None, None, None),
    "qwen25vl": Adapter("qwen25vl", "Qwen2.5-VL native: <tool_call>{mobile_use ...}</tool_call>, resized pixels",
                        QWEN_SYSTEM_PROMPT, qwen_parse, qwen_write),
    "uitars": Adapter("uitars", "UI-TARS v1: Thought: ... Action: click(start_box='(x,y)'), 0-1000 relative",
                      UITARS_SYSTEM_PROMPT, uitars_parse, uitars_write),
    "uitars15": Adapter("uitars15", "UI-TARS-1.5: Action: click(point='<point>x y</point>'), resized pixels",
                        UITARS15_SYSTEM_PROMPT, uitars15_parse, uitars15_write),
    "agentcpm": Adapter("agentcpm", "AgentCPM-GUI: {\"thought\", \"POINT\": [x, y], ...} JSON, 0-1000 relative",
                        AGENTCPM_SYSTEM_PROMPT, agentcpm_parse, agentcpm_write),
}

"""Policies eval_sop.py can score besides the in-process model: a model served behind any
OpenAI-compatible chat-completions endpoint (`vllm serve`, `transformers serve`, SGLang, a hosted
API), and the model-family adapters that translate between the evaluator's action format and each
family's own (`--action-format`).

The served policy is a sampler of the rollout driver (rollout.semi_online_rollout), as sampler.Sampler is:
it gets the chat.Prompt the in-process model would get (the prompt contract, chat.PromptSpec) and
sends its messages, each screenshot as a PNG data URL of the RESIZED image (smart_resize under the
contract's pixel limits; a Qwen2.5-VL server leaves such an image as it is, so the model sees the
pixels and the coordinate frame an in-process model sees). The answer is translated by the adapter
into the evaluator's response format (`<think>..</think><action>{json}</action>`, pixels of the
resized screenshot), which reward.score_response then judges like any response.

Adapters (ADAPTERS; coordinates in the family's frame -> pixels of the resized screenshot):
- uis1: the project's own format (chat.FULL_SYSTEM_PROMPT), absolute resized pixels; the answer as is.
- qwen25vl: Qwen2.5-VL's native mobile tool call, `<tool_call>{"name": "mobile_use", "arguments":
  {"action": "click", "coordinate": [x, y]}}</tool_call>`, absolute pixels of the resized image,
  the same action names as ours (the release's action space is Qwen2.5-VL's).
- uitars: UI-TARS, `Thought: ...\nAction: click(start_box='(x,y)')`, 0-1000 relative (x/1000 of the
  width); scroll(direction='down') scrolls the content down: the finger moves up.
- agentcpm: AgentCPM-GUI, one JSON object `{"thought": ..., "POINT": [x, y], ...}`, 0-1000 relative;
  "to" is the direction the finger moves (or an end point); PRESS, TYPE, STATUS, duration.
Each adapter has its system prompt, a parser and a writer: earlier turns of the history (the
evaluator's format) are rewritten into the family's, in the current screenshot's frame.

Failure is per step, never fatal: a network error or an HTTP 5xx/429 is retried --retries times with
exponential backoff, then the step is answered with finish_reason "error: ..." (a wrong step: SOP
ends the episode there, eval_sop reports the error per episode); an answer the adapter cannot parse
is passed on unparsed, a malformed and so wrong step. Every raw answer is kept (ServedSampler.raw)
for `eval_sop.py score --action-format` to re-score offline.

Also here: OnlineModelPolicy (a sampler, in process or served, as a batched online MiniWob++ policy),
the trivial policies that never look at the screen (trivial_policies, run_baselines: the floor every
figure of eval_sop.py is printed beside), and eval_sop's flags of the served policy and its step protocols by name (NAMED_PROTOCOLS: the
static walk under reward.py's androidcontrol or aitw rules).
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import utils
import dataset
import gui
import reward
from rollout import sop_metrics

# -----------------------------------------------------------------------------
# model-family adapters


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _rel_to_px(x, y, size) -> list[float]:
    """0-1000 relative (x, y) -> pixels of an image of size (W, H)."""
    return [x * size[0] / 1000, y * size[1] / 1000]


def _px_to_rel(pt, size) -> list[int]:
    """Pixels of an image of size (W, H) -> 0-1000 relative, rounded."""
    return [round(pt[0] * 1000 / size[0]), round(pt[1] * 1000 / size[1])]


def _finger(direction: str, start, size, frac: float = 0.3) -> list[float]:
    """The end of a finger move of `frac` of the screen from `start` towards `direction`."""
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
    return [start[0] + dx * frac * size[0], start[1] + dy * frac * size[1]]


_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


# --- Qwen2.5-VL native tool call

QWEN_SYSTEM_PROMPT = """You are a helpful assistant.

# Tools

You may call one function to assist with the user query. The function is described here:
<tools>
{"type": "function", "function": {"name": "mobile_use", "description": "Use a touchscreen to interact with a mobile device. Coordinates are pixels of the latest screenshot.", "parameters": {"properties": {"action": {"description": "key, click, long_press, swipe, type, system_button, open, wait, terminate", "enum": ["key", "click", "long_press", "swipe", "type", "system_button", "open", "wait", "terminate"], "type": "string"}, "coordinate": {"description": "(x, y): the point to click, press or start a swipe from", "type": "array"}, "coordinate2": {"description": "(x, y): where a swipe ends", "type": "array"}, "text": {"description": "for key, type and open", "type": "string"}, "time": {"description": "seconds, for long_press and wait", "type": "number"}, "button": {"description": "Back, Home, Menu or Enter", "enum": ["Back", "Home", "Menu", "Enter"], "type": "string"}, "status": {"description": "success or failure", "enum": ["success", "failure"], "type": "string"}}, "required": ["action"], "type": "object"}}}
</tools>

Think first, then return the call as a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [x, y]}}
</tool_call>"""

_TOOL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def qwen_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels of the resized image) of a Qwen2.5-VL tool-call answer; the thought
    is the text before <tool_call> (a <think> block's content where there is one)."""
    m = _TOOL_RE.search(text)
    if m is None:
        return text.strip(), None
    thought = text[:m.start()]
    t = gui.parse_response(thought).thought
    try:
        call = json.loads(m.group(1).strip())
        return (t if t is not None else thought.strip()), gui.check_action(call["arguments"])
    except (ValueError, KeyError, TypeError):
        return thought.strip(), None


def qwen_write(thought: str, action: dict, size) -> str:
    return f"{thought}\n<tool_call>\n" + json.dumps({"name": "mobile_use", "arguments": action}, ensure_ascii=False) + \
        "\n</tool_call>"


# --- UI-TARS

UITARS_SYSTEM_PROMPT = """You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space
click(start_box='(x1,y1)')
long_press(start_box='(x1,y1)')
type(content='')
scroll(start_box='(x1,y1)', direction='down or up or right or left')
drag(start_box='(x1,y1)', end_box='(x3,y3)')
open_app(app_name='')
press_home()
press_back()
press_enter()
wait()
finished(content='xxx')

Coordinates are relative, 0-1000 across the width and down the height of the screenshot.

## Note
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part."""

_CALL_RE = re.compile(r"Action:\s*([a-z_]+)\((.*)\)\s*$", re.S)
_KWARG_RE = re.compile(r"(\w+)\s*=\s*(['\"])(.*?)\2", re.S)


def _box_point(v: str, size) -> list[float] | None:
    """'(x,y)', '<|box_start|>(x,y)<|box_end|>', '[x1, y1, x2, y2]' (its centre), 0-1000 -> pixels."""
    nums = [_num(n) for n in re.findall(r"-?\d+(?:\.\d+)?", v)]
    if len(nums) not in (2, 4) or None in nums:
        return None
    x, y = (nums[0], nums[1]) if len(nums) == 2 else ((nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2)
    return _rel_to_px(x, y, size)


def uitars_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels) of a UI-TARS answer `Thought: ...\\nAction: name(k='v', ...)`."""
    m = _CALL_RE.search(text)
    thought = text[:m.start()] if m else text
    thought = re.sub(r"^\s*Thought:\s*", "", thought).strip()
    if m is None:
        return thought, None
    name, kw = m.group(1), {k: v for k, _, v in _KWARG_RE.findall(m.group(2))}
    start = _box_point(kw.get("start_box", ""), size)
    if name in ("click", "long_press") and start:
        return thought, {"action": name, "coordinate": start}
    if name == "scroll" and start and kw.get("direction") in _OPPOSITE:  # content down = finger up
        return thought, {"action": "swipe", "coordinate": start,
                         "coordinate2": _finger(_OPPOSITE[kw["direction"]], start, size)}
    if name == "drag" and start and _box_point(kw.get("end_box", ""), size):
        return thought, {"action": "swipe", "coordinate": start, "coordinate2": _box_point(kw["end_box"], size)}
    simple = {"type": ("type", "content"), "open_app": ("open", "app_name"), "finished": ("terminate", None),
              "press_home": ("system_button", "Home"), "press_back": ("system_button", "Back"),
              "press_enter": ("system_button", "Enter"), "wait": ("wait", None)}
    if name not in simple:
        return thought, None
    kind, arg = simple[name]
    if kind == "system_button":
        return thought, {"action": kind, "button": arg}
    if kind in ("type", "open"):
        return (thought, {"action": kind, "text": kw[arg]}) if arg in kw else (thought, None)
    return thought, {"action": kind, **({"status": "success"} if kind == "terminate" else {})}


def uitars_write(thought: str, action: dict, size) -> str | None:
    a, kind = action, action["action"]
    box = lambda pt: "(%d,%d)" % tuple(_px_to_rel(pt, size))  # noqa: E731
    if kind in ("click", "long_press"):
        call = f"{kind}(start_box='{box(a['coordinate'])}')"
    elif kind == "swipe":
        d = gui.swipe_direction(a["coordinate"], a["coordinate2"]) or "up"
        call = f"scroll(start_box='{box(a['coordinate'])}', direction='{_OPPOSITE[d]}')"
    elif kind in ("type", "open"):
        call = f"{'type' if kind == 'type' else 'open_app'}({'content' if kind == 'type' else 'app_name'}='{a['text']}')"
    elif kind == "system_button" and a["button"].lower() in ("home", "back", "enter"):
        call = f"press_{a['button'].lower()}()"
    elif kind in ("wait", "terminate"):
        call = "wait()" if kind == "wait" else "finished(content='')"
    else:
        return None
    return f"Thought: {thought}\nAction: {call}"


# --- AgentCPM-GUI

AGENTCPM_SYSTEM_PROMPT = """# Role
You are an agent operating a smartphone. Given the task and the screenshot, output the next action as ONE JSON object.

# Actions (coordinates are relative, 0-1000 across the width and down the height)
{"thought": "...", "POINT": [x, y]}                      tap
{"thought": "...", "POINT": [x, y], "duration": 1000}    long press (milliseconds)
{"thought": "...", "POINT": [x, y], "to": "up"}          swipe: the finger moves up, down, left or right (or "to": [x, y])
{"thought": "...", "TYPE": "text"}                       type into the focused box
{"thought": "...", "PRESS": "HOME"}                      press HOME, BACK or ENTER
{"thought": "...", "duration": 1000}                     wait
{"thought": "...", "STATUS": "finish"}                   the task is done"""


def agentcpm_parse(text: str, size) -> tuple[str, dict | None]:
    """(thought, action in pixels) of an AgentCPM-GUI answer: the first JSON object in the text."""
    i = text.find("{")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[i:]) if i >= 0 else (None, 0)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return text.strip(), None
    thought = str(obj.get("thought", "")).strip()
    pt = obj.get("POINT")
    if isinstance(pt, list) and len(pt) == 2 and None not in (_num(pt[0]), _num(pt[1])):
        start = _rel_to_px(_num(pt[0]), _num(pt[1]), size)
        to = obj.get("to")
        if isinstance(to, str) and to in _OPPOSITE:
            return thought, {"action": "swipe", "coordinate": start, "coordinate2": _finger(to, start, size)}
        if isinstance(to, list) and len(to) == 2 and None not in (_num(to[0]), _num(to[1])):
            return thought, {"action": "swipe", "coordinate": start, "coordinate2": _rel_to_px(_num(to[0]), _num(to[1]), size)}
        if "duration" in obj:
            return thought, {"action": "long_press", "coordinate": start}
        return thought, {"action": "click", "coordinate": start}
    if isinstance(obj.get("TYPE"), str):
        return thought, {"action": "type", "text": obj["TYPE"]}
    if isinstance(obj.get("PRESS"), str) and obj["PRESS"].upper() in ("HOME", "BACK", "ENTER"):
        return thought, {"action": "system_button", "button": obj["PRESS"].capitalize()}
    if isinstance(obj.get("STATUS"), str):
        return thought, {"action": "terminate", "status": "success" if obj["STATUS"] in ("finish", "satisfied") else "failure"}
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
        out["STATUS"] = "finish"
    else:
        return None  # open: AgentCPM-GUI opens an app by tapping its icon
    return json.dumps(out, ensure_ascii=False)


# --- the table


@dataclass(frozen=True)
class Adapter:
    """One model family's conventions. system_prompt: replaces the contract's (None: keep it);
    parse(text, (W, H)) -> (thought, action dict in pixels of the resized image, or None when the
    answer is malformed); write(thought, action, (W, H)) -> the family's text of an action given in
    pixels (None: the family has no such action; the history turn is then left as it is)."""
    name: str
    about: str
    system_prompt: str | None
    parse: Callable | None
    write: Callable | None

    def to_response(self, raw: str, size: tuple[int, int]) -> str:
        """The family's answer `raw` as an evaluator response (gui.format_response, pixels of the
        resized image of `size`); a malformed answer comes back unchanged, and so scores as malformed."""
        if self.parse is None:
            return raw
        try:  # a parser's slip on an odd answer is a malformed answer, never a crash
            thought, action = self.parse(raw, size)
            action = gui.check_action(action) if action is not None else None
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError):
            thought, action = None, None
        return raw if action is None else gui.format_response(thought or "", action)

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
    "uitars": Adapter("uitars", "UI-TARS: Thought: ... Action: click(start_box='(x,y)'), 0-1000 relative",
                      UITARS_SYSTEM_PROMPT, uitars_parse, uitars_write),
    "agentcpm": Adapter("agentcpm", "AgentCPM-GUI: {\"thought\", \"POINT\": [x, y], ...} JSON, 0-1000 relative",
                        AGENTCPM_SYSTEM_PROMPT, agentcpm_parse, agentcpm_write),
}


# -----------------------------------------------------------------------------
# the served policy


def image_url(im) -> str:
    """A PIL image as a PNG data URL (lossless: the server decodes the very pixels)."""
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def openai_messages(messages: list, adapter: Adapter, size: tuple[int, int]) -> list:
    """chat.Prompt.messages -> OpenAI chat messages: images as data URLs, the system prompt and the
    history turns in the adapter's family format (in the frame of the current screenshot's `size`)."""
    out = []
    for m in messages:
        if m["role"] == "system" and adapter.system_prompt is not None:
            out.append({"role": "system", "content": adapter.system_prompt})
            continue
        if m["role"] == "assistant":
            text = "".join(c["text"] for c in m["content"] if c["type"] == "text")
            out.append({"role": "assistant", "content": adapter.from_response(text, size)})
            continue
        parts = []
        for c in m["content"]:
            if c["type"] == "image":
                if "image" not in c:
                    raise ValueError("a served model needs the prompt's pixels (chat.build_prompt with pixels=True)")
                parts.append({"type": "image_url", "image_url": {"url": image_url(c["image"])}})
            else:
                parts.append({"type": "text", "text": c["text"]})
        out.append({"role": m["role"], "content": parts})
    return out


class ServerError(RuntimeError):
    """An answer that is no chat completion (HTTP error, bad JSON, no choices): retried when transient."""

    def __init__(self, msg: str, transient: bool):
        super().__init__(msg)
        self.transient = transient


@dataclass
class ServedOutput:
    """What the rollout driver reads of a sample (sampler.SampleOutput's fields) plus the raw answer."""
    ids: list
    text: str           # the answer as an evaluator response (Adapter.to_response)
    logprobs: object
    finish_reason: str  # "stop" | "length" | "error: <why>" (the request failed after its retries)
    prompt_index: int
    raw: str = ""


class ServedSampler:
    """A sampler (rollout.semi_online_rollout's `generate`) backed by an OpenAI-compatible server.

    base_url: up to /v1 (".../v1/chat/completions" is posted to); model: the served model's name;
    api_key: sent as a Bearer token (eval_sop reads it from $OPENAI_API_KEY); concurrency: requests
    in flight at once (threads); timeout: seconds per request; retries: further tries after a network
    error, HTTP 429 or 5xx, waiting backoff * 2**k seconds before try k + 1. Greedy: temperature 0;
    sampled: `temperature` and the prompt's seed. Keeps raw[id(prompt)] = (raw answer, error) for the
    caller to record, and counts requests, retries and failures in `stats`."""

    def __init__(self, base_url: str, model: str, adapter: Adapter, *, api_key: str | None = None,
                 max_new_tokens: int = 512, concurrency: int = 8, timeout: float = 120.0, retries: int = 3,
                 backoff: float = 1.0, temperature: float = 1.0):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.adapter, self.api_key = model, adapter, api_key
        self.max_new_tokens, self.concurrency, self.timeout = max_new_tokens, concurrency, timeout
        self.retries, self.backoff, self.temperature = retries, backoff, temperature
        self.raw: dict = {}
        self.stats = {"requests": 0, "retries": 0, "failed": 0}
        self._lock = threading.Lock()  # the counters are shared by the request threads

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _post(self, body: dict) -> dict:
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                payload = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:200].decode("utf-8", "replace")
            raise ServerError(f"HTTP {e.code} from {self.url}: {detail}", e.code == 429 or e.code >= 500) from None
        except (urllib.error.URLError, OSError) as e:  # refused, unreachable, timed out, reset
            raise ServerError(f"no answer from {self.url}: {getattr(e, 'reason', e)}", True) from None
        try:
            reply = json.loads(payload)
            choice = reply["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ServerError(f"{self.url} answered no chat completion ({type(e).__name__}: {e}): "
                              f"{payload[:120]!r}", False) from None
        return {"text": text, "finish_reason": choice.get("finish_reason") or "stop"}

    def _one(self, prompt, greedy: bool, seed) -> tuple[str, str]:
        body = {"model": self.model, "max_tokens": self.max_new_tokens,
                "messages": openai_messages(prompt.messages, self.adapter, prompt.resized_size),
                "temperature": 0.0 if greedy else self.temperature}
        if seed is not None:
            body["seed"] = int(seed) % (2**31)
        for k in range(self.retries + 1):
            self._count("requests")
            try:
                r = self._post(body)
                return r["text"], ("length" if r["finish_reason"] == "length" else "stop")
            except ServerError as e:
                if not e.transient or k == self.retries:
                    self._count("failed")
                    return "", f"error: {e}"
                self._count("retries")
                time.sleep(self.backoff * 2**k)
        raise AssertionError("unreachable")

    def generate(self, prompts: list, n: int | list[int] = 1, greedy: bool = True, seeds=None):
        """outs[i][j] for j < n[i]: the answers to prompts[i] (chat.Prompt with messages), as
        ServedOutput. Never raises on a server fault (finish_reason says it)."""
        ns = [n] * len(prompts) if isinstance(n, int) else list(n)
        jobs = [(i, j) for i, k in enumerate(ns) for j in range(k)]

        def run(job):
            i, j = job
            seed = None if seeds is None else seeds[i] + j
            return self._one(prompts[i], greedy, seed)

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            answers = list(pool.map(run, jobs))
        outs = [[] for _ in prompts]
        for (i, _), (raw, finish) in zip(jobs, answers):
            text = self.adapter.to_response(raw, prompts[i].resized_size) if not finish.startswith("error") else ""
            outs[i].append(ServedOutput([], text, None, finish, i, raw))
            self.raw[id(prompts[i])] = (raw, finish[len("error: "):] if finish.startswith("error") else None)
        return outs


# -----------------------------------------------------------------------------
# the model (in process or served) as a batched online MiniWob++ policy (eval_sop --online)


def play_seed(base: int, task: str, seed: int, sample: int, t: int) -> int:
    """The sampler seed of sampled play `sample` of online episode (task, seed) at step t (a CRC-32): its
    own draws, whatever else is in the batch and whatever K is (play j is the same for every K > j)."""
    return zlib.crc32(f"{base}|{task}|{seed}|{sample}|{t}".encode())


class NoAnswer(RuntimeError):
    """The action OnlineModelPolicy returns for an episode whose request got no answer (a served model's
    request failed after its retries): miniwob_env.evaluate_online ends the episode with this `cause`,
    so the server's failure is never scored as the model's no-op or step limit."""
    cause = "server_error"


class OnlineModelPolicy:
    """A batched miniwob_env policy: for every episode in flight, obs -> prompt with that episode's
    own earlier responses -> one response of `sampler`, all prompts in one generate call -> action
    in pixels of obs['screenshot']. Greedy when `sample` is None; else sampled play number `sample`
    at `temperature`, each prompt seeded with play_seed(sample_seed, task, seed, sample, t) (a rerun
    with the same batch size gives the same responses). Malformed output returns None (the env's
    no-op that costs a step); a request that got no answer (finish_reason "error: ...") returns NoAnswer,
    which ends the episode as server_error (n_server_errors counts them). Keeps report views (`view`) of
    the (task, seed) episodes in `show`; stats gains
    the response counts. `transcripts[(task, seed)]`: every step's element list (obs["elements"], as the
    prompt showed it), response text and malformed count, of the episode's last attempt (a retry starts it over)."""

    batched = True  # miniwob_env.evaluate_online: one call for every episode in flight

    def __init__(self, sampler, make_prompt_online, show: set, stats: dict, sample: int | None = None,
                 temperature: float = 1.0, sample_seed: int = 0, view: Callable | None = None):
        self.sampler, self.make_prompt, self.show, self.stats = sampler, make_prompt_online, show, stats
        self.view = view  # report.step_view: a shown episode's step as the HTML report draws it
        self.sample, self.temperature, self.sample_seed = sample, temperature, sample_seed
        self.views: dict = {}
        self.goals: dict = {}
        self.state: dict = {}  # (task, seed) -> (screenshots, responses) of the episode in flight
        self.transcripts: dict = {}  # (task, seed) -> {"elements": [...], "responses": [...]}, every step
        self.n_malformed = self.n_server_errors = 0

    def __call__(self, obs_list: list[dict], steps: list[int]) -> list:
        keys, prompts = [], []
        for obs, t in zip(obs_list, steps):
            key = (obs["task"], obs["seed"])
            if t == 0:  # a new episode (or a retry after a browser fault)
                self.state[key] = ([], [])
                self.transcripts[key] = {"elements": [], "responses": self.state[key][1], "malformed": 0}
                if key in self.show:
                    self.views[key], self.goals[key] = [], obs["goal"]
            shots, history = self.state[key]
            shots.append(obs["screenshot"])
            self.transcripts[key]["elements"].append(obs.get("elements"))
            keys.append(key)
            prompts.append(self.make_prompt(obs, shots, history))
        if self.sample is None:
            outs = self.sampler.generate(prompts, n=1, greedy=True)
        else:  # the sampler's temperature for this call only (sampler.process_logits applies it)
            seeds = [play_seed(self.sample_seed, k[0], k[1], self.sample, t) for k, t in zip(keys, steps)]
            kept, self.sampler.temperature = self.sampler.temperature, self.temperature
            try:
                outs = self.sampler.generate(prompts, n=1, greedy=False, seeds=seeds)
            finally:
                self.sampler.temperature = kept
        self.state = {k: self.state[k] for k in keys}  # an episode not asked about has ended
        actions = []
        for key, t, prompt, out in zip(keys, steps, prompts, (o[0] for o in outs)):
            image = self.state[key][0][-1]
            self.stats["responses"] += 1
            self.stats["truncated"] += out.finish_reason == "length"
            self.stats["server_errors"] += out.finish_reason.startswith("error")  # a served request that failed
            self.stats["tokens"] += len(out.ids)
            self.state[key][1].append(out.text)
            if out.finish_reason.startswith("error"):  # no answer: the server's failure, not the model's
                self.n_server_errors += 1
                if key in self.views and self.view is not None:
                    v = self.view(t, image, image.size, None, "", None, False, None)
                    self.views[key].append({**v, "verdict": f"no answer: server {out.finish_reason}", "cls": "neutral"})
                actions.append(NoAnswer(f"no answer from the server: {out.finish_reason[len('error: '):]}"))
                continue
            parsed = gui.parse_response(out.text)
            # the reward's strict rules: a response cut at the cap, or with text after its action, is a no-op
            action = parsed.action if parsed.error is None and out.finish_reason == "stop" else None
            self.n_malformed += action is None
            self.transcripts[key]["malformed"] += action is None
            if action is not None:  # model pixels (resized screenshot) -> pixels of the screenshot we were given
                action = gui.scale_action(action, prompt.resized_size, image.size)
            if key in self.views and self.view is not None:
                # no expert online: the action is drawn, "right" or "wrong" is the episode's outcome
                self.views[key].append(self.view(t, image, image.size, None, out.text, action, action is not None, None))
            actions.append(action)
        return actions


# -----------------------------------------------------------------------------
# trivial policies: what a policy that never looks at the screen scores under the match rules
# (docs/method.md §4); every figure of eval_sop.py is printed beside this floor (eval_sop.py baselines)


def trivial_policies(steps: list[tuple[dataset.Step, tuple[int, int]]], seed: int = 0) -> dict:
    """Trivial policies as {name: (action types it answers, fn(step, size) -> action in original
    pixels)}. Each answers with the step's own action type (an oracle for the type, so its rate
    isolates the arguments): clicks at the centre, uniformly at random, at the most frequent expert
    point (0.04 grid, read off the data); the constant texts "", "a", "e", "the", and each text
    type's most frequent content token (reward.content_tokens: stop words, which match nothing under
    the strict rules, left out) and text; each swipe direction; each system button. "most frequent
    type" answers every step with the data's most frequent action type and trivial arguments."""
    rng = random.Random(seed)
    point = gui.action_types("point")  # the types grounding accuracy counts: the click floors answer them
    kinds = Counter(s.action["action"] for s, _ in steps)
    pts = Counter((round(s.action["coordinate"][0] / w / 0.04), round(s.action["coordinate"][1] / h / 0.04))
                  for s, (w, h) in steps if s.action["action"] in point)
    mode = pts.most_common(1)[0][0] if pts else (12, 12)
    pol = {
        "click centre": (point, lambda s, z: {"action": s.action["action"], "coordinate": [z[0] / 2, z[1] / 2]}),
        "click uniform random": (point, lambda s, z: {"action": s.action["action"],
                                                                 "coordinate": [rng.uniform(0, z[0]), rng.uniform(0, z[1])]}),
        "click most frequent point": (point, lambda s, z: {"action": s.action["action"], "coordinate":
                                                                      [mode[0] * 0.04 * z[0], mode[1] * 0.04 * z[1]]}),
    }
    texts = {}
    for kind in gui.action_types("text"):
        vals = [s.action["text"] for s, _ in steps if s.action["action"] == kind]
        if vals:
            tok = Counter(t for v in vals for t in set(reward.content_tokens(v))).most_common(1)  # a stop word scores 0
            full = Counter(reward.normalize_text(v) for v in vals).most_common(1)
            texts[kind] = [c for c in (tok[0][0] if tok else None, full[0][0]) if c]
    for c in ("", "a", "e", "the"):
        pol[f"text {c!r}"] = (gui.action_types("text"), lambda s, z, c=c: {"action": s.action["action"], "text": c})
    for kind, cands in texts.items():
        for label, c in zip(("most frequent token", "most frequent text"), cands):
            pol[f"{kind} {label} {c!r}"] = ((kind,), lambda s, z, c=c: {"action": kind, "text": c})
    for d, (a, b) in {"up": ((0.5, 0.75), (0.5, 0.25)), "down": ((0.5, 0.25), (0.5, 0.75)),
                      "left": ((0.75, 0.5), (0.25, 0.5)), "right": ((0.25, 0.5), (0.75, 0.5))}.items():
        pol[f"swipe {d}"] = (gui.action_types("direction"), lambda s, z, a=a, b=b: {"action": s.action["action"], "coordinate":
                             [a[0] * z[0], a[1] * z[1]], "coordinate2": [b[0] * z[0], b[1] * z[1]]})
    pol["type alone (wait, terminate)"] = (gui.action_types("type"), lambda s, z: {"action": s.action["action"]})
    for btn in gui.SYSTEM_BUTTONS:
        pol[f"button {btn}"] = (gui.action_types("button"), lambda s, z, btn=btn: {"action": s.action["action"], "button": btn})
    top = kinds.most_common(1)[0][0] if kinds else "click"
    trivial_args = {"click": {"coordinate": None}, "long_press": {"coordinate": None}, "type": {"text": "the"},
                    "answer": {"text": "the"}, "key": {"text": "the"}, "open": {"text": "the"},
                    "system_button": {"button": "Back"}, "swipe": {"coordinate": None, "coordinate2": None}}

    def most_frequent(s, z):
        a = {"action": top, **trivial_args.get(top, {})}
        if "coordinate" in a:
            a["coordinate"] = [z[0] / 2, z[1] * (0.75 if top == "swipe" else 0.5)]
        if "coordinate2" in a:
            a["coordinate2"] = [z[0] / 2, z[1] * 0.25]
        return a
    pol[f"most frequent type ({top})"] = (gui.action_types(), most_frequent)
    return pol


def run_baselines(episodes: list[dataset.Episode], sizes: dict, rules: str = "strict", seed: int = 0) -> dict:
    """Match rates of trivial_policies on `episodes` (sizes: id(step) -> original (W, H)).
    Returns {"counts": steps per type, "rates": {policy: {type: rate}}, "floor": {...}} where floor
    is the best trivial policy per action type ("floor_by_type", with its name), the step success
    rate and SOP PG/TSR of the policy that uses that best one for every step of its type (a floor
    tuned on the data itself: an upper bound on what ignoring the screen can get), and the type
    accuracy of always answering the most frequent type."""
    steps = [(s, sizes[id(s)]) for ep in episodes for s in ep.steps]
    counts = Counter(s.action["action"] for s, _ in steps)
    pol = trivial_policies(steps, seed)
    hits = {name: Counter() for name in pol}
    per_step = {}  # (policy, id(step)) -> match, only for the types a policy answers
    for name, (types, fn) in pol.items():
        for s, z in steps:
            if s.action["action"] in types:
                ok = reward.action_match(fn(s, z), s.action, s.candidate_bbox, z, rules=rules)[0]
                hits[name][s.action["action"]] += ok
                per_step[name, id(s)] = ok
    rates = {name: {k: hits[name][k] / counts[k] for k in counts if k in types}
             for name, (types, _) in pol.items()}
    best = {}
    for k in counts:
        cands = [(r[k], name) for name, r in rates.items() if k in r and not name.startswith("most frequent type")]
        best[k] = max(cands) if cands else (0.0, None)
    best_ok = {id(s): per_step.get((best[s.action["action"]][1], id(s)), False) for s, _ in steps}
    progress = []
    for ep in episodes:
        c = 0
        while c < len(ep.steps) and best_ok[id(ep.steps[c])]:
            c += 1
        progress.append((c, len(ep.steps)))
    sop = sop_metrics(progress)
    top = next(name for name in pol if name.startswith("most frequent type"))
    floor = {"floor_by_type": {k: {"rate": v[0], "policy": v[1]} for k, v in best.items()},
             "step_sr": sum(best_ok.values()) / max(len(steps), 1), "sop_pg": sop["pg"], "sop_tsr": sop["tsr"],
             "type_acc": counts.most_common(1)[0][1] / len(steps) if steps else 0.0,
             "most_frequent_type_step_sr": sum(hits[top].values()) / max(len(steps), 1)}
    return {"rules": rules, "steps": len(steps), "episodes": len(episodes), "counts": dict(counts),
            "rates": rates, "floor": floor}


def format_baselines(res: dict) -> str:
    """The rates of run_baselines as a plain-text table (percent), one row per policy."""
    kinds = list(res["counts"])
    head = f"{'policy':<44}" + "".join(f"{k:>14}" for k in kinds)
    lines = [f"trivial-policy match rates (%), rules={res['rules']}, {res['steps']} steps", head,
             f"{'(steps)':<44}" + "".join(f"{res['counts'][k]:>14}" for k in kinds)]
    for name, r in res["rates"].items():
        lines.append(f"{name[:44]:<44}" + "".join(f"{100 * r[k]:>14.1f}" if k in r else f"{'':>14}" for k in kinds))
    f = res["floor"]
    lines.append(f"floor (best trivial per type): step SR {100 * f['step_sr']:.1f}%, SOP PG {100 * f['sop_pg']:.1f}%, "
                 f"TSR {100 * f['sop_tsr']:.1f}%; most frequent type: type acc {100 * f['type_acc']:.1f}%")
    return "\n".join(lines)


def step_sizes(episodes: list[dataset.Episode], image_root=None, blank_screens=None) -> dict:
    """id(step) -> original (W, H) by dataset.original_size (headers only)."""
    return {id(s): dataset.original_size(s, image_root=image_root, blank_screens=blank_screens)
            for ep in episodes for s in ep.steps}


# -----------------------------------------------------------------------------
# eval_sop's flags and outputs for a served model, and the step protocols by name

# a published step protocol: eval_sop's static walk under (match rules, step instruction shown or None =
# as given), docs/method.md §8 and README "A served model, and the published step protocols"
NAMED_PROTOCOLS = {"androidcontrol-high": ("androidcontrol", False), "androidcontrol-low": ("androidcontrol", True),
                   "aitw": ("aitw", None)}
PROTOCOL_HELP = ("androidcontrol-high / -low: AndroidControl-High (goal only) / -Low (goal + step instruction), type "
                 "acc and step SR under --match-rules androidcontrol; aitw: the AITW 14%% rule (--match-rules aitw)")


def add_served_args(p) -> None:
    """eval_sop's flags of --policy openai (the API key comes from $OPENAI_API_KEY, never a flag)."""
    g = p.add_argument_group("served model (--policy openai; policies.py; the API key from $OPENAI_API_KEY)")
    g.add_argument("--base-url", default=None, help="the server's URL up to /v1, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--served-model", default=None, help="the model name the server serves (vllm serve's --served-model-name)")
    g.add_argument("--action-format", choices=list(ADAPTERS), default="uis1",
                   help="the served model's family (system prompt, answer format, coordinates): " +
                   "; ".join(f"{k}: {a.about}" for k, a in ADAPTERS.items()))
    g.add_argument("--concurrency", type=utils.positive_int, default=8, help="requests in flight at once")
    g.add_argument("--timeout", type=utils.positive_float, default=120.0, help="seconds per request")
    g.add_argument("--retries", type=utils.non_negative_int, default=3,
                   help="retries of a request after a network error, HTTP 429 or 5xx (backoff 1, 2, 4 ... s; 0: none); then "
                   "the step is a wrong step and its episode records the error")


def check_args(args, given: set) -> None:
    """eval_sop's served flags and named protocols: raises utils.UsageError on a bad combination; a named
    --protocol becomes `static` with its match rules and step-instruction setting (args.named_protocol:
    its name, else None). given: the flags on the command line (utils.explicit_flags)."""
    served = args.policy == "openai"
    if served != bool(args.base_url and args.served_model) or (not served and (args.base_url or args.served_model)):
        raise utils.UsageError("--policy openai needs --base-url and --served-model (and only it takes them)")
    if args.concurrency < 1 or args.retries < 0 or not args.timeout > 0:
        raise utils.UsageError(f"--concurrency {args.concurrency} / --retries {args.retries} / --timeout {args.timeout}: "
                             "need >= 1 / >= 0 / > 0")
    named = [p for p in args.protocol if p in NAMED_PROTOCOLS]
    args.named_protocol = named[0] if named else None
    if not named:
        return
    rules, instruction = NAMED_PROTOCOLS[named[0]]
    if len(named) > 1 or ("match_rules" in given and args.match_rules != rules) or \
            (instruction is not None and args.step_instruction not in (None, instruction)):
        raise utils.UsageError(f"--protocol {' '.join(named)}: one named protocol a run; it sets --match-rules {rules}" +
                             ("" if instruction is None else f" and --{'' if instruction else 'no-'}step-instruction"))
    args.match_rules = rules
    if instruction is not None:
        args.step_instruction = instruction
    args.protocol = list(dict.fromkeys("static" if p in NAMED_PROTOCOLS else p for p in args.protocol))


def served_sampler(args) -> ServedSampler:
    """The ServedSampler of eval_sop's flags, its API key from $OPENAI_API_KEY."""
    return ServedSampler(args.base_url, args.served_model, ADAPTERS[args.action_format],
                         api_key=os.environ.get("OPENAI_API_KEY") or None, max_new_tokens=args.max_new_tokens,
                         concurrency=args.concurrency, timeout=args.timeout, retries=args.retries,
                         temperature=args.temperature)


def raw_answer(sampler, prompt) -> dict:
    """{"raw": the served answer to `prompt`} for a walk's row (and forgets it); {} for other samplers."""
    return {"raw": sampler.raw.pop(id(prompt), ("", None))[0]} if isinstance(sampler, ServedSampler) else {}


def served_summary(args, sampler: ServedSampler, steps_failed: int, sop_records) -> dict:
    """result.json's `served`: the server, requests, retries, failures and the SOP episodes a failure
    ended (each one's episodes.jsonl line says why: server_error); one stderr line when any failed."""
    failed = [r for r in sop_records or [] if r["server_error"]]
    if steps_failed:
        print(f"eval_sop: {steps_failed} steps got no answer from {args.base_url} after {args.retries} retries "
              f"(wrong steps; {len(failed)} SOP episodes ended by one): {failed[0]['server_error'] if failed else ''}",
              file=sys.stderr)
    return {"base_url": args.base_url, "served_model": args.served_model, "action_format": args.action_format,
            **sampler.stats, "steps_server_error": steps_failed, "episodes_server_error": len(failed)}


def write_responses(path: str, sop_records, static_records) -> None:
    """The raw answers as `eval_sop.py score --action-format` reads them: {episode_id, step, response,
    history ("expert": static, "own": SOP), truncated (static)} per line."""
    with open(path, "w", encoding="utf-8") as f:
        for r in static_records or []:
            f.write(utils.dumps({"episode_id": r["episode_id"], "step": r["t"], "response": r.get("raw", ""),
                               "truncated": r["truncated"], "history": "expert"}) + "\n")
        for r in sop_records or []:
            for t, raw in enumerate(r.get("raw_responses", [])):
                f.write(utils.dumps({"episode_id": r["episode_id"], "step": t, "response": raw, "history": "own"}) + "\n")

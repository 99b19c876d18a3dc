"""MiniWob++ as a live GUI environment for UI-S1: expert demonstrations and online evaluation.

MiniWob++ (PyPI `miniwob` 1.1.0) serves small web tasks in a real browser. Each task shows a
160 x 210 px task area (TASK_W x TASK_H, at the page's top-left): a yellow goal banner (the
"utterance", 50 px) over the task widgets. The screenshot is the 168 x 224 px top-left corner of
the page (SCREEN_W x SCREEN_H): the task area plus an 8 px / 14 px strip of page background right
and below it. 168 and 224 are multiples of 28, so Qwen2.5-VL's smart_resize (gui.resized_size)
leaves the screenshot unchanged and model pixels == page pixels == element-box pixels. This
module drives those pages itself (it uses miniwob only for the HTML files, the DOM reader in
core.js, the goal field extractors and the selenium input helpers), because it must own the
browser's life cycle:

1. Browser. Debian `chromium` + `chromium-driver`, headless, with the flags a closed network needs
   (CHROME_FLAGS), a fresh --user-data-dir per start, device scale factor 1 and a fixed 500 x 320
   viewport, so one CSS pixel of the page is one pixel of the 168 x 224 screenshot: the
   ORIGINAL screenshot pixel space, the page coordinate space and the element boxes are the same.
2. Faults. Every reset/step runs under a deadline (step_timeout_s). A step that runs past it, or
   any WebDriver/transport error, kills the browser's whole process group and raises
   BrowserFault; the next reset starts a fresh browser. evaluate_online retries the episode once
   and otherwise counts it as a browser fault, so a run never hangs.
3. Actions. Our action dicts (docs/method.md §3) with coordinates in pixels of the image the
   policy saw (`image_size`, e.g. a smart_resize'd screenshot) are mapped back to page pixels by
   `to_page_xy` (pixel centres, clamped to the screen). click -> mouse click; long_press ->
   press, hold, release; type -> key strokes into the focused element; key / system_button Enter
   -> key press; swipe -> mouse wheel at coordinate with delta = finger start - finger end (the
   finger moving up scrolls the content down); wait -> sleep (capped); terminate -> ends the
   episode without touching the page; answer, open, system_button Back/Home/Menu -> no-op.
   An action that cannot be parsed is a no-op that still costs a step (info["invalid"]).
4. Reward and success. MiniWob's env_reward is scaled by elapsed time and some tasks give
   partial POSITIVE raw rewards to wrong answers (click-checkboxes: (right - wrong) / n), so
   success := raw_reward >= 1.0 (SUCCESS_RAW_REWARD). "raw > 0" would count a click-checkboxes
   episode with 3 of 4 boxes right as a success (docs/method.md §11). MiniWob's own wall-clock limit
   (10-30 s per task) is raised to episode_time_s (default 600 s) because time does not enter the
   success test and a model policy on a CPU is slow; the step limit is the budget that counts.
5. Experts. EXPERTS maps a task to a scripted expert that reads the DOM (element boxes, values,
   focus, click marks) and the task fields parsed from the goal, never the screenshot. Experts
   are stateless: each call looks at the current page and returns the next action, a templated
   thought and the target element (whose box becomes candidate_bbox). Click points come from
   document.elementFromPoint, so the expert never clicks an element hidden under another.
   18 tasks, expert steps per episode (100 seeds, 100% success each): 1 step: click-test,
   click-button, click-link, click-dialog, click-tab, focus-text; 2: click-button-sequence,
   click-option, click-collapsible; 1-3: click-tab-2 (opens tabs left to right until the link
   shows); 1-8: click-checkboxes; 3: enter-text, enter-text-dynamic, enter-text-2; 4-5:
   search-engine; 5: enter-password, login-user; 7: multi-layouts. Typing is always
   click-the-field, then type.
6. Refs. Element refs ([ref] in the element list) come from core.js and are unique within an
   observation (checked); reset() clears refs left on the page by earlier looks.

Policies for evaluate_online are callables `policy(obs, step) -> action dict`, where obs has
"goal", "screenshot" (PIL RGB, 168 x 224, None with screenshots=False), "elements" (text),
"history" (earlier action dicts), "dom" (list[Element]), "fields", "task", "seed", "image_size".
The policy answers in pixels of the screenshot it was given (ORIGINAL pixels); a model wrapper
that resizes screenshots maps its answer back (gui.scale_action) or passes image_size to step().
smart_resize does not resize 168 x 224, so a Qwen2.5-VL policy's pixels are already ORIGINAL ones.

CLI (last stdout line is a JSON object):
    python miniwob_env.py eval --policy expert --tasks all --seeds 100
    python miniwob_env.py eval --policy random --tasks click-test enter-text --seeds 20
    python miniwob_env.py show --task login-user --seed 3   # goal, element list, expert's plan
"""

import base64
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import miniwob
from miniwob.constants import WEBDRIVER_SPECIAL_KEYS
from miniwob.fields import get_field_extractor
from miniwob.selenium_actions import execute_press_key, execute_type_text
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.action_chains import ActionChains
from urllib3.exceptions import HTTPError as Urllib3Error

# -----------------------------------------------------------------------------
# constants

TASK_W, TASK_H = 160, 210  # MiniWob's task area (#wrap) at the page's top-left, in page CSS px
# The ORIGINAL screenshot: the page's top-left SCREEN_W x SCREEN_H CSS px (task area + background).
# Both sides are multiples of 28 (Qwen2.5-VL's smart_resize factor), so smart_resize keeps
# 168 x 224 as it is (160 x 210 would become 168 x 224, a scaled space the element boxes and
# expert thoughts, written in page pixels, would not match).
SCREEN_W, SCREEN_H = 168, 224
VIEWPORT_W, VIEWPORT_H = 500, 320  # miniwob's own window size for the standard tasks
HTML_DIR = Path(miniwob.__file__).parent / "html" / "miniwob"
SUCCESS_RAW_REWARD = 1.0  # success := raw_reward >= this (see the module docstring, point 4)
CHROME_BINARY = os.environ.get("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",  # containers and CI run as root without user namespaces
    "--disable-gpu",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: tasks are local file:// pages
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--hide-scrollbars",
    "--mute-audio",
    "--force-device-scale-factor=1",
    f"--window-size={VIEWPORT_W},{VIEWPORT_H + 160}",  # viewport is fixed below via CDP
)
KEY_ALIASES = {  # our key names -> WebDriver special keys (miniwob's "<Name>" syntax)
    "enter": "<Enter>", "return": "<Enter>", "tab": "<Tab>", "backspace": "<Backspace>",
    "delete": "<Delete>", "escape": "<Escape>", "esc": "<Escape>", "space": "<Space>",
    "up": "<ArrowUp>", "down": "<ArrowDown>", "left": "<ArrowLeft>", "right": "<ArrowRight>",
    "arrowup": "<ArrowUp>", "arrowdown": "<ArrowDown>", "arrowleft": "<ArrowLeft>",
    "arrowright": "<ArrowRight>", "pageup": "<PageUp>", "pagedown": "<PageDown>",
    "home": "<Home>", "end": "<End>",
}
WAIT_CAP_S = 2.0  # a policy's wait action sleeps at most this long
LONG_PRESS_CAP_S = 1.0
INTERACTIVE_TAGS = ("input", "button", "a", "select", "textarea", "label", "option")


class BrowserFault(RuntimeError):
    """The browser crashed, hung past the step deadline, or the driver connection broke."""


# what a dead or wedged browser raises through selenium (urllib3's errors are no OSError)
_DRIVER_ERRORS = (WebDriverException, OSError, Urllib3Error, BrowserFault)


# -----------------------------------------------------------------------------
# DOM: one flat list of elements per observation

# Runs core.getDOMInfo() (miniwob's DOM reader: boxes, text, values, focus, click marks) and
# flattens it. For every element it also finds a point of the task screen where the element is
# on top (document.elementFromPoint), trying the centre first, so clicks hit what they aim at.
_OBSERVE_JS = """
var W = arguments[0], H = arguments[1];
var root = core.getDOMInfo();
var out = [];
function hits(el, x, y) { var h = document.elementFromPoint(x, y); return h && (h === el || el.contains(h)); }
function visiblePoint(el, n) {
  var x1 = Math.max(0, n.left), y1 = Math.max(0, n.top);
  var x2 = Math.min(W, n.left + n.width), y2 = Math.min(H, n.top + n.height);
  if (x2 - x1 < 1 || y2 - y1 < 1) return null;
  var cx = Math.floor((x1 + x2) / 2), cy = Math.floor((y1 + y2) / 2);
  if (hits(el, cx, cy)) return [cx, cy];
  for (var i = 1; i < 8; i++) for (var j = 1; j < 8; j++) {
    var x = Math.floor(x1 + (x2 - x1) * i / 8), y = Math.floor(y1 + (y2 - y1) * j / 8);
    if (hits(el, x, y)) return [x, y];
  }
  return null;
}
function walk(n, parent) {
  var el = core.previousDOMInfo[n.ref] || core.previousDOMInfo[parent];  // text nodes: parent
  out.push({ref: n.ref, parent: parent, tag: n.tag.toLowerCase(),
            text: n.text === undefined ? null : String(n.text),
            value: n.value === undefined ? null : n.value,
            id: n.id || '', classes: typeof n.classes === 'string' ? n.classes : '',
            left: n.left, top: n.top, width: n.width, height: n.height,
            focused: !!n.focused, tampered: !!n.tampered, leaf: n.children.length === 0,
            point: el ? visiblePoint(el, n) : null});
  n.children.forEach(function (c) { walk(c, n.ref); });
}
walk(root, 0);
return {utterance: core.getUtterance(), elements: out, done: WOB_DONE_GLOBAL};
"""

# A page is settled when no jQuery animation runs and the layout did not move between two reads.
_LAYOUT_JS = """
var busy = (window.jQuery && jQuery(':animated').length) || 0;
var s = [];
document.querySelectorAll('#wrap *').forEach(function (e) {
  var r = e.getBoundingClientRect(); s.push(r.left | 0, r.top | 0, r.width | 0, r.height | 0);
});
return [busy, s.join(',')];
"""

_METADATA_JS = (
    "return {done: WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL, "
    "raw_reward: WOB_RAW_REWARD_GLOBAL, reason: String(WOB_REWARD_REASON)};"
)


@dataclass
class Element:
    """One DOM element (or text pseudo-element, tag "t", negative ref) in page = original px."""

    ref: int
    parent: int
    tag: str  # lower case; inputs carry their type: "input_text", "input_checkbox"
    text: str | None
    value: object  # str for text inputs, bool for checkbox/radio, None otherwise
    id: str
    classes: str
    left: float
    top: float
    width: float
    height: float
    focused: bool
    tampered: bool  # clicked in this episode (core.js marks the click target)
    leaf: bool
    point: tuple[int, int] | None  # a screen point where this element is on top, or None

    @property
    def box(self) -> list[int]:
        """Integer box (x1, y1, x2, y2) clipped to the screen, original pixels."""
        x1 = min(max(math.floor(self.left), 0), SCREEN_W)
        y1 = min(max(math.floor(self.top), 0), SCREEN_H)
        x2 = min(max(math.ceil(self.left + self.width), 0), SCREEN_W)
        y2 = min(max(math.ceil(self.top + self.height), 0), SCREEN_H)
        return [x1, y1, x2, y2]

    @property
    def visible(self) -> bool:
        x1, y1, x2, y2 = self.box
        return x2 > x1 and y2 > y1

    @property
    def label(self) -> str:
        """What the element shows: its text, an input's value, or checked/unchecked."""
        if isinstance(self.value, bool):
            return "checked" if self.value else "unchecked"
        if self.value is not None:
            return str(self.value)
        return (self.text or "").strip()


def _parse_dom(raw: dict) -> list[Element]:
    dom = [Element(**{**e, "point": tuple(e["point"]) if e["point"] else None})
           for e in raw["elements"]]
    if len({e.ref for e in dom}) != len(dom):  # refs name elements in text and in parent links
        raise RuntimeError("element refs are not unique in this observation")
    return dom


def _shown_text(e: Element, max_text: int = 60) -> str:
    """An element's label as its elements_text line shows it: whitespace collapsed, cut to max_text."""
    text = " ".join(e.label.split())
    return text[: max_text - 3] + "..." if len(text) > max_text else text


def elements_text(dom: list[Element], max_text: int = 60) -> str:
    """The element list a model sees: one line per visible leaf or interactive element,
    "[ref] tag 'text' at (x,y) (x1,y1,x2,y2)" in original screenshot pixels, where (x,y) is the
    element's click point (Element.point, the point the experts click; left out when nothing of
    the element is on top) and the rest its box. Showing the point right after the text turns
    grounding into copying: short_thought's "Click tag 'text' at (x,y)." is a substring of the
    line, so a small model need not average box corners."""
    lines = []
    for e in dom:
        if not e.visible or not (e.leaf or e.tag.split("_")[0] in INTERACTIVE_TAGS):
            continue
        if e.tag in ("body", "div") and not e.label:
            continue  # empty layout boxes carry nothing
        text = _shown_text(e, max_text)
        at = f" at ({e.point[0]},{e.point[1]})" if e.point is not None else ""
        lines.append(f"[{e.ref}] {e.tag} '{text}'{at} ({','.join(str(v) for v in e.box)})")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# action mapping: our action dicts -> page coordinates


def to_page_xy(coord, image_size=None) -> tuple[int, int]:
    """Map a point in pixels of an image of size image_size=(W, H) (the screenshot the policy
    saw) to page pixels of the SCREEN_W x SCREEN_H = 168 x 224 screen. Pixel centres map to
    pixel centres: x_page = floor((x + 0.5) * 168 / W); with image_size None or (168, 224) (what
    smart_resize makes of the screenshot) an integer point maps to itself. Points off the image
    are clamped onto the screen."""
    W, H = image_size or (SCREEN_W, SCREEN_H)
    if W <= 0 or H <= 0:
        raise ValueError(f"bad image_size {image_size}")
    x, y = float(coord[0]), float(coord[1])
    if not (math.isfinite(x) and math.isfinite(y)):
        raise ValueError(f"non-finite coordinate {coord}")
    px = math.floor((x + 0.5) * SCREEN_W / W)
    py = math.floor((y + 0.5) * SCREEN_H / H)
    return min(max(px, 0), SCREEN_W - 1), min(max(py, 0), SCREEN_H - 1)


def _key_name(text: str) -> str | None:
    """Our key text ("Enter", "tab", "a") -> miniwob key syntax ("<Enter>", "a"), or None."""
    t = str(text).strip()
    if len(t) == 1:
        return t
    if t.lower() in KEY_ALIASES:
        return KEY_ALIASES[t.lower()]
    if f"<{t}>" in WEBDRIVER_SPECIAL_KEYS:
        return f"<{t}>"
    return None


# -----------------------------------------------------------------------------
# the environment


class MiniWobEnv:
    """One MiniWob++ task in one headless Chromium that this object starts, restarts and kills.

        env = MiniWobEnv("enter-text")
        obs = env.reset(seed=3)                         # obs: see observe()
        obs, reward, done, info = env.step({"action": "click", "coordinate": [40, 70]})
        env.close()

    reward is MiniWob's raw reward (0 until done); info["success"] = reward >= 1.0.
    """

    def __init__(self, task: str, *, step_timeout_s: float = 20.0, episode_time_s: float = 600.0,
                 screenshots: bool = True, data_mode: str = "train"):
        if not (HTML_DIR / f"{task}.html").exists():
            raise ValueError(f"unknown MiniWob++ task {task!r} (no {task}.html in {HTML_DIR})")
        self.task = task
        self.step_timeout_s = step_timeout_s
        self.episode_time_s = episode_time_s
        self.screenshots = screenshots
        self.data_mode = data_mode
        self.field_extractor = get_field_extractor(task)
        self.driver = None
        self._service = None
        self._profile_dir = None
        self._fields = []
        self.seed = None
        self.done = True
        self.n_starts = 0  # browser starts, restarts included

    # --- browser life cycle -------------------------------------------------

    def start(self):
        """Start Chromium + chromedriver in a new session (own process group) and load the task."""
        self.close()
        for path in (CHROME_BINARY, CHROMEDRIVER):
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} not found: apt-get install chromium chromium-driver")
        self._profile_dir = tempfile.mkdtemp(prefix="miniwob-chrome-")
        opts = webdriver.ChromeOptions()
        for flag in CHROME_FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={self._profile_dir}")
        opts.binary_location = CHROME_BINARY  # with both paths given, selenium-manager never runs
        # start_new_session: chromedriver and every chromium process it spawns share one process
        # group, so a hung or crashed browser is killed as a whole with os.killpg.
        self._service = webdriver.ChromeService(executable_path=CHROMEDRIVER,
                                                popen_kw={"start_new_session": True})
        with self._deadline(60.0, "browser start"):
            self.driver = webdriver.Chrome(service=self._service, options=opts)
            self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": VIEWPORT_W, "height": VIEWPORT_H, "deviceScaleFactor": 1, "mobile": False})
            self.driver.get((HTML_DIR / f"{self.task}.html").as_uri())
            w, h, dpr = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight, window.devicePixelRatio];")
        if w < SCREEN_W or h < SCREEN_H or dpr != 1:
            raise BrowserFault(f"viewport {w}x{h} at dpr {dpr}: the {SCREEN_W}x{SCREEN_H} "
                               "screenshot area does not fit")
        self.n_starts += 1

    def close(self):
        """Quit the browser (politely if it answers, by SIGKILL of its process group if not)."""
        if self.driver is not None:
            try:
                with self._deadline(10.0, "browser quit"):
                    self.driver.quit()
            except Exception:  # noqa: BLE001 -- whatever went wrong, the kill below cleans up
                pass
        self._kill()
        self.driver = None
        self._service = None
        if self._profile_dir:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None
        self.done = True

    def _kill(self):
        proc = getattr(self._service, "process", None)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # pgid == chromedriver's pid (new session)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            pass

    class _Deadline:
        """Context manager: kill the browser if the block runs past `seconds`, then raise
        BrowserFault; any WebDriver/transport error inside also becomes a BrowserFault."""

        def __init__(self, env, seconds, what):
            self.env, self.seconds, self.what, self.fired = env, seconds, what, False

        def _fire(self):
            self.fired = True
            self.env._kill()

        def __enter__(self):
            self.timer = threading.Timer(self.seconds, self._fire)
            self.timer.daemon = True
            self.timer.start()
            return self

        def __exit__(self, exc_type, exc, tb):
            self.timer.cancel()
            if not self.fired and (exc_type is None or not issubclass(exc_type, _DRIVER_ERRORS)):
                return False  # success, or an error that is not the browser's (re-raised)
            self.env._kill()  # the next reset() starts a fresh browser
            self.env.driver = None
            if self.fired:
                raise BrowserFault(f"{self.what} ran past {self.seconds:.0f}s; browser killed") from exc
            if exc_type is BrowserFault:
                return False
            raise BrowserFault(f"{self.what}: {exc_type.__name__}: {exc}") from exc

    def _deadline(self, seconds, what):
        return MiniWobEnv._Deadline(self, seconds, what)

    # --- episodes -------------------------------------------------------------

    def reset(self, seed: int) -> dict:
        """Start episode `seed` (MiniWob seeds Math.random with it) and return the first obs.
        (Re)starts the browser first if there is none or the last one faulted."""
        if self.driver is None:
            self.start()
        with self._deadline(self.step_timeout_s, f"reset({seed})"):
            self.driver.execute_script(
                "core.endEpisode(0);"  # leave any running episode (no-op when none runs)
                # forget element refs of earlier looks, so refs are unique in this episode
                "document.querySelectorAll('[data-wob_ref]').forEach(function (e) {"
                "  delete e.dataset.wob_ref; delete e.dataset.wob_eps; });"
                "Math.seedrandom(arguments[0]); core.setDataMode(arguments[1]);"
                "core.EPISODE_MAX_TIME = arguments[2]; core.startEpisodeReal();",
                seed, self.data_mode, int(self.episode_time_s * 1000))
            ready_by = time.time() + 2.0
            while not self.driver.execute_script("return WOB_TASK_READY;"):
                if time.time() > ready_by:
                    raise BrowserFault(f"{self.task} seed {seed} did not become ready")
                time.sleep(0.05)
            self._settle()
            self.seed, self.done = seed, False
            obs = self.observe(refresh_fields=True)
        return obs

    def observe(self, refresh_fields: bool = False) -> dict:
        """The current observation: goal, screenshot (PIL, 168x224), dom, elements text, fields."""
        raw = self.driver.execute_script(_OBSERVE_JS, SCREEN_W, SCREEN_H)
        dom = _parse_dom(raw)
        if refresh_fields:  # fields are parsed once per episode, from the goal at reset
            self._fields = list(self.field_extractor(raw["utterance"]))
        return {"goal": raw["utterance"], "task": self.task, "seed": self.seed,
                "screenshot": self.screenshot() if self.screenshots else None,
                "image_size": (SCREEN_W, SCREEN_H), "dom": dom, "elements": elements_text(dom),
                "fields": dict(self._fields)}

    def screenshot(self) -> Image.Image:
        """The page's top-left 168x224 (the 160x210 task area and the background around it) as
        RGB, 1 image px = 1 page CSS px (device scale factor 1)."""
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "clip": {"x": 0, "y": 0, "width": SCREEN_W, "height": SCREEN_H,
                                      "scale": 1}})
        img = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
        if img.size != (SCREEN_W, SCREEN_H):  # never rescale: image px must stay page px
            raise BrowserFault(f"screenshot is {img.size}, expected {(SCREEN_W, SCREEN_H)}")
        return img

    def _settle(self, max_s: float = 2.0):
        """Wait until animations end and the layout is stable over two reads (20 ms apart)."""
        prev, t_end = None, time.time() + max_s
        while time.time() < t_end:
            busy, sig = self.driver.execute_script(_LAYOUT_JS)
            if not busy and sig == prev:
                return
            prev = sig
            time.sleep(0.02)

    def step(self, action: dict | None, image_size=None):
        """Apply one action; coordinates are in pixels of an image of size image_size (W, H)
        (default: the original 168x224 screenshot). Returns (obs, reward, done, info):
        obs is None once done; reward is the raw MiniWob reward; info has success, reason,
        env_reward, invalid, terminated (policy sent terminate)."""
        if self.driver is None or self.done:
            raise RuntimeError("step() before reset() or after the episode ended")
        info = {"invalid": False, "terminated": False}
        with self._deadline(self.step_timeout_s, f"step {action}"):
            try:
                kind = self._perform(action, image_size)
            except (KeyError, TypeError, ValueError, IndexError) as e:
                kind, info["error"] = "invalid", f"{type(e).__name__}: {e}"
            info["invalid"] = kind == "invalid"
            if kind == "terminate":
                info["terminated"] = True
            else:
                self._settle()
            meta = self.driver.execute_script(_METADATA_JS)
            done = bool(meta["done"]) or kind == "terminate"
            obs = None if done else self.observe()
        self.done = done
        reward = float(meta["raw_reward"]) if meta["done"] else 0.0
        info.update(success=bool(meta["done"]) and reward >= SUCCESS_RAW_REWARD,
                    env_done=bool(meta["done"]), env_reward=float(meta["env_reward"] or 0.0),
                    reason=meta["reason"])
        return obs, reward, done, info

    def _perform(self, action, image_size) -> str:
        """Execute one action dict in the page; returns its kind ("invalid" for a no-op)."""
        if not isinstance(action, dict) or "action" not in action:
            return "invalid"
        kind = action["action"]
        d = self.driver
        if kind in ("click", "long_press"):
            x, y = to_page_xy(action["coordinate"], image_size)
            chain = ActionChains(d, duration=0)
            chain.w3c_actions.pointer_action.move_to_location(x, y)
            if kind == "click":
                chain.w3c_actions.pointer_action.click()
            else:
                hold = min(float(action.get("time", 1.0)), LONG_PRESS_CAP_S)
                chain.w3c_actions.pointer_action.click_and_hold()
                chain.w3c_actions.pointer_action.pause(hold)
                chain.w3c_actions.pointer_action.release()
            chain.w3c_actions.perform()
        elif kind == "type":
            execute_type_text(str(action["text"]), d)
        elif kind in ("key", "system_button"):
            name = action["text"] if kind == "key" else action["button"]
            if kind == "system_button" and str(name).lower() != "enter":
                return "noop"  # Back/Home/Menu have no meaning inside one web page
            key = _key_name(name)
            if key is None:
                return "invalid"
            execute_press_key(key, d)
        elif kind == "swipe":
            x1, y1 = to_page_xy(action["coordinate"], image_size)
            x2, y2 = to_page_xy(action["coordinate2"], image_size)
            chain = ActionChains(d)  # finger up (y2 < y1) = content scrolls down = wheel dy > 0
            chain.w3c_actions.wheel_action.scroll(x=x1, y=y1, delta_x=x1 - x2, delta_y=y1 - y2,
                                                  duration=150)
            chain.w3c_actions.perform()
        elif kind == "wait":
            time.sleep(min(max(float(action.get("time", 1.0)), 0.0), WAIT_CAP_S))
        elif kind == "terminate":
            return "terminate"
        elif kind in ("answer", "open"):
            return "noop"
        else:
            return "invalid"
        return kind


# -----------------------------------------------------------------------------
# scripted experts (read the DOM and the goal's fields, never the screenshot)


@dataclass
class ExpertStep:
    action: dict
    thought: str
    target: Element | None = None  # clicked element; its box is the step's candidate_bbox


def short_thought(action: dict, target: Element | None) -> str:
    """A one-sentence thought naming what the action does: "Click button 'okay' at (24,73).",
    "Type 'abc'.", "Done." (terminate). The click's words and point are those of the target's
    line in elements_text, so a model can copy them; make_miniwob_data.py --thoughts short."""
    kind = action["action"]
    if kind == "terminate":
        return "Done."
    if kind == "click" and target is not None:
        x, y = action["coordinate"]
        return f"Click {target.tag} '{_shown_text(target)}' at ({x},{y})."
    if kind == "type":
        return f"Type '{action['text']}'."
    return f"{kind.capitalize()}."


class ExpertError(RuntimeError):
    """The expert found no sensible next action (should not happen on a healthy page)."""


def _find(dom, pred, what):
    for e in dom:
        if pred(e):
            return e
    raise ExpertError(f"expert cannot find {what}")


def _describe(e: Element) -> str:
    kind = e.tag.replace("input_", "")
    if kind in ("text", "password", "number"):
        return f"the {kind} field" + (f" holding '{e.value}'" if e.value else " (empty)")
    if kind in ("checkbox", "radio"):
        return f"the {e.label} {kind}"
    return f"the {kind} '{e.label}'" if e.label else f"the {kind}"


def _click(e: Element, why: str) -> ExpertStep:
    if e.point is None:
        raise ExpertError(f"target [{e.ref}] {e.tag} '{e.label}' is not clickable on screen")
    thought = f"I see {_describe(e)} at ({e.point[0]},{e.point[1]}). {why}"
    return ExpertStep({"action": "click", "coordinate": list(e.point)}, thought, e)


def _fill(field_el: Element, text: str, what: str) -> ExpertStep | None:
    """Click an empty field, then type into it; None when it already holds `text`."""
    if field_el.value == text:
        return None
    if field_el.value not in ("", None):
        raise ExpertError(f"{what} holds {field_el.value!r}, expected {text!r}")
    if not field_el.focused:
        return _click(field_el, f"I click the {what} to focus it before typing.")
    return ExpertStep({"action": "type", "text": text},
                      f"The {what} is focused and empty. I type '{text}' into it.", None)


def _by_id(dom, id_, what=None):
    return _find(dom, lambda e: e.id == id_, what or f"#{id_}")


def _text_is(e, text):
    return (e.text or "").strip() == text


def expert_click_test(obs):
    btn = _by_id(obs["dom"], "subbtn", "the button")
    return _click(btn, "The task asks me to click it.")


def expert_click_button(obs):
    t = obs["fields"]["target"]
    btn = _find(obs["dom"], lambda e: e.tag == "button" and _text_is(e, t), f"button {t!r}")
    return _click(btn, "It is the button named in the goal, so I click it.")


def expert_click_link(obs):
    t = obs["fields"]["target"]
    link = _find(obs["dom"], lambda e: "alink" in e.classes and _text_is(e, t), f"link {t!r}")
    return _click(link, "It is the link named in the goal, so I click it.")


def expert_click_dialog(obs):
    x = _find(obs["dom"], lambda e: e.tag == "button" and "ui-dialog-titlebar-close" in e.classes,
              "the dialog's close button")
    return _click(x, "It is the dialog's close button 'x', so I click it.")


def expert_click_tab(obs):
    t = obs["fields"]["target"]
    tab = _find(obs["dom"], lambda e: e.tag == "a" and _text_is(e, f"Tab #{t}"), f"Tab #{t}")
    return _click(tab, f"The goal asks for Tab #{t}, so I click it.")


def expert_focus_text(obs):
    box = _by_id(obs["dom"], "tt", "the textbox")
    return _click(box, "Clicking the textbox gives it the focus the goal asks for.")


def expert_click_button_sequence(obs):
    one, two = _by_id(obs["dom"], "subbtn"), _by_id(obs["dom"], "subbtn2")
    if not one.tampered:
        return _click(one, "Button ONE comes first, so I click it now.")
    return _click(two, "Button ONE is done; button TWO comes next.")


def expert_click_option(obs):
    t, dom = obs["fields"]["target"], obs["dom"]
    radios = [e for e in dom if e.tag == "input_radio"]
    texts = {e.parent: (e.text or "").strip() for e in dom if e.tag == "t"}
    radio = _find(radios, lambda e: texts.get(e.parent) == t, f"radio {t!r}")
    if radio.value is not True:
        return _click(radio, f"It is the option '{t}' the goal names, so I select it.")
    return _click(_by_id(dom, "subbtn"), f"'{t}' is selected; I click Submit.")


def expert_click_checkboxes(obs):
    dom, fields = obs["dom"], obs["fields"]
    want = {v for k, v in fields.items() if k.startswith("target")}
    texts = {e.parent: (e.text or "").strip() for e in dom if e.tag == "t"}
    for box in (e for e in dom if e.tag == "input_checkbox"):
        name = texts.get(box.parent)
        if (name in want) != (box.value is True):
            verb = "check" if name in want else "uncheck"
            return _click(box, f"'{name}' must be {verb}ed to match the goal, so I click it.")
    return _click(_by_id(dom, "subbtn"), "Every checkbox matches the goal; I click Submit.")


def expert_click_collapsible(obs):
    dom = obs["dom"]
    header = _find(dom, lambda e: e.tag == "h3", "the section header")
    if "ui-state-active" not in header.classes:
        return _click(header, "The section is collapsed; I click its header to expand it.")
    return _click(_by_id(dom, "subbtn"), "The section is expanded; I click Submit.")


def expert_click_tab_2(obs):
    t, dom = obs["fields"]["target"], obs["dom"]
    link = next((e for e in dom if "alink" in e.classes and _text_is(e, t) and e.point), None)
    if link is not None:
        return _click(link, "It is the link named in the goal, on the open tab; I click it.")
    # Not on the open tab: open the next tab to the right (the episode starts on Tab #1).
    tabs = [e for e in dom if e.tag == "a" and (e.text or "").startswith("Tab #")]
    parents = {e.ref: e for e in dom}
    active = [i for i, e in enumerate(tabs) if "ui-tabs-active" in parents[e.parent].classes]
    if not active or active[0] + 1 >= len(tabs):
        raise ExpertError(f"link {t!r} is on no tab")
    nxt = tabs[active[0] + 1]
    return _click(nxt, f"The link '{t}' is not on this tab; I open {nxt.text} to look there.")


def expert_enter_text(obs):
    t, dom = obs["fields"]["target"], obs["dom"]
    step = _fill(_by_id(dom, "tt", "the text field"), t, "text field")
    return step or _click(_by_id(dom, "subbtn"), f"The field holds '{t}'; I click Submit.")


def expert_enter_text_2(obs):
    f, dom = obs["fields"], obs["dom"]
    t = f["text"].lower() if f["case"] == "lower" else f["text"].upper()
    step = _fill(_by_id(dom, "tt", "the text field"), t, "text field")
    return step or _click(_by_id(dom, "subbtn"), f"The field holds '{t}'; I click Submit.")


def expert_enter_password(obs):
    t, dom = obs["fields"]["target"], obs["dom"]
    step = (_fill(_by_id(dom, "password"), t, "password field")
            or _fill(_by_id(dom, "verify"), t, "verify password field"))
    return step or _click(_by_id(dom, "subbtn"), "Both fields hold the password; I click Submit.")


def expert_login_user(obs):
    f, dom = obs["fields"], obs["dom"]
    step = (_fill(_by_id(dom, "username"), f["username"], "username field")
            or _fill(_by_id(dom, "password"), f["password"], "password field"))
    return step or _click(_by_id(dom, "subbtn"), "Username and password are in; I click Login.")


def expert_search_engine(obs):
    f, dom = obs["fields"], obs["dom"]
    step = _fill(_by_id(dom, "search-text", "the search box"), f["query"], "search box")
    if step:
        return step
    titles = [e for e in dom if "search-title" in e.classes]
    if not titles:
        return _click(_by_id(dom, "search"), f"'{f['query']}' is in the search box; I click Search.")
    rank = int(f["rank"])
    page = (rank - 1) // 3 + 1  # 3 results per page
    parents = {e.ref: e for e in dom}
    links = [e for e in dom if "page-link" in e.classes]
    current = next(int(e.text) for e in links if "active" in parents[e.parent].classes)
    if current != page:
        link = _find(links, lambda e: _text_is(e, str(page)), f"page link {page}")
        return _click(link, f"Result {rank} is on page {page}, not on page {current}; I open page {page}.")
    return _click(titles[(rank - 1) % 3], f"This is search result number {rank}; I click it.")


def _ancestors(dom_by_ref, e):
    for _ in range(len(dom_by_ref)):  # bounded: a tree has no longer path
        if e.parent not in dom_by_ref:
            return
        e = dom_by_ref[e.parent]
        yield e


def expert_multi_layouts(obs):
    f, dom = obs["fields"], obs["dom"]
    by_ref = {e.ref: e for e in dom}
    children = {}
    for e in dom:
        children.setdefault(e.parent, []).append(e)

    def texts_under(a):
        out, todo = [], list(children.get(a.ref, []))
        while todo:
            e = todo.pop()
            if e.tag != "input_text" and e.text:
                out.append(e.text.strip().lower())
            todo.extend(children.get(e.ref, []))
        return out

    def field_for(keywords, what):  # the input whose nearest labelled ancestor names `what`
        for inp in (e for e in dom if e.tag == "input_text"):
            for a in _ancestors(by_ref, inp):
                labels = [t for t in texts_under(a) if any(k in t for k in keywords)]
                others = [t for t in texts_under(a) if t and t not in labels]
                if labels:
                    if len(labels) == 1 and not any(
                            any(k in t for k in kw) for t in others for kw in _ML_KEYS.values()):
                        return inp
                    break
        raise ExpertError(f"no input labelled {what}")

    fields = [(field_for(_ML_KEYS[k], k), k) for k in ("genre", "director", "year")]
    for inp, key in sorted(fields, key=lambda p: p[0].top):  # top to bottom, as a person would
        step = _fill(inp, f[key], f"{key} field")
        if step:
            return step
    submit = _find(dom, lambda e: (e.text or "").strip() in ("Submit", "Search", "Go!"),
                   "the submit button")
    return _click(submit, "Genre, director and year are filled in; I click "
                  f"'{submit.text.strip()}' to search.")


_ML_KEYS = {"genre": ("genre",), "director": ("director",), "year": ("year", "date")}


EXPERTS: dict[str, Callable[[dict], ExpertStep]] = {
    "click-test": expert_click_test,
    "click-button": expert_click_button,
    "click-link": expert_click_link,
    "click-dialog": expert_click_dialog,
    "click-tab": expert_click_tab,
    "focus-text": expert_focus_text,
    "click-button-sequence": expert_click_button_sequence,
    "click-option": expert_click_option,
    "click-checkboxes": expert_click_checkboxes,
    "click-collapsible": expert_click_collapsible,
    "click-tab-2": expert_click_tab_2,
    "enter-text": expert_enter_text,
    "enter-text-dynamic": expert_enter_text,
    "enter-text-2": expert_enter_text_2,
    "enter-password": expert_enter_password,
    "login-user": expert_login_user,
    "search-engine": expert_search_engine,
    "multi-layouts": expert_multi_layouts,
}


# -----------------------------------------------------------------------------
# expert episodes (the data generator's source)

TRAIN_SEED_BASE, TEST_SEED_BASE = 0, 100_000  # splits use disjoint seed ranges
MAX_EXPERT_STEPS = 12


def final_observation(env: MiniWobEnv) -> tuple[Image.Image, str]:
    """Screenshot and element list of the screen as the last action left it. After an
    episode MiniWob covers everything with a black START screen (its sync cover); we hide it
    for this one look so the terminate step shows the finished task, as a phone would."""
    with env._deadline(env.step_timeout_s, "final observation"):
        env.driver.execute_script("if (core.cover_div) core.cover_div.style.display = 'none';")
        img = env.screenshot()
        raw = env.driver.execute_script(_OBSERVE_JS, SCREEN_W, SCREEN_H)
        env.driver.execute_script("if (core.cover_div) core.cover_div.style.display = 'block';")
    return img, elements_text(_parse_dom(raw))


def expert_episode(env: MiniWobEnv, seed: int, max_steps: int = MAX_EXPERT_STEPS,
                   thoughts: str = "long") -> dict:
    """Roll the task's expert through episode `seed`, recording every step.

    Returns {"goal", "task", "seed", "success", "raw_reward", "reason", "steps": [...]}, each
    step {"screenshot": PIL, "action", "thought", "elements", "candidate_bbox"}; a successful
    episode ends with a terminate step on the final screenshot. thoughts: "long" (the expert's
    reasoning sentence) or "short" (short_thought). Raises BrowserFault, ValueError."""
    if thoughts not in ("long", "short"):
        raise ValueError(f"expert_episode: thoughts must be 'long' or 'short', got {thoughts!r}")
    expert = EXPERTS[env.task]
    obs = env.reset(seed)
    goal, steps, reward, info = obs["goal"], [], 0.0, {}
    for _ in range(max_steps):
        st = expert(obs)
        thought = st.thought if thoughts == "long" else short_thought(st.action, st.target)
        steps.append({"screenshot": obs["screenshot"], "action": st.action, "thought": thought,
                      "elements": obs["elements"],
                      "candidate_bbox": [st.target.box] if st.target is not None else []})
        obs, reward, done, info = env.step(st.action)
        if done:
            break
    success = bool(info.get("success"))
    if success:
        img, elements = final_observation(env)
        done_action = {"action": "terminate", "status": "success"}
        steps.append({"screenshot": img, "action": done_action,
                      "thought": "The task is complete, so I finish with success." if thoughts == "long"
                      else short_thought(done_action, None),
                      "elements": elements, "candidate_bbox": []})
    return {"goal": goal, "task": env.task, "seed": seed, "success": success,
            "raw_reward": reward, "reason": info.get("reason"), "steps": steps}


# -----------------------------------------------------------------------------
# online evaluation

Policy = Callable[[dict, int], dict]


def expert_policy(obs: dict, step: int) -> dict:
    """The scripted expert as a policy (reads obs["dom"] and obs["fields"])."""
    return EXPERTS[obs["task"]](obs).action


def random_click_policy(obs: dict, step: int) -> dict:
    """Clicks a uniformly random pixel of the screenshot; deterministic per (task, seed, step)."""
    W, H = obs["image_size"]
    rng = random.Random(f"{obs['task']}-{obs['seed']}-{step}")
    return {"action": "click", "coordinate": [rng.randrange(W), rng.randrange(H)]}


POLICIES = {"expert": expert_policy, "random": random_click_policy}
CAUSES = ("wrong_action", "step_limit", "browser_fault", "policy_error")


def run_episode(env: MiniWobEnv, policy: Policy, seed: int, max_steps: int) -> dict:
    """One online episode. cause: success | wrong_action (the environment ended the episode
    without full reward, or the policy sent terminate first) | step_limit | policy_error.
    env_seconds times the environment alone (reset + steps, screenshots included)."""
    t0 = time.time()
    obs = env.reset(seed)
    env_seconds, history = time.time() - t0, []
    ep = {"seed": seed, "success": False, "steps": max_steps, "cause": "step_limit"}
    for t in range(max_steps):
        try:
            action = policy({**obs, "history": list(history)}, t)
        except Exception as e:  # noqa: BLE001 -- a policy bug is reported, not fatal to the run
            ep = {"seed": seed, "success": False, "steps": t, "cause": "policy_error",
                  "error": f"{type(e).__name__}: {e}"}
            break
        t0 = time.time()
        obs, reward, done, info = env.step(action)
        env_seconds += time.time() - t0
        history.append(action)
        if done:
            ep = {"seed": seed, "success": info["success"], "steps": t + 1,
                  "cause": "success" if info["success"] else "wrong_action",
                  "raw_reward": reward, "reason": info["reason"], "terminated": info["terminated"]}
            break
    ep["env_seconds"] = env_seconds
    return ep


def evaluate_online(policy: Policy, tasks, seeds, max_steps: int = 15, *, retries: int = 1,
                    screenshots: bool = True, step_timeout_s: float = 20.0,
                    episode_time_s: float = 600.0, progress: bool = True) -> dict:
    """Run `policy` live on every task for every seed; seeds is a list or a count n
    (-> TEST_SEED_BASE + 0..n-1, the held-out test seeds). A browser fault restarts the
    browser and retries the episode up to `retries` times, then counts as browser_fault.

    policy(obs, step) -> action dict in pixels of obs["screenshot"] (original 168x224).
    Returns {"per_task": {task: {...}}, "overall": {...}, "episodes": [...]}, where each
    summary has episodes, success_rate, mean_steps, failures (by cause), seconds_per_episode
    and seconds_per_env_step (environment time incl. reset, per step)."""
    from tqdm import tqdm

    if isinstance(seeds, int):
        seeds = list(range(TEST_SEED_BASE, TEST_SEED_BASE + seeds))
    episodes = []
    bar = tqdm(total=len(tasks) * len(seeds), disable=not progress, desc="eval", file=sys.stderr,
               mininterval=2.0)
    for task in tasks:
        env = MiniWobEnv(task, step_timeout_s=step_timeout_s, episode_time_s=episode_time_s,
                         screenshots=screenshots)
        try:
            for seed in seeds:
                t0 = time.time()
                for attempt in range(retries + 1):
                    try:
                        ep = run_episode(env, policy, seed, max_steps)
                        break
                    except BrowserFault as e:
                        env.close()  # the next reset starts a fresh browser
                        ep = {"seed": seed, "success": False, "steps": 0,
                              "cause": "browser_fault", "error": str(e)}
                ep.update(task=task, seconds=time.time() - t0, attempts=attempt + 1)
                episodes.append(ep)
                bar.update(1)
        finally:
            env.close()
    bar.close()

    def summary(eps):
        n = len(eps)
        steps = sum(e["steps"] for e in eps)
        return {"episodes": n,
                "success_rate": sum(e["success"] for e in eps) / max(n, 1),
                "mean_steps": steps / max(n, 1),
                "failures": {c: sum(e["cause"] == c for e in eps) for c in CAUSES},
                "seconds_per_episode": sum(e["seconds"] for e in eps) / max(n, 1),
                # environment time (reset included) per step taken: what a step costs
                "seconds_per_env_step": sum(e.get("env_seconds", 0.0) for e in eps) / max(steps, 1)}

    per_task = {t: summary([e for e in episodes if e["task"] == t]) for t in tasks}
    return {"per_task": per_task, "overall": summary(episodes), "episodes": episodes}


def check_tasks(tasks, need_expert: bool = False) -> None:
    """Raise ValueError naming the first task that is no MiniWob++ task (or, with need_expert, has
    no scripted expert here)."""
    for task in tasks:
        if not (HTML_DIR / f"{task}.html").exists():
            raise ValueError(f"unknown MiniWob++ task {task!r} (tasks with an expert: {', '.join(sorted(EXPERTS))})")
        if need_expert and task not in EXPERTS:
            raise ValueError(f"task {task!r} has no scripted expert (those with one: {', '.join(sorted(EXPERTS))})")


# -----------------------------------------------------------------------------
# CLI


def main(argv=None):
    import cli  # only the CLI needs it (it imports torch; the environment itself does not)

    ap = cli.make_parser(__doc__.split("\n")[0] + "\n\n" + __doc__[__doc__.index("CLI ("):])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="online evaluation of a built-in policy", formatter_class=cli.HelpFormatter,
                        epilog=ap.epilog)
    ev.add_argument("--policy", choices=sorted(POLICIES), default="expert", help="policy to run")
    ev.add_argument("--tasks", nargs="+", default=["all"], help="task names, or 'all' (experts)")
    ev.add_argument("--seeds", type=int, default=20, help="episodes per task")
    ev.add_argument("--seed-base", type=int, default=TEST_SEED_BASE, help="first seed")
    ev.add_argument("--max-steps", type=int, default=15, help="step limit per episode")
    ev.add_argument("--step-timeout", type=float, default=20.0, help="seconds per env step")
    ev.add_argument("--no-screenshots", action="store_true",
                    help="skip screenshots (the built-in policies do not look at them)")
    ev.add_argument("--out", default=None, help="also write the full result JSON here")
    sh = sub.add_parser("show", help="print one episode: goal, element lists, expert actions",
                        formatter_class=cli.HelpFormatter, epilog=ap.epilog)
    sh.add_argument("--task", required=True, help="task name")
    sh.add_argument("--seed", type=int, default=0, help="episode seed")
    args = ap.parse_args(argv)
    try:
        check_tasks([args.task] if args.cmd == "show" else [] if args.tasks == ["all"] else args.tasks,
                    need_expert=args.cmd == "show" or args.policy == "expert")
    except ValueError as e:
        raise cli.UsageError(str(e)) from None
    if args.cmd == "eval" and args.seeds < 1:
        raise cli.UsageError(f"--seeds {args.seeds}: need at least 1 episode per task")

    if args.cmd == "show":
        env = MiniWobEnv(args.task)
        try:
            ep = expert_episode(env, args.seed)
        finally:
            env.close()
        print(f"goal: {ep['goal']}")
        for k, st in enumerate(ep["steps"]):
            print(f"--- step {k}\n{st['elements']}\nthought: {st['thought']}\n"
                  f"action: {json.dumps(st['action'])}  candidate_bbox: {st['candidate_bbox']}")
        print(cli.dumps({"task": args.task, "seed": args.seed, "success": ep["success"],
                           "steps": len(ep["steps"])}))
        return

    tasks = sorted(EXPERTS) if args.tasks == ["all"] else args.tasks
    seeds = list(range(args.seed_base, args.seed_base + args.seeds))
    t0 = time.time()
    res = evaluate_online(POLICIES[args.policy], tasks, seeds, max_steps=args.max_steps,
                         screenshots=not args.no_screenshots, step_timeout_s=args.step_timeout)
    for task, r in res["per_task"].items():
        fails = ", ".join(f"{c}={n}" for c, n in r["failures"].items() if n)
        print(f"{task:24s} success {r['success_rate']:6.1%}  mean steps {r['mean_steps']:4.1f}  "
              f"{r['seconds_per_env_step'] * 1000:5.0f} ms/env step  {fails}")
    if args.out:
        Path(args.out).write_text(cli.dumps(res, indent=1))
    out = {"policy": args.policy, "seeds": args.seeds, "seed_base": args.seed_base,
           "max_steps": args.max_steps, "seconds": round(time.time() - t0, 1),
           "overall": res["overall"],
           "per_task": {t: {"success_rate": r["success_rate"], "mean_steps": r["mean_steps"],
                            "failures": r["failures"]} for t, r in res["per_task"].items()}}
    print(cli.dumps(out))


if __name__ == "__main__":
    import cli

    cli.cli(main)

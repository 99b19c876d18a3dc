"""MiniWob++ as a live GUI environment for UI-S1: the browser, observations, actions, online evaluation.

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
3. Actions. Our action dicts (docs/method.md §3), coordinates in pixels of the image the policy
   saw (`image_size`), mapped back to page pixels by `to_page_xy`, performed by EXECUTORS (one per
   gui.ACTIONS type: mouse press, key strokes, wheel for swipes; answer, open, Back/Home/Menu are
   no-ops). An action that cannot be parsed is a no-op that still costs a step (info["invalid"]).
4. Reward and success. MiniWob's env_reward is scaled by elapsed time and some tasks give
   partial POSITIVE raw rewards to wrong answers (click-checkboxes: (right - wrong) / n), so
   success := raw_reward >= 1.0 (SUCCESS_RAW_REWARD). "raw > 0" would count a click-checkboxes
   episode with 3 of 4 boxes right as a success (docs/method.md §11). MiniWob's own wall-clock limit
   (10-30 s per task) is raised to episode_time_s (default 600 s) because time does not enter the
   success test and a model policy on a CPU is slow; the step limit is the budget that counts.
5. Experts. The scripted DOM experts, the built-in policies (expert, random), expert episodes
   (the data generator's source) and the CLI live in envs/miniwob_experts.py, which imports this
   module (never the reverse).
6. Refs. Element refs ([ref] in the element list) come from core.js and are unique within an
   observation (checked); reset() clears refs left on the page by earlier looks.
7. Pages. envs/miniwob_tasks.py says which tasks exist and serves their pages: the package's and the
   project's own (OWN_TASKS: the memory tasks, whose fact leaves the screen before it is needed), which
   load, seed, step and pay exactly as the package's; their knobs ride in the URL query.

Policies for evaluate_online are callables `policy(obs, step) -> action dict` (or, with a true
`batched` attribute, `policy(list of obs, list of steps) -> list of actions`, one call for every
episode in flight: how a model answers many browsers in one batch), where obs has
"goal", "screenshot" (PIL RGB, 168 x 224, None with screenshots=False), "elements" (text),
"history" (earlier action dicts), "dom" (list[Element]), "fields", "task", "seed", "image_size".
The policy answers in pixels of the screenshot it was given (ORIGINAL pixels); a model wrapper
that resizes screenshots maps its answer back (gui.scale_action) or passes image_size to step().
smart_resize does not resize 168 x 224, so a Qwen2.5-VL policy's pixels are already ORIGINAL ones.
"""

import base64
import contextlib
import io
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

from miniwob.constants import WEBDRIVER_SPECIAL_KEYS
from miniwob.selenium_actions import execute_press_key, execute_type_text
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.action_chains import ActionChains
from urllib3.exceptions import HTTPError as Urllib3Error

from envs.miniwob_tasks import field_extractor
from envs.miniwob_tasks import task_page as _task_page

# -----------------------------------------------------------------------------
# constants

TASK_W, TASK_H = 160, 210  # MiniWob's task area (#wrap) at the page's top-left, in page CSS px
# The ORIGINAL screenshot: the page's top-left SCREEN_W x SCREEN_H CSS px (task area + background).
# Both sides are multiples of 28 (Qwen2.5-VL's smart_resize factor), so smart_resize keeps
# 168 x 224 as it is (160 x 210 would become 168 x 224, a scaled space the element boxes and
# expert thoughts, written in page pixels, would not match).
SCREEN_W, SCREEN_H = 168, 224
VIEWPORT_W, VIEWPORT_H = 500, 320  # miniwob's own window size for the standard tasks
SUCCESS_RAW_REWARD = 1.0  # success := raw_reward >= this (see the module docstring, point 4)
TIMED_OUT = "timed out"   # core.js's reason when its episode timer (core.EPISODE_MAX_TIME) fires
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
        _task_page(task)
        self.task, self.step_timeout_s, self.episode_time_s = task, step_timeout_s, episode_time_s
        self.screenshots, self.data_mode = screenshots, data_mode
        self.field_extractor = field_extractor(task)
        self.driver = self._service = self._profile_dir = None
        self._fields = []
        self.seed, self.done = None, True
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
            self.driver.get(_task_page(self.task))
            w, h, dpr = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight, window.devicePixelRatio];")
        if w < SCREEN_W or h < SCREEN_H or dpr != 1:
            raise BrowserFault(f"viewport {w}x{h} at dpr {dpr}: the {SCREEN_W}x{SCREEN_H} "
                               "screenshot area does not fit")
        self.n_starts += 1

    def load_task(self, task: str):
        """Point this env (and its running browser, if any) at another task's page, so one browser
        serves many tasks in turn: cheaper than a new browser per task (~1-3 s each on 2 cores).
        Raises ValueError for an unknown task, BrowserFault if the page does not load."""
        _task_page(task)
        self.task, self.field_extractor = task, field_extractor(task)
        self.seed, self.done, self._fields = None, True, []
        if self.driver is not None:
            with self._deadline(self.step_timeout_s, f"load {task}"):
                self.driver.get(_task_page(task))

    def close(self):
        """Quit the browser (politely if it answers, by SIGKILL of its process group if not)."""
        if self.driver is not None:
            try:
                with self._deadline(10.0, "browser quit"):
                    self.driver.quit()
            except Exception:  # noqa: BLE001 -- whatever went wrong, the kill below cleans up
                pass
        self._kill()
        self.driver = self._service = None
        if self._profile_dir:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None
        self.done = True

    def _kill(self):
        proc = getattr(self._service, "process", None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # pgid == chromedriver's pid (new session)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.wait(timeout=5)

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
        env_reward, invalid, terminated (policy sent terminate), timed_out (the page's episode timer,
        episode_time_s, ran out: raw reward -1; an action that comes after it is not sent, so it
        cannot start the next problem on the START cover)."""
        if self.driver is None or self.done:
            raise RuntimeError("step() before reset() or after the episode ended")
        info = {"invalid": False, "terminated": False}
        with self._deadline(self.step_timeout_s, f"step {action}"):
            meta = self.driver.execute_script(_METADATA_JS)
            if meta["done"]:  # the page's own timer ended the episode before this action: it would land
                kind = "none"  # on the START cover and begin a new problem, so it is not sent
            else:
                try:
                    kind = self._perform(action, image_size)
                except (KeyError, TypeError, ValueError, IndexError) as e:
                    kind, info["error"] = "invalid", f"{type(e).__name__}: {e}"
                if kind != "terminate":
                    self._settle()
                meta = self.driver.execute_script(_METADATA_JS)
            info["invalid"], info["terminated"] = kind == "invalid", kind == "terminate"
            done = bool(meta["done"]) or kind == "terminate"
            obs = None if done else self.observe()
        self.done = done
        reward = float(meta["raw_reward"]) if meta["done"] else 0.0
        info.update(success=bool(meta["done"]) and reward >= SUCCESS_RAW_REWARD,
                    env_done=bool(meta["done"]), env_reward=float(meta["env_reward"] or 0.0),
                    reason=meta["reason"], timed_out=bool(meta["done"]) and meta["reason"] == TIMED_OUT)
        return obs, reward, done, info

    def _perform(self, action, image_size) -> str:
        """Execute one action dict in the page through EXECUTORS; returns its kind ("invalid" for a
        no-op on bad input, "noop" for an action a web page has no meaning for)."""
        if not isinstance(action, dict) or action.get("action") not in EXECUTORS:
            return "invalid"
        return EXECUTORS[action["action"]](self.driver, action, image_size) or action["action"]


# The executors: one per registered action type (gui.ACTIONS; tests/test_layout.py checks the two agree).
# Each takes the webdriver, the action dict (coordinates in pixels of an image of image_size) and
# image_size (W, H); returns None when it performed the action, else "noop" or "invalid".

def _do_point(d, action, image_size):
    """click, long_press: a pointer press at the point (long_press held `time` s, capped)."""
    x, y = to_page_xy(action["coordinate"], image_size)
    chain = ActionChains(d, duration=0)
    chain.w3c_actions.pointer_action.move_to_location(x, y)
    if action["action"] == "click":
        chain.w3c_actions.pointer_action.click()
    else:
        hold = min(float(action.get("time", 1.0)), LONG_PRESS_CAP_S)
        chain.w3c_actions.pointer_action.click_and_hold()
        chain.w3c_actions.pointer_action.pause(hold)
        chain.w3c_actions.pointer_action.release()
    chain.w3c_actions.perform()


def _do_type(d, action, image_size):
    execute_type_text(str(action["text"]), d)


def _do_wait(d, action, image_size):
    time.sleep(min(max(float(action.get("time", 1.0)), 0.0), WAIT_CAP_S))


def _do_key(d, action, image_size):
    """key, system_button: a key press; Back/Home/Menu have no meaning inside one web page."""
    name = action["text"] if action["action"] == "key" else action["button"]
    if action["action"] == "system_button" and str(name).lower() != "enter":
        return "noop"
    key = _key_name(name)
    if key is None:
        return "invalid"
    execute_press_key(key, d)


def _do_swipe(d, action, image_size):
    """swipe: a wheel scroll at the start point; finger up (y2 < y1) = content scrolls down = wheel dy > 0."""
    x1, y1 = to_page_xy(action["coordinate"], image_size)
    x2, y2 = to_page_xy(action["coordinate2"], image_size)
    chain = ActionChains(d)
    chain.w3c_actions.wheel_action.scroll(x=x1, y=y1, delta_x=x1 - x2, delta_y=y1 - y2, duration=150)
    chain.w3c_actions.perform()


EXECUTORS = {"click": _do_point, "long_press": _do_point, "type": _do_type, "key": _do_key, "system_button": _do_key,
             "swipe": _do_swipe, "wait": _do_wait, "terminate": lambda d, a, s: "terminate",
             "answer": lambda d, a, s: "noop", "open": lambda d, a, s: "noop"}  # no app to open in a page


# -----------------------------------------------------------------------------
# the finished screen, seed splits

TRAIN_SEED_BASE, TEST_SEED_BASE = 0, 100_000  # splits use disjoint seed ranges
ONLINE_SEED_BASE = 200_000  # online evaluation: fresh pages, seeds no data file uses


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


# -----------------------------------------------------------------------------
# online evaluation

Policy = Callable[[dict, int], dict]
CAUSES = ("wrong_action", "step_limit", "time_out", "browser_fault", "policy_error", "server_error")


class _Live:
    """One episode in flight in evaluate_online: its env, where it stands, its clocks."""

    def __init__(self, idx: int, task: str, seed: int, attempt: int, env: "MiniWobEnv"):
        self.idx, self.task, self.seed, self.attempt, self.env = idx, task, seed, attempt, env
        self.obs, self.t, self.history, self.ep, self.over = None, 0, [], None, False
        self.seconds = self.env_seconds = self.policy_seconds = 0.0  # wall share; its browser's own; policy share

    def end(self, **ep) -> None:
        self.ep = {"seed": self.seed, "success": False, **ep}


def _act(policy, batched: bool, lives: list[_Live]) -> list:
    """The policy's actions for every episode in flight: one call of a batched policy, else one call
    per episode; an exception is the action of the episodes it was asked about (-> policy_error)."""
    obs = [{**lv.obs, "history": list(lv.history)} for lv in lives]
    calls = [(obs, [lv.t for lv in lives])] if batched else [([o], [lv.t]) for o, lv in zip(obs, lives)]
    out = []
    for o, t in calls:
        try:
            out += list(policy(o, t)) if batched else [policy(o[0], t[0])]
        except Exception as e:  # noqa: BLE001 -- a policy bug is reported, not fatal to the run
            out += [e] * len(o)
    return out


def _each(pool, fn, items: list) -> list[tuple]:
    """fn(item) for every item, in `pool`'s threads (None: one after another), as (result, BrowserFault
    or None, seconds): each browser is its own process, so their waits (page work, the settle polls)
    overlap; any other exception propagates."""
    def timed(item):
        t0 = time.time()
        try:
            return fn(item), None, time.time() - t0
        except BrowserFault as e:
            return None, e, time.time() - t0
    return list(pool.map(timed, items)) if pool is not None and len(items) > 1 else [timed(i) for i in items]


def _begin(lv: _Live) -> dict:
    """Load the episode's task page if its browser shows another, then reset to its seed."""
    if lv.env.task != lv.task:
        lv.env.load_task(lv.task)
    return lv.env.reset(lv.seed)


def online_summary(episodes: list[dict], tasks) -> dict:
    """evaluate_online's result of `episodes` (its records, in task then seed order): per_task, overall, episodes."""
    def summary(eps):
        n = len(eps)
        steps = sum(e["steps"] for e in eps)
        return {"episodes": n, "success_rate": sum(e["success"] for e in eps) / max(n, 1),
                "mean_steps": steps / max(n, 1), "failures": {c: sum(e["cause"] == c for e in eps) for c in CAUSES},
                "seconds_per_episode": sum(e["seconds"] for e in eps) / max(n, 1),
                # environment time (reset included) per step taken: what a step costs
                "seconds_per_env_step": sum(e.get("env_seconds", 0.0) for e in eps) / max(steps, 1)}

    return {"per_task": {t: summary([e for e in episodes if e["task"] == t]) for t in tasks},
            "overall": summary(episodes), "episodes": episodes}


def evaluate_online(policy: Policy, tasks, seeds, max_steps: int = 15, *, batch_size: int = 1, retries: int = 1,
                    screenshots: bool = True, step_timeout_s: float = 20.0,
                    episode_time_s: float = 600.0, progress: bool = True, on_episode: Callable | None = None) -> dict:
    """Run `policy` live on every task for every seed; seeds is a list or a count n (-> TEST_SEED_BASE
    + 0..n-1, the held-out test seeds). policy(obs, step) -> action dict in pixels of obs["screenshot"]
    (original 168x224); with a true `batched` attribute, policy(list[obs], list[step]) -> list[action].

    Up to batch_size episodes run at once, one browser each, resetting and stepping in threads; a
    batched policy answers them in one call. An episode that ends hands its browser to the next in
    line, preferably of the task its page shows. Episodes do not interact, so results do not depend on
    batch_size (greedy answers agree across batch compositions, sampler.py note 6). A browser fault
    restarts that browser and retries the episode up to `retries` times, then counts as browser_fault.

    An episode: cause success | wrong_action (the page ended it without full reward, or the policy
    sent terminate first) | step_limit | time_out (the page's timer, episode_time_s, ran out) |
    browser_fault | policy_error | server_error (evaluation.online.NoAnswer: an exception returned as an
    action names its `cause`); `seconds` its share of the wall
    time (each policy call and reset or step phase split evenly over its episodes), `policy_seconds` its
    share of the policy calls, `env_seconds` its browser's own time (browsers overlap). on_episode(record):
    called as each episode ends. Returns {"per_task": {task: {...}}, "overall": {...}, "episodes": [...] (task,
    then seed order)}; each summary has episodes, success_rate, mean_steps, failures (by cause),
    seconds_per_episode and seconds_per_env_step. Raises ValueError for batch_size < 1 or an unknown task."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"evaluate_online: batch_size {batch_size} must be >= 1")
    if isinstance(seeds, int):
        seeds = list(range(TEST_SEED_BASE, TEST_SEED_BASE + seeds))
    for t in tasks:  # an unknown task fails before any browser starts
        _task_page(t)
    batched = bool(getattr(policy, "batched", False))
    # the episodes in line, task by task round robin, so the first browsers start on different tasks;
    # idx: the episode's place in the results (task, then seed order)
    line = deque((ti * len(seeds) + k, task, seed, 1) for k, seed in enumerate(seeds) for ti, task in enumerate(tasks))
    done: dict[int, dict] = {}
    retried: dict[int, float] = {}  # seconds an episode spent before a browser fault, carried to its retry
    envs: list[MiniWobEnv] = []
    live: list[_Live] = []
    start_share: dict[int, float] = {}  # id(env) -> its start's seconds, charged to the first episode it serves
    bar = tqdm(total=len(line), disable=not progress, desc="eval", file=sys.stderr, mininterval=2.0)
    pool = ThreadPoolExecutor(batch_size) if batch_size > 1 else None

    def finish(lv: _Live) -> None:
        lv.over = True
        done[lv.idx] = {**lv.ep, "env_seconds": lv.env_seconds, "policy_seconds": lv.policy_seconds, "task": lv.task,
                        "seconds": lv.seconds, "attempts": lv.attempt}
        if on_episode is not None:  # e.g. eval_sop's run folder, which appends it to its file at once
            on_episode(done[lv.idx])
        bar.update(1)

    def fault(lv: _Live, e: Exception) -> None:
        lv.over = True
        lv.env.close()  # the next reset starts a fresh browser
        if lv.attempt <= retries:  # retried next, with what it spent so far
            line.appendleft((lv.idx, lv.task, lv.seed, lv.attempt + 1))
            retried[lv.idx] = lv.seconds
        else:
            lv.end(steps=lv.t, cause="browser_fault", error=str(e))
            finish(lv)

    try:
        while line or live:
            want = min(batch_size, len(line) + len(live)) - len(envs)
            if want > 0:  # the browsers this batch still lacks, started together
                fresh = [MiniWobEnv(line[i][1], step_timeout_s=step_timeout_s, episode_time_s=episode_time_s,
                                    screenshots=screenshots) for i in range(min(want, len(line)))]
                envs += fresh
                t0 = time.time()
                _each(pool, MiniWobEnv.start, fresh)  # a faulted start: the first reset starts it again
                start_share.update((id(e), (time.time() - t0) / len(fresh)) for e in fresh)
            new: list[_Live] = []
            while line and len(live) + len(new) < batch_size:  # the free browsers take the next episodes
                busy = {id(lv.env) for lv in live + new}
                idle = [e for e in envs if id(e) not in busy]  # never empty: `want` started enough browsers
                # a free browser takes the next episode of the task it shows (no page load), else the next in line
                env, k = next(((e, j) for e in idle for j, item in enumerate(line) if item[1] == e.task), (idle[0], 0))
                idx, task, seed, attempt = line[k]
                del line[k]
                lv = _Live(idx, task, seed, attempt, env)
                lv.env_seconds = start_share.pop(id(env), 0.0)
                lv.seconds = retried.pop(idx, 0.0) + lv.env_seconds
                new.append(lv)
            t0 = time.time()
            outs = _each(pool, _begin, new)
            for lv, (obs, err, dt) in zip(new, outs):
                lv.seconds += (time.time() - t0) / len(new)
                lv.env_seconds += dt
                if err is not None:
                    fault(lv, err)
                elif max_steps < 1:  # no step allowed
                    lv.end(steps=0, cause="step_limit")
                    finish(lv)
                else:
                    lv.obs = obs
                    live.append(lv)
            if not live:
                continue
            t0 = time.time()
            actions = _act(policy, batched, live)
            if len(actions) != len(live):
                actions = [RuntimeError(f"policy returned {len(actions)} actions for {len(live)} episodes")] * len(live)
            share = (time.time() - t0) / len(live)
            stepping = []
            for lv, action in zip(live, actions):
                lv.seconds += share
                lv.policy_seconds += share
                if isinstance(action, Exception):
                    lv.end(steps=lv.t, cause=getattr(action, "cause", "policy_error"),
                           error=f"{type(action).__name__}: {action}")
                    finish(lv)
                else:
                    stepping.append((lv, action))
            t0 = time.time()
            outs = _each(pool, lambda la: la[0].env.step(la[1]), stepping)
            for (lv, action), (out, err, dt) in zip(stepping, outs):
                lv.seconds += (time.time() - t0) / len(stepping)
                lv.env_seconds += dt
                if err is not None:
                    fault(lv, err)
                    continue
                obs, reward, ended, info = out
                lv.history.append(action)
                lv.t += 1
                if ended:
                    cause = "success" if info["success"] else "time_out" if info["timed_out"] else "wrong_action"
                    lv.end(success=info["success"], steps=lv.t, cause=cause,
                           raw_reward=reward, reason=info["reason"], terminated=info["terminated"])
                    finish(lv)
                elif lv.t >= max_steps:
                    lv.end(steps=max_steps, cause="step_limit")
                    finish(lv)
                else:
                    lv.obs = obs
            live = [lv for lv in live if not lv.over]
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        for env in envs:
            env.close()
        bar.close()
    return online_summary([done[i] for i in sorted(done)], tasks)

"""AndroidControl's own layouts -> our action space and the UI-S1 episode layout (docs/android_control.md).

One mapping of a native action (`release_action`), used by both readers of AndroidControl's layouts:
- the converter of Google's release (tools/convert_android_control.py: TFRecord shards -> UI-S1 JSONL);
- the loader of the native per-step JSON (`native_episodes`: rows {image, gt, task} -> UI-S1 episode
  dicts, whose steps dataset.load_episodes then checks like any UI-S1 step). dataset.py imports this
  module only when it is given a file in that layout (a JSON list), so it stands off the RL path.

Swipes. A native `scroll` `direction` is the side the content comes from: the finger moves the opposite
way on both axes, so a native "scroll down" becomes a finger swipe upwards (every loaded swipe is the
finger's path, gui.py). The release's UI-S1 files converted only up/down; their horizontal swipes keep
the native direction (dataset.SWIPE_CONVENTIONS "mixed"), so its 133 left/right test swipes disagree
with this conversion. Each file is self-consistent, which is all a match needs.
"""
from __future__ import annotations

import json
import logging
import math
import re

from utils import InputError

logger = logging.getLogger(__name__)

# the action types of Google's release (its README); the native per-step JSON adds ROW_ACTIONS' three
NATIVE_ACTIONS = ("click", "long_press", "scroll", "input_text", "open_app", "navigate_back", "navigate_home", "wait")
PRESS_TIME = WAIT_TIME = 2  # seconds, as the release writes long_press and wait
IMAGE_RE = re.compile(r"episode_(\w+?)-screenshot_(\d+)\.\w+$")  # a native row's image: episode id, step
# a native row's fields under the UI-S1 step's names, so dataset's errors name the row's own field
ROW_FIELDS = {"action_content": "gt", "step_instruction": "task", "screenshot": "image"}


class Bad(InputError, ValueError):
    """One field of a native action or row and what is wrong with it; the caller adds where (shard and
    record, or file and row). An InputError: a script reports it in one line (cli.run_script)."""

    def __init__(self, field: str, what: str):
        super().__init__(f"{field}: {what}")
        self.field, self.what = field, what


# -----------------------------------------------------------------------------
# one native action -> ours

def finger_swipe(direction: str, size: tuple[int, int]) -> tuple[list[int], list[int]]:
    """(start, end) of the finger for a native scroll `direction` (the side the content comes from)
    on a screenshot (W, H) = size: the finger starts on that side and moves to the other, on both
    axes. Points: the centre line at a quarter and three quarters of the screen, (W/2, H/4) <->
    (W/2, 3H/4) and (W/4, H/2) <-> (3W/4, H/2), the release's points. Raises Bad("direction")."""
    w, h = size
    side = {"up": [w // 2, h // 4], "down": [w // 2, 3 * h // 4],
            "left": [w // 4, h // 2], "right": [3 * w // 4, h // 2]}
    opposite = {"up": "down", "down": "up", "left": "right", "right": "left"}
    if direction not in side:
        raise Bad("direction", f"expected up/down/left/right, got {direction!r}")
    if side[direction] == side[opposite[direction]]:  # a swipe with no direction could never be matched
        raise Bad("direction", f"the {w}x{h} screenshot is too small for a {direction} swipe")
    return side[direction], side[opposite[direction]]


def _point(act: dict, size: tuple[int, int], bounds: bool) -> list[int]:
    """act's (x, y) rounded to int pixels; with bounds, within the (W, H) screenshot (1 px slack)."""
    kind, xy = act.get("action_type"), []
    for k, limit in (("x", size[0]), ("y", size[1])):
        v = act.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Bad("x/y", f"expected numbers for {kind!r}, got x={act.get('x')!r} y={act.get('y')!r}")
        try:
            f = float(v)  # JSON's integers have no bound: one past a float's range is a bad record
        except OverflowError:
            raise Bad(k, f"the integer {str(v)[:20]}... ({len(str(v))} digits) does not fit a coordinate") from None
        if not math.isfinite(f):
            raise Bad(k, f"expected a finite number for {kind!r}, got {v!r}")
        if bounds and not -1 <= f <= limit + 1:  # gui's bound: a point off the screenshot is a bad record
            raise Bad(k, f"{v} lies outside the {size[0]}x{size[1]} screenshot")
        xy.append(int(round(v)))
    return xy


def release_action(act, size: tuple[int, int], *, bounds: bool = True) -> dict:
    """One native action of Google's release (the decoded JSON of an episode's `actions[k]`, or a
    native row's `gt`) -> our action dict (gui.ACTIONS), coordinates in pixels of the screenshot the
    action was taken on, whose (W, H) is `size` (also where a scroll's finger path lies). bounds:
    points must lie on that screenshot (the converter; the loader checks them against the recorded
    size itself). Raises Bad naming the key: a missing or ill-typed argument, an unknown type."""
    if not isinstance(act, dict):
        raise Bad("action", f"expected a JSON object, got {type(act).__name__}")
    kind = act.get("action_type")

    def text(key):
        v = act.get(key)
        if not isinstance(v, str):
            raise Bad(key, f"expected a string for {kind!r}, got {v!r}")
        return v

    if kind == "click":
        return {"action": "click", "coordinate": _point(act, size, bounds)}
    if kind == "long_press":
        return {"action": "long_press", "coordinate": _point(act, size, bounds), "time": PRESS_TIME}
    if kind == "scroll":
        start, end = finger_swipe(act.get("direction"), size)
        return {"action": "swipe", "coordinate": start, "coordinate2": end}
    if kind == "input_text":
        return {"action": "type", "text": text("text")}
    if kind == "open_app":
        return {"action": "open", "text": text("app_name")}
    if kind in ("navigate_back", "navigate_home"):
        return {"action": "system_button", "button": "Back" if kind == "navigate_back" else "Home"}
    if kind == "wait":
        return {"action": "wait", "time": WAIT_TIME}
    raise Bad("action_type", f"unknown action type {kind!r} (known: {', '.join(NATIVE_ACTIONS)})")


def row_action(gt, size: tuple[int, int]) -> dict:
    """A native row's `gt` -> our action: the release's types (release_action, points unchecked: the
    loader checks them against the row's recorded size), and the three the per-step JSON adds:
    keyboard_enter (the Enter button), answer, and AndroidWorld's terminal `status`. Raises Bad."""
    kind = gt.get("action_type") if isinstance(gt, dict) else None
    if kind in NATIVE_ACTIONS or not isinstance(gt, dict):
        return release_action(gt, size, bounds=False)
    if kind == "keyboard_enter":
        return {"action": "system_button", "button": "Enter"}
    if kind == "answer":
        text = gt.get("text")
        if not isinstance(text, str):
            raise Bad("text", f"expected a string for 'answer', got {text!r}")
        return {"action": "answer", "text": text}
    if kind == "status":
        s = gt.get("goal_status")
        if s not in ("complete", "infeasible", "successful", "success", "failure"):
            raise Bad("goal_status", f"unknown status {s!r}")
        return {"action": "terminate", "status": "success" if s in ("complete", "successful", "success") else "failure"}
    raise Bad("action_type", f"unknown native action {kind!r}")


# -----------------------------------------------------------------------------
# the native per-step JSON -> UI-S1 episodes

def _row_step(row, screen: tuple[int, int]) -> tuple[str, int, dict]:
    """One native row -> (episode id, step number, its step in the UI-S1 layout). Raises Bad."""
    if not isinstance(row, dict):
        raise Bad("<row>", f"expected a JSON object, got {type(row).__name__}")
    img = row.get("image")
    m = IMAGE_RE.search(img) if isinstance(img, str) else None
    if m is None:
        raise Bad("image", f"expected a name like episode_<id>-screenshot_<k>.png, got {img!r}")
    size = row.get("image_size", row.get("img_size"))  # checked by the loader; until then, if it is no size
    ok = isinstance(size, list) and len(size) == 2 and all(type(c) is int and c > 0 for c in size)
    try:  # ... a scroll lies on the phone's usual screen (the loader then names the bad size)
        action = row_action(row.get("gt"), tuple(size) if ok else screen)
    except Bad as e:
        raise Bad("gt" if e.field == "action" else "/".join(f"gt.{f}" for f in e.field.split("/")), e.what) from None
    task = row.get("task")
    if task is not None and not isinstance(task, str):
        raise Bad("task", f"expected a string, got {task!r}")
    step = {"action_content": action, "screenshot": img, "image_size": size, "step_instruction": task,
            "candidate_bbox": row.get("candidate_bbox")}
    return m.group(1), int(m.group(2)), step


def read_rows(text: str, path: str) -> list:
    """The rows of a JSON list file (native_episodes, which dataset.load_episodes asks for every JSON list).
    Raises Bad naming the file and line of invalid JSON, or row 0 when the rows are not native steps
    {image, gt, task} (UI-S1 episodes are read one per line, from a JSONL file)."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise Bad(f"{path}: line {e.lineno}", f"invalid JSON: {e.msg}") from None
    first = rows[0] if rows else {"gt": None}
    if not (isinstance(first, dict) and ("gt" in first or "image" in first) and "steps" not in first):
        saw = sorted(first) if isinstance(first, dict) else type(first).__name__
        raise Bad(f"{path}: row 0", f"unknown format: expected a native AndroidControl step (image, gt, "
                  f"task), or UI-S1 episodes (goal, steps) one per line in a JSONL file; saw {saw}")
    return rows


def native_episodes(text: str, path: str, screen: tuple[int, int]) -> list[dict]:
    """The text of a native JSON list file `path` (read_rows: one row per step, image
    episode_<id>-screenshot_<k>.png) -> episodes {goal, episode_id, meta, steps: [(row, step in the UI-S1
    layout, swipes as finger paths)]}, in order of first appearance, steps sorted by k (dataset.Episode's
    fields but source, once each step is checked). screen: (W, H) of a row that records no
    size (a scroll's finger path lies on it). The file records no goal: the goal is the episode's step
    instructions joined, those of rows dropped at a gap included (like AndroidControl-Low's plan of the
    whole task); a row's own "goal" wins. Raises Bad (read_rows's, or naming "row i: field"): the
    message is complete.

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
    groups: dict[str, dict[int, tuple[int, dict]]] = {}
    goals: dict[str, str] = {}  # a goal, where a row carries one (other exports of the format do)
    for i, row in enumerate(read_rows(text, path)):
        try:
            ep, k, step = _row_step(row, screen)
        except Bad as e:
            raise Bad(f"{path}: row {i}: field {e.field!r}", e.what) from None
        if k in groups.setdefault(ep, {}):
            raise Bad(f"{path}: row {i}: field 'image'", f"duplicate step {k} of episode {ep}")
        groups[ep][k] = (i, step)
        if isinstance(row.get("goal"), str) and row["goal"]:
            goals.setdefault(ep, row["goal"])
    out, gapped = [], []
    for ep, by_k in groups.items():
        ks = sorted(by_k)
        run = next((j for j in range(1, len(ks)) if ks[j] != ks[j - 1] + 1), len(ks))
        meta = {"format": "android_control_native", "swipe_convention": "native scroll direction"}
        if run < len(ks) or ks[0] != 0:
            meta.update(steps_recorded=ks, first_step=ks[0], steps_dropped=len(ks) - run)
            gapped.append((ep, ks, len(ks) - run))
        tasks = (by_k[k][1]["step_instruction"] for k in ks)
        goal = goals.get(ep) or " ".join(t.strip() for t in tasks if t and t.strip())
        out.append({"goal": goal, "episode_id": ep, "steps": [by_k[k] for k in ks[:run]], "meta": meta})
    if gapped:
        ep, ks, _ = gapped[0]
        logger.warning("%s: %d of %d episodes skip step numbers or start after step 0 (e.g. episode %s: steps %s); "
                       "each is cut at its first gap, %d rows dropped (extras.android_control.native_episodes)",
                       path, len(gapped), len(out), ep, _ranges(ks), sum(n for *_, n in gapped))
    return out


def _ranges(ks: list[int]) -> str:
    """Sorted ints as runs: [0, 1, 2, 3, 4, 6, 7] -> '0-4, 6-7'."""
    runs, start = [], ks[0]
    for a, b in zip(ks, ks[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else f"{a}")
            start = b
    return ", ".join(runs)

"""Episodes and screenshots (docs/method.md §2): UI-S1 JSONL files and AndroidControl's native JSON
(extras/android_control.py) loaded into `Episode` / `Step`: actions canonical (gui.check_action),
swipes as finger paths, coordinates in ORIGINAL screenshot pixels (`original_size`)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from PIL import Image

import utils
from gui import as_number, check_action, swipe_direction

ANDROID_CONTROL_SIZE = (1080, 2400)  # (W, H) of AndroidControl phones where a native row records no size

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

    @property
    def task(self) -> str:
        """The group the episode is reported and logged under: its MiniWob task, else its data file."""
        return str(self.meta.get("task") or self.source)


class DataError(utils.InputError, ValueError):
    """Bad input (a data file, a recorded size that disagrees with its screenshot): the message
    names file, line (or row) and field; scripts report it in one line."""


def _bad(where: str, fld: str, msg: str) -> DataError:
    """The error of field `fld` of the record at `where` ("file: line N" or "file: row N")."""
    return DataError(f"{where}: field {fld!r}: {msg}")


def _size(v, where, fld):
    if v is None:
        return None
    ok = isinstance(v, (list, tuple)) and len(v) == 2
    if not ok or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in v):
        raise _bad(where, fld, f"expected [W, H] positive ints, got {v!r}")
    return (v[0], v[1])


def _boxes(v, where, fld):
    if v is None:
        return []
    if isinstance(v, (list, tuple)) and len(v) == 4 and all(as_number(c) is not None for c in v):
        v = [v]  # a single box (the release's `len(...) == 4` case)
    if not isinstance(v, (list, tuple)):
        raise _bad(where, fld, f"expected a list of [x1, y1, x2, y2] boxes, got {v!r}")
    out = []
    for i, b in enumerate(v):
        if not isinstance(b, (list, tuple)) or len(b) != 4 or any(as_number(c) is None for c in b):
            raise _bad(where, f"{fld}[{i}]", f"expected [x1, y1, x2, y2] numbers, got {b!r}")
        if b[2] < b[0] or b[3] < b[1]:  # such a box can never contain a point: no step could match on it
            raise _bad(where, f"{fld}[{i}]", f"reversed corners (x2 < x1 or y2 < y1): {b!r}")
        if b[2] == b[0] or b[3] == b[1]:
            raise _bad(where, f"{fld}[{i}]", f"empty box (zero width or height): {b!r}")
        out.append(list(b))
    return out


def _text(v, where, fld):
    if v is None or isinstance(v, str):
        return v
    raise _bad(where, fld, f"expected a string, got {v!r}")


def _elements(v, where, fld):
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):  # one element per line: role, text, box as the producer wrote them
        return "\n".join(e if isinstance(e, str) else json.dumps(e, ensure_ascii=False) for e in v)
    raise _bad(where, fld, f"expected a string or a list, got {type(v).__name__}")


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


def _to_finger(action: dict, convention: str | None, where, fld) -> dict:
    """A stored swipe -> the finger's path under the file's `convention`. A zero-length swipe, or a
    file that declares no convention, raises DataError."""
    if action["coordinate"] == action["coordinate2"]:
        raise _bad(where, fld, f"zero-length swipe {action['coordinate']} -> "
                   f"{action['coordinate2']}: it has no direction, no prediction could match it")
    if convention is None:
        raise _bad(where, "swipe_convention", "the file stores swipes but declares no convention: "
                          "pass swipe_convention (eval_sop.py --swipe-convention) one of "
                          f"{SWIPE_CONVENTIONS}, or add \"swipe_convention\" to each episode")
    d = swipe_direction(action["coordinate"], action["coordinate2"])
    if convention == "scroll" or (convention == "mixed" and d in ("left", "right")):
        return {**action, "coordinate": action["coordinate2"], "coordinate2": action["coordinate"]}
    return action


def _check_points(action: dict, size, where, fld):
    """Expert points lie in the recorded image (W, H), 1 px slack, else DataError (with a hint when
    they lie in (H, W))."""
    if size is None:
        return
    w, h = size
    for k in ("coordinate", "coordinate2"):
        if k in action:
            x, y = action[k]
            if not (-1 <= x <= w + 1 and -1 <= y <= h + 1):
                hint = ("; image_size looks (H, W)-swapped: write [W, H]"
                        if -1 <= x <= h + 1 and -1 <= y <= w + 1 else "")
                raise _bad(where, f"{fld}.{k}", f"point {[x, y]} lies outside the recorded "
                           f"image_size {w}x{h} (W x H){hint}")


def _uis1_episode(obj, where, path, root, default_id, swipe_convention=None) -> Episode:
    """One episode of the UI-S1 format (MiniWob's adds task, seed, image_size and per-step
    thoughts and elements)."""
    if not isinstance(obj, dict):
        raise _bad(where, "<episode>", f"expected a JSON object, got {type(obj).__name__}")
    if "steps" not in obj and ("gt" in obj or "image" in obj):
        raise _bad(where, "steps", f"missing: this line looks like a native AndroidControl step "
                          f"(keys {sorted(obj)}); native files are one JSON list of such rows")
    goal = obj.get("goal")
    if not isinstance(goal, str):
        raise _bad(where, "goal", f"expected a string, got {goal!r}")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise _bad(where, "steps", "expected a non-empty list")
    ep_size = _size(obj.get("image_size"), where, "image_size")
    declared = obj.get("swipe_convention")
    if declared is not None and declared not in SWIPE_CONVENTIONS:
        raise _bad(where, "swipe_convention", f"expected one of {SWIPE_CONVENTIONS}, got {declared!r}")
    convention = swipe_convention or declared
    out = [_step(s, where, f"steps[{k}].", root, ep_size, convention) for k, s in enumerate(steps)]
    ep_id = obj.get("episode_id", default_id)
    if isinstance(ep_id, bool) or not isinstance(ep_id, (str, int)):
        raise _bad(where, "episode_id", f"expected a string or int, got {ep_id!r}")
    meta = {k: v for k, v in obj.items() if k not in ("goal", "steps", "episode_id")}
    if convention is not None:
        meta["swipe_convention"] = convention
    return Episode(goal=goal, episode_id=str(ep_id), steps=out, source=path, meta=meta)


def _step(s, where, prefix: str, root, size, convention, names: dict | None = None) -> Step:
    """One step in the UI-S1 layout (steps[k], or a converted native row) -> Step. size: the
    episode's image_size; errors name prefix + the field (a native row's own name: `names`)."""
    fld = lambda key: prefix + (names or {}).get(key, key)  # noqa: E731
    if not isinstance(s, dict):
        raise _bad(where, prefix.rstrip("."), "expected a JSON object")
    if "action_content" not in s:
        raise _bad(where, fld("action_content"), "missing")
    raw = s["action_content"]
    try:
        action = check_action(raw, strict=True)
    except ValueError as e:
        raise _bad(where, fld("action_content"), str(e)) from None
    if action["action"] == "swipe":
        action = _to_finger(action, convention, where, fld("action_content"))
    size = _size(s.get("image_size"), where, fld("image_size")) or size
    _check_points(action, size, where, fld("action_content"))
    check = s.get("check_options") or {}
    if not isinstance(check, dict):
        raise _bad(where, fld("check_options"), "expected a JSON object")
    if "candidate_bbox" in s:
        boxes = _boxes(s["candidate_bbox"], where, fld("candidate_bbox"))
    elif "candidate_bbox" in check:
        boxes = _boxes(check["candidate_bbox"], where, fld("check_options") + ".candidate_bbox")
    else:  # the train file puts one box on the action itself (a dict: check_action said so)
        boxes = _boxes(raw.get("bbox"), where, fld("action_content") + ".bbox")
    instruction = _text(s.get("step_instruction"), where, fld("step_instruction"))
    return Step(screenshot=_text(s.get("screenshot"), where, fld("screenshot")), action=action,
                candidate_bbox=boxes, image_size=size,  # a blank instruction is none
                step_instruction=instruction if instruction and instruction.strip() else None,
                thought=_text(s.get("thought"), where, fld("thought")),
                elements=_elements(s.get("elements"), where, fld("elements")),
                root=root, where=f"{where}: {prefix[:-1]}" if prefix else str(where))


def load_episodes(path: str, *, limit: int | None = None, swipe_convention: str | None = None) -> list[Episode]:
    """The first `limit` episodes of a UI-S1 JSONL file (an episode a line, "line-<n>" its default
    id) or of AndroidControl's native per-step JSON list. Swipes come back as finger paths: a JSONL
    file's convention is swipe_convention (one of SWIPE_CONVENTIONS), else each episode's, else
    KNOWN_SWIPE_CONVENTIONS's. Anything malformed raises DataError (a ValueError) naming file, line
    (or row) and field; an unknown swipe_convention, ValueError."""
    path, root = str(path), os.path.dirname(os.path.abspath(path))
    if swipe_convention is not None and swipe_convention not in SWIPE_CONVENTIONS:
        raise ValueError(f"swipe_convention: expected one of {SWIPE_CONVENTIONS}, "
                         f"got {swipe_convention!r}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: byte {e.start}: not UTF-8 text (a JSONL or JSON episode file "
                        "was expected)") from None
    if text.lstrip().startswith("["):  # a JSON list: AndroidControl's native per-step rows
        from extras import android_control

        try:
            native = android_control.native_episodes(text, path, ANDROID_CONTROL_SIZE)[:limit]
        except android_control.Bad as e:
            raise DataError(str(e)) from None
        episodes = []
        for ep in native:  # each step checked as a UI-S1 one, errors naming the row's own field
            steps = [_step(s, f"{path}: row {i}", "", root, None, "finger",
                           android_control.ROW_FIELDS) for i, s in ep.pop("steps")]
            episodes.append(Episode(source=path, steps=steps, **ep))
        return episodes
    convention = swipe_convention or KNOWN_SWIPE_CONVENTIONS.get(hashlib.sha256(raw).hexdigest())
    episodes = {}  # by id
    for n, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(episodes) >= limit:
            break
        if not line.strip():
            continue
        where = f"{path}: line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(where, "<json>", f"invalid JSON: {e.msg} (column {e.colno})") from None
        ep = _uis1_episode(obj, where, path, root, f"line-{n}", convention)
        if ep.episode_id in episodes:
            raise _bad(where, "episode_id", f"duplicate episode id {ep.episode_id!r}")
        episodes[ep.episode_id] = ep
    return list(episodes.values())


# -----------------------------------------------------------------------------
# Screenshots

def screenshot_candidates(step: Step, image_root: str | None = None) -> list[str]:
    """Where a step's screenshot may lie, in order: under image_root the recorded path (leading '/'
    dropped), then its file name; without, the path as is, relative to the data file's folder."""
    p = step.screenshot
    if not p:
        return []
    if image_root is not None:
        return [os.path.join(image_root, p.lstrip("/\\")), os.path.join(image_root, os.path.basename(p))]
    return [os.path.join(step.root or ".", p)]  # an absolute p stays as it is


def _screenshot_file(step: Step, image_root: str | None) -> str | None:
    return next((p for p in screenshot_candidates(step, image_root) if os.path.isfile(p)), None)


def original_size(step: Step, *, image_root: str | None = None,
                  blank_screens: tuple[int, int] | None = None) -> tuple[int, int]:
    """(W, H) of the step's ORIGINAL screenshot, the pixels of its expert action and boxes: the one
    answer of rollout, SFT and evaluation. A file found: its size (header only), which a recorded
    image_size must match within 1 px, else DataError naming Step.where (with a hint when it is the
    (H, W)); no file: the recorded image_size, else blank_screens, else FileNotFoundError."""
    path, rec = _screenshot_file(step, image_root), step.image_size
    if path is None:
        if rec is None and blank_screens is None:
            raise FileNotFoundError(_missing_message(step, image_root))
        return rec or (int(blank_screens[0]), int(blank_screens[1]))
    with Image.open(path) as im:
        size = im.size
    if rec is not None and (abs(rec[0] - size[0]) > 1 or abs(rec[1] - size[1]) > 1):
        swapped = (abs(rec[0] - size[1]) <= 1 and abs(rec[1] - size[0]) <= 1)
        raise DataError(f"{step.where or step.screenshot}: field 'image_size': recorded "
                        f"{rec[0]}x{rec[1]} (W x H) but {path} is {size[0]}x{size[1]}"
                        + ("; the record looks (H, W)-swapped: write [W, H]" if swapped else ""))
    return size


def _missing_message(step: Step, image_root: str | None) -> str:
    tried = ", ".join(screenshot_candidates(step, image_root)) or "nothing recorded"
    return (f"screenshot {step.screenshot!r} not found (tried: {tried}); "
            "pass --image-root DIR, or --blank-screens WxH for blank stand-ins")


def load_screenshot(step: Step, *, image_root: str | None = None,
                    blank_screens: tuple[int, int] | None = None) -> Image.Image:
    """The step's screenshot in RGB, of size original_size(step, ...) (which checks it). No file:
    FileNotFoundError, or with blank_screens a black image of that size stands in."""
    size = original_size(step, image_root=image_root, blank_screens=blank_screens)
    p = _screenshot_file(step, image_root)
    if p is not None:
        with Image.open(p) as im:
            return im.convert("RGB")
    if blank_screens is None:
        raise FileNotFoundError(_missing_message(step, image_root))
    return Image.new("RGB", size)

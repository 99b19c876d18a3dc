"""Which MiniWob++ task pages exist and where they are served from: the `miniwob` package's pages and the
project's own (envs/miniwob_pages/), both loaded, seeded, stepped and paid by envs/miniwob_env.py alike.

The project's pages are written on MiniWob++'s core.js (MIT licence; Copyright 2016 OpenAI, 2018 Stanford
University, 2022 Farama Foundation): the same episode, seed and reward semantics, the utterance in #query.
OWN_TASKS names each variant: (page, URL query = the task's knobs, read by the page with core.getOpt).

Memory tasks (memory.html's header): a fact shown at step 0 is chosen among distractors at step gap + 1
(memory-code-*, memory-name-*), or typed into a field (memory-type-*: at step gap + 1 when the field opens
focused, else gap + 2), after it left the screen; only the agent's own earlier thought still holds it.
Distance 1 needs --num-images 1 to keep the fact out of the kept screenshots; from distance 2 on, the
release's 2 screenshots do not hold it either. Tune difficulty in OWN_TASKS (or add a name: the expert, the data tool
and eval_sop --online take every memory-* row).

The task names are checked while flags are parsed (`miniwob_task`, `miniwob_task_or_all`): importing this
module needs no browser and not the `miniwob` package itself (it is only located).
"""

import atexit
import importlib.util
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlencode

import cli

_SPEC = importlib.util.find_spec("miniwob")  # located, not imported: the task names need no browser
HTML_DIR = Path(_SPEC.origin if _SPEC and _SPEC.origin else ".").parent / "html" / "miniwob"  # the package's task pages
PAGES_DIR = Path(__file__).resolve().parent / "miniwob_pages"  # the project's own
OWN_TASKS = {
    "memory-code-1": ("memory.html", {"fact": "code", "len": 4, "options": 4, "gap": 0}),
    "memory-name-2": ("memory.html", {"fact": "name", "options": 4, "gap": 1, "widget": "radio"}),
    "memory-code-3": ("memory.html", {"fact": "code", "len": 4, "options": 4, "gap": 2}),
    # typed recall: no choices to look up, the code itself is typed (read at step 0, typed at step 1 / 3)
    "memory-type-1": ("memory.html", {"fact": "code", "len": 8, "gap": 0, "widget": "type", "focus": 1}),
    "memory-type-3": ("memory.html", {"fact": "code", "len": 8, "gap": 1, "widget": "type"}),
    # the same with codes of 4 or 8 digits, single tokens of the tiny model's vocabulary (docs/protocol_memory.md §9)
    "memory-d4-type-1": ("memory.html", {"fact": "code", "len": 4, "chars": "digits", "gap": 0, "widget": "type",
                                         "focus": 1}),
    "memory-d4-type-3": ("memory.html", {"fact": "code", "len": 4, "chars": "digits", "gap": 1, "widget": "type"}),
    "memory-d8-type-1": ("memory.html", {"fact": "code", "len": 8, "chars": "digits", "gap": 0, "widget": "type",
                                         "focus": 1}),
    "memory-d8-type-3": ("memory.html", {"fact": "code", "len": 8, "chars": "digits", "gap": 1, "widget": "type"}),
}
MEMORY_TASKS = [t for t in OWN_TASKS if t.startswith("memory-")]
_serve_root: Path | None = None


def _own_root() -> Path:
    """A folder that serves our pages beside MiniWob++'s `core` and `common` (symlinks), so a page's
    "../core/core.js" resolves as it does for the package's pages; one per process, removed at exit."""
    global _serve_root
    if _serve_root is None:
        root = Path(tempfile.mkdtemp(prefix="miniwob-own-"))
        for name, target in (("core", HTML_DIR.parent / "core"), ("common", HTML_DIR.parent / "common"),
                             ("own", PAGES_DIR)):
            (root / name).symlink_to(target, target_is_directory=True)
        atexit.register(shutil.rmtree, root, True)  # unlinks the symlinks, never their targets
        _serve_root = root
    return _serve_root


def is_task(task: str) -> bool:
    """A MiniWob++ task of the package, or one of the project's own pages (OWN_TASKS)."""
    return task in OWN_TASKS or (HTML_DIR / f"{task}.html").exists()


def task_page(task: str) -> str:
    """The URL of a task's page (file URI; our own pages carry their knobs as the query). Raises ValueError
    for an unknown task."""
    if task in OWN_TASKS:
        page, knobs = OWN_TASKS[task]
        return (_own_root() / "own" / page).as_uri() + "?" + urlencode(knobs)
    if not is_task(task):
        raise ValueError(f"unknown MiniWob++ task {task!r} (no {task}.html in {HTML_DIR}, not in OWN_TASKS)")
    return (HTML_DIR / f"{task}.html").as_uri()


def field_extractor(task: str):
    """miniwob's goal-field parser of a package task (utterance -> [(key, value)]); our pages put no fields
    in the goal. Raises KeyError for a package task miniwob has no parser for."""
    from miniwob.fields import get_field_extractor  # the package itself, where an online run needs it

    return (lambda utterance: []) if task in OWN_TASKS else get_field_extractor(task)


def tasks() -> list[str]:
    """The MiniWob++ tasks there is a page for: the installed package's html/miniwob/*.html and the
    project's own (OWN_TASKS, the memory tasks)."""
    return sorted({p.stem for p in HTML_DIR.glob("*.html")} | set(OWN_TASKS))


miniwob_task = cli.names(tasks, "MiniWob++ task")                                        # --tasks, --online-tasks
miniwob_task_or_all = cli.names(lambda: ["all", "memory", *tasks()], "MiniWob++ task")  # 'all', 'memory': task sets

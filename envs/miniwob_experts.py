"""The scripted MiniWob++ experts, the built-in policies and the MiniWob++ command line.

The environment (browser, observations, actions, online evaluation) is envs/miniwob_env.py; this
module imports it (never the reverse).

EXPERTS maps a task to a scripted expert that reads the DOM (element boxes, values, focus, click
marks) and the task fields parsed from the goal, never the screenshot. Experts are stateless (but
the memory tasks', below): each call looks at the current page and returns the next action, a
templated thought and the target element (whose box becomes candidate_bbox). Click points come from
document.elementFromPoint, so the expert never clicks an element hidden under another.
18 MiniWob++ tasks, expert steps per episode (100 seeds, 100% success each): 1 step: click-test,
click-button, click-link, click-dialog, click-tab, focus-text; 2: click-button-sequence,
click-option, click-collapsible; 1-3: click-tab-2 (opens tabs left to right until the link
shows); 1-8: click-checkboxes; 3: enter-text, enter-text-dynamic, enter-text-2; 4-5:
search-engine; 5: enter-password, login-user; 7: multi-layouts. Typing is always
click-the-field, then type. expert_episode rolls an expert through one episode and records it
(tools/make_miniwob_data.py writes those records as episode files).

The memory tasks (the project's own pages, envs/miniwob_tasks.OWN_TASKS: memory-code-1, memory-name-2,
memory-code-3, memory-type-1, memory-type-3; 2, 4, 4, 3 and 5 steps) show a fact at step 0 that a later
screen no longer holds. Their expert notes it when it is on screen (ExpertStep.note, said in the thought:
"The code is 'K7Q2' and I note it ...") and acts on its note at the using step, so it is not stateless
there: expert_episode and expert_policy hand it the notes of its earlier steps in the episode
(obs["notes"]), as an agent has its own thoughts.

CLI (last stdout line is a JSON object):
    python envs/miniwob_experts.py eval --policy expert --tasks all --seeds 100
    python envs/miniwob_experts.py eval --policy random --tasks click-test enter-text --seeds 20
    python envs/miniwob_experts.py eval --tasks memory --seeds 100 --seed-base 700000  # the memory tasks
    python envs/miniwob_experts.py show --task login-user --seed 3   # goal, element list, expert's plan
"""

import json
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, when run as a file
from envs.miniwob_env import (  # noqa: E402
    TEST_SEED_BASE,
    Element,
    MiniWobEnv,
    _shown_text,
    evaluate_online,
    final_observation,
)
from envs import miniwob_tasks  # noqa: E402
from envs.miniwob_tasks import MEMORY_TASKS, is_task  # noqa: E402
import cli  # noqa: E402
import utils  # noqa: E402
from gui import ACTIONS  # noqa: E402

# -----------------------------------------------------------------------------
# scripted experts (read the DOM and the goal's fields, never the screenshot)


@dataclass
class ExpertStep:
    action: dict
    thought: str
    target: Element | None = None  # clicked element; its box is the step's candidate_bbox
    note: str | None = None  # a fact read off this screen that a later step needs (memory tasks)


def short_thought(action: dict, target: Element | None, note: str | None = None) -> str:
    """A one-sentence thought naming what the action does: "Click button 'okay' at (24,73).",
    "Type 'abc'.", "Done." (terminate). The click's words and point are those of the target's
    line in elements_text, so a model can copy them; tools/make_miniwob_data.py --thoughts short.
    A step that notes a fact for later (memory tasks) says so first: "Noted: 'K7Q2'. Click ..."."""
    if note is not None:
        return f"Noted: '{note}'. " + short_thought(action, target)
    kind = action["action"]
    if kind == "terminate":
        return "Done."
    if kind in ACTIONS and ACTIONS[kind].rule == "point":  # "Click." without a target
        if target is None:
            return f"{_verb(kind).capitalize()}."
        x, y = action["coordinate"]
        return f"{_verb(kind).capitalize()} {target.tag} '{_shown_text(target)}' at ({x},{y})."
    if kind == "type":
        return f"Type '{action['text']}'."
    gist = _gist("", action)  # any other registered type: its gist, "Swipe from (3,4) to (3,40)."
    return f"{gist[:1].upper()}{gist[1:]}."


_CLICK = re.compile(r"^I see (?P<what>.+) at \((?P<x>-?\d+),(?P<y>-?\d+)\)\. (?P<why>.+)$")
_TYPE = re.compile(r"^The (?P<field>.+) is focused and empty\. I type '(?P<text>.*)' into it\.$")
DONE_THOUGHT = "The task is complete, so I finish with success."


def _verb(kind: str) -> str:
    """An action type as a verb: "click", "long-press", "double-click"."""
    return str(kind).replace("_", "-")


def _gist(thought: str, action: dict) -> str:
    """What a step did, in a few words, from its long thought: "click the button 'ONE'", "type 'abc'",
    "press the key 'Enter'"; any registered action type has one (gui.ACTIONS): a type without wording of
    its own is its verb and its spec's required arguments, "double-click (3,4)", "scroll 'down'"."""
    kind = action.get("action")
    spec = ACTIONS.get(kind)
    if spec is not None and spec.rule == "point" and (m := _CLICK.match(thought)):
        return f"{_verb(kind)} {m['what']}"
    if kind in ("type", "answer", "open", "key"):
        verb = {"type": "type", "answer": "answer", "open": "open", "key": "press the key"}[kind]
        return f"{verb} '{action.get('text', '')}'"
    if kind == "swipe" and "coordinate" in action and "coordinate2" in action:
        (x1, y1), (x2, y2) = action["coordinate"], action["coordinate2"]
        return f"swipe from ({x1},{y1}) to ({x2},{y2})"
    if kind == "system_button":
        return f"press {action.get('button', '')}"
    if kind == "terminate":
        return "finish"
    words = [_verb(kind)]
    for name, typ in spec.args if spec is not None else ():
        v = action.get(name)
        if typ == "point" and isinstance(v, (list, tuple)) and len(v) == 2:
            words.append(f"({v[0]},{v[1]})")
        elif typ in ("str", "num") and v is not None:
            words.append(f"'{v}'" if typ == "str" else str(v))
    return " ".join(words)


def varied_thoughts(steps: list[dict], key: str) -> list[str]:
    """Thoughts in rule-based templates, for one expert episode: the same decision as its long
    thoughts, in one of four phrasings picked per step, with details a small model tends to drop
    (the steps done so far, the clicked element's box centre restated). `tools/make_miniwob_data.py
    --thoughts varied`. The policy does not reproduce such thoughts verbatim, so its own history differs
    from the expert's, a stand-in for the paper's setting, where the expert's thoughts come from a
    stronger model (docs/method.md §5; claim 1b of docs/protocol_memory.md).

    No hindsight: thought k is a function of steps[:k + 1] and the key only. It names what the screen
    and the history so far show, never a later step's action or target (a plan line such as "next:
    click the link 'X'" would put step k+1's target into step k+1's prompt under expert history, and
    name elements the agent cannot have seen yet; tests/test_varied_thoughts.py checks every shipped
    file). steps: [{"action", "thought"}] with long thoughts (expert_episode's); a step of any
    registered action type (gui.ACTIONS) whose thought is not a click or type sentence keeps its
    words inside a varied frame. key: a stable string (e.g. "task-seed") seeding the choice of phrasing.
    Returns one thought per step; the actions are untouched. Raises ValueError on a step whose action
    type is not registered or whose thought is empty."""
    out = []
    gists = [_gist(st["thought"], st["action"]) for st in steps]
    for k, st in enumerate(steps):
        rng = random.Random(f"{key}-{k}")
        done = "; ".join(gists[:k]) or "nothing yet"
        t, a = st["thought"], st["action"]
        if not isinstance(a, dict) or a.get("action") not in ACTIONS:
            raise ValueError(f"step {k}: action {a!r} is not a registered action type")
        if not (t or "").strip():
            raise ValueError(f"step {k}: empty thought")
        if (m := _CLICK.match(t)) is not None and ACTIONS[a["action"]].rule == "point":
            what, x, y, why, verb = m["what"], m["x"], m["y"], m["why"], _verb(a["action"])
            forms = [f"{why} The element is {what}, centred at ({x},{y}).",
                     f"Done so far: {done}. Now I {verb} {what} at ({x},{y}): {why[0].lower()}{why[1:]}",
                     f"Looking at the page, {what} sits at ({x},{y}). {why}",
                     f"Step {k + 1}. {why} So: {verb} ({x},{y}), on {what}."]
        elif (m := _TYPE.match(t)) is not None:
            field, text = m["field"], m["text"]
            forms = [f"The {field} has the focus and holds nothing; typing '{text}'.",
                     f"Done so far: {done}. I enter '{text}' in the {field}.",
                     f"Step {k + 1}. '{text}' goes into the {field}, which is focused.",
                     f"I type '{text}': the {field} is empty and focused."]
        elif t == DONE_THOUGHT and a["action"] == "terminate":
            forms = [f"Done so far: {done}. Nothing is left, so I finish with success.",
                     "Every part of the goal is satisfied; the task is finished.",
                     f"Step {k + 1}. The page shows the goal reached. I stop with success.",
                     "All required actions are complete, so I terminate successfully."]
        else:  # any other registered action (key, swipe, wait, ...): its own words in a varied frame
            forms = [f"Done so far: {done}. {t}",
                     f"Step {k + 1}. {t}",
                     f"{t} So I {gists[k]}.",
                     f"Looking at the page: {t}"]
        out.append(rng.choice(forms))
    return out


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


def _click(e: Element, why: str, kind: str = "click") -> ExpertStep:
    """A step of a point action (click; kind: any type whose spec's rule is "point") on element e."""
    if e.point is None:
        raise ExpertError(f"target [{e.ref}] {e.tag} '{e.label}' is not clickable on screen")
    thought = f"I see {_describe(e)} at ({e.point[0]},{e.point[1]}). {why}"
    return ExpertStep({"action": kind, "coordinate": list(e.point)}, thought, e)


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


def expert_memory(obs):
    """The memory tasks (envs/miniwob_pages/memory.html): note the fact while it is on screen, press the one
    button of each page in between, then pick the noted fact among the choices (or type it into the field
    and click Submit). The fact is on no later screen, so the expert takes it from obs["notes"] (the notes of
    its own earlier steps, as the agent has its earlier thoughts) and raises ExpertError without one."""
    dom, notes = obs["dom"], obs.get("notes") or []
    what = "name" if "name" in obs["goal"] else "code"
    fact = next((e for e in dom if e.id == "fact"), None)
    if fact is not None:
        st = _click(_by_id(dom, "next"), f"The {what} is '{fact.label}' and I note it; I click Next to go on.")
        st.note = fact.label
        return st
    go = next((e for e in dom if e.id == "go"), None)
    if go is not None:
        return _click(go, f"The page shows one button, '{go.label}'; I click it to go on.")
    if not notes:
        raise ExpertError(f"the {what} must be chosen, but no note holds it")
    noted = notes[-1]
    field = next((e for e in dom if e.id == "tt"), None)
    if field is not None:  # typed recall: click the field (unless it opened focused), type the note, Submit
        step = _fill(field, noted, f"{what} field")
        return step or _click(_by_id(dom, "subbtn"), f"The field holds '{noted}', the {what} I noted; I click Submit.")
    texts = {e.parent: (e.text or "").strip() for e in dom if e.tag == "t"}
    radios = [e for e in dom if e.tag == "input_radio"]
    if radios:
        radio = _find(radios, lambda e: texts.get(e.parent) == noted, f"the choice {noted!r}")
        if radio.value is not True:
            return _click(radio, f"'{noted}' is the {what} I noted at the start, so I select it.")
        return _click(_by_id(dom, "subbtn"), f"'{noted}' is selected; I click Submit.")
    opt = _find(dom, lambda e: e.tag == "button" and _text_is(e, noted), f"the choice {noted!r}")
    return _click(opt, f"It is the {what} I noted at the start, so I click it.")


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
    **{task: expert_memory for task in MEMORY_TASKS},
}
PACKAGE_TASKS = sorted(t for t in EXPERTS if t not in MEMORY_TASKS)  # the 18 MiniWob++ tasks with an expert


def task_list(names: list[str]) -> list[str]:
    """Task names as the command lines take them: "all" -> the 18 MiniWob++ tasks with an expert (the set the
    shipped data/miniwob/{train,test}.jsonl hold), "memory" -> the memory tasks; other names as given."""
    out = []
    for n in names:
        out += PACKAGE_TASKS if n == "all" else MEMORY_TASKS if n == "memory" else [n]
    return list(dict.fromkeys(out))


# -----------------------------------------------------------------------------
# expert episodes (the data generator's source)

MAX_EXPERT_STEPS = 12


def expert_episode(env: MiniWobEnv, seed: int, max_steps: int = MAX_EXPERT_STEPS,
                   thoughts: str = "long") -> dict:
    """Roll the task's expert through episode `seed`, recording every step.

    Returns {"goal", "task", "seed", "success", "raw_reward", "reason", "steps": [...]}, each
    step {"screenshot": PIL, "action", "thought", "elements", "candidate_bbox"}; a successful
    episode ends with a terminate step on the final screenshot. thoughts: "long" (the expert's
    reasoning sentence), "short" (short_thought) or "varied" (varied_thoughts of the long ones).
    Raises BrowserFault, ValueError."""
    if thoughts not in ("long", "short", "varied"):
        raise ValueError(f"expert_episode: thoughts must be 'long', 'short' or 'varied', got {thoughts!r}")
    expert = EXPERTS[env.task]
    obs = env.reset(seed)
    goal, steps, reward, info, notes = obs["goal"], [], 0.0, {}, []
    for _ in range(max_steps):
        st = expert({**obs, "notes": list(notes)})
        if st.note is not None:
            notes.append(st.note)
        thought = short_thought(st.action, st.target, st.note) if thoughts == "short" else st.thought
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
                      "thought": short_thought(done_action, None) if thoughts == "short" else DONE_THOUGHT,
                      "elements": elements, "candidate_bbox": []})
    if thoughts == "varied":
        for st, t in zip(steps, varied_thoughts(steps, f"{env.task}-{seed}")):
            st["thought"] = t
    return {"goal": goal, "task": env.task, "seed": seed, "success": success,
            "raw_reward": reward, "reason": info.get("reason"), "steps": steps}


# -----------------------------------------------------------------------------
# built-in policies (online evaluation: envs/miniwob_env.evaluate_online)


_NOTES: dict[tuple[str, int], list[str]] = {}  # (task, seed) -> the expert's notes so far in that episode


def expert_policy(obs: dict, step: int) -> dict:
    """The scripted expert as a policy (reads obs["dom"] and obs["fields"]). It keeps the notes its steps
    take (ExpertStep.note) per (task, seed), from step 0 on, as an agent keeps its earlier thoughts: the
    memory tasks need them. An episode runs in one thread at a time, so the dict needs no lock."""
    key = (obs["task"], obs["seed"])
    if step == 0:  # a new episode of this (task, seed): forget the notes of an earlier play of it
        _NOTES.pop(key, None)
    st = EXPERTS[obs["task"]]({**obs, "notes": list(_NOTES.get(key, []))})
    if st.note is not None:
        _NOTES.setdefault(key, []).append(st.note)
    return st.action


def random_click_policy(obs: dict, step: int) -> dict:
    """Clicks a uniformly random pixel of the screenshot; deterministic per (task, seed, step)."""
    W, H = obs["image_size"]
    rng = random.Random(f"{obs['task']}-{obs['seed']}-{step}")
    return {"action": "click", "coordinate": [rng.randrange(W), rng.randrange(H)]}


POLICIES = {"expert": expert_policy, "random": random_click_policy}


def check_tasks(tasks, need_expert: bool = False) -> None:
    """Raise ValueError naming the first task that is no MiniWob++ task (or, with need_expert, has
    no scripted expert here)."""
    for task in tasks:
        if not is_task(task):
            raise ValueError(f"unknown MiniWob++ task {task!r} (tasks with an expert: {', '.join(sorted(EXPERTS))})")
        if need_expert and task not in EXPERTS:
            raise ValueError(f"task {task!r} has no scripted expert (those with one: {', '.join(sorted(EXPERTS))})")


# -----------------------------------------------------------------------------
# CLI


def main(argv=None):
    ap = cli.make_parser(__doc__.split("\n")[0] + "\n\n" + __doc__[__doc__.index("CLI ("):])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="online evaluation of a built-in policy", formatter_class=cli.HelpFormatter,
                        epilog=ap.epilog)
    ev.add_argument("--policy", choices=sorted(POLICIES), default="expert", help="policy to run")
    ev.add_argument("--tasks", nargs="+", type=miniwob_tasks.miniwob_task_or_all, default=["all"],
                    help="task names, 'all' (the 18 MiniWob++ tasks with an expert) or 'memory' (the memory tasks)")
    ev.add_argument("--seeds", type=cli.positive_int, default=20, help="episodes per task")
    ev.add_argument("--seed-base", type=cli.non_negative_int, default=TEST_SEED_BASE, help="first seed")
    ev.add_argument("--max-steps", type=cli.positive_int, default=15, help="step limit per episode")
    ev.add_argument("--step-timeout", type=cli.positive_float, default=20.0, help="seconds per env step")
    ev.add_argument("--no-screenshots", action="store_true",
                    help="skip screenshots (the built-in policies do not look at them)")
    ev.add_argument("--out", default=None, help="also write the full result JSON here")
    sh = sub.add_parser("show", help="print one episode: goal, element lists, expert actions",
                        formatter_class=cli.HelpFormatter, epilog=ap.epilog)
    sh.add_argument("--task", required=True, type=miniwob_tasks.miniwob_task, help="task name")
    sh.add_argument("--seed", type=cli.non_negative_int, default=0, help="episode seed")
    args = ap.parse_args(argv)
    try:
        check_tasks([args.task] if args.cmd == "show" else task_list(args.tasks),
                    need_expert=args.cmd == "show" or args.policy == "expert")
    except ValueError as e:
        raise utils.UsageError(str(e)) from None
    if args.cmd == "eval" and args.seeds < 1:
        raise utils.UsageError(f"--seeds {args.seeds}: need at least 1 episode per task")

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
        print(utils.dumps({"task": args.task, "seed": args.seed, "success": ep["success"],
                           "steps": len(ep["steps"])}))
        return

    tasks = task_list(args.tasks)
    seeds = list(range(args.seed_base, args.seed_base + args.seeds))
    t0 = time.time()
    res = evaluate_online(POLICIES[args.policy], tasks, seeds, max_steps=args.max_steps,
                         screenshots=not args.no_screenshots, step_timeout_s=args.step_timeout)
    for task, r in res["per_task"].items():
        fails = ", ".join(f"{c}={n}" for c, n in r["failures"].items() if n)
        print(f"{task:24s} success {r['success_rate']:6.1%}  mean steps {r['mean_steps']:4.1f}  "
              f"{r['seconds_per_env_step'] * 1000:5.0f} ms/env step  {fails}")
    if args.out:
        Path(args.out).write_text(utils.dumps(res, indent=1))
    out = {"policy": args.policy, "seeds": args.seeds, "seed_base": args.seed_base,
           "max_steps": args.max_steps, "seconds": round(time.time() - t0, 1),
           "overall": res["overall"],
           "per_task": {t: {"success_rate": r["success_rate"], "mean_steps": r["mean_steps"],
                            "failures": r["failures"]} for t, r in res["per_task"].items()}}
    print(utils.dumps(out))


if __name__ == "__main__":
    cli.run_script(main)

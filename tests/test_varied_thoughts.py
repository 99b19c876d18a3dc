"""Varied expert thoughts (envs/miniwob_experts.varied_thoughts, tools/make_miniwob_data.py --restyle): the
decision of each long thought kept, the phrasing varied, the actions untouched; no browser."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envs.miniwob_experts import DONE_THOUGHT, varied_thoughts

REPO = Path(__file__).resolve().parents[1]
EPISODE = [  # enter-text, as the expert writes it (long thoughts)
    {"action": {"action": "click", "coordinate": [80, 72]},
     "thought": "I see the text field (empty) at (80,72). I click the text field to focus it before typing."},
    {"action": {"action": "type", "text": "Myron"}, "thought": "The text field is focused and empty. I type 'Myron' into it."},
    {"action": {"action": "click", "coordinate": [63, 110]},
     "thought": "I see the button 'Submit' at (63,110). The field holds 'Myron'; I click Submit."},
    {"action": {"action": "terminate", "status": "success"}, "thought": DONE_THOUGHT},
]


def test_varied_thoughts_keep_the_decision_and_vary_the_words():
    a = varied_thoughts(EPISODE, "enter-text-7")
    assert a == varied_thoughts(EPISODE, "enter-text-7")          # a pure function of (steps, key)
    assert "(80,72)" in a[0] and "text field" in a[0]             # the click's point and target survive
    assert "'Myron'" in a[1] and "(63,110)" in a[2]
    assert all(t != s["thought"] for t, s in zip(a, EPISODE))    # no step keeps the template's words
    seen = {t for k in range(40) for t in varied_thoughts(EPISODE, f"enter-text-{k}")[:1]}
    assert len(seen) == 4                                          # every phrasing of a click occurs
    # details a small model drops: the steps done so far, the step count, the point restated
    assert any("nothing yet" in t for t in seen) and any("Step 1." in t for t in seen)
    assert all("Myron" not in t for t in seen)  # and never the next step's text (no hindsight)
    with pytest.raises(ValueError, match="step 1: action .* is not a registered action type"):
        varied_thoughts([EPISODE[0], {"action": {"action": "fly"}, "thought": "hmm"}], "x")


def test_restyle_rewrites_thoughts_only_and_names_a_bad_line(tmp_path):
    ep = {"goal": "g", "episode_id": "enter-text-7", "task": "enter-text", "seed": 7,
          "steps": [{"screenshot": f"images/x-{k}.png", "action_content": s["action"], "thought": s["thought"],
                     "check_options": {"action": s["action"]["action"], "candidate_bbox": []}}
                    for k, s in enumerate(EPISODE)]}
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(ep) + "\n")
    run = lambda *a: subprocess.run([sys.executable, "tools/make_miniwob_data.py", "--restyle", *a],  # noqa: E731
                                    cwd=REPO, capture_output=True, text=True)
    assert run(str(src), str(dst)).returncode == 0
    out = json.loads(dst.read_text())
    assert [s["thought"] for s in out["steps"]] == varied_thoughts(EPISODE, "enter-text-7")
    strip = lambda e: [{k: v for k, v in s.items() if k != "thought"} for s in e["steps"]]  # noqa: E731
    assert strip(out) == strip(ep) and out["goal"] == ep["goal"]
    src.write_text(json.dumps(ep) + "\n" + json.dumps({**ep, "steps": [{**ep["steps"][0], "thought": ""}]}) + "\n")
    bad = run(str(src), str(dst))
    assert bad.returncode == 2 and f"{src}:2: step 0: empty thought" in bad.stderr


# -----------------------------------------------------------------------------
# no hindsight: a thought names only what the screen and the history so far show

LINE = re.compile(r"^\[-?\d+\] (?P<tag>\S+) '(?P<text>.*)'(?: at \(\d+,\d+\))? \((?P<box>\d+,\d+,\d+,\d+)\)$")
SHIPPED = sorted(p for d in sorted(REPO.glob("data/miniwob*")) for p in d.glob("*.jsonl"))


def hindsight(ep: dict) -> list[str]:
    """Every place where the thought of step k names the target of a later step j (its element's text
    quoted, its click point, or the text it types) while the goal and the element lists of steps 0..k hold
    no such text or point (a memory task's code, read at step 0 and clicked at step 3, is named at step 0
    lawfully: it is on screen then). Returns one message per finding."""
    shown = [ep["goal"]]
    for st in ep["steps"]:
        shown.append(shown[-1] + "\n" + (st.get("elements") or ""))
    found = []
    for j, st in enumerate(ep["steps"]):
        a, names = st["action_content"], []
        if a["action"] == "click":
            bbox = st["check_options"]["candidate_bbox"]
            box = ",".join(map(str, bbox[0])) if bbox else None
            line = next((m for m in map(LINE.match, st["elements"].splitlines()) if m and m["box"] == box), None)
            names = ([f"'{line['text']}'"] if line and line["text"] else []) + ["({},{})".format(*a["coordinate"])]
        elif a["action"] == "type":
            names = [f"'{a['text']}'"]
        for k in range(j):
            for n in names:  # shown_k = goal + element lists of steps 0..k (shown[k + 1])
                if n in ep["steps"][k]["thought"] and n not in shown[k + 1] and n.strip("'") not in ep["goal"]:
                    found.append(f"{ep['episode_id']} step {k} names {n} of step {j}: {ep['steps'][k]['thought']!r}")
    return found


def test_the_hindsight_check_finds_a_plan_line():
    # click-collapsible as the varied thoughts once wrote it: step 0 names step 1's 'Submit', which
    # shows only once the section is open; the same thought without the plan line passes
    ep = {"episode_id": "click-collapsible-0", "goal": "Expand the section below and click submit.", "steps": [
        {"elements": "[3] h3 'Section #1' at (80,62) (2,55,158,70)", "action_content": {"action": "click", "coordinate": [80, 62]},
         "check_options": {"candidate_bbox": [[2, 55, 158, 70]]},
         "thought": "The section is collapsed; I click its header to expand it. Next: click the button 'Submit'."},
        {"elements": "[3] h3 'Section #1' at (80,62) (2,55,158,70)\n[9] button 'Submit' at (50,161) (28,150,72,172)",
         "action_content": {"action": "click", "coordinate": [50, 161]},
         "check_options": {"candidate_bbox": [[28, 150, 72, 172]]}, "thought": "I click Submit."}]}
    assert hindsight(ep) == [f"click-collapsible-0 step 0 names 'Submit' of step 1: {ep['steps'][0]['thought']!r}"]
    ep["steps"][0]["thought"] = "The section is collapsed; I click its header to expand it."
    assert hindsight(ep) == []
    ep["steps"][0]["thought"] += " Then I click (50,161)."  # a later click point counts too
    assert len(hindsight(ep)) == 1


def test_varied_thoughts_are_causal_and_cover_every_action_type():
    # thought k depends on steps 0..k only: changing or dropping later steps leaves it as it was
    for cut in range(1, len(EPISODE)):
        other = EPISODE[:cut] + [{"action": {"action": "click", "coordinate": [1, 2]},
                                  "thought": "I see the button 'Cancel' at (1,2). I click it."}]
        assert varied_thoughts(other, "k")[:cut] == varied_thoughts(EPISODE, "k")[:cut]
    assert not any(w in t for k in range(40) for t in varied_thoughts(EPISODE, f"enter-text-{k}")
                   for w in ("Next", "Then", "Afterwards", "Cancel"))
    import gui

    sample = {"point": [3, 4], "str": "a", "num": 1}  # an argument of each kind, from each type's ActionSpec
    examples = {kind: {n: sample[t] for n, t in spec.args + spec.optional} for kind, spec in gui.ACTIONS.items()}
    for kind, args in examples.items():  # every registered action type gets a thought, none raises
        steps = [{"action": {"action": kind, **args}, "thought": f"I do a {kind}."}] * 2
        out = [t for j in range(8) for t in varied_thoughts(steps, f"x-{kind}-{j}")]
        assert all(f"I do a {kind}." in t for t in out) and len(set(out)) > 1
    with pytest.raises(ValueError, match="not a registered action type"):
        varied_thoughts([{"action": {"action": "fly"}, "thought": "up"}], "x")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_shipped_thought_names_a_later_target(path):
    found = [f for line in path.read_text().splitlines() if line.strip() for f in hindsight(json.loads(line))]
    assert not found, f"{len(found)} thoughts with hindsight, e.g. {found[:3]}"


VARIED = sorted(p.relative_to(REPO) for d in sorted(REPO.glob("data/miniwob*")) for p in d.glob("*_varied.jsonl"))


@pytest.mark.parametrize("varied", VARIED, ids=str)
def test_shipped_varied_files_are_the_current_restyle(varied):
    # each *_varied.jsonl is its source restyled by today's varied_thoughts: same steps, causal thoughts
    assert len(VARIED) >= 6  # data/miniwob and data/miniwob_memory: train, test, rl each
    src = [json.loads(x) for x in (REPO / str(varied).replace("_varied", "")).read_text().splitlines() if x.strip()]
    out = [json.loads(x) for x in (REPO / varied).read_text().splitlines() if x.strip()]
    assert len(src) == len(out)
    for s, o in zip(src, out):
        steps = [{"action": st["action_content"], "thought": st["thought"]} for st in s["steps"]]
        assert [st["thought"] for st in o["steps"]] == varied_thoughts(steps, s["episode_id"])
        assert [{k: v for k, v in st.items() if k != "thought"} for st in o["steps"]] == \
            [{k: v for k, v in st.items() if k != "thought"} for st in s["steps"]]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_file_replays_perfectly(path, capsys):
    # the expert's actions replayed under the SOP protocol: PG = TSR = 1.0 (thoughts are not scored)
    import eval_sop

    s = eval_sop.main(["--data", str(path), "--image-root", str(path.parent), "--per-task-limit", "3"])
    assert s["pg"] == 1.0 and s["tsr"] == 1.0 and s["episodes"] >= 3

"""Varied expert thoughts (envs/miniwob_experts.varied_thoughts, tools/make_miniwob_data.py --restyle): the
decision of each long thought kept, the phrasing varied, the actions untouched; no browser."""
import json
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
    # details a small model drops: what comes next, or what was done so far
    assert all("type 'Myron'" in t or "Step 1" in t or "nothing yet" in t for t in seen)
    with pytest.raises(ValueError, match="step 1: not a long expert thought"):
        varied_thoughts([EPISODE[0], {"action": {"action": "wait"}, "thought": "hmm"}], "x")


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
    src.write_text(json.dumps(ep) + "\n" + json.dumps({**ep, "steps": [{**ep["steps"][0], "thought": "short"}]}) + "\n")
    bad = run(str(src), str(dst))
    assert bad.returncode == 2 and f"{src}:2: step 0: not a long expert thought" in bad.stderr

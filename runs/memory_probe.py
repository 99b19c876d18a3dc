"""eval_sop.py with every online episode's greedy responses kept, and the memory tasks' fact beside them:
the mechanism probe of runs/repro_memory.py.

On a memory task (envs/miniwob_tasks.MEMORY_TASKS) the fact is shown at step 0 only; at the using step
(the choice, or the typed code) it is on no screen, so the agent can only take it from its own step-0
response (its thought: "The code is 'K7Q2' and I note it ..."). The probe asks, per test episode, whether
that step-0 response of the greedy online play carries the fact (the code or name the page showed), beside
the episode's success.

This script runs eval_sop.main in this process, with the same flags (the evaluation is the test
evaluation: nothing is played twice), then reads back online_episodes.jsonl, where each of a model's
episodes carries its greedy play's transcript (every step's element list and response), and writes
OUT/online_responses.jsonl, one line per online episode in that file's order: {task, seed, success, fact
(None off the memory tasks), responses [step 0, 1, ...], note_carries_fact (None off the memory tasks)}. The
fact is read off the step-0 element list (fact_shown). The file is written last: its presence means the
evaluation finished.

    python runs/memory_probe.py --policy model --model CKPT --online --online-tasks memory-type-1 \\
        --online-seeds 4 --online-seed-base 900000 --out out/probe      # any eval_sop.py flags
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESPONSES_FILE = "online_responses.jsonl"


def note_carries(fact: str | None, response: str | None) -> bool | None:
    """Whether `response` names `fact` as a whole token (not inside a longer word or code; case as the
    page shows it: codes are upper case, names capitalised). None when there is no fact (not a memory task)."""
    if fact is None:
        return None
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(fact)}(?![A-Za-z0-9])", response or "") is not None


def fact_shown(task: str, elements: str | None) -> str | None:
    """The fact a memory task's step-0 page shows, read off its element list (envs/miniwob_pages/memory.html
    shows it as the page's one bold element: a line "[k] b 'K7Q2' at ..."); None off the memory tasks or
    when no such line is there (tests/test_repro_memory.py checks it against the scripted expert's note
    on every shipped memory episode)."""
    from envs.miniwob_tasks import MEMORY_TASKS
    if task not in MEMORY_TASKS or not elements:
        return None
    m = re.search(r"^\[-?\d+\] b '([^']*)' at ", elements, re.M)
    return m[1] if m else None


def main(argv=None) -> dict:
    import eval_sop
    argv = sys.argv[1:] if argv is None else list(argv)
    given = eval_sop.sop_parser().parse_args(argv)  # eval_sop.py's flags, checked as it checks them
    out = given.out
    if not out or out.endswith(".jsonl") or not given.online:
        import utils
        raise utils.UsageError("give --online and an --out folder (eval_sop.py's flags otherwise)")
    summary = eval_sop.main(argv)
    rows = []
    for line in (Path(out) / "online_episodes.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            if e.get("steps") and "responses" not in e:  # played, yet no transcript
                raise RuntimeError(f"memory_probe: episode {e['task']} {e['seed']} took {e['steps']} steps but "
                                   "online_episodes.jsonl holds no responses for it (eval_sop.run_online writes them)")
            fact = fact_shown(e["task"], (e.get("elements") or [None])[0])
            responses = e.get("responses", [])
            rows.append({"task": e["task"], "seed": int(e["seed"]), "success": bool(e["success"]), "fact": fact,
                         "responses": responses,
                         "note_carries_fact": note_carries(fact, responses[0] if responses else None)})
    (Path(out) / RESPONSES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = probe_counts(rows)
    print(json.dumps({"probe": probe}))
    return {**(summary or {}), "probe": probe}


def probe_counts(rows: list[dict]) -> dict:
    """Per memory task and pooled: episodes n, notes that carry the fact, successes, successes among the
    episodes whose note carries it and among the others (rows: online_responses.jsonl's lines)."""
    out: dict = {}
    for r in rows:
        if r.get("note_carries_fact") is None:
            continue
        for key in (r["task"], "pooled"):
            c = out.setdefault(key, {"n": 0, "note_right": 0, "success": 0, "success_note_right": 0,
                                     "success_note_wrong": 0})
            c["n"] += 1
            c["note_right"] += r["note_carries_fact"]
            c["success"] += r["success"]
            c["success_note_right"] += r["success"] and r["note_carries_fact"]
            c["success_note_wrong"] += r["success"] and not r["note_carries_fact"]
    return out


if __name__ == "__main__":
    import utils
    utils.run_script(main)

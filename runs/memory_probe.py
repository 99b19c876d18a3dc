"""eval_sop.py with every online episode's greedy responses kept, and the memory tasks' fact beside them:
the mechanism probe of runs/repro_memory.py.

On a memory task (envs/miniwob_tasks.MEMORY_TASKS) the fact is shown at step 0 only; at the choosing step
it is on no screen, so the agent can only take it from its own step-0 response (its thought: "The code is
'K7Q2' and I note it ..."). The probe asks, per test episode, whether that step-0 response of the greedy online
play carries the fact (the code or name the page showed), beside the episode's success.

eval_sop.py keeps a response only for the few episodes its HTML report shows, so this script runs
eval_sop.main itself, in this process, with the same flags, and swaps eval_sop's online policy class for a
subclass that also records, for every greedy episode, the text of each response and, at step 0, the fact
as the scripted expert notes it off the same page (miniwob_experts.EXPERTS[task](obs).note: the element
list of the page the model saw). Nothing is played twice: the evaluation is the test evaluation. It
writes eval_sop.py's outputs and then OUT/online_responses.jsonl, one line per online episode in
online_episodes.jsonl's order: {task, seed, success, fact (None off the memory tasks), responses [step
0, 1, ...], note_carries_fact (None off the memory tasks)}. The file is written last: its presence
means the evaluation finished.

    python runs/memory_probe.py --policy model --model CKPT --online --online-tasks memory-code-1 \\
        --online-seeds 4 --online-seed-base 900000 --out out/probe      # any eval_sop.py flags

What eval_sop.py would need to record this itself: each online episode's greedy responses in
online_episodes.jsonl (a `responses` list), and for the memory tasks the step-0 fact (`fact`).
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


def expert_fact(obs: dict) -> str | None:
    """The fact the scripted expert notes on this screen (a memory task's step 0), else None."""
    from envs.miniwob_experts import EXPERTS, ExpertError
    from envs.miniwob_tasks import MEMORY_TASKS
    if obs.get("task") not in MEMORY_TASKS:
        return None
    try:
        return EXPERTS[obs["task"]]({**obs, "notes": []}).note
    except ExpertError:
        return None


def recording_policy(base: type, record: dict) -> type:
    """A subclass of eval_sop's online policy class `base` (policies.OnlineModelPolicy) whose greedy plays
    append each response's text to record[(task, seed)]["responses"] and note the step-0 fact; a retried
    episode (step 0 again) starts over. Sampled plays (--samples) are not recorded."""

    class Recording(base):
        def __call__(self, obs_list, steps):
            actions = super().__call__(obs_list, steps)
            if self.sample is None:
                for obs, t in zip(obs_list, steps):
                    key = (obs["task"], int(obs["seed"]))
                    if t == 0:
                        record[key] = {"fact": expert_fact(obs), "responses": []}
                    record[key]["responses"].append(self.state[key][1][-1])
            return actions

    return Recording


def main(argv=None) -> dict:
    import eval_sop
    argv = sys.argv[1:] if argv is None else list(argv)
    given = eval_sop.sop_parser().parse_args(argv)  # eval_sop.py's flags, checked as it checks them
    out = given.out
    if not out or out.endswith(".jsonl") or not given.online:
        import utils
        raise utils.UsageError("give --online and an --out folder (eval_sop.py's flags otherwise)")
    record: dict = {}
    kept = eval_sop.OnlineModelPolicy
    eval_sop.OnlineModelPolicy = recording_policy(kept, record)
    try:
        summary = eval_sop.main(argv)
    finally:
        eval_sop.OnlineModelPolicy = kept
    rows = []
    for line in (Path(out) / "online_episodes.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            if e.get("steps") and (e["task"], int(e["seed"])) not in record:  # played, yet never seen by the policy
                raise RuntimeError(f"memory_probe: episode {e['task']} {e['seed']} took {e['steps']} steps but no "
                                   "response was recorded: eval_sop.py no longer plays through eval_sop.OnlineModelPolicy")
            r = record.get((e["task"], int(e["seed"])), {"fact": None, "responses": []})
            rows.append({"task": e["task"], "seed": int(e["seed"]), "success": bool(e["success"]), "fact": r["fact"],
                         "responses": r["responses"],
                         "note_carries_fact": note_carries(r["fact"], r["responses"][0] if r["responses"] else None)})
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

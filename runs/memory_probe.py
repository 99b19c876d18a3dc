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
(None off the memory tasks), responses [step 0, 1, ...], note_carries_fact (None off the memory tasks)}, and,
with eval_sop.py's --samples K, sampled_responses (K lists, play j's responses per step) and sampled_notes (K
bools: play j's step-0 note carries the fact; [] off the memory tasks). The fact is read off the step-0
element list (fact_shown); a sampled play's step 0 is the same page (same seed). The file is written last:
its presence means the evaluation finished.

What the samples tell (probe_counts): the sampled note rate, and per episode how many of the K samples note the
fact, split by the greedy note: semi-online RL can only reinforce a right note that some rollout samples, so
`headroom` (greedy's note wrong, >= 1 sample right) is where it can act (docs/protocol_memory.md §9).

    python runs/memory_probe.py --policy model --model CKPT --online --online-tasks memory-type-1 \\
        --online-seeds 4 --online-seed-base 900000 --out out/probe      # any eval_sop.py flags
    python runs/memory_probe.py --read out/eval    # the probe of an eval_sop.py --online run that exists
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
    if argv[:1] == ["--read"]:  # no evaluation: the probe of one that exists
        import utils
        if len(argv) != 2 or not (Path(argv[1]) / "online_episodes.jsonl").is_file():
            raise utils.UsageError(f"--read {' '.join(argv[1:])}: give one folder holding an online_episodes.jsonl")
        return write_probe(Path(argv[1]), {})
    given = eval_sop.sop_parser().parse_args(argv)  # eval_sop.py's flags, checked as it checks them
    out = given.out
    if not out or out.endswith(".jsonl") or not given.online:
        import utils
        raise utils.UsageError("give --online and an --out folder (eval_sop.py's flags otherwise)")
    return write_probe(Path(out), eval_sop.main(argv))


def write_probe(out: Path, summary: dict | None) -> dict:
    """OUT/online_responses.jsonl from OUT/online_episodes.jsonl, the counts printed as one JSON line."""
    rows = probe_rows(out)
    (out / RESPONSES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = probe_counts(rows)
    print(json.dumps({"probe": probe}))
    return {**(summary or {}), "probe": probe}


def probe_rows(out: Path) -> list[dict]:
    """online_responses.jsonl's lines (module docstring) from eval_sop.py's OUT/online_episodes.jsonl. Raises
    RuntimeError for an episode that took steps but holds no transcript."""
    rows = []
    for line in (out / "online_episodes.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            if e.get("steps") and "responses" not in e:  # played, yet no transcript
                raise RuntimeError(f"memory_probe: episode {e['task']} {e['seed']} took {e['steps']} steps but "
                                   "online_episodes.jsonl holds no responses for it (eval_sop.run_online writes them)")
            fact = fact_shown(e["task"], (e.get("elements") or [None])[0])
            responses = e.get("responses", [])
            row = {"task": e["task"], "seed": int(e["seed"]), "success": bool(e["success"]), "fact": fact,
                   "responses": responses, "note_carries_fact": note_carries(fact, responses[0] if responses else None)}
            if "sampled_responses" in e:
                row["sampled_responses"] = e["sampled_responses"]
                row["sampled_notes"] = [] if fact is None else [note_carries(fact, r[0] if r else None)
                                                                for r in e["sampled_responses"]]
            rows.append(row)
    return rows


def probe_counts(rows: list[dict]) -> dict:
    """Per memory task and pooled: episodes n, greedy notes that carry the fact, successes, successes among
    the episodes whose note carries it and among the others (rows: online_responses.jsonl's lines). Rows with
    sampled_notes (eval_sop --samples K) add `sampled` (sampled_counts)."""
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
    for key, c in out.items():
        sampled = sampled_counts([r for r in rows if r.get("note_carries_fact") is not None
                                  and (key == "pooled" or r["task"] == key)])
        if sampled:
            c["sampled"] = sampled
    return out


def sampled_counts(rows: list[dict]) -> dict | None:
    """The sampled plays' step-0 notes of memory-task rows (each with greedy's note_carries_fact and K
    sampled_notes; None when no row has samples). Keys: episodes, samples (sum of K), note_right (right
    sampled notes), note_rate (note_right / samples), share_mean (the mean over episodes of each one's share of
    right samples), spread (episodes with 0 < right samples < K), spread_greedy_right / spread_greedy_wrong
    (spread split by greedy's note: which way the spread runs), headroom (greedy's note wrong and >= 1 sample
    right: what semi-online RL can reinforce), headroom_rate (headroom / episodes), lost (greedy's note right
    and >= 1 sample wrong), and hist_greedy_right / hist_greedy_wrong (str(j) -> episodes with j of K right)."""
    rows = [r for r in rows if r.get("sampled_notes")]
    if not rows:
        return None
    c = {"episodes": len(rows), "samples": 0, "note_right": 0, "spread": 0, "spread_greedy_right": 0,
         "spread_greedy_wrong": 0, "headroom": 0, "lost": 0, "hist_greedy_right": {}, "hist_greedy_wrong": {}}
    shares = []
    for r in rows:
        k, j, g = len(r["sampled_notes"]), sum(bool(x) for x in r["sampled_notes"]), bool(r["note_carries_fact"])
        c["samples"] += k
        c["note_right"] += j
        shares.append(j / k)
        if 0 < j < k:
            c["spread"] += 1
            c["spread_greedy_right" if g else "spread_greedy_wrong"] += 1
        c["headroom"] += not g and j > 0
        c["lost"] += g and j < k
        hist = c["hist_greedy_right" if g else "hist_greedy_wrong"]
        hist[str(j)] = hist.get(str(j), 0) + 1
    c["note_rate"] = c["note_right"] / c["samples"]
    c["share_mean"] = sum(shares) / len(shares)
    c["headroom_rate"] = c["headroom"] / c["episodes"]
    return c


if __name__ == "__main__":
    import cli
    cli.run_script(main)

"""Does the step reward's verdict on a click agree with what the click does in the environment?

The reward of a click (reward.action_match, strict rules) asks one question: is the point near the
expert's point or inside the expert's target box? The environment asks another: does the click do
what the expert's click did? Where the two disagree, RL is pushed away from clicks that work (the
reward says no, the page says yes) or towards clicks that do not. This script puts every click
step of a MiniWob++ data file to both judges, on the same clicks:

    python runs/diagnose_reward.py --data data/miniwob/test.jsonl --per-task 4
    python runs/diagnose_reward.py --data out/repro/data/train_8t.jsonl --image-root data/miniwob --per-task 6

For each click step k of an episode (task, seed recorded in the file), the candidate clicks are
the centre of every element the step's element list names (the points a model is shown), plus the
expert's own point. Each candidate is judged
- by the reward: action_match against the step's expert action and boxes (original pixels);
- by the environment: reset(seed), replay the expert's actions 0..k-1, click the candidate, and
  compare the page with the page the expert's click leaves (the element list with refs dropped,
  whether the episode ended and its raw reward), then play the expert's remaining actions: the
  same effect = the same page AND the episode still ends in success (focus and a task's hidden
  state do not show in the element list).
A reward "yes" on a click of another effect is a false positive, a reward "no" on a click of the
same effect a false negative. Prints a table per task, examples of each disagreement, and writes --out JSON.
"""
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
import cli  # noqa: E402
from envs import miniwob_tasks  # noqa: E402
import dataset  # noqa: E402
import reward  # noqa: E402
from envs import miniwob_env as me  # noqa: E402

_AT = re.compile(r"^\[\d+\] (.*?) at \((\d+),(\d+)\)", re.M)
_REF = re.compile(r"^\[\d+\] ", re.M)


def candidates(step) -> list[tuple[str, tuple[int, int]]]:
    """(label, point) of every element line 'label at (x,y)' of the step, and the expert's point."""
    out = [(m.group(1), (int(m.group(2)), int(m.group(3)))) for m in _AT.finditer(step.elements or "")]
    out.append(("<expert point>", tuple(step.action["coordinate"])))
    seen, uniq = set(), []
    for label, pt in out:
        if pt not in seen:
            seen.add(pt)
            uniq.append((label, pt))
    return uniq


def effect(env, seed: int, prefix: list[dict], action: dict, rest: list[dict]) -> tuple:
    """What `action` does after the expert's prefix: (page signature right after it: element list
    without refs, done, raw reward; whether the expert's remaining actions then end in success).
    The second part catches what the element list does not show: focus, a task's hidden state
    (button ONE before TWO), a click that changed nothing."""
    env.reset(seed)
    for a in prefix:
        _, _, done, _ = env.step(a)
        if done:
            raise RuntimeError(f"seed {seed}: the expert's prefix ended the episode early")
    obs, reward, done, info = env.step(action)
    page = (None if obs is None else _REF.sub("", obs["elements"]), bool(done), round(float(reward), 3))
    success = bool(info["success"])
    for a in rest:
        if done:
            break
        _, _, done, info = env.step(a)
        success = bool(info["success"])
    return page, success


def judge_clicks(episodes, *, max_candidates: int = 12, image_root: str | None = None) -> list[dict]:
    """Every candidate click of every click step of `episodes` (MiniWob++ episodes with task and seed
    in meta), judged by the reward and by the environment. Returns one dict per click: task, episode,
    step, label, point and expert (original pixels), reward_match, env_same. Raises RuntimeError when
    the recorded expert actions do not replay to success (the data and the environment disagree)."""
    rows = []
    by_task = defaultdict(list)
    for ep in episodes:
        by_task[ep.meta["task"]].append(ep)
    for task, task_eps in sorted(by_task.items()):
        env = me.MiniWobEnv(task, screenshots=False)
        try:
            work = [(ep, k) for ep in task_eps for k, s in enumerate(ep.steps) if s.action["action"] == "click"]
            for ep, k in tqdm(work, desc=task, file=sys.stderr):
                step = ep.steps[k]
                size = dataset.original_size(step, image_root=image_root)
                prefix = [s.action for s in ep.steps[:k]]
                seed = int(ep.meta["seed"])
                rest = [s.action for s in ep.steps[k + 1:]]
                want = effect(env, seed, prefix, step.action, rest)
                if not want[1]:
                    raise RuntimeError(f"{ep.episode_id}: the recorded expert actions do not succeed on replay")
                for label, pt in candidates(step)[:max_candidates]:
                    click = {"action": "click", "coordinate": list(pt)}
                    match, _ = reward.action_match(click, step.action, step.candidate_bbox, size)
                    same = effect(env, seed, prefix, click, rest) == want
                    rows.append(dict(task=task, episode=ep.episode_id, step=k, label=label, point=list(pt),
                                     expert=step.action["coordinate"], reward_match=bool(match), env_same=bool(same)))
        finally:
            env.close()
    return rows


def confusion(rows: list[dict]) -> dict:
    """Per task: tp, fp, fn, tn over clicks (reward_match vs env_same), click steps, steps with a fn."""
    table = {}
    for task in sorted({x["task"] for x in rows}):
        r = [x for x in rows if x["task"] == task]
        c = {"tp": sum(x["reward_match"] and x["env_same"] for x in r),
             "fp": sum(x["reward_match"] and not x["env_same"] for x in r),
             "fn": sum(not x["reward_match"] and x["env_same"] for x in r),
             "tn": sum(not x["reward_match"] and not x["env_same"] for x in r)}
        c["steps"] = len({(x["episode"], x["step"]) for x in r})
        c["steps_with_fn"] = len({(x["episode"], x["step"]) for x in r if x["env_same"] and not x["reward_match"]})
        table[task] = c
    return table


def main():
    ap = cli.make_parser(__doc__)
    ap.add_argument("--data", default="data/miniwob/test.jsonl", help="MiniWob++ episodes (task and seed recorded)")
    ap.add_argument("--image-root", default=None, help="screenshot folder (default: the data file's)")
    ap.add_argument("--tasks", nargs="*", type=miniwob_tasks.miniwob_task, default=None, help="only these tasks (default: all in the file)")
    ap.add_argument("--per-task", type=cli.positive_int, default=4, help="episodes per task")
    ap.add_argument("--max-candidates", type=cli.positive_int, default=12, help="candidate clicks per step (first N)")
    ap.add_argument("--examples", type=cli.positive_int, default=3, help="disagreements printed per task and kind")
    ap.add_argument("--out", default="out/diagnose_reward.json", help="JSON with every judged click")
    args = ap.parse_args()

    chosen = defaultdict(list)
    for ep in dataset.load_episodes(args.data):
        t = ep.meta.get("task")
        if t and (args.tasks is None or t in args.tasks) and len(chosen[t]) < args.per_task:
            chosen[t].append(ep)
    t0 = time.time()
    rows = judge_clicks([ep for eps in chosen.values() for ep in eps], max_candidates=args.max_candidates,
                        image_root=args.image_root)
    table = confusion(rows)
    print(f"{'task':24s} {'steps':>5s} {'clicks':>6s} {'tp':>4s} {'fp':>4s} {'fn':>4s} {'tn':>5s} {'steps w/ fn':>11s}")
    for task, c in table.items():
        print(f"{task:24s} {c['steps']:5d} {c['tp'] + c['fp'] + c['fn'] + c['tn']:6d} {c['tp']:4d} {c['fp']:4d} "
              f"{c['fn']:4d} {c['tn']:5d} {c['steps_with_fn']:11d}")
    for kind, cond in (("false negative (reward no, same effect)", lambda x: x["env_same"] and not x["reward_match"]),
                       ("false positive (reward yes, other effect)", lambda x: x["reward_match"] and not x["env_same"])):
        for task in table:
            for x in [x for x in rows if x["task"] == task and cond(x)][:args.examples]:
                print(f"{kind}: {x['episode']} step {x['step']}: {x['label']!r} at {tuple(x['point'])}, "
                      f"expert {tuple(x['expert'])}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(commit=commit, command=" ".join(sys.argv), data=args.data,
                                              per_task=args.per_task, table=table, clicks=rows,
                                              seconds=round(time.time() - t0, 1)), indent=1))
    print(f"wrote {args.out} ({len(rows)} clicks, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

"""Generate MiniWob++ expert demonstrations in the UI-S1 episode format (JSONL, one episode a line).

Each task's scripted expert (EXPERTS in envs/miniwob_experts.py; it reads the DOM, never the
screenshot) plays episodes in a live headless Chromium. Every step stores the 168 x 224 screenshot
it acted on (the 160 x 210 task area plus page background; 168 x 224 is what Qwen2.5-VL's
smart_resize keeps unchanged, see SCREEN_W in envs/miniwob_env.py), the action in ORIGINAL
screenshot pixels (= page pixels = element-box pixels), a templated thought, the element list and the
target's box (check_options.candidate_bbox, for the click match of docs/method.md §4). A successful episode
ends with a {"action": "terminate", "status": "success"} step on the final screen, so a model
learns to stop. Episodes the expert fails (none expected: experts reach >= 99%) are left out
and listed in the manifest. Train and test splits use disjoint seed ranges
(TRAIN_SEED_BASE, TEST_SEED_BASE in envs/miniwob_env.py).

    python tools/make_miniwob_data.py                          # default set -> data/miniwob/
    python tools/make_miniwob_data.py --train-seeds 100 --test-seeds 20 --out /tmp/miniwob_big
    python tools/make_miniwob_data.py --tasks enter-text login-user --workers 1
    python tools/make_miniwob_data.py --tasks click-test focus-text click-dialog click-button \
        --train-seeds 150 --thoughts short --out /tmp/miniwob_click   # a set a tiny model learns
    python tools/make_miniwob_data.py --restyle data/miniwob/rl.jsonl data/miniwob/rl_varied.jsonl  # no browser
    python tools/make_miniwob_data.py --tasks memory-type-1 memory-type-3 --out data/miniwob \
        --prefix memory_ --train-seeds 64 --train-seed-base 400000 --test-seeds 16 --test-seed-base 500000 \
        --rl-seeds 48 --rl-seed-base 600000      # the memory tasks beside the others (data/miniwob/README.md)

Writes (replacing only these): OUT/train.jsonl, OUT/test.jsonl, OUT/rl.jsonl (with --rl-seeds), OUT/images/,
OUT/manifest.json; with --prefix P: OUT/P{train,test,rl}.jsonl, OUT/Pmanifest.json and the images of --tasks.
Line format:
    {"goal", "episode_id": "<task>-<seed>", "task", "seed", "image_size": [168, 224],
     "steps": [{"screenshot": "images/<task>-<seed>-<k>.png", "action_content": {...},
                "thought", "elements", "check_options": {"action", "candidate_bbox"}}]}
"""

import json
import multiprocessing as mp
import platform
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: utils, envs
import cli  # noqa: E402
import utils  # noqa: E402
from envs import miniwob_env as me  # noqa: E402
from envs import miniwob_experts as experts  # noqa: E402
from envs import miniwob_tasks  # noqa: E402
from envs.miniwob_tasks import OWN_TASKS  # noqa: E402

# -----------------------------------------------------------------------------
# config

ap = cli.make_parser(__doc__)
# data
ap.add_argument("--out", default="data/miniwob", help="output folder")
ap.add_argument("--tasks", nargs="+", type=miniwob_tasks.miniwob_task_or_all, default=["all"],
                help="task names, 'all' (the 18 MiniWob++ tasks with an expert) or 'memory' (the memory tasks)")
ap.add_argument("--train-seeds", type=cli.positive_int, default=24, help="train episodes per task")
ap.add_argument("--test-seeds", type=cli.positive_int, default=8, help="held-out test episodes per task")
ap.add_argument("--train-seed-base", type=cli.non_negative_int, default=me.TRAIN_SEED_BASE, help="first train seed")
ap.add_argument("--test-seed-base", type=cli.non_negative_int, default=me.TEST_SEED_BASE, help="first test seed")
ap.add_argument("--prefix", default="",
                help="name the files PREFIX{train,test,rl}.jsonl and PREFIXmanifest.json, and replace only the images of "
                     "--tasks in OUT/images/ (the rest stay): a task family beside others in one folder, one image root")
ap.add_argument("--rl-seeds", type=cli.non_negative_int, default=0, help="RL demonstration episodes per task (OUT/rl.jsonl; 0: none)")
ap.add_argument("--rl-seed-base", type=cli.non_negative_int, default=300_000, help="first RL seed")
ap.add_argument("--thoughts", choices=["long", "short", "varied"], default="long",
                help="long: the expert's reasoning; short: 'Click button 'okay' at (24,73).' (fewer target tokens); "
                     "varied: four rule-based phrasings per action with extra details (experts.varied_thoughts)")
ap.add_argument("--restyle", nargs=2, metavar=("IN", "OUT"), default=None,
                help="no browser: copy the long-thought episodes of JSONL IN to OUT with --thoughts varied "
                     "(same screenshots and actions; OUT beside IN, so the image paths hold)")
# environment
ap.add_argument("--max-steps", type=cli.positive_int, default=experts.MAX_EXPERT_STEPS, help="expert step limit")
ap.add_argument("--step-timeout", type=cli.positive_float, default=20.0, help="seconds per env step")
ap.add_argument("--retries", type=cli.non_negative_int, default=1, help="retries of an episode after a browser fault (0: none)")
ap.add_argument("--workers", type=cli.positive_int, default=2, help="parallel browsers (one task at a time each)")


# -----------------------------------------------------------------------------
# worker: one (task, split) job in its own browser


def run_job(job):
    """Play the expert on every seed of one task (both splits, one browser); write the PNGs;
    return the episodes per split (JSON-ready, screenshots as relative paths), skipped seeds
    and timing."""
    task, splits, out, max_steps, step_timeout, retries, thoughts = job
    env = me.MiniWobEnv(task, step_timeout_s=step_timeout)
    res = {"task": task, "episodes": {s: [] for s in splits}, "skipped": {s: [] for s in splits},
           "env_steps": 0, "env_seconds": 0.0}
    try:
        for split, seeds in splits.items():
            for seed in seeds:
                t0 = time.time()
                for attempt in range(retries + 1):
                    try:
                        ep = experts.expert_episode(env, seed, max_steps=max_steps, thoughts=thoughts)
                        break
                    except me.BrowserFault as e:
                        env.close()  # the next reset starts a fresh browser
                        ep = {"success": False, "reason": f"browser fault: {e}", "steps": []}
                res["env_seconds"] += time.time() - t0
                res["env_steps"] += sum(st["action"]["action"] != "terminate" for st in ep["steps"])
                if not ep["success"]:
                    res["skipped"][split].append({"seed": seed, "reason": str(ep.get("reason"))})
                    continue
                steps = []
                for k, st in enumerate(ep["steps"]):
                    rel = f"images/{task}-{seed}-{k}.png"
                    st["screenshot"].save(Path(out) / rel, optimize=True)
                    steps.append({"screenshot": rel, "action_content": st["action"],
                                  "thought": st["thought"], "elements": st["elements"],
                                  "check_options": {"action": st["action"]["action"],
                                                    "candidate_bbox": st["candidate_bbox"]}})
                res["episodes"][split].append({
                    "goal": ep["goal"], "episode_id": f"{task}-{seed}", "task": task, "seed": seed,
                    "image_size": [me.SCREEN_W, me.SCREEN_H], "steps": steps})
    finally:
        env.close()
    return res


def versions():
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None

    return {"python": platform.python_version(), "miniwob": metadata.version("miniwob"),
            "selenium": metadata.version("selenium"), "pillow": metadata.version("pillow"),
            "chromium": run([me.CHROME_BINARY, "--version"]),
            "chromedriver": run([me.CHROMEDRIVER, "--version"])}


# -----------------------------------------------------------------------------
# main

LICENCE = ("the project's own page, built on MiniWob++'s core.js (MIT licence; Copyright 2016 OpenAI, "
           "2018 Stanford University, 2022 Farama Foundation)")


def restyle(src: Path, dst: Path) -> dict:
    """Write the episodes of `src` (long expert thoughts) to `dst` with varied thoughts (experts.varied_thoughts,
    keyed by episode_id); everything else byte for byte. Raises utils.UsageError naming the file and line of an
    episode whose thoughts are not long expert thoughts."""
    lines = []
    for i, line in enumerate(src.read_text().splitlines(), 1):
        if not line.strip():
            continue
        ep = json.loads(line)
        steps = [{"action": st["action_content"], "thought": st.get("thought", "")} for st in ep["steps"]]
        try:
            new = experts.varied_thoughts(steps, ep.get("episode_id") or f"{ep.get('task')}-{ep.get('seed')}")
        except ValueError as e:
            raise utils.UsageError(f"{src}:{i}: {e} (--restyle needs long expert thoughts)") from None
        for st, t in zip(ep["steps"], new):
            st["thought"] = t
        lines.append(utils.dumps(ep))
    dst.write_text("\n".join(lines) + "\n")
    return {"in": str(src), "out": str(dst), "episodes": len(lines)}


def main(argv=None):
    args = ap.parse_args(argv)
    if args.restyle:
        src, dst = (Path(p) for p in args.restyle)
        if not src.is_file():
            raise utils.UsageError(f"--restyle {src}: no such file")
        print(utils.dumps(restyle(src, dst)))
        return
    tasks = sorted(experts.task_list(args.tasks))
    try:
        experts.check_tasks(tasks, need_expert=True)
    except ValueError as e:
        raise utils.UsageError(str(e)) from None
    ranges = {"train": (args.train_seed_base, args.train_seeds), "test": (args.test_seed_base, args.test_seeds),
              "rl": (args.rl_seed_base, args.rl_seeds)}
    for a, b in (("train", "test"), ("train", "rl"), ("test", "rl")):
        (sa, na), (sb, nb) = ranges[a], ranges[b]
        if na > 0 and nb > 0 and sa + na > sb and sb + nb > sa:
            raise utils.UsageError(f"{a} seeds {sa}+{na} and {b} seeds {sb}+{nb} overlap")
    if args.workers < 1:
        raise utils.UsageError(f"--workers {args.workers}: need at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pre = args.prefix
    for name in ("train.jsonl", "test.jsonl", "rl.jsonl", "manifest.json"):
        (out / f"{pre}{name}").unlink(missing_ok=True)
    if pre:  # only these tasks' images go: images/<task>-<seed>-<k>.png
        mine = re.compile("^(" + "|".join(map(re.escape, tasks)) + r")-\d+-\d+\.png$")
        for f in (out / "images").glob("*.png"):
            if mine.match(f.name):
                f.unlink()
    else:
        shutil.rmtree(out / "images", ignore_errors=True)
    (out / "images").mkdir(exist_ok=True)

    splits = {s: range(b, b + n) for s, (b, n) in ranges.items() if s != "rl" or n > 0}
    jobs = [(t, {s: list(seeds) for s, seeds in splits.items()}, str(out), args.max_steps,
             args.step_timeout, args.retries, args.thoughts) for t in tasks]
    t0 = time.time()
    results = []
    bar = tqdm(total=len(tasks), desc="tasks", unit="task")
    # ProcessPoolExecutor, not multiprocessing.Pool: a worker that dies (say, killed for memory)
    # raises BrokenProcessPool here instead of hanging the run forever.
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(run_job, job): job[0] for job in jobs}
        for fut in as_completed(futures):
            try:
                r = fut.result()
            except BrokenProcessPool:
                sys.exit(f"a worker process died while generating {futures[fut]}; rerun")
            results.append(r)
            bar.set_postfix_str(r["task"])
            bar.update(1)
    bar.close()
    seconds = time.time() - t0

    # write splits sorted by (task, seed) so the files do not depend on worker timing
    results.sort(key=lambda r: r["task"])
    manifest_splits, per_task = {}, {r["task"]: {} for r in results}
    for split, seeds in splits.items():
        eps = [e for r in results for e in r["episodes"][split]]
        with open(out / f"{pre}{split}.jsonl", "w") as f:
            for e in eps:
                f.write(utils.dumps(e) + "\n")
        manifest_splits[split] = {
            "file": f"{pre}{split}.jsonl", "seed_base": seeds.start, "seeds_per_task": len(seeds),
            "episodes": len(eps), "steps": sum(len(e["steps"]) for e in eps),
            "skipped": {r["task"]: r["skipped"][split] for r in results if r["skipped"][split]}}
        for r in results:
            per_task[r["task"]][split] = {
                "episodes": len(r["episodes"][split]),
                "steps": sum(len(e["steps"]) for e in r["episodes"][split])}
    env_steps = sum(r["env_steps"] for r in results)
    env_seconds = sum(r["env_seconds"] for r in results)  # inside episodes: reset, steps, shots
    written = [out / st["screenshot"] for r in results for eps in r["episodes"].values()
               for e in eps for st in e["steps"]]
    written += [out / m["file"] for m in manifest_splits.values()]
    n_files = len(written) - len(manifest_splits)  # the images this run wrote (one per step)
    size_mb = sum(p.stat().st_size for p in written) / 2**20
    manifest = {
        "format": "UI-S1 episode JSONL; coordinates and boxes in original screenshot pixels",
        "source": "MiniWob++ scripted DOM experts (envs/miniwob_experts.py)",
        "tasks": tasks, "image_size": [me.SCREEN_W, me.SCREEN_H], "splits": manifest_splits,
        "per_task": per_task, "versions": versions(),
        # the project's own pages (written on MiniWob++'s core.js, MIT): where each lives and its knobs
        "own_tasks": {t: {"page": f"envs/miniwob_pages/{OWN_TASKS[t][0]}", "knobs": OWN_TASKS[t][1],
                          "licence": LICENCE}
                      for t in tasks if t in OWN_TASKS},
        "success": f"raw_reward >= {me.SUCCESS_RAW_REWARD}",
        "args": vars(args),
        "timing": {"seconds": round(seconds, 1), "workers": args.workers, "env_steps": env_steps,
                   "seconds_per_env_step": round(env_seconds / max(env_steps, 1), 4)},
        "images": n_files,
    }
    (out / f"{pre}manifest.json").write_text(utils.dumps(manifest, indent=1) + "\n")
    summary = {"out": str(out), "seconds": round(seconds, 1), "env_steps": env_steps,
               "seconds_per_env_step": manifest["timing"]["seconds_per_env_step"],
               "images": n_files, "size_mb": round(size_mb, 2),
               **{f"{s}_episodes": m["episodes"] for s, m in manifest_splits.items()},
               **{f"{s}_steps": m["steps"] for s, m in manifest_splits.items()},
               "skipped": sum(len(v) for m in manifest_splits.values() for v in m["skipped"].values())}
    print(f"next: python train_sft.py --data {out / f'{pre}train.jsonl'}", flush=True)
    print(utils.dumps(summary))


if __name__ == "__main__":
    cli.run_script(main)

"""Online MiniWob++ evaluation of eval_sop.py (--online): the policy plays live episodes on held-out
seeds through miniwob_env.evaluate_online, greedy, with its own responses as history; with --samples K
each episode is also played K times sampled, for pass@K and the flippable fraction. Episodes are
appended to the run folder as they end (evaluation.outputs) and a resumed run plays only the rest.
"""
import contextlib
import time
from collections import Counter, defaultdict

import torch

import report
from envs import miniwob_env, miniwob_experts
from evaluation import outputs
from policies import OnlineModelPolicy
from evaluation.stats import wilson  # the 95% interval of every rate reported
from vlm import sampling_mode


def lent_to_sampler(sampler):
    """vlm.sampling_mode for a sampler that holds a model (eval + no_grad); else nothing."""
    model = getattr(sampler, "model", None)
    return sampling_mode(model) if isinstance(model, torch.nn.Module) else contextlib.nullcontext()


def wilson_rate(k: int, n: int) -> dict:
    """k successes of n as {successes, n, rate, lo, hi}, lo-hi the 95% Wilson interval (rate nan for n = 0)."""
    lo, hi = wilson(k, n)
    return {"successes": k, "n": n, "rate": k / n if n else float("nan"), "lo": lo, "hi": hi}


def flip_counts(greedy: dict, sampled: list[dict], tasks: list[str]) -> dict:
    """Greedy success, pass@K and the flippable fraction of online episodes, per task and pooled.

    greedy: {(task, seed): success} of the greedy play; sampled: K such dicts (K >= 1), one per
    sampled play of the same episodes. Per episode: pass@K = at least one of the K samples succeeds
    (the greedy play does not count); flippable = greedy fails and at least one sample succeeds (the
    episodes RL with a verifiable reward could turn into greedy successes). Returns {"per_task":
    {task: {greedy, pass_at_k, flippable, sampled_sr}}, "pooled": {...}}, each a wilson_rate() over the
    episodes, sampled_sr over the K x episodes sampled plays (its interval treats them as
    independent). Raises ValueError when a sampled play lacks an episode of the greedy one."""
    if not sampled or any(set(p) != set(greedy) for p in sampled):
        raise ValueError("flip_counts: every sampled play needs exactly the greedy play's episodes")

    def counts(keys):
        hit = [any(p[key] for p in sampled) for key in keys]
        g = [bool(greedy[key]) for key in keys]
        return {"greedy": wilson_rate(sum(g), len(keys)), "pass_at_k": wilson_rate(sum(hit), len(keys)),
                "flippable": wilson_rate(sum(h and not x for h, x in zip(hit, g)), len(keys)),
                "sampled_sr": wilson_rate(sum(bool(p[key]) for p in sampled for key in keys), len(sampled) * len(keys))}

    return {"per_task": {t: counts([key for key in greedy if key[0] == t]) for t in tasks},
            "pooled": counts(list(greedy))}


def run_online(sampler, make_prompt_online, tasks: list[str], seeds: list[int], args,
               stats: dict | None = None, folder: outputs.RunFolder | None = None) -> tuple[dict, list[dict]]:
    """Live MiniWob++ episodes. sampler None -> miniwob_env's scripted expert. The result of
    evaluate_online gains `malformed` (responses that parsed to no action). With --samples K (a
    model) every episode is then played K more times, sampled at --temperature on the same seeds
    (the same pages), play j seeded by play_seed: each episode gains `sampled_success` (K bools),
    `sampled_responses` (K lists, play j's response text per step; step 0's page is greedy's, same seed) and
    the result `sampled` (flip_counts, with the plays' response counts). A model's episodes also carry
    the greedy play's transcript: `elements` and `responses`, one per step (online_episodes.jsonl); an
    episode whose request got no answer ends as cause server_error (`server_errors` counts them). With a
    run folder each greedy episode is appended as it ends, and those it holds (--resume) are kept."""

    k = max(args.report_episodes, 0)
    keys = [(task, seed) for task in tasks for seed in seeds]
    wrapped = None
    if sampler is not None:
        wrapped = OnlineModelPolicy(sampler, make_prompt_online, {keys[i] for i in report.shown_indices(len(keys), k)},
                                    stats if stats is not None else Counter(), view=report.step_view)
    held = {(e["task"], int(e["seed"])): e for e in folder.done["online"]} if folder else {}
    todo = defaultdict(list)  # the seeds still to play -> their tasks (one evaluate_online call per seed set)
    for task in tasks:
        left = tuple(s for s in seeds if (task, s) not in held)
        if left:
            todo[left].append(task)

    def transcript(e):  # the greedy play's element lists and responses (the policy has answered every step)
        e.update(wrapped.transcripts.get((e["task"], e["seed"]), {"elements": [], "responses": [], "malformed": 0})
                 if wrapped is not None else {})

    def ended(e):  # on disk as soon as it ends
        transcript(e)
        folder.append("online", [e])

    runs = []
    with lent_to_sampler(sampler):
        for todo_seeds, todo_tasks in todo.items():
            runs.append(miniwob_env.evaluate_online(wrapped or miniwob_experts.expert_policy, todo_tasks,
                                                    list(todo_seeds), max_steps=args.online_max_steps,
                                                    batch_size=args.online_batch,
                                                    **({"on_episode": ended} if folder else {})))
    for e in (e for r in runs for e in r["episodes"]):
        transcript(e)
    if not held and len(runs) == 1:
        res = runs[0]
    else:  # resumed: the kept and the new episodes as one evaluation, in task then seed order
        eps = [*held.values(), *(e for r in runs for e in r["episodes"])]
        res = miniwob_env.online_summary(sorted(eps, key=lambda e: keys.index((e["task"], e["seed"]))), tasks)
    shown = []
    if wrapped is not None:
        by_key = {(e["task"], e["seed"]): e for e in res["episodes"]}
        for key in keys:
            if key in wrapped.views:
                e = by_key[key]
                outcome, end = report.online_outcome(e)
                for v in wrapped.views[key]:  # no expert online: a frame's colour follows the episode's outcome
                    if v.get("verdict"):  # set by the policy: no answer from the server
                        continue
                    if v["pred"] == "(no valid action)":
                        v["verdict"], v["cls"] = "no valid action (a no-op)", "wrong"
                    elif v["t"] == end:
                        v["verdict"], v["cls"] = ("terminate before the task was done" if e.get("terminated")
                                                  else "wrong action: the page ended the episode"), "wrong"
                    elif e["success"]:
                        v["verdict"], v["cls"] = "action", ""
                    else:
                        v["verdict"], v["cls"] = "action (the episode failed)", "neutral"
                shown.append({"title": f"{key[0]} seed {key[1]}", "goal": wrapped.goals[key],
                              "success": e["success"], "outcome": outcome,
                              "steps": wrapped.views[key], "first_wrong": end})
    res["malformed"] = sum(e.get("malformed", 0) for e in res["episodes"])  # the last attempt's, per episode
    res["server_errors"] = sum(e["cause"] == "server_error" for e in res["episodes"])
    if sampler is not None and getattr(args, "samples", 0):
        t0, sstats, plays, said, malformed, no_answer = time.time(), Counter(), [], [], 0, 0
        for j in range(args.samples):
            play = OnlineModelPolicy(sampler, make_prompt_online, set(), sstats, sample=j,
                                     temperature=args.temperature, sample_seed=args.sample_seed)
            with lent_to_sampler(sampler):
                r = miniwob_env.evaluate_online(play, tasks, seeds, max_steps=args.online_max_steps,
                                                batch_size=args.online_batch)
            plays.append({(e["task"], e["seed"]): bool(e["success"]) for e in r["episodes"]})
            said.append(play.transcripts)
            malformed += play.n_malformed
            no_answer += play.n_server_errors
        for e in res["episodes"]:
            e["sampled_success"] = [p[(e["task"], e["seed"])] for p in plays]
            e["sampled_responses"] = [list(tr.get((e["task"], e["seed"]), {}).get("responses", [])) for tr in said]
        res["sampled"] = {"samples": args.samples, "temperature": args.temperature, "sample_seed": args.sample_seed,
                          **flip_counts({(e["task"], e["seed"]): bool(e["success"]) for e in res["episodes"]},
                                        plays, tasks),
                          "responses": sstats["responses"], "malformed_responses": malformed,
                          "server_errors": no_answer,
                          "truncated_responses": sstats["truncated"], "seconds": round(time.time() - t0, 1)}
    return res, shown

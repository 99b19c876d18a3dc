"""Online MiniWob++ evaluation of eval_sop.py (--online): the policy plays live episodes on held-out
seeds through miniwob_env.evaluate_online, greedy, with its own responses as history; with --samples K
each episode is also played K times sampled, for pass@K and the flippable fraction. Episodes are
appended to the run folder as they end (evaluation.outputs) and a resumed run plays only the rest.
The policy is OnlineModelPolicy: a sampler (in process or served) as a batched MiniWob++ policy.
"""
import contextlib
import time
import zlib
from collections import Counter, defaultdict
from typing import Callable

import torch

import gui
from envs import miniwob_env, miniwob_experts
from evaluation import outputs, views
from evaluation.stats import wilson  # the 95% interval of every rate reported
from vlm import sampling_mode


# -----------------------------------------------------------------------------
# the model (in process or served) as a batched online MiniWob++ policy (eval_sop --online)


def play_seed(base: int, task: str, seed: int, sample: int, t: int) -> int:
    """The sampler seed of sampled play `sample` of online episode (task, seed) at step t (a CRC-32): its
    own draws, whatever else is in the batch and whatever K is (play j is the same for every K > j)."""
    return zlib.crc32(f"{base}|{task}|{seed}|{sample}|{t}".encode())


class NoAnswer(RuntimeError):
    """The action OnlineModelPolicy returns for an episode whose request got no answer (a served model's
    request failed after its retries): miniwob_env.evaluate_online ends the episode with this `cause`,
    so the server's failure is never scored as the model's no-op or step limit."""
    cause = "server_error"


class OnlineModelPolicy:
    """A batched miniwob_env policy: for every episode in flight, obs -> prompt with that episode's
    own earlier responses -> one response of `sampler`, all prompts in one generate call -> action
    in pixels of obs['screenshot']. Greedy when `sample` is None; else sampled play number `sample`
    at `temperature`, each prompt seeded with play_seed(sample_seed, task, seed, sample, t) (a rerun
    with the same batch size gives the same responses). Malformed output returns None (the env's
    no-op that costs a step); a request that got no answer (finish_reason "error: ...") returns NoAnswer,
    which ends the episode as server_error (n_server_errors counts them). Keeps report views (`view`) of
    the (task, seed) episodes in `show`; stats gains
    the response counts. `transcripts[(task, seed)]`: every step's element list (obs["elements"], as the
    prompt showed it), response text and malformed count, of the episode's last attempt (a retry starts it over)."""

    batched = True  # miniwob_env.evaluate_online: one call for every episode in flight

    def __init__(self, sampler, make_prompt_online, show: set, stats: dict, sample: int | None = None,
                 temperature: float = 1.0, sample_seed: int = 0, view: Callable | None = None):
        self.sampler, self.make_prompt, self.show, self.stats = sampler, make_prompt_online, show, stats
        self.view = view  # views.step_view: a shown episode's step as the HTML report draws it
        self.sample, self.temperature, self.sample_seed = sample, temperature, sample_seed
        self.views: dict = {}
        self.goals: dict = {}
        self.state: dict = {}  # (task, seed) -> (screenshots, responses) of the episode in flight
        self.transcripts: dict = {}  # (task, seed) -> {"elements": [...], "responses": [...]}, every step
        self.n_malformed = self.n_server_errors = 0

    def __call__(self, obs_list: list[dict], steps: list[int]) -> list:
        keys, prompts = [], []
        for obs, t in zip(obs_list, steps):
            key = (obs["task"], obs["seed"])
            if t == 0:  # a new episode (or a retry after a browser fault)
                self.state[key] = ([], [])
                self.transcripts[key] = {"elements": [], "responses": self.state[key][1], "malformed": 0}
                if key in self.show:
                    self.views[key], self.goals[key] = [], obs["goal"]
            shots, history = self.state[key]
            shots.append(obs["screenshot"])
            self.transcripts[key]["elements"].append(obs.get("elements"))
            keys.append(key)
            prompts.append(self.make_prompt(obs, shots, history))
        if self.sample is None:
            outs = self.sampler.generate(prompts, n=1, greedy=True)
        else:  # the sampler's temperature for this call only (sampler.process_logits applies it)
            seeds = [play_seed(self.sample_seed, k[0], k[1], self.sample, t) for k, t in zip(keys, steps)]
            kept, self.sampler.temperature = self.sampler.temperature, self.temperature
            try:
                outs = self.sampler.generate(prompts, n=1, greedy=False, seeds=seeds)
            finally:
                self.sampler.temperature = kept
        self.state = {k: self.state[k] for k in keys}  # an episode not asked about has ended
        actions = []
        for key, t, prompt, out in zip(keys, steps, prompts, (o[0] for o in outs)):
            image = self.state[key][0][-1]
            self.stats["responses"] += 1
            self.stats["truncated"] += out.finish_reason == "length"
            self.stats["server_errors"] += out.finish_reason.startswith("error")  # a served request that failed
            self.stats["tokens"] += len(out.ids)
            self.state[key][1].append(out.text)
            if out.finish_reason.startswith("error"):  # no answer: the server's failure, not the model's
                self.n_server_errors += 1
                if key in self.views and self.view is not None:
                    v = self.view(t, image, image.size, None, "", None, False, None)
                    self.views[key].append({**v, "verdict": f"no answer: server {out.finish_reason}", "cls": "neutral"})
                actions.append(NoAnswer(f"no answer from the server: {out.finish_reason[len('error: '):]}"))
                continue
            parsed = gui.parse_response(out.text)
            # the reward's strict rules: a response cut at the cap, or with text after its action, is a no-op
            action = parsed.action if parsed.error is None and out.finish_reason == "stop" else None
            bad = action is None and not out.finish_reason.startswith("error")  # not the server's
            self.n_malformed += bad
            self.transcripts[key]["malformed"] += bad
            if action is not None:  # model pixels (resized screenshot) -> pixels of the screenshot we were given
                action = gui.scale_action(action, prompt.resized_size, image.size)
            if key in self.views and self.view is not None:
                # no expert online: the action is drawn, "right" or "wrong" is the episode's outcome
                self.views[key].append(self.view(t, image, image.size, None, out.text, action, action is not None, None))
            actions.append(action)
        return actions

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
        wrapped = OnlineModelPolicy(sampler, make_prompt_online, {keys[i] for i in views.shown_indices(len(keys), k)},
                                    stats if stats is not None else Counter(), view=views.step_view)
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
                outcome, end = views.online_outcome(e)
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

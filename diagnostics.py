"""The RL trainer's diagnostics, built on the rollout driver: greedy vs sampled accuracy on held-out
episodes (the sampled policy the reward sees against the greedy one evaluation runs), and the
per-task reward of a step's rollouts (train_semionline.py's reward_by_task metric).
"""
from __future__ import annotations

import chat
from rollout import StepRecord, semi_online_rollout, sop_progress


def greedy_vs_sampled(sampler, episodes, tokenizer, image_processor, spec: chat.PromptSpec = chat.PromptSpec(), *,
                      samples: int = 4, seed: int = 0, image_root=None, blank_screens=None) -> dict:
    """The RL run's held-out diagnostic: the reward sees sampled responses (the sampler's
    temperature and top-p), evaluation runs the greedy policy, and the two can move apart (RL that
    sharpens the sampled policy towards the greedy one without moving the greedy one). Walks
    `episodes` three times with the driver, patch threshold 0: static (the expert's history)
    greedily, static with `samples` samples per step, and SOP (own history, greedy). Returns counts
    (floats, to be summed over ranks): greedy_match / greedy_steps, sampled_match / sampled_steps,
    sop_pg_sum (sum of per-episode progress), sop_solved, episodes."""
    def walk(**kw):
        return semi_online_rollout(sampler, episodes, tokenizer, image_processor, spec=spec, patch_threshold=0,
                                   image_root=image_root, blank_screens=blank_screens, **kw) if episodes else []
    greedy = walk(n_rollouts=1, greedy=True, history_mode="expert")
    sampled = walk(n_rollouts=samples, greedy=False, history_mode="expert", seed=seed)
    sop = sop_progress(walk(n_rollouts=1, greedy=True, history_mode="own"), {k: len(e.steps) for k, e in enumerate(episodes)})
    return {"greedy_match": float(sum(r.match for r in greedy)), "greedy_steps": float(len(greedy)),
            "sampled_match": float(sum(r.match for r in sampled)), "sampled_steps": float(len(sampled)),
            "sop_pg_sum": float(sum(c / n for c, n in sop.values())), "sop_solved": float(sum(c == n for c, n in sop.values())),
            "episodes": float(len(sop))}


def task_reward_sums(records: list[StepRecord], slot_task: dict[int, str], tasks: list[str]) -> list[float]:
    """Per task of `tasks`, the reward sum of `records` (a record's task: slot_task[record.task_idx]),
    then per task the response count: 2 * len(tasks) floats, to be summed over ranks and read by
    task_rewards (the trainer's reward_by_task)."""
    ix, n = {t: i for i, t in enumerate(tasks)}, len(tasks)
    sums = [0.0] * (2 * n)
    for r in records:
        k = ix[slot_task[r.task_idx]]
        sums[k] += r.reward
        sums[n + k] += 1
    return sums


def task_rewards(tasks: list[str], sums: list[float]) -> dict[str, dict]:
    """{task: {"reward": mean reward, "responses": count}} from task_reward_sums (tasks with responses)."""
    n = len(tasks)
    return {t: {"reward": sums[k] / sums[n + k], "responses": int(sums[n + k])} for k, t in enumerate(tasks) if sums[n + k] > 0}

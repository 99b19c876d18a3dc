"""Rollouts for semi-online RL (docs/method.md §5): `semi_online_rollout` walks N rollouts per task
through the expert episode with their OWN history; a wrong response is patched (patch.py) or ends
its rollout. One `StepRecord` per sampled response is what the trainer reads. `sop_progress`: each
rollout's SOP progress (§8), logged and scored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from tqdm import tqdm

import chat
import dataset
import gui
import patch
import reward
from schedule import stable_seed

# -----------------------------------------------------------------------------
# semi-online rollout driver (docs/method.md §5)

HISTORY_MODES = ("own", "expert")  # own: semi-online RL; expert: the offline-RL baseline


@dataclass
class StepRecord:
    """One sampled response: rollout `rollout_idx` of task `task_idx` at step `step_idx`; the
    contract between the rollout, which writes it, and the trainer, which reads it (the trainer's
    own numbers, advantages and log-probs, live in train_semionline.TrainItem).

    task_idx: the task's index in `episodes`, or task_ids[index] when the driver is given task_ids.
    prompt: the chat.Prompt it was sampled from (token ids, images, resized_size).
    response_ids: the sampler's ids, exactly (the trainer scores these, never re-tokenised text).
    sampler_logp: (L,) fp32 log_softmax(logits / T) of those ids, full vocabulary (pi_old).
    reward / match / type_match / error: reward.score_response's (a malformed response: reward 0,
    error says why; truncated = finish_reason != "stop").
    patched: replaced in the history by a patch (the patch text is never trained on).
    ended: the rollout ended at this step (a wrong step with no patch left, or the last step).
    history: the rollout's history (earlier responses or patches) the prompt was built from.
    """
    task_idx: int
    rollout_idx: int
    step_idx: int
    prompt: Any
    response_ids: list[int]
    sampler_logp: torch.Tensor
    response: str
    finish_reason: str
    reward: float
    match: bool
    type_match: bool
    error: str | None
    patched: bool
    ended: bool
    history: list[str]


@dataclass
class _Rollout:
    history: list[str] = field(default_factory=list)
    n_patches: int = 0
    alive: bool = True


@dataclass(frozen=True)
class RolloutSpec:
    """How the rollouts walk each expert episode (§5), set by the trainer or the evaluator.
    n_rollouts: N, the group of eq. 6.2-6.3. patch_mode, patch_threshold: how a wrong step is
    patched and how many patches a rollout may take (0: the first wrong step ends it, as SOP does).
    history_mode: "own" (semi-online RL) or "expert" (offline RL and the static protocol: no early
    end). match_rules: action_match's ("strict", "release" or a rule function). greedy: argmax
    decoding. image_root, blank_screens: dataset.load_screenshot's."""
    n_rollouts: int = 8
    patch_mode: str = "thought-free"
    patch_threshold: int = 2
    history_mode: str = "own"
    match_rules: str | Callable = "strict"
    greedy: bool = False
    image_root: str | None = None
    blank_screens: tuple[int, int] | None = None


def semi_online_rollout(sampler, episodes, tokenizer, image_processor,
                        walk: RolloutSpec = RolloutSpec(), *,
                        spec: chat.PromptSpec = chat.PromptSpec(),
                        seed: int | list[int] | None = None, task_ids: list[int] | None = None,
                        progress: bool = False) -> list[StepRecord]:
    """Roll walk.n_rollouts copies of the policy through each expert episode with their own history
    (§5): at step t all live rollouts of all tasks are sampled in one batched call (identical
    prompts share one) and scored by reward.score_response (§4); a wrong response is patched while
    patch.should_patch allows, else its rollout ends. Also the evaluator's driver (§8: SOP is one
    greedy rollout, patch_threshold 0; static the same with the expert's history).

    sampler: sampler.Sampler or anything with .generate(prompts, n, greedy, seeds) (n: a sample
    count per prompt) -> outs[i][j] with .text, .ids, .logprobs, .finish_reason; its own
    `prompt_builder`, if any, replaces _Prompts (policies.StepPrompts of the expert replay).
    episodes: list[dataset.Episode]. spec: the prompt contract. seed: an int or one per task; a
    prompt's seed derives from (it, episode_id, step, history), so a task's rollouts depend on
    neither the batch nor the rank. task_ids: each episode's task_idx in the records (default: its
    index). Returns the records in (step, task, rollout) order; ValueError on a bad history_mode."""
    if walk.history_mode not in HISTORY_MODES:
        raise ValueError(f"history_mode must be one of {HISTORY_MODES}, got {walk.history_mode!r}")
    patch.check_patch_data(walk.patch_mode, episodes)
    prompt_for = getattr(sampler, "prompt_builder", _Prompts)(
        episodes, tokenizer, image_processor, spec, walk.image_root, walk.blank_screens)
    task_seeds = [seed] * len(episodes) if isinstance(seed, int) else seed  # one per task, or None
    states = [[_Rollout() for _ in range(walk.n_rollouts)] for _ in episodes]
    records: list[StepRecord] = []
    T = max((len(ep.steps) for ep in episodes), default=0)
    for t in tqdm(range(T), desc="rollout steps", disable=not progress, leave=False):
        live = [(k, i) for k, ep in enumerate(episodes) if t < len(ep.steps)
                for i in range(walk.n_rollouts) if states[k][i].alive]
        if not live:
            break
        outs = _sample_step(sampler, prompt_for, episodes, states, live, t, task_seeds, walk.greedy)
        to_patch = []  # score, then decide: keep, patch or end
        for k, i in live:
            prompt, s = outs[(k, i)]
            step = episodes[k].steps[t]
            orig = dataset.original_size(step, image_root=walk.image_root,
                                         blank_screens=walk.blank_screens)
            # a response cut at the token cap is malformed under the strict rules (a wrong step)
            score = reward.score_response(s.text, step, resized_size=prompt.resized_size,
                                          orig_size=orig, rules=walk.match_rules,
                                          truncated=s.finish_reason != "stop")
            state = states[k][i]
            rec = StepRecord(task_idx=k if task_ids is None else task_ids[k], rollout_idx=i,
                             step_idx=t, prompt=prompt, response_ids=list(s.ids),
                             sampler_logp=s.logprobs, response=s.text,
                             finish_reason=s.finish_reason, reward=score.reward, match=score.match,
                             type_match=score.type_match, error=score.error, patched=False,
                             ended=False, history=list(state.history))
            records.append(rec)
            if _advance(state, rec, step, orig, walk, episodes[k].episode_id):
                to_patch.append((k, i, rec, orig))  # an on-policy patch, made below
            if t == len(episodes[k].steps) - 1:  # the episode's last step ends every rollout
                rec.ended, state.alive = True, False
        if to_patch:  # --patch on-policy: the policy writes the patches' thoughts, all at once
            from extras.on_policy_patch import patch_on_policy
            patch_on_policy(sampler, prompt_for, episodes, states, to_patch, t, task_seeds,
                            walk.greedy)
    return records


class _Prompts:
    """prompt_for(k, t, history, hint): chat.step_prompt of task k at step t, each screenshot loaded
    once, freed when no later prompt reads it."""

    def __init__(self, episodes, tokenizer, image_processor, spec, image_root, blank_screens):
        self.episodes, self.spec = episodes, spec
        self.tokenizer, self.image_processor = tokenizer, image_processor
        self.image_root, self.blank_screens = image_root, blank_screens
        self.shots = [[None] * len(ep.steps) for ep in episodes]

    def screenshot(self, k: int, t: int):
        if self.shots[k][t] is None:
            self.shots[k][t] = dataset.load_screenshot(self.episodes[k].steps[t],
                                                       image_root=self.image_root,
                                                       blank_screens=self.blank_screens)
        return self.shots[k][t]

    def __call__(self, k: int, t: int, history, hint=None):
        step, spec = self.episodes[k].steps[t], self.spec
        # the prompt reads the last num_images screenshots only; steps are walked in order,
        # so older ones are never needed again: free them
        k_img = spec.num_images
        if t >= k_img:
            self.shots[k][t - k_img] = None
        shots = [self.screenshot(k, s) if s > t - k_img else None for s in range(t + 1)]
        return chat.step_prompt(self.tokenizer, self.image_processor, spec,
                                goal=self.episodes[k].goal, step=step, history=history, hint=hint,
                                screenshots=shots)


def _sample_step(sampler, prompt_for, episodes, states, live, t: int, task_seeds,
                 greedy: bool) -> dict:
    """One sampler call for step t: rollouts of one (task, history) share a prompt, which asks for
    as many samples. Returns {(k, i): (prompt, sample)} of the live rollouts."""
    groups: dict[tuple, list[int]] = {}
    for k, i in live:
        groups.setdefault((k, tuple(states[k][i].history)), []).append(i)
    keys = list(groups)
    prompts = {key: prompt_for(key[0], t, list(key[1])) for key in keys}
    seeds = None if task_seeds is None else [
        stable_seed(task_seeds[k], episodes[k].episode_id, t, h) for k, h in keys]
    res = sampler.generate([prompts[key] for key in keys], n=[len(groups[key]) for key in keys],
                           greedy=greedy, seeds=seeds)
    out = {}
    for key, samples in zip(keys, res):  # a group's samples go to its rollouts, in order
        for i, s in zip(groups[key], samples):
            out[(key[0], i)] = (prompts[key], s)
    return out


def _advance(state: _Rollout, rec: StepRecord, step, orig, walk: RolloutSpec,
             episode_id: str) -> bool:
    """A rollout's next history entry after scored step `rec`: the expert's (history_mode
    "expert"), its own response when right, a patch while the threshold allows, else the rollout
    ends. Returns True when the patch is an on-policy thought, generated for all such rollouts at
    once (extras/on_policy_patch.py)."""
    if walk.history_mode == "expert":
        thought = patch.clean_thought(step.thought)
        state.history.append(gui.expert_response(step, orig, rec.prompt.resized_size, thought))
    elif rec.match:
        state.history.append(rec.response)  # build_prompt strips special tokens
    elif patch.should_patch(state.n_patches, walk.patch_threshold):
        rec.patched = True
        state.n_patches += 1
        if walk.patch_mode == "on-policy":
            state.history.append(None)  # filled after one batched generation
            return True
        state.history.append(patch.make_patch(walk.patch_mode, response=rec.response, step=step,
                                              orig_size=orig, resized_size=rec.prompt.resized_size,
                                              episode_id=episode_id))
    else:
        rec.ended, state.alive = True, False
    return False


# -----------------------------------------------------------------------------
# SOP progress of a walk (docs/method.md §8): one definition, logged by the trainer, the basis of
# the evaluator's PG and TSR (evaluation/metrics.py)

def sop_progress(records: list[StepRecord],
                 episode_len: dict) -> dict[tuple[int, int], tuple[int, int]]:
    """SOP progress of each rollout (§8). episode_len: task_idx -> steps of its episode. Returns
    (task_idx, rollout_idx) -> (correct steps before its first wrong step, episode length)."""
    first_err: dict[tuple[int, int], int] = {}
    for r in records:
        key = (r.task_idx, r.rollout_idx)
        first_err.setdefault(key, episode_len[r.task_idx])
        if not r.match:
            first_err[key] = min(first_err[key], r.step_idx)
    return {key: (c, episode_len[key[0]]) for key, c in first_err.items()}

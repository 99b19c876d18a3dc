"""
The patch module of semi-online RL (docs/method.md §5).

When a rollout's sampled response y_t does not match the expert action a*_t, the
rollout may go on with a *patch* in its history instead of y_t: a response that
carries the expert action, so that the next steps see a history that agrees with
the expert screenshots they are shown. The sampled y_t is still trained on with
its reward; the patch text itself is never trained on (it is history only).

Modes (`--patch`):
- "thought-free"  : the policy's own thought from y_t + the expert action (paper);
- "empty-thought" : an empty think block + the expert action (the release, whose
                    data has no thoughts);
- "off-policy"    : the dataset's expert thought (step.thought) + the expert action;
                    data without thoughts is an error that names the episode;
- "on-policy"     : the policy itself writes the thought, prompted with a hint that
                    gives it the expert action (`on_policy_hint`, placed at the end of
                    the step's user turn by chat.step_prompt); the driver
                    samples all those thoughts in one batched call (`on_policy_patches`)
                    and keeps only their think blocks, with the expert action.

How often (`--patch-threshold`, `should_patch`): -1 = no limit, 0 = never (the
rollout ends at its first error), k = at most k patches per rollout (release: 2).

The expert action is stored in ORIGINAL screenshot pixels; every patch writes it
in the RESIZED pixel space of the screenshot the model saw at that step
(gui.scale_action(action, orig_size, resized_size), sizes (W, H)), the space in
which the model itself writes coordinates (docs/method.md §3, §11 "coordinates").

Run the tests: python -m pytest -q tests/test_patch.py
"""

import json
import re
from typing import Any, Callable, Sequence

import gui

PATCH_MODES = ("thought-free", "empty-thought", "off-policy", "on-policy")

# a think tag inside a thought would close or reopen the patch's think block; special tokens
# (<|im_end|>, <|image_pad|>, ...) are chat.build_prompt's to strip, from every history entry
_THINK_TAG = re.compile(r"</?think>")

# -----------------------------------------------------------------------------
# when to patch


def should_patch(n_patches: int, threshold: int) -> bool:
    """Patch this wrong step? n_patches: patches this rollout already has.

    threshold -1: always (no limit); 0: never (the rollout ends at its first
    error); k > 0: while fewer than k patches were made (at most k in all).
    """
    if threshold < -1:
        raise ValueError(f"patch threshold must be -1 (no limit) or >= 0, got {threshold}")
    if n_patches < 0:
        raise ValueError(f"n_patches must be >= 0, got {n_patches}")
    return threshold == -1 or n_patches < threshold


def check_patch_data(mode: str, episodes: Sequence[Any]) -> None:
    """Fail fast, before any rollout: the mode exists, and off-policy data has thoughts.

    episodes: dataset.Episode list. Raises ValueError naming the first episode (id and
    file) and step without an expert thought.
    """
    if mode not in PATCH_MODES:
        raise ValueError(f"patch mode must be one of {PATCH_MODES}, got {mode!r}")
    if mode != "off-policy":
        return
    for ep in episodes:
        for t, step in enumerate(ep.steps):
            if not (step.thought or "").strip():
                raise ValueError(_missing_thought_msg(ep.episode_id, t, getattr(ep, "source", None)))


def _missing_thought_msg(episode_id, step_idx=None, source=None) -> str:
    where = f" (from {source})" if source else ""
    at = f" at step {step_idx}" if step_idx is not None else ""
    return (
        f"--patch off-policy needs the dataset's expert thought, but episode {episode_id!r}{where} "
        f"has no thought{at}; use --patch thought-free, empty-thought or on-policy for this data"
    )


# -----------------------------------------------------------------------------
# the pieces of a patch


def clean_thought(text: str | None) -> str:
    """A thought fit for a response's think block: stray think tags removed, stripped ("" for None).
    Special-token strings are left to the one stripper, chat.strip_special, which chat.build_prompt
    applies to every history entry (docs/method.md §10)."""
    if not text:
        return ""
    return _THINK_TAG.sub("", text).strip()


def extract_thought(generated: str) -> str:
    """The thought in a generated response: its think block, else the text before any action block."""
    parsed = gui.parse_response(generated)
    if parsed.thought is not None:
        return clean_thought(parsed.thought)
    return clean_thought(generated.split("<action>", 1)[0])


def expert_action_resized(step: Any, orig_size: tuple[int, int], resized_size: tuple[int, int]) -> dict:
    """The step's expert action in the pixel space the model saw (sizes are (W, H))."""
    return gui.scale_action(step.action, orig_size, resized_size)


# -----------------------------------------------------------------------------
# on-policy thought: a hint for the prompt, one batched generation for all patches


def on_policy_hint(expert_action_resized: dict) -> str:
    """The hint that asks the policy for a thought leading to the expert action
    (coordinates in the resized space it sees). One paragraph, no leading newline."""
    action = json.dumps(expert_action_resized, ensure_ascii=False)
    return (
        f"Hint: the correct action for this step is {action}. "
        "Think about why this action is the right next step toward the goal, "
        "then answer in the required format with exactly this action."
    )


def on_policy_patches(
    hint_prompts: Sequence[Any],
    expert_actions_resized: Sequence[dict],
    generate: Callable[[list[Any]], list[str]],
) -> list[str]:
    """All on-policy patches of one rollout step in one batched generation.

    hint_prompts: one prompt per wrong step to patch, built by the driver as the step's
        prompt with hint=on_policy_hint(...) (chat.step_prompt; any object `generate` accepts).
    expert_actions_resized: the matching expert actions, resized pixels.
    generate: the sampler, list of prompts -> list of decoded response texts.
    The generated action is discarded: only its thought is kept, with the expert action.
    """
    if len(hint_prompts) != len(expert_actions_resized):
        raise ValueError(f"{len(hint_prompts)} prompts but {len(expert_actions_resized)} expert actions")
    if not hint_prompts:
        return []
    outs = generate(list(hint_prompts))
    if len(outs) != len(hint_prompts):
        raise ValueError(f"generate returned {len(outs)} texts for {len(hint_prompts)} prompts")
    return [gui.format_response(extract_thought(o), a) for o, a in zip(outs, expert_actions_resized)]


# -----------------------------------------------------------------------------
# one entry point for the driver


def make_patch(
    mode: str,
    *,
    response: str,
    step: Any,
    orig_size: tuple[int, int],
    resized_size: tuple[int, int],
    episode_id: str | None = None,
) -> str:
    """The history entry that replaces the wrong response `response` at `step`.

    mode: one of PATCH_MODES except "on-policy", whose patches need a generation and are made in one
    batched call by `on_policy_patches`. step: dataset.Step (expert action in original pixels).
    orig_size, resized_size: (W, H) of the screenshot, as stored and as the model saw it.
    episode_id: named in the error when off-policy data has no thought.
    """
    if mode not in PATCH_MODES or mode == "on-policy":
        raise ValueError(f"patch mode must be one of {PATCH_MODES[:3]} (on-policy: on_policy_patches), got {mode!r}")
    action = expert_action_resized(step, orig_size, resized_size)  # resized pixels
    if mode == "thought-free":
        return gui.format_response(clean_thought(gui.parse_response(response).thought), action)
    if mode == "empty-thought":
        return gui.format_response("", action)
    if mode == "off-policy":
        if not (step.thought or "").strip():
            raise ValueError(_missing_thought_msg(episode_id))
        return gui.expert_response(step, orig_size, resized_size, clean_thought(step.thought))

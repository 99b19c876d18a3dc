"""The patch of semi-online RL (docs/method.md §5): the history entry that replaces a wrong
sampled response y_t (still trained on with its reward; a patch is history only), carrying the
expert action (stored in ORIGINAL pixels), written in the RESIZED pixels the model saw
(gui.scale_action; sizes (W, H), §3). The modes (PATCH_MODES, `--patch`, §5's table) differ
only in the thought before the action.
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
    """Patch this wrong step, the rollout having made n_patches? threshold (--patch-threshold):
    -1 always, 0 never (the rollout ends at its first error), k > 0 at most k patches in all.
    Raises ValueError on threshold < -1 or n_patches < 0."""
    if threshold < -1 or n_patches < 0:
        raise ValueError(f"patch threshold must be >= -1 and n_patches >= 0, "
                         f"got {threshold} and {n_patches}")
    return threshold == -1 or n_patches < threshold


def check_patch_data(mode: str, episodes: Sequence[Any]) -> None:
    """Fail before any rollout: an unknown mode, or off-policy data (dataset.Episode list) with a
    step without an expert thought, raises ValueError naming the episode (id, file) and step."""
    if mode not in PATCH_MODES:
        raise ValueError(f"patch mode must be one of {PATCH_MODES}, got {mode!r}")
    for ep in episodes if mode == "off-policy" else ():
        for t, step in enumerate(ep.steps):
            if not (step.thought or "").strip():
                raise ValueError(_missing_thought_msg(ep.episode_id, t, ep.source))


def _missing_thought_msg(episode_id, step_idx=None, source=None) -> str:
    where = f" (from {source})" if source else ""
    at = f" at step {step_idx}" if step_idx is not None else ""
    return (f"--patch off-policy needs the dataset's expert thought, but episode {episode_id!r}"
            f"{where} has no thought{at}; use --patch thought-free, empty-thought or on-policy "
            "for this data")


# -----------------------------------------------------------------------------
# the pieces of a patch


def clean_thought(text: str | None) -> str:
    """A thought fit for a think block: stray think tags removed, stripped ("" for None). Special-
    token strings stay: chat.build_prompt strips them (chat.strip_special)."""
    return _THINK_TAG.sub("", text).strip() if text else ""


def extract_thought(generated: str) -> str:
    """The thought of a generated response: its think block, else the text before any action."""
    thought = gui.parse_response(generated).thought
    return clean_thought(thought if thought is not None else generated.split("<action>", 1)[0])


# -----------------------------------------------------------------------------
# on-policy thought: a hint for the prompt, one batched generation for all patches


def on_policy_hint(expert_action_resized: dict) -> str:
    """The hint (one paragraph; chat.step_prompt puts it after the step instruction) asking the
    policy for a thought leading to the expert action, in the resized pixels it sees."""
    action = json.dumps(expert_action_resized, ensure_ascii=False)
    return (f"Hint: the correct action for this step is {action}. "
            "Think about why this action is the right next step toward the goal, "
            "then answer in the required format with exactly this action.")


def on_policy_patches(hint_prompts: Sequence[Any], expert_actions_resized: Sequence[dict],
                      generate: Callable[[list[Any]], list[str]]) -> list[str]:
    """All on-policy patches of one rollout step in one call of `generate` (prompts -> texts): the
    thought written for hint_prompts[i] (a step prompt with on_policy_hint) before the expert action
    expert_actions_resized[i]; the generated action is dropped. ValueError if the counts differ."""
    if len(hint_prompts) != len(expert_actions_resized):
        raise ValueError(f"{len(hint_prompts)} prompts but {len(expert_actions_resized)} "
                         "expert actions")
    if not hint_prompts:
        return []
    outs = generate(list(hint_prompts))
    if len(outs) != len(hint_prompts):
        raise ValueError(f"generate returned {len(outs)} texts for {len(hint_prompts)} prompts")
    return [gui.format_response(extract_thought(o), a)
            for o, a in zip(outs, expert_actions_resized)]


# -----------------------------------------------------------------------------
# one entry point for the driver


def make_patch(mode: str, *, response: str, step: Any, orig_size: tuple[int, int],
               resized_size: tuple[int, int], episode_id: str | None = None) -> str:
    """The history entry replacing the wrong `response` at `step` (dataset.Step) under `mode`, one
    of PATCH_MODES but on-policy (on_policy_patches). Sizes (W, H): the screenshot as stored and
    as the model saw it. Raises ValueError naming episode_id when off-policy data has no thought."""
    if mode not in PATCH_MODES or mode == "on-policy":
        raise ValueError(f"patch mode must be one of {PATCH_MODES[:3]} "
                         f"(on-policy: on_policy_patches), got {mode!r}")
    action = gui.scale_action(step.action, orig_size, resized_size)  # resized pixels
    if mode == "thought-free":
        return gui.format_response(clean_thought(gui.parse_response(response).thought), action)
    if mode == "empty-thought":
        return gui.format_response("", action)
    if not (step.thought or "").strip():
        raise ValueError(_missing_thought_msg(episode_id))
    return gui.format_response(clean_thought(step.thought), action)

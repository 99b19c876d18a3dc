"""The prompt contract (docs/method.md §3): how one step of an episode becomes model input, the
same in SFT, semi-online RL and evaluation. `PromptSpec` holds the options the stages must agree
on (saved in args.json, adopted by `resolve_spec`); `build_prompt` renders a step under it."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

import cli
import utils
import gui
from configs.flags import flag

if TYPE_CHECKING:
    import torch

# -----------------------------------------------------------------------------
# system prompts (the full one's action list is generated from gui.ACTIONS)

def full_system_prompt() -> str:
    """The full system prompt, its action list generated from gui.ACTIONS as it stands now."""
    return """You are a GUI agent operating a device. You are given a task goal, the screenshots of the steps so far and your own earlier responses. Perform the next action to complete the task.

## Action space
Write one action as a JSON object with the action and its arguments at the same level:
""" + gui.action_prompt_lines() + """
Coordinates are integer pixels of the latest screenshot, from its left and top edges.

## Output format
<think>
your reasoning
</think>
<action>
{"action": "...", ...}
</action>"""


FULL_SYSTEM_PROMPT = full_system_prompt()  # the registry's at import; build_prompt calls the function

# A model trained from scratch (the tiny presets) learns the format from its targets; the full action
# list is 353 of its ~700 prompt tokens on MiniWob++, so it trains on this instead (--system-prompt short)
SHORT_SYSTEM_PROMPT = ("You are a GUI agent. Answer with <think>your reasoning</think> then "
                       "<action>one JSON action</action>.")
# name -> its text; the full one made at each call, so that a type registered at run time shows
SYSTEM_PROMPTS = {"full": full_system_prompt, "short": lambda: SHORT_SYSTEM_PROMPT}


# -----------------------------------------------------------------------------
# the contract


@dataclass(frozen=True)
class PromptSpec:
    """Every option that must agree between SFT, RL and evaluation; a field's help is its flag's."""
    num_images: int = flag(2, "screenshots kept as images (the last K steps; release 2)")
    min_pixels: int = flag(gui.MIN_PIXELS, "smart_resize lower bound (resized screenshot pixels)")
    max_pixels: int = flag(gui.MAX_PIXELS, "smart_resize upper bound (resized screenshot pixels)")
    max_prompt_tokens: int | None = flag(None, "prompt budget in tokens (None: no budget); the "
                                         "oldest history turns are summarised past it")
    step_instruction: bool = flag(False, "show the low-level step instruction (AndroidControl-Low)")
    elements: bool = flag(True, "show the recorded element list of the step (MiniWob++)")
    system_prompt: str = flag("full", "system prompt: the full action list, or a one-line format "
                              "reminder for models trained from scratch")

    def __post_init__(self):
        if self.num_images < 1:
            raise ValueError(f"--num-images {self.num_images}: must be >= 1")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"--min-pixels {self.min_pixels} / --max-pixels {self.max_pixels}: "
                             "need 0 < min <= max")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"--max-prompt-tokens {self.max_prompt_tokens}: must be >= 1")
        if self.system_prompt not in SYSTEM_PROMPTS:
            raise ValueError(f"--system-prompt {self.system_prompt!r}: "
                             f"expected one of {sorted(SYSTEM_PROMPTS)}")


FIELDS = tuple(f.name for f in fields(PromptSpec))


def add_prompt_args(parser: argparse.ArgumentParser) -> None:
    """One flag per PromptSpec field, defaulting to None (not given: resolve_spec decides)."""
    g = parser.add_argument_group("prompt contract (adopted from the starting checkpoint unless given)")
    for f in fields(PromptSpec):
        kw = ({"action": argparse.BooleanOptionalAction} if f.type == "bool" else
              {"choices": sorted(SYSTEM_PROMPTS)} if f.name == "system_prompt" else
              {"type": cli.positive_int})
        g.add_argument("--" + f.name.replace("_", "-"), default=None, **kw,
                       help=f"{f.metadata['help']} (default: checkpoint's, else {f.default})")


def checkpoint_spec(model) -> dict:
    """The prompt fields a checkpoint folder was trained with: args.json's "prompt" (older ones: the
    same names at its top level); {} for 'tiny', 'auto' or a folder without args.json. Raises
    utils.UsageError naming the file when args.json is not JSON."""
    f = Path(str(model)) / "args.json"
    if str(model) == "auto" or fresh_defaults(model) or not f.is_file():  # none, or made from scratch
        return {}
    try:
        saved = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise utils.UsageError(f"{f}: line {e.lineno}: invalid JSON: {e.msg}") from None
    saved = saved.get("prompt") if isinstance(saved.get("prompt"), dict) else saved
    return {k: saved[k] for k in FIELDS if k in saved}


def fresh_defaults(model) -> dict:
    """The fields that differ from PromptSpec's defaults for a model without a checkpoint: a 'tiny'
    model ('tiny' or 'tiny:<preset>'), trained from scratch, gets the short system prompt."""
    return {"system_prompt": "short"} if utils.is_tiny(model) else {}


def resolve_spec(args, model, say=print) -> PromptSpec:
    """The prompt contract of a stage starting from `model` (docs/method.md §3), field by field: the
    flag given (args.<field> not None; said when it differs), else the checkpoint's (said), else
    fresh_defaults(model), else PromptSpec's. Sets args.prompt (a dict, for args.json) and each
    args.<field>. Raises utils.UsageError on an invalid spec."""
    saved = checkpoint_spec(model)
    given = {k: getattr(args, k) for k in FIELDS if getattr(args, k, None) is not None}
    for k in [k for k in given if k in saved and saved[k] != given[k]]:
        say(f"warning: --{k.replace('_', '-')} {given[k]} differs from the checkpoint's {saved[k]} "
            f"({model}/args.json)")
    taken = {k: v for k, v in saved.items() if k not in given}
    try:
        spec = PromptSpec(**{**fresh_defaults(model), **taken, **given})
    except ValueError as e:  # a bad flag value, or a bad checkpoint file: one line, exit 2
        raise utils.UsageError(str(e)) from None
    if taken:
        said = ", ".join(f"{k}={v}" for k, v in taken.items())
        say(f"prompt contract from {model}/args.json: {said}")
    args.prompt = asdict(spec)
    for name in FIELDS:
        setattr(args, name, getattr(spec, name))
    return spec


# -----------------------------------------------------------------------------
# rendering

@dataclass
class Prompt:
    input_ids: "torch.LongTensor"  # (T,), <|image_pad|> expanded; ends with the assistant header
    pixel_values: "torch.FloatTensor | None"  # (P, C * temporal_patch * patch**2) = (P, 1176)
    image_grid_thw: "torch.LongTensor | None"  # (I, 3)
    resized_size: tuple[int, int]  # (W, H) of the LAST screenshot as the model sees it
    n_dropped_turns: int  # oldest history turns replaced by the summary line
    image_steps: list[int] = field(default_factory=list)  # step index of each image, in order
    # the chat messages after the budget, image parts holding their resized PIL image (none when
    # pixels=False): what a served model is sent (policies.py), the same prompt as in process
    messages: list = field(default_factory=list)


def special_tokens(tokenizer) -> list[str]:
    """All special-token strings of the tokenizer (<|im_end|>, <|image_pad|>, ...)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}).values()
    toks = {t.content for t in added if getattr(t, "special", False)}
    toks |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(toks, key=len, reverse=True)


def strip_special(text: str, tokens: list[str]) -> str:
    """Free text without special-token strings (a sampled <|im_end|> or <|image_pad|> would break
    the chat or the image pad count)."""
    for t in tokens:
        text = text.replace(t, "")
    return text


def build_prompt(tokenizer, image_processor, spec: "PromptSpec", *, goal: str, screenshots: list,
                 history: list[str], step_instruction: str | None = None, elements: str | None = None,
                 pixels: bool = True) -> Prompt:
    """Model inputs for step t = len(screenshots) - 1 under `spec`. screenshots: original images of
    steps 0..t, only the last spec.num_images read (others may be None; with pixels=False a (W, H)
    will do, pixel_values None). history: the responses of steps 0..t-1. Special-token strings are
    cut from every text; the kept screenshots are resized here (so coordinates are known exactly);
    past spec.max_prompt_tokens the oldest turns are summarised (extras/prompt_budget.py). Raises
    ValueError when history and screenshots disagree."""
    import torch

    t = len(screenshots) - 1
    if t < 0 or len(history) != t:
        raise ValueError(f"build_prompt: {len(screenshots) or 'no'} screenshots and {len(history)} "
                         "history responses: step t needs t + 1 screenshots and t responses")
    patch, merge = int(image_processor.patch_size), int(image_processor.merge_size)
    specials = special_tokens(tokenizer)
    clean = lambda s: strip_special(s, specials) if s else s  # noqa: E731
    goal, step_instruction, elements = clean(goal), clean(step_instruction), clean(elements)
    history = [clean(h) for h in history]

    shown = list(range(max(0, t + 1 - spec.num_images), t + 1))  # the steps kept as images
    sizes = {i: getattr(screenshots[i], "size", screenshots[i]) for i in shown}  # image, or (W, H)
    resized = {i: gui.resized_size(sizes[i], factor=patch * merge, min_pixels=spec.min_pixels,
                                   max_pixels=spec.max_pixels) for i in shown}
    n_pad = {i: (resized[i][0] // patch) * (resized[i][1] // patch) // merge**2 for i in shown}

    def render(drop: int = 0, earlier: str = ""):  # turns < drop told as `earlier`
        """(tokens with pads expanded, ids, steps with an image, messages)."""
        messages = _messages(spec, goal, history, shown, step_instruction, elements, drop, earlier)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids, steps = tokenizer.encode(text, add_special_tokens=False), [i for i in shown if i >= drop]
        return len(ids) + sum(n_pad[i] - 1 for i in steps), ids, steps, messages

    drop, (n, ids, steps_with_image, messages) = 0, render()
    if spec.max_prompt_tokens is not None and n > spec.max_prompt_tokens:
        from extras import prompt_budget  # a budget, and a prompt over it

        drop, (n, ids, steps_with_image, messages) = prompt_budget.fit(render, history, shown[0],
                                                                      spec.max_prompt_tokens, n)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ids = _expand_pads(ids, pad, [n_pad[i] for i in steps_with_image])
    pixel_values, grid, messages = _pixel_inputs(image_processor, screenshots, resized,
                                                 steps_with_image, patch, pixels, messages)
    return Prompt(input_ids=torch.tensor(ids, dtype=torch.long), pixel_values=pixel_values,
                  image_grid_thw=grid, resized_size=resized[t], n_dropped_turns=drop,
                  image_steps=steps_with_image, messages=messages)


def _messages(spec, goal, history, shown, step_instruction, elements, drop=0, earlier="") -> list:
    """The chat of step t = len(history) (docs/method.md §3, Context) from step `drop` on: its first
    user turn has the goal and `earlier` (what is said of the dropped turns), the steps `shown`
    their screenshot, the current turn the step instruction and the element list."""
    t = len(history)
    system = SYSTEM_PROMPTS[spec.system_prompt]()
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}]
    for i in range(drop, t + 1):
        content = [{"type": "text", "text": f"Task goal: {goal}{earlier}\n"}] if i == drop else []
        if i in shown:
            content += [{"type": "text", "text": f"Step {i + 1} screenshot:"}, {"type": "image"}]
        else:
            content.append({"type": "text", "text": f"Step {i + 1} (screenshot not shown)."})
        if i == t:
            if step_instruction and step_instruction.strip():  # never an empty "Step instruction:" line
                content.append({"type": "text", "text": f"\nStep instruction: {step_instruction}"})
            if elements:
                content.append({"type": "text", "text": f"\nUI elements on screen:\n{elements}"})
        messages.append({"role": "user", "content": content})
        if i < t:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": history[i]}]})
    return messages


def _expand_pads(ids: list[int], pad_id: int, n_pads: list[int]) -> list[int]:
    """Each <|image_pad|> of `ids` expanded to its image's token count n_pads[k], in order."""
    if ids.count(pad_id) != len(n_pads):
        raise RuntimeError(f"prompt has {ids.count(pad_id)} image pads for {len(n_pads)} images")
    counts = iter(n_pads)
    return [t for tok in ids for t in ([pad_id] * next(counts) if tok == pad_id else [tok])]


def _pixel_inputs(image_processor, screenshots, resized, steps, patch, pixels, messages):
    """(pixel_values (P, 1176), image_grid_thw (I, 3), messages) of the images of `steps`, each
    resized to resized[i] (W, H) and given to its image part of `messages`. With pixels=False no
    pixel is touched: pixel_values None, the grid the image processor would report."""
    import torch

    if not steps:
        return None, None, messages
    want = [[1, resized[i][1] // patch, resized[i][0] // patch] for i in steps]
    if not pixels:
        return None, torch.tensor(want, dtype=torch.long), messages
    # convert and resize copy an image already in RGB / at its size: same pixels, bit for bit
    images = [screenshots[i].convert("RGB").resize(resized[i], Image.BICUBIC) for i in steps]
    feats = image_processor(images=images, do_resize=False, return_tensors="pt")
    pixel_values, grid = feats["pixel_values"], feats["image_grid_thw"].long()  # (P, 1176), (I, 3)
    if grid.tolist() != want:  # do_resize=False: the grid is the resized size's, or coordinates drift
        raise RuntimeError(f"image processor grids {grid.tolist()} disagree with the resized sizes "
                           f"{[resized[i] for i in steps]} (W, H)")
    parts = iter(images)  # the image parts, in order of appearance
    messages = [{**m, "content": [{**c, "image": next(parts)} if c["type"] == "image" else c
                                  for c in m["content"]]} for m in messages]
    return pixel_values, grid, messages


def step_prompt(tokenizer, image_processor, spec: PromptSpec, *, goal: str, step, screenshots: list,
                history: list[str], hint: str | None = None, pixels: bool = True) -> Prompt:
    """build_prompt for a recorded step (dataset.Step), the one place every stage makes one: its
    step instruction when the spec shows it, with `hint` (patch.on_policy_hint) after it, and
    the element list when the spec shows it."""
    instruction = step.step_instruction if spec.step_instruction and step.step_instruction else None
    if hint:
        instruction = f"{instruction.strip()}\n{hint}" if instruction and instruction.strip() else hint
    return build_prompt(tokenizer, image_processor, spec, goal=goal, screenshots=screenshots,
                        history=history, step_instruction=instruction,
                        elements=step.elements if spec.elements else None, pixels=pixels)

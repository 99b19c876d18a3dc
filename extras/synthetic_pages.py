"""The SFT copy warm-up's synthetic pages (train_sft.py --copy-warmup-steps; train_sft.synthetic_example
makes a training example of one), in the shipped MiniWob++ format; also the tiny tokenizer's corpus
(tools/build_tiny_tokenizer.py). train_sft.py imports this module only when the warm-up runs."""
from __future__ import annotations

import random

ELEMENT_KINDS = ("button", "div", "input_text", "span", "label", "a")


def page_labels(episodes) -> list[str]:
    """The distinct non-empty element labels (the text between the first pair of single quotes of
    an element line) of every step of `episodes` (dataset.Episode), sorted; [] when there is none."""
    labels = set()
    for ep in episodes:
        for step in ep.steps:
            for line in (step.elements or "").splitlines():
                parts = line.split("'")
                if len(parts) >= 3 and parts[1]:
                    labels.add(parts[1])
    return sorted(labels)


def synthetic_page(rng: random.Random, labels: list[str], max_elements: int = 1) -> tuple[str, str, dict, str]:
    """A page of 1..max_elements element lines in the shipped MiniWob++ format (pixels of a
    160-pixel-wide screen, boxes stacked from y = 52 down), distinct labels from `labels`, one of
    them the target. Returns (goal, element lines, the click action {"action": "click",
    "coordinate": [x, y]} at the target box's centre, the expert-style thought)."""
    n = rng.randint(1, max_elements)
    labs = rng.sample(labels, n)
    lines, targets = [], []
    y = rng.randint(52, 70)
    first = rng.randint(1, 20)
    for i in range(n):
        kind = rng.choice(ELEMENT_KINDS)
        w, h = rng.randint(20, 150), rng.randint(10, 25)
        x0 = rng.randint(2, 158 - w)
        cx, cy = x0 + w // 2, y + h // 2
        lines.append(f"[{first + i}] {kind} '{labs[i]}' at ({cx},{cy}) ({x0},{y},{x0 + w},{y + h})")
        targets.append((kind, labs[i], cx, cy))
        y += h + rng.randint(0, 8)
    kind, lab, cx, cy = rng.choice(targets)
    return (f'Click on the "{lab}" {kind}.', "\n".join(lines), {"action": "click", "coordinate": [cx, cy]},
            f"Click {kind} '{lab}' at ({cx},{cy}).")


def synthetic_type_page(rng: random.Random, labels: list[str]) -> tuple[str, str, dict, str]:
    """A page whose focused input box must receive a text quoted in the goal (the copy of a string,
    as a click copies a point): one `input_text` line (empty, a 130 x 21 box at a random height),
    the text a label from `labels`. Returns (goal, element line, {"action": "type", "text": text},
    the expert-style thought)."""
    text = rng.choice(labels)
    y, first = rng.randint(52, 150), rng.randint(1, 20)
    line = f"[{first}] input_text '' at (66,{y + 10}) (2,{y},130,{y + 21})"
    return (f'Enter "{text}" into the text field.', line, {"action": "type", "text": text},
            f"The text field is focused and empty. I type '{text}' into it.")

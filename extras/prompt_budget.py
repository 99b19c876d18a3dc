"""The prompt's token budget (--max-prompt-tokens): which of the oldest turns chat.build_prompt summarises.

chat.build_prompt imports this module only when a budget is set and its prompt is over it: a long episode
(AndroidControl's longest has 24 steps of 3,354-token screenshots) would otherwise outgrow the context.
The oldest turns are dropped (their images with them: pads and pixels always agree) and summarised by one
action-only line each, in the first user turn; once only turns with screenshots are left, the oldest
summary lines go before such a turn does. A logged warning says what went; a prompt that cannot fit even
so (the current screenshot alone is too big) is returned with a warning, never an exception.
"""
from __future__ import annotations

import json
import logging
from typing import Callable

from gui import parse_response

logger = logging.getLogger(__name__)


def summary_line(i: int, response: str) -> str:
    """Turn i's line of the summary: its action as JSON ("Step 3: {...}"), or that it had none."""
    a = parse_response(response).action
    return f"Step {i + 1}: " + (json.dumps(a, ensure_ascii=False) if a is not None else "(no valid action)")


def earlier_steps(history: list[str], drop: int, n_summary: int) -> str:
    """What the first user turn says of turns 0..drop-1 once they are dropped: their count and the
    summary lines of the last n_summary of them ("" when nothing is dropped)."""
    if drop == 0:
        return ""
    lines = [summary_line(i, history[i]) for i in range(drop - n_summary, drop)]
    shown = "actions only" if n_summary == drop else f"actions of the last {n_summary} only"
    return f"\nEarlier steps: {drop} (screenshots not shown; {shown}):" + "".join("\n" + s for s in lines)


def fit(render: Callable, history: list[str], first_image: int, budget: int, n_full: int) -> tuple[int, tuple]:
    """The first (drop, n_summary) whose prompt fits `budget` tokens, in order of preference: the oldest
    turns summarised, one action line each, until the turns left carry screenshots (first_image: the
    oldest step shown as an image); then the oldest summary lines go (binary search: the length grows
    with n_summary); only then turns with a screenshot. render(drop, earlier) -> (tokens with pads
    expanded, ...) renders the prompt with turns 0..drop-1 replaced by the text `earlier`; n_full: the
    tokens of the whole prompt. Returns (drop, render's result for it)."""
    t = len(history)

    def fits(d, k):
        r = render(d, earlier_steps(history, d, k))
        return r[0] <= budget, r

    for drop in range(1, t + 1):
        ok, best = fits(drop, drop)
        if ok:
            n_summary = drop
            break
        if drop not in (first_image, t):
            continue
        ok, r = fits(drop, 0)
        if not ok:
            continue
        lo, hi, best = 0, drop, r  # fits with lo lines, not with hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok, r = fits(drop, mid)
            lo, hi, best = (mid, hi, r) if ok else (lo, mid, best)
        n_summary = lo
        break
    else:  # nothing fits: everything but the current turn goes, and we say so
        drop, n_summary = t, 0
        best = render(drop, earlier_steps(history, drop, 0))
    logger.warning("prompt of %d tokens over the budget of %d: summarised the oldest %d of %d turns "
                   "(%d summary lines kept) -> %d tokens%s", n_full, budget, drop, t, n_summary,
                   best[0], "; STILL OVER BUDGET" if best[0] > budget else "")
    return drop, best

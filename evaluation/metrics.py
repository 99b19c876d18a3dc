"""The evaluator's metrics of a walk (docs/method.md §8): PG and TSR of SOP from each episode's
progress (rollout.sop_progress, the one definition the trainer shares), the static protocol's type,
grounding and step accuracy, and the history gap (own vs expert history on the steps SOP reached).
eval_sop.py reports them; the trainer never reads them.
"""
from __future__ import annotations

import gui


def sop_metrics(progress: list[tuple[int, int]]) -> dict:
    """progress: (correct steps before the first error, episode length) per episode -> PG, TSR."""
    if not progress:
        return {"pg": 0.0, "tsr": 0.0, "episodes": 0, "steps": 0}
    return {"pg": sum(c / n for c, n in progress) / len(progress),
            "tsr": sum(c == n for c, n in progress) / len(progress),
            "episodes": len(progress), "steps": sum(n for _, n in progress)}


def static_metrics(steps: list[dict]) -> dict:
    """steps: {type_match, match, expert_type} per evaluated step -> type accuracy, grounding accuracy
    (None when no point step, gui.action_types("point"), had its type matched), step success rate."""
    point = gui.action_types("point")  # steps with a point to hit
    grounded = [s for s in steps if s["expert_type"] in point and s["type_match"]]
    n = len(steps)
    return {"type_acc": sum(s["type_match"] for s in steps) / n if n else 0.0,
            "grounding_acc": sum(s["match"] for s in grounded) / len(grounded) if grounded else None,
            "step_sr": sum(s["match"] for s in steps) / n if n else 0.0,
            "steps": n, "grounding_steps": len(grounded)}


def history_gap(steps: list[tuple[str, int, bool, bool]]) -> dict:
    """Own vs expert history on the steps both reach. steps: (task, t, own, expert) per step that SOP
    reached (every earlier step right under its own history), own its SOP match, expert the static
    protocol's match of the same step (the expert's history). Per task and pooled: steps, own_right,
    expert_right, own_acc, expert_acc, gap = own_acc - expert_acc, the discordant pairs own_only and
    expert_only (accuracies None without steps); `later` the same over t >= 1 (step 0 has no history:
    the two prompts are one)."""
    def count(rows):
        n, own, exp = len(rows), sum(r[2] for r in rows), sum(r[3] for r in rows)
        acc = (lambda k: k / n) if n else (lambda k: None)  # noqa: E731 -- None (JSON null) for no step
        return {"steps": n, "own_right": own, "expert_right": exp, "own_acc": acc(own), "expert_acc": acc(exp),
                "gap": acc(own - exp), "own_only": sum(r[2] and not r[3] for r in rows),
                "expert_only": sum(r[3] and not r[2] for r in rows)}

    def both(rows):
        return {**count(rows), "later": count([r for r in rows if r[1] >= 1])}

    return {"per_task": {task: both([r for r in steps if r[0] == task]) for task in dict.fromkeys(r[0] for r in steps)},
            "pooled": both(steps)}

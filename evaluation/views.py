"""What the HTML report shows of an evaluated step and episode, made while the evaluator runs (eval_sop.py's
SOP and static walks, evaluation/online.py's live episodes) and drawn by report.write_report: a step's
screenshot with the target boxes, the expert's and the predicted action (step_view), which episodes are
shown (shown_indices), and each episode's one-line outcome (sop_outcome, online_outcome).
"""
import base64
import io
import json

from PIL import Image, ImageDraw

import dataset
import gui

REPORT_WIDTH = 300  # px of each screenshot in the HTML report


def draw_step(image: Image.Image, orig: tuple[int, int], expert: dict | None, boxes: list,
              pred: dict | None, ok: bool) -> str:
    """The screenshot scaled to REPORT_WIDTH px wide with the target boxes (green), the expert point
    or swipe (green cross / line) and the predicted one (blue if right, red if wrong); all actions and
    boxes in ORIGINAL pixels (orig = (W, H)). Returns a base64 PNG."""
    scale = REPORT_WIDTH / image.width
    size = (REPORT_WIDTH, max(1, round(image.height * scale)))
    im = image.convert("RGB").resize(size, Image.NEAREST if scale > 1 else Image.BILINEAR)
    sx, sy = size[0] / orig[0], size[1] / orig[1]
    d = ImageDraw.Draw(im)
    pt = lambda xy: (xy[0] * sx, xy[1] * sy)  # noqa: E731
    for x1, y1, x2, y2 in boxes or ():
        d.rectangle([pt((x1, y1)), pt((x2, y2))], outline=(0, 200, 0), width=2)
    for act, colour, mark in ((expert, (0, 200, 0), "cross"), (pred, (40, 90, 255) if ok else (230, 0, 0), "dot")):
        if not act or "coordinate" not in act:
            continue
        x, y = pt(act["coordinate"])
        if "coordinate2" in act:
            d.line([(x, y), pt(act["coordinate2"])], fill=colour, width=3)
        if mark == "cross":
            d.line([(x - 8, y), (x + 8, y)], fill=colour, width=3)
            d.line([(x, y - 8), (x, y + 8)], fill=colour, width=3)
        else:
            d.ellipse([x - 6, y - 6, x + 6, y + 6], outline=colour, width=3)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def step_view(t: int, image, orig, step: dataset.Step | None, text: str, pred: dict | None, ok: bool,
              reward: float | None) -> dict:
    """What the report shows of one evaluated step: pred is the parsed action in ORIGINAL pixels;
    step None (online: no expert) draws the prediction alone."""
    return {"t": t, "png": draw_step(image, orig, step.action if step else None, step.candidate_bbox if step else [],
                                     pred, ok),
            "thought": gui.parse_response(text).thought, "pred": json.dumps(pred) if pred else "(no valid action)",
            "expert": json.dumps(step.action) if step else None, "ok": ok, "reward": reward, "raw": text}


def shown_indices(n: int, k: int) -> set[int]:
    """k indices spread evenly over range(n) (MiniWob files are sorted by task: this covers tasks)."""
    return {int(i * n / k) for i in range(k)} if n > k else set(range(n))



def sop_outcome(n_correct: int, n_steps: int, malformed: bool, server_error: str | None = None) -> str:
    """The report's label of an SOP episode: what happened, and at which (0-based) step; server_error:
    the last step got no answer from the server (its error), which is never called the model's."""
    if n_correct == n_steps:
        return f"success: all {n_steps} steps right"
    if server_error:
        return (f"no answer from the server at step {n_correct} ({server_error}): "
                f"{n_correct}/{n_steps} steps right before it")
    what = "no valid action" if malformed else "wrong action"
    return f"{what} at step {n_correct}: {n_correct}/{n_steps} steps right before it"


def online_outcome(e: dict) -> tuple[str, int | None]:
    """The report's label of an online episode (a miniwob_env.evaluate_online episode record) and the 0-based
    step that ended it wrongly (None: success, step limit, or an error outside the policy's actions).
    The environment's cause "wrong_action" covers two things: the policy sent terminate before
    the task was done, or the page itself ended the episode without full reward."""
    n, cause = e["steps"], e["cause"]
    if cause == "success":
        return f"success in {n} steps", None
    if cause == "wrong_action" and e.get("terminated"):
        return f"terminated early: terminate at step {n - 1} before the task was done", n - 1
    if cause == "wrong_action":
        return (f"wrong action at step {n - 1}: the page ended the episode "
                f"(raw reward {e.get('raw_reward', 0.0):.2f})", n - 1)
    if cause == "step_limit":
        return f"step limit: not done after {n} steps", None
    return f"{cause.replace('_', ' ')} at step {n}: {e.get('error', '')}".rstrip(": "), None

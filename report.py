"""The HTML report of eval_sop.py: each shown episode as a row of screenshots with the target boxes,
the expert point and the predicted one drawn, the thought, the action, and the step that ended it.

    report.write_report("out/eval/report.html", title, summary, sections)

A section is (heading, note, episodes); an episode is {title, goal, success, outcome, steps,
first_wrong}, each step a `step_view`. Static HTML, images inline (base64 PNG): open it in a browser.
"""

import base64
import html
import io
import json
import os

from PIL import Image, ImageDraw

import cli
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


CSS = """body{font-family:sans-serif;margin:16px;color:#222} .ep{border:1px solid #bbb;margin:14px 0;padding:8px}
.steps{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}
.step{width:310px;border:2px solid #8c8;padding:4px;font-size:12px}
.step.wrong{border-color:#e88;background:#fff4f4} .step.first{border:4px solid #d00} .step.neutral{border-color:#bbb}
.step img{display:block} code{white-space:pre-wrap;word-break:break-all} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px} .ok{color:#080} .bad{color:#c00}"""


def write_report(path: str, title: str, summary: dict, sections: list[tuple[str, str, list[dict]]]) -> None:
    """sections: (heading, note, episodes), each episode {title, goal, outcome, steps: [step_view], first_wrong}."""
    e = html.escape
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(cli.dumps(v) if not isinstance(v, float) else f'{v:.4f}')}</td></tr>"
                   for k, v in summary.items() if k not in ("per_task", "sources", "report"))
    per_task = summary.get("per_task") or {}
    cols = list(dict.fromkeys(k for v in per_task.values() for k in v))
    cell = lambda v: "" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    tasks = "".join(f"<tr><th>{e(t)}</th>" + "".join(f"<td>{cell(v.get(c))}</td>" for c in cols) + "</tr>"
                    for t, v in per_task.items())
    if tasks:
        tasks = "<h2>Per task</h2><table><tr><th>task</th>" + "".join(f"<th>{e(c)}</th>" for c in cols) + \
            f"</tr>{tasks}</table>"
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style></head>"
           f"<body><h1>{e(title)}</h1><table>{rows}</table>{tasks}<p>Boxes: target candidates (green). Green cross: "
           "expert point / swipe. Circle: predicted point (blue right, red wrong). Frames: green right, red wrong, "
           "thick red the step that ended the episode; online (no expert), grey: an action of a failed "
           "episode.</p>"]
    for heading, note, episodes in sections:
        out.append(f"<h2>{e(heading)}</h2><p>{e(note)}</p>")
        for ep in episodes:
            out.append(f"<div class='ep'><h3>{e(ep['title'])} - <span class='{'ok' if ep['success'] else 'bad'}'>"
                       f"{e(ep['outcome'])}</span></h3><p>Goal: {e(ep['goal'])}</p><div class='steps'>")
            for s in ep["steps"]:
                cls = "step" + (f" {s['cls']}" if s.get("cls") else "" if s["ok"] else " wrong") + \
                    (" first" if s["t"] == ep.get("first_wrong") else "")
                if s.get("verdict"):  # online: set from the episode's outcome (run_online)
                    verdict = s["verdict"]
                elif s["expert"] is None:
                    verdict = "action" if s["ok"] else "no valid action (a no-op)"
                else:
                    verdict = "right" if s["ok"] else "WRONG"
                reward = f", reward {s['reward']:.2f}" if s["reward"] is not None else ""
                out.append(f"<div class='{cls}'><img src='data:image/png;base64,{s['png']}' alt='step {s['t']}'>"
                           f"<b>Step {s['t']}: {verdict}{reward}</b><br>Thought: <code>{e(s['thought'] or '')}</code>"
                           f"<br>Model: <code>{e(s['pred'])}</code>")
                if s["expert"] is not None:
                    out.append(f"<br>Expert: <code>{e(s['expert'])}</code>")
                if s["pred"] == "(no valid action)":
                    out.append(f"<br>Raw output: <code>{e(s['raw'][:400]) or '(empty)'}</code>")
                out.append("</div>")
            out.append("</div></div>")
    out.append("</body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))


def shown_indices(n: int, k: int) -> set[int]:
    """k indices spread evenly over range(n) (MiniWob files are sorted by task: this covers tasks)."""
    return {int(i * n / k) for i in range(k)} if n > k else set(range(n))



def sop_outcome(n_correct: int, n_steps: int, malformed: bool) -> str:
    """The report's label of an SOP episode: what happened, and at which (0-based) step."""
    if n_correct == n_steps:
        return f"success: all {n_steps} steps right"
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


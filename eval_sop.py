"""Evaluation of a GUI policy: SOP (docs/method.md §8), static AndroidControl-style metrics, online
MiniWob++ success, and offline scoring of recorded responses.

Protocols (one run may combine them; each prompt is built by gui.build_prompt, each step judged by
gui.score_response, the same match function rollout and training use):
- sop (default): the policy acts on each expert episode with its OWN earlier responses as history,
  greedy, no patching; an episode stops at its first wrong step. PG = mean over episodes of
  (correct steps before the first error) / (episode length); TSR = share of episodes with every
  step correct.
- static (AndroidControl-High; with --step-instruction -Low): every step is evaluated with the
  EXPERT's earlier actions as history. type_acc = share of steps whose action type matched;
  grounding_acc = among click/long_press steps whose type matched, the share that fully matched;
  step_sr = share of steps fully matched.
- online (--online; MiniWob++ only): the policy plays live episodes through
  miniwob_env.evaluate_online on held-out seeds, with its own responses as history; malformed
  output is a no-op that still costs a step. Success = MiniWob raw reward >= 1.

Policies:
- expert: the expert actions, written as model responses in pixels of the resized screenshot,
  replayed through the full path (prompt building with the real tokenizer and image processor,
  token budget, parse, coordinate mapping, match). Must give PG = TSR = 1.0 on every real file;
  anything less is a bug in that path. Online it is miniwob_env's scripted DOM expert.
- model: greedy decoding of --model ('tiny', a Hugging Face folder, or a checkpoint folder or run
  folder with a `latest` pointer) through rollout.Sampler. SOP keeps a pool of --batch-size live
  episodes and sends the current step of every live episode in ONE generate call; an episode that
  ends is replaced by the next one (greedy ids do not depend on the batch's make-up).

Commands (the last stdout line is one JSON object; progress bars go to stderr):
    # expert replay on the AndroidControl test episodes, blank 1080x2400 screens (none ship);
    # --max-pixels 50176 keeps the blank images small so the replay takes minutes, not an hour
    python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl --policy expert \\
        --blank-screens 1080x2400 --max-pixels 50176
    # a checkpoint on MiniWob++: SOP, static, and online on 5 held-out seeds per task, with a report
    # (--model out/sft/ckpt follows its `latest` pointer; the prompt options come from its args.json)
    python eval_sop.py --data data/miniwob/test.jsonl --policy model --model out/sft/ckpt \\
        --protocol sop static --online --online-seeds 5 --out out/eval/sft
    # the untrained tiny model, 2 episodes per task, short responses (a CPU smoke run, ~1 min)
    python eval_sop.py --data data/miniwob/test.jsonl --per-task-limit 2 --policy model --model tiny \\
        --max-new-tokens 32 --protocol sop static --out /tmp/eval_tiny
    # online only, the scripted DOM expert (must give online_sr = 1.0)
    python eval_sop.py --online --online-tasks click-test enter-text --online-seeds 3
    # AndroidControl-Low static metrics of a model
    python eval_sop.py --data data/android_control/android_control_test_uis1.jsonl --policy model \\
        --model /models/Qwen2.5-VL-7B-Instruct --protocol static --step-instruction --blank-screens 1080x2400
    # score recorded responses (coordinates in resized pixels) of any model
    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \\
        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400

--out DIR writes result.json (the summary and the run's args), episodes.jsonl (SOP, one line per
episode), static_steps.jsonl, online_episodes.jsonl and report.html (HTML: screenshots with the
predicted and expert points and the target boxes, thoughts, actions, the first wrong step).
Single process only (no torchrun).
"""

import argparse
import base64
import html
import io
import json
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from PIL import Image, ImageDraw
from tqdm import tqdm

import cli
import gui
import utils

# -----------------------------------------------------------------------------
# Config

GROUNDING_TYPES = ("click", "long_press")  # steps that count for grounding accuracy
REPORT_WIDTH = 300                          # px of each screenshot in the HTML report


size_arg = cli.arg_type(gui.parse_size)  # argparse type for 'WxH' -> (W, H)
input_file = cli.arg_type(cli.input_file)  # argparse type: a readable file
# prompt options that must agree with training: read from a checkpoint's args.json unless given
PROMPT_ARGS = ("num_images", "min_pixels", "max_pixels", "max_prompt_tokens", "step_instruction", "elements")


def sop_parser() -> argparse.ArgumentParser:
    p = cli.make_parser(__doc__)
    # data
    p.add_argument("--data", nargs="*", default=[], type=input_file, help="episode files (UI-S1 JSONL or AndroidControl native JSON); "
                   "may be empty with --online")
    p.add_argument("--limit", type=int, default=None, help="first N episodes of each file (default: all)")
    p.add_argument("--per-task-limit", type=int, default=None,
                   help="first N episodes of each task (episode.meta['task'], else each file) (default: all)")
    p.add_argument("--swipe-convention", choices=gui.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared per episode, or known for the shipped "
                   "files; a file with swipes and neither is an error)")
    p.add_argument("--match-rules", choices=gui.MATCH_RULES, default="strict",
                   help="strict (ours; the reward's rules) or release (the UI-S1 release's SOP scoring as it ran, "
                   "for comparison with the paper; README 'Reward rules and trivial-policy floors')")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--image-root", default=None, type=cli.arg_type(cli.input_dir), help="folder holding the screenshots (default: paths as recorded)")
    g.add_argument("--blank-screens", type=size_arg, default=None,
                   help="WxH: blank images stand in for missing screenshots "
                   "(dry runs; AndroidControl phones are 1080x2400)")
    # prompt
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer directory (default: the model folder's, else the shipped Qwen2.5-VL tokenizer)")
    p.add_argument("--num-images", type=int, default=2, help="screenshots kept as images (the last K steps; release 2)")
    p.add_argument("--min-pixels", type=int, default=gui.MIN_PIXELS, help="smart_resize min pixels (release 4*28*28)")
    p.add_argument("--max-pixels", type=int, default=gui.MAX_PIXELS,
                   help="smart_resize max pixels (release 12800*28*28)")
    p.add_argument("--max-prompt-tokens", type=int, default=32768,
                   help="prompt budget: oldest turns are summarised beyond it (0: no budget); a model policy "
                   "also caps it at the model's context minus --max-new-tokens")
    p.add_argument("--step-instruction", action=argparse.BooleanOptionalAction, default=False,
                   help="add the step instruction (AndroidControl-Low style)")
    p.add_argument("--elements", action=argparse.BooleanOptionalAction, default=True,
                   help="add the recorded element list, where there is one (training always adds it)")
    # policy
    p.add_argument("--policy", choices=["expert", "model"], default="expert",
                   help="who acts: expert = replay the expert actions; model = greedy responses of --model")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (random, seeded by --seed), a Hugging Face folder, a checkpoint folder, or a folder "
                   "with a `latest` pointer (e.g. out/sft/ckpt); the prompt options not given (--num-images, "
                   "--min/max-pixels, --max-prompt-tokens, --step-instruction, --elements) come from its args.json")
    p.add_argument("--max-new-tokens", type=int, default=512,
                   help="response length limit, as training's (docs/method.md §7); a response that hits it is cut and usually a "
                   "wrong step: result.json counts them (responses_at_cap)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per generate call (SOP: live episodes)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the model runs")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny model's init")
    # protocols
    p.add_argument("--protocol", nargs="+", choices=["sop", "static"], default=["sop"],
                   help="offline protocols on --data: sop (own history) and/or static (expert history)")
    p.add_argument("--online", action="store_true", help="also evaluate online in live MiniWob++ (chromium)")
    p.add_argument("--online-tasks", nargs="+", default=None,
                   help="MiniWob++ tasks (default: the tasks of --data, else every task with an expert)")
    p.add_argument("--online-seeds", type=int, default=5, help="held-out episodes per task (test seeds 100000+)")
    p.add_argument("--online-seed-base", type=int, default=None, help="first online seed (default: the test base)")
    p.add_argument("--online-max-steps", type=int, default=12, help="step limit of an online episode")
    # output
    p.add_argument("--out", default=None, help="output folder (result.json, episodes.jsonl, report.html, ...); "
                   "a path ending in .jsonl writes only the per-episode SOP lines there")
    p.add_argument("--report", default=None, help="HTML report path (default: OUT/report.html when --out is a folder)")
    p.add_argument("--report-episodes", type=int, default=8, help="episodes shown per protocol in the report")
    p.add_argument("--log-level", default="WARNING", help="logging level (budget warnings are WARNING)")
    return p


def score_parser() -> argparse.ArgumentParser:
    p = cli.make_parser("Score recorded responses with the rule reward (docs/method.md §4). Input lines: "
                          "{episode_id, step (0-based), response}, coordinates in pixels of the resized screenshot.\n\n"
                          "    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \\\n"
                          "        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400",
                          prog="eval_sop.py score")
    p.add_argument("--data", nargs="+", required=True, type=input_file, help="episode files the responses refer to")
    p.add_argument("--responses", required=True, type=input_file, help="JSONL of responses; an optional field finish_reason ('length' "
                   "= cut at the token cap) or truncated (bool) is counted into responses_at_cap")
    p.add_argument("--subset", action="store_true",
                   help="allow responses that cover only some steps (default: every step of --data must be scored)")
    p.add_argument("--match-rules", choices=gui.MATCH_RULES, default="strict", help="strict (ours) or release")
    p.add_argument("--swipe-convention", choices=gui.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared, or known for shipped files)")
    p.add_argument("--out", required=True, help="JSONL of scores, one line per response")
    p.add_argument("--image-size", type=size_arg, default=None,
                   help="WxH of the original screenshots, for steps that record no size")
    p.add_argument("--image-root", default=None, help="else read the size from the screenshot files here")
    p.add_argument("--min-pixels", type=int, default=gui.MIN_PIXELS, help="smart_resize min pixels the model saw")
    p.add_argument("--max-pixels", type=int, default=gui.MAX_PIXELS, help="smart_resize max pixels the model saw")
    return p


# -----------------------------------------------------------------------------
# Policies. An item is (prompt, episode, t, orig_size); a policy maps a list of items to response texts.


def expert_policy(prompt: gui.Prompt, episode: gui.Episode, t: int, orig_size: tuple[int, int]) -> str:
    """The expert action, in pixels of the screenshot the prompt shows."""
    return gui.expert_response(episode.steps[t], orig_size, prompt.resized_size)


def expert_batch(items: list) -> list[str]:
    return [expert_policy(*item) for item in items]  # the global name: tests replace expert_policy


expert_batch.needs_pixels = False  # it reads the prompt's resized size only: screenshots are never decoded


class ModelPolicy:
    """Greedy responses of a model through the batched sampler, in chunks of batch_size prompts.
    Counts what it generated: responses, truncated ones (no stop token within max_new_tokens),
    response tokens and generation time."""

    needs_pixels = True

    def __init__(self, sampler, batch_size: int):
        self.sampler, self.batch_size = sampler, batch_size
        self.n_responses = self.n_truncated = self.n_tokens = 0
        self.seconds = 0.0

    def __call__(self, items: list) -> list[str]:
        from rollout import sampling_mode

        texts = []
        for i in range(0, len(items), self.batch_size):
            t0 = time.time()
            with sampling_mode(self.sampler.model):  # eval + no_grad
                outs = self.sampler.generate([item[0] for item in items[i:i + self.batch_size]], n=1, greedy=True)
            self.seconds += time.time() - t0
            for o in outs:
                texts.append(o[0].text)
                self.n_responses += 1
                self.n_truncated += o[0].finish_reason != "stop"
                self.n_tokens += len(o[0].ids)
        return texts


def resolve_model(name: str) -> str:
    """'tiny', a folder with config.json, or a folder whose `latest` pointer names a checkpoint."""
    from utils import latest_checkpoint

    if name == "tiny" or os.path.isfile(os.path.join(name, "config.json")):
        return name
    ckpt = latest_checkpoint(name) if os.path.isdir(name) else None
    if ckpt is None:
        raise FileNotFoundError(f"--model {name}: not 'tiny', no config.json there and no `latest` checkpoint pointer")
    return str(ckpt)


def load_sampler(args, tokenizer):
    """The model of --model on --device (bf16 on CUDA, fp32 on CPU) inside a rollout.Sampler."""
    import torch

    from rollout import Sampler
    from utils import load_model

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = load_model(args.model, dtype=dtype, device=device, seed=args.seed)
    model.eval()
    return Sampler(model, tokenizer, max_new_tokens=args.max_new_tokens)


# -----------------------------------------------------------------------------
# Metrics


def sop_metrics(progress: list[tuple[int, int]]) -> dict:
    """progress: (correct steps before the first error, episode length) per episode -> PG, TSR."""
    if not progress:
        return {"pg": 0.0, "tsr": 0.0, "episodes": 0, "steps": 0}
    return {"pg": sum(c / n for c, n in progress) / len(progress),
            "tsr": sum(c == n for c, n in progress) / len(progress),
            "episodes": len(progress), "steps": sum(n for _, n in progress)}


def static_metrics(steps: list[dict]) -> dict:
    """steps: {type_match, match, expert_type} per evaluated step -> type accuracy, grounding accuracy
    (None when no click/long_press step had its type matched), step success rate."""
    grounded = [s for s in steps if s["expert_type"] in GROUNDING_TYPES and s["type_match"]]
    n = len(steps)
    return {"type_acc": sum(s["type_match"] for s in steps) / n if n else 0.0,
            "grounding_acc": sum(s["match"] for s in grounded) / len(grounded) if grounded else None,
            "step_sr": sum(s["match"] for s in steps) / n if n else 0.0,
            "steps": n, "grounding_steps": len(grounded)}


def task_of(ep: gui.Episode) -> str:
    """The group an episode is reported under: its MiniWob task, else its data file."""
    return str(ep.meta.get("task") or ep.source)


# -----------------------------------------------------------------------------
# Report: screenshots with the points and boxes drawn, as static HTML


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


def step_view(t: int, image, orig, step: gui.Step | None, text: str, pred: dict | None, ok: bool,
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
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(utils.dumps(v) if not isinstance(v, float) else f'{v:.4f}')}</td></tr>"
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


# -----------------------------------------------------------------------------
# Protocols


@dataclass
class _Live:
    """One episode under SOP."""
    idx: int
    ep: gui.Episode
    t: int = 0
    shots: list = field(default_factory=list)
    history: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    responses: list = field(default_factory=list)
    views: list | None = None  # report views when this episode is shown
    done: bool = False


def run_sop(episodes: list[gui.Episode], policy, make_prompt, args, show: set[int]) -> tuple[list[dict], list[dict]]:
    """SOP over `episodes` with a pool of --batch-size live episodes, one policy call per round.
    Returns (one record per episode, in order; report episodes)."""
    todo, live, records, shown = list(range(len(episodes)))[::-1], [], [None] * len(episodes), {}
    pixels = getattr(policy, "needs_pixels", True)
    bar = tqdm(total=len(episodes), desc=f"SOP {args.policy}", unit="ep", file=sys.stderr)
    while todo or live:
        while todo and len(live) < args.batch_size:
            i = todo.pop()
            live.append(_Live(i, episodes[i], views=[] if i in show else None))
        items, images = [], []
        for s in live:
            step = s.ep.steps[s.t]
            orig = gui.original_size(step, image_root=args.image_root, blank_screens=args.blank_screens)
            image = None  # decoded only for a policy that looks at it, or for the report
            if pixels or s.views is not None:
                image = gui.load_screenshot(step, image_root=args.image_root, blank_screens=args.blank_screens)
            s.shots.append(image if pixels else orig)
            if len(s.shots) > args.num_images:  # build_prompt reads only the last num_images; free the rest
                s.shots[-args.num_images - 1] = None
            items.append((make_prompt(s.ep, s.t, s.shots, s.history, pixels=pixels), s.ep, s.t, orig))
            images.append(image)
        for s, (prompt, ep, t, orig), image, text in zip(live, items, images, policy(items)):
            step = ep.steps[t]
            score = gui.score_response(text, step, resized_size=prompt.resized_size, orig_size=orig,
                                       rules=args.match_rules)
            s.rewards.append(score.reward)
            s.responses.append(text)
            if s.views is not None:
                s.views.append(step_view(t, image, orig, step, text, score.action, score.match, score.reward))
            if score.match:
                s.history.append(text)
                s.t += 1
            if not score.match or s.t == len(ep.steps):  # SOP: the episode ends at its first wrong step
                s.done = True
                n_correct = s.t
                records[s.idx] = {"source": ep.source, "task": task_of(ep), "episode_id": ep.episode_id,
                                  "steps": len(ep.steps), "correct": n_correct, "success": n_correct == len(ep.steps),
                                  "rewards": s.rewards, "malformed": sum(gui.parse_response(r).action is None
                                                                         for r in s.responses),
                                  "responses": s.responses}
                if s.views is not None:
                    shown[s.idx] = {"title": f"{ep.episode_id} ({task_of(ep)})", "goal": ep.goal,
                                    "success": n_correct == len(ep.steps),
                                    "outcome": sop_outcome(n_correct, len(ep.steps), score.action is None),
                                    "steps": s.views, "first_wrong": None if n_correct == len(ep.steps) else n_correct}
                bar.update(1)
        live = [s for s in live if not s.done]
    bar.close()
    return records, [shown[i] for i in sorted(shown)]


def run_static(episodes: list[gui.Episode], policy, make_prompt, args, show: set[int]) -> tuple[list[dict], list[dict]]:
    """Every step of every episode with the expert's earlier actions as history, --batch-size
    prompts per policy call. Returns (one record per step, report episodes)."""
    records, pending, meta, views = [], [], [], defaultdict(list)  # pending items, their (episode, screenshot)

    def flush():
        for (prompt, ep, t, orig), (idx, image), text in zip(pending, meta, policy(pending)):
            step = ep.steps[t]
            score = gui.score_response(text, step, resized_size=prompt.resized_size, orig_size=orig,
                                       rules=args.match_rules)
            records.append({"episode": idx, "episode_id": ep.episode_id, "task": task_of(ep), "t": t,
                            "expert_type": step.action["action"], "type_match": score.type_match, "match": score.match,
                            "reward": score.reward, "malformed": score.action is None, "response": text})
            if idx in show:
                views[idx].append(step_view(t, image, orig, step, text, score.action, score.match, score.reward))
        pending.clear()
        meta.clear()

    pixels = getattr(policy, "needs_pixels", True)
    for idx, ep in enumerate(tqdm(episodes, desc=f"static {args.policy}", unit="ep", file=sys.stderr)):
        origs = [gui.original_size(s, image_root=args.image_root, blank_screens=args.blank_screens) for s in ep.steps]
        images = [gui.load_screenshot(s, image_root=args.image_root, blank_screens=args.blank_screens)
                  for s in ep.steps] if pixels or idx in show else [None] * len(ep.steps)
        shots = images if pixels else origs
        # expert history: each earlier action as a response in pixels of ITS resized screenshot
        history = [gui.expert_response(s, o, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
                   for s, o in zip(ep.steps, origs)]
        for t in range(len(ep.steps)):
            pending.append((make_prompt(ep, t, shots[:t + 1], history[:t], pixels=pixels), ep, t, origs[t]))
            meta.append((idx, images[t]))
            if len(pending) >= args.batch_size:
                flush()
    flush()
    shown = []
    for idx in sorted(views):
        ep, steps = episodes[idx], sorted(views[idx], key=lambda v: v["t"])
        wrong = [v["t"] for v in steps if not v["ok"]]
        shown.append({"title": f"{ep.episode_id} ({task_of(ep)})", "goal": ep.goal, "success": not wrong,
                      "outcome": f"all {len(steps)} steps right" if not wrong else
                      f"{len(steps) - len(wrong)}/{len(steps)} steps right, first wrong action at step {wrong[0]}",
                      "steps": steps, "first_wrong": wrong[0] if wrong else None})
    return records, shown


class OnlineModelPolicy:
    """A miniwob_env policy: obs -> prompt with its own earlier responses -> one greedy response ->
    action in pixels of obs['screenshot']. Malformed output returns None (the env's no-op that costs
    a step). Keeps report views of the (task, seed) episodes in `show`."""

    def __init__(self, policy, make_prompt_online, show: set):
        self.policy, self.make_prompt, self.show = policy, make_prompt_online, show
        self.views: dict = {}
        self.goals: dict = {}
        self.n_malformed = 0

    def __call__(self, obs: dict, t: int):
        key = (obs["task"], obs["seed"])
        if t == 0:  # a new episode (or a retry after a browser fault)
            self.shots, self.history = [], []
            if key in self.show:
                self.views[key], self.goals[key] = [], obs["goal"]
        image = obs["screenshot"]
        self.shots.append(image)
        prompt = self.make_prompt(obs, self.shots, self.history)
        text = self.policy([(prompt, None, t, image.size)])[0]
        self.history.append(text)
        action = gui.parse_response(text).action
        self.n_malformed += action is None
        if action is not None:  # model pixels (resized screenshot) -> pixels of the screenshot we were given
            action = gui.scale_action(action, prompt.resized_size, image.size)
        if key in self.views:
            # no expert online: the action is drawn, "right" or "wrong" is the episode's outcome
            self.views[key].append(step_view(t, image, image.size, None, text, action, action is not None, None))
        return action


def run_online(policy, make_prompt_online, tasks: list[str], seeds: list[int], args) -> tuple[dict, list[dict]]:
    """Live MiniWob++ episodes. policy None -> miniwob_env's scripted expert. The result of
    evaluate_online gains `malformed` (responses that parsed to no action)."""
    import miniwob_env

    k = max(args.report_episodes, 0)
    keys = [(task, seed) for task in tasks for seed in seeds]
    wrapped = None
    if policy is not None:
        wrapped = OnlineModelPolicy(policy, make_prompt_online, {keys[i] for i in shown_indices(len(keys), k)})
    res = miniwob_env.evaluate_online(wrapped or miniwob_env.expert_policy, tasks, seeds,
                                      max_steps=args.online_max_steps)
    shown = []
    if wrapped is not None:
        by_key = {(e["task"], e["seed"]): e for e in res["episodes"]}
        for key in keys:
            if key in wrapped.views:
                e = by_key[key]
                outcome, end = online_outcome(e)
                for v in wrapped.views[key]:  # no expert online: a frame's colour follows the episode's outcome
                    if v["pred"] == "(no valid action)":
                        v["verdict"], v["cls"] = "no valid action (a no-op)", "wrong"
                    elif v["t"] == end:
                        v["verdict"], v["cls"] = ("terminate before the task was done" if e.get("terminated")
                                                  else "wrong action: the page ended the episode"), "wrong"
                    elif e["success"]:
                        v["verdict"], v["cls"] = "action", ""
                    else:
                        v["verdict"], v["cls"] = "action (the episode failed)", "neutral"
                shown.append({"title": f"{key[0]} seed {key[1]}", "goal": wrapped.goals[key],
                              "success": e["success"], "outcome": outcome,
                              "steps": wrapped.views[key], "first_wrong": end})
    res["malformed"] = wrapped.n_malformed if wrapped is not None else 0
    return res, shown


def sop_outcome(n_correct: int, n_steps: int, malformed: bool) -> str:
    """The report's label of an SOP episode: what happened, and at which (0-based) step."""
    if n_correct == n_steps:
        return f"success: all {n_steps} steps right"
    what = "no valid action" if malformed else "wrong action"
    return f"{what} at step {n_correct}: {n_correct}/{n_steps} steps right before it"


def online_outcome(e: dict) -> tuple[str, int | None]:
    """The report's label of an online episode (a miniwob_env.run_episode record) and the 0-based
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


# -----------------------------------------------------------------------------
# Trivial-policy floors: what a policy that never looks at the screen scores under the rules


def baselines_parser() -> argparse.ArgumentParser:
    p = cli.make_parser("Match rates of trivial policies per action type (the floor to put next to every score). "
                          "Last stdout line: JSON.\n\n"
                          "    python eval_sop.py baselines --data data/android_control/android_control_test_uis1.jsonl",
                          prog="eval_sop.py baselines")
    p.add_argument("--data", nargs="+", required=True, type=input_file, help="episode files")
    p.add_argument("--match-rules", choices=gui.MATCH_RULES, default="strict", help="strict (ours) or release")
    p.add_argument("--swipe-convention", choices=gui.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared, or known for shipped files)")
    p.add_argument("--image-root", default=None, help="screenshots folder (sizes are read from file headers)")
    p.add_argument("--image-size", type=size_arg, default=gui.ANDROID_CONTROL_SIZE,
                   help="WxH for steps with neither a recorded size nor a file (default 1080x2400, AndroidControl)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random-click policy")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p


def trivial_policies(steps: list[tuple[gui.Step, tuple[int, int]]], seed: int = 0) -> dict:
    """Trivial policies as {name: (action types it answers, fn(step, size) -> action in original
    pixels)}. Each answers with the step's own action type (an oracle for the type, so its rate
    isolates the arguments): clicks at the centre, uniformly at random, at the most frequent expert
    point (0.04 grid, read off the data); the constant texts "", "a", "e", "the", and each text
    type's most frequent token and text; each swipe direction; each system button. "most frequent
    type" answers every step with the data's most frequent action type and trivial arguments."""
    import random

    rng = random.Random(seed)
    kinds = Counter(s.action["action"] for s, _ in steps)
    pts = Counter((round(s.action["coordinate"][0] / w / 0.04), round(s.action["coordinate"][1] / h / 0.04))
                  for s, (w, h) in steps if s.action["action"] in GROUNDING_TYPES)
    mode = pts.most_common(1)[0][0] if pts else (12, 12)
    pol = {
        "click centre": (GROUNDING_TYPES, lambda s, z: {"action": s.action["action"], "coordinate": [z[0] / 2, z[1] / 2]}),
        "click uniform random": (GROUNDING_TYPES, lambda s, z: {"action": s.action["action"],
                                                                 "coordinate": [rng.uniform(0, z[0]), rng.uniform(0, z[1])]}),
        "click most frequent point": (GROUNDING_TYPES, lambda s, z: {"action": s.action["action"], "coordinate":
                                                                      [mode[0] * 0.04 * z[0], mode[1] * 0.04 * z[1]]}),
    }
    texts = {}
    for kind in gui.TEXT_ACTIONS:
        vals = [s.action["text"] for s, _ in steps if s.action["action"] == kind]
        if vals:
            tok = Counter(t for v in vals for t in set(gui.text_tokens(v))).most_common(1)
            full = Counter(gui.normalize_text(v) for v in vals).most_common(1)
            texts[kind] = [c for c in (tok[0][0] if tok else None, full[0][0]) if c]
    for c in ("", "a", "e", "the"):
        pol[f"text {c!r}"] = (gui.TEXT_ACTIONS, lambda s, z, c=c: {"action": s.action["action"], "text": c})
    for kind, cands in texts.items():
        for label, c in zip(("most frequent token", "most frequent text"), cands):
            pol[f"{kind} {label} {c!r}"] = ((kind,), lambda s, z, c=c: {"action": kind, "text": c})
    for d, (a, b) in {"up": ((0.5, 0.75), (0.5, 0.25)), "down": ((0.5, 0.25), (0.5, 0.75)),
                      "left": ((0.75, 0.5), (0.25, 0.5)), "right": ((0.25, 0.5), (0.75, 0.5))}.items():
        pol[f"swipe {d}"] = (("swipe",), lambda s, z, a=a, b=b: {"action": "swipe", "coordinate": [a[0] * z[0], a[1] * z[1]],
                                                                   "coordinate2": [b[0] * z[0], b[1] * z[1]]})
    pol["type alone (wait, terminate)"] = (("wait", "terminate"), lambda s, z: {"action": s.action["action"]})
    for btn in gui.SYSTEM_BUTTONS:
        pol[f"button {btn}"] = (("system_button",), lambda s, z, btn=btn: {"action": "system_button", "button": btn})
    top = kinds.most_common(1)[0][0] if kinds else "click"
    trivial_args = {"click": {"coordinate": None}, "long_press": {"coordinate": None}, "type": {"text": "the"},
                    "answer": {"text": "the"}, "key": {"text": "the"}, "open": {"text": "the"},
                    "system_button": {"button": "Back"}, "swipe": {"coordinate": None, "coordinate2": None}}

    def most_frequent(s, z):
        a = {"action": top, **trivial_args.get(top, {})}
        if "coordinate" in a:
            a["coordinate"] = [z[0] / 2, z[1] * (0.75 if top == "swipe" else 0.5)]
        if "coordinate2" in a:
            a["coordinate2"] = [z[0] / 2, z[1] * 0.25]
        return a
    pol[f"most frequent type ({top})"] = (gui.ACTION_TYPES, most_frequent)
    return pol


def run_baselines(episodes: list[gui.Episode], sizes: dict, rules: str = "strict", seed: int = 0) -> dict:
    """Match rates of trivial_policies on `episodes` (sizes: id(step) -> original (W, H)).
    Returns {"counts": steps per type, "rates": {policy: {type: rate}}, "floor": {...}} where floor
    is the best trivial policy per action type ("floor_by_type", with its name), the step success
    rate and SOP PG/TSR of the policy that uses that best one for every step of its type (a floor
    tuned on the data itself: an upper bound on what ignoring the screen can get), and the type
    accuracy of always answering the most frequent type."""
    steps = [(s, sizes[id(s)]) for ep in episodes for s in ep.steps]
    counts = Counter(s.action["action"] for s, _ in steps)
    pol = trivial_policies(steps, seed)
    hits = {name: Counter() for name in pol}
    per_step = {}  # (policy, id(step)) -> match, only for the types a policy answers
    for name, (types, fn) in pol.items():
        for s, z in steps:
            if s.action["action"] in types:
                ok = gui.action_match(fn(s, z), s.action, s.candidate_bbox, z, rules=rules)[0]
                hits[name][s.action["action"]] += ok
                per_step[name, id(s)] = ok
    rates = {name: {k: hits[name][k] / counts[k] for k in counts if k in types}
             for name, (types, _) in pol.items()}
    best = {}
    for k in counts:
        cands = [(r[k], name) for name, r in rates.items() if k in r and not name.startswith("most frequent type")]
        best[k] = max(cands) if cands else (0.0, None)
    best_ok = {id(s): per_step.get((best[s.action["action"]][1], id(s)), False) for s, _ in steps}
    progress = []
    for ep in episodes:
        c = 0
        while c < len(ep.steps) and best_ok[id(ep.steps[c])]:
            c += 1
        progress.append((c, len(ep.steps)))
    sop = sop_metrics(progress)
    top = next(name for name in pol if name.startswith("most frequent type"))
    floor = {"floor_by_type": {k: {"rate": v[0], "policy": v[1]} for k, v in best.items()},
             "step_sr": sum(best_ok.values()) / max(len(steps), 1), "sop_pg": sop["pg"], "sop_tsr": sop["tsr"],
             "type_acc": counts.most_common(1)[0][1] / len(steps) if steps else 0.0,
             "most_frequent_type_step_sr": sum(hits[top].values()) / max(len(steps), 1)}
    return {"rules": rules, "steps": len(steps), "episodes": len(episodes), "counts": dict(counts),
            "rates": rates, "floor": floor}


def format_baselines(res: dict) -> str:
    """The rates of run_baselines as a plain-text table (percent), one row per policy."""
    kinds = list(res["counts"])
    head = f"{'policy':<44}" + "".join(f"{k:>14}" for k in kinds)
    lines = [f"trivial-policy match rates (%), rules={res['rules']}, {res['steps']} steps", head,
             f"{'(steps)':<44}" + "".join(f"{res['counts'][k]:>14}" for k in kinds)]
    for name, r in res["rates"].items():
        lines.append(f"{name[:44]:<44}" + "".join(f"{100 * r[k]:>14.1f}" if k in r else f"{'':>14}" for k in kinds))
    f = res["floor"]
    lines.append(f"floor (best trivial per type): step SR {100 * f['step_sr']:.1f}%, SOP PG {100 * f['sop_pg']:.1f}%, "
                 f"TSR {100 * f['sop_tsr']:.1f}%; most frequent type: type acc {100 * f['type_acc']:.1f}%")
    return "\n".join(lines)


def step_sizes(episodes: list[gui.Episode], image_root=None, blank_screens=None) -> dict:
    """id(step) -> original (W, H) by gui.original_size (headers only)."""
    return {id(s): gui.original_size(s, image_root=image_root, blank_screens=blank_screens)
            for ep in episodes for s in ep.steps}


def baselines_main(argv: list[str]) -> dict:
    args = baselines_parser().parse_args(argv)
    episodes = [ep for path in args.data for ep in gui.load_episodes(path, swipe_convention=args.swipe_convention)]
    res = run_baselines(episodes, step_sizes(episodes, args.image_root, args.image_size), args.match_rules, args.seed)
    res["data"] = list(args.data)
    print(format_baselines(res))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(utils.dumps(res, indent=1))
    return res


# -----------------------------------------------------------------------------
# score subcommand


def score_main(argv: list[str]) -> dict:
    """Score recorded responses. Every response must name a step of --data; unless --subset, every
    step of --data must have at least one response (several per step are allowed). Raises
    gui.DataError (a ValueError) naming the responses file, line and field, or the unscored steps."""
    args = score_parser().parse_args(argv)
    index: dict[str, tuple[gui.Episode, str]] = {}
    for path in args.data:
        for ep in gui.load_episodes(path, swipe_convention=args.swipe_convention):
            if ep.episode_id in index:
                raise gui.DataError(f"episode id {ep.episode_id!r} is in both {index[ep.episode_id][1]} and {path}; "
                                 "score one file at a time")
            index[ep.episode_id] = (ep, path)
    n = reward = match = type_match = at_cap = 0
    per_step = Counter()
    rows = []
    with open(args.responses, encoding="utf-8") as fin:
        for lineno, line in enumerate(fin, start=1):
            if not line.strip():
                continue
            where = f"{args.responses}: line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise gui.DataError(f"{where}: invalid JSON: {e.msg}") from None
            if not isinstance(rec, dict) or not {"episode_id", "step", "response"} <= rec.keys():
                raise gui.DataError(f"{where}: expected an object with episode_id, step, response")
            ep_id, t = str(rec["episode_id"]), rec["step"]
            if ep_id not in index:
                raise gui.DataError(f"{where}: field 'episode_id': unknown episode {ep_id!r} (not in {', '.join(args.data)})")
            ep = index[ep_id][0]
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < len(ep.steps):
                raise gui.DataError(f"{where}: field 'step': episode {ep_id} has steps 0..{len(ep.steps) - 1}, got {t!r}")
            if not isinstance(rec["response"], str):
                raise gui.DataError(f"{where}: field 'response': expected a string, got {type(rec['response']).__name__}")
            step = ep.steps[t]
            try:
                orig = gui.original_size(step, image_root=args.image_root, blank_screens=args.image_size)
            except FileNotFoundError:
                raise gui.DataError(f"{where}: episode {ep_id} step {t} records no screenshot size; pass --image-size WxH "
                                 "or --image-root DIR") from None
            resized = gui.resized_size(orig, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
            s = gui.score_response(rec["response"], step, resized_size=resized, orig_size=orig, rules=args.match_rules)
            rows.append({"episode_id": rec["episode_id"], "step": t, "reward": s.reward, "match": s.match,
                         "type_match": s.type_match, "format_ok": s.format_ok, "action": s.action})
            n += 1
            reward += s.reward
            match += s.match
            type_match += s.type_match
            at_cap += rec.get("finish_reason") == "length" or rec.get("truncated") is True
            per_step[ep_id, t] += 1
    if n == 0:
        raise gui.DataError(f"{args.responses}: no responses to score")
    total = sum(len(ep.steps) for ep, _ in index.values())
    missing = [(i, t) for i, (ep, _) in index.items() for t in range(len(ep.steps)) if (i, t) not in per_step]
    if missing and not args.subset:
        shown = ", ".join(f"{i}:{t}" for i, t in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise gui.DataError(f"{args.responses}: {len(missing)} of {total} steps of {', '.join(args.data)} have no response "
                         f"(episode:step {shown}); pass --subset to score only the steps given")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fout:
        fout.writelines(utils.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    # the floor on the same steps, for the figure above
    eps = [ep for ep, _ in index.values()]
    base = run_baselines(eps, step_sizes(eps, args.image_root, args.image_size), args.match_rules)
    return {"responses": n, "reward_mean": reward / n, "match_rate": match / n, "type_match_rate": type_match / n,
            "match_rules": args.match_rules, "steps_total": total, "steps_scored": len(per_step),
            "steps_unscored": len(missing), "responses_per_step_mean": n / len(per_step),
            "responses_per_step_max": max(per_step.values()), "responses_at_cap": at_cap,
            "floor_step_sr": base["floor"]["step_sr"], "floor_type_acc": base["floor"]["type_acc"], "out": args.out}


# -----------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("score", "baselines"):
        summary = (score_main if argv[0] == "score" else baselines_main)(argv[1:])
        print(utils.dumps(summary))
        return summary

    parser = sop_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.policy == "expert" and "model" in cli.explicit_flags(parser, argv):
        raise cli.UsageError(f"--model {args.model} is given but --policy is expert (the default): add --policy model")
    cli.check_pixels(args)
    if not args.data and not args.online:
        raise cli.UsageError("nothing to evaluate: give --data and/or --online")
    t0 = time.time()
    out_dir = args.out if args.out and not args.out.endswith(".jsonl") else None
    report_path = args.report or (os.path.join(out_dir, "report.html") if out_dir else None)

    # --- setup: tokenizer, image processor and, for --policy model, the model inside a sampler
    from utils import load_processor
    if args.policy == "model":
        args.model = resolve_model(args.model)
        cli.adopt_checkpoint_args(args, parser, argv, args.model, PROMPT_ARGS)  # the prompt it was trained on
    tok_dir = args.tokenizer or (args.model if args.policy == "model" and args.model != "tiny" else None)
    tokenizer, image_processor = load_processor(tok_dir, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    budget = args.max_prompt_tokens or None
    model_policy = None
    if args.policy == "model":
        sampler = load_sampler(args, tokenizer)
        model_policy = ModelPolicy(sampler, args.batch_size)
        # docs/method.md §10: a long history must be summarised, never overflow the context
        cfg = getattr(sampler.model, "config", None)
        ctx = getattr(cfg.get_text_config(), "max_position_embeddings", None) if cfg is not None else None
        if ctx:
            budget = min(budget or ctx, ctx - args.max_new_tokens)
    policy = model_policy or expert_batch
    stats = {"max_tokens": 0, "budgeted": 0, "over": 0}

    def build(goal, shots, history, step_instruction, elements, pixels=True):
        prompt = gui.build_prompt(
            tokenizer, image_processor, goal=goal, screenshots=shots, history=history,
            step_instruction=step_instruction if args.step_instruction else None,
            elements=elements if args.elements else None, num_images=args.num_images,
            min_pixels=args.min_pixels, max_pixels=args.max_pixels, max_prompt_tokens=budget, pixels=pixels)
        stats["max_tokens"] = max(stats["max_tokens"], len(prompt.input_ids))
        stats["budgeted"] += prompt.n_dropped_turns > 0
        stats["over"] += budget is not None and len(prompt.input_ids) > budget  # the current turn alone is too long
        return prompt

    def make_prompt(ep, t, shots, history, pixels=True):
        return build(ep.goal, shots, history, ep.steps[t].step_instruction, ep.steps[t].elements, pixels)

    def make_prompt_online(obs, shots, history):
        return build(obs["goal"], shots, history, None, obs["elements"])

    # --- data
    episodes = []
    for path in args.data:
        episodes += gui.load_episodes(path, limit=args.limit, swipe_convention=args.swipe_convention)
    if args.per_task_limit is not None:
        seen = defaultdict(int)
        keep = []
        for ep in episodes:
            seen[task_of(ep)] += 1
            if seen[task_of(ep)] <= args.per_task_limit:
                keep.append(ep)
        episodes = keep
    show = shown_indices(len(episodes), max(args.report_episodes, 0))

    # --- protocols
    summary = {"policy": args.policy, "model": args.model if args.policy == "model" else None,
               "match_rules": args.match_rules,
               "protocols": (list(args.protocol) if episodes else []) + (["online"] if args.online else []),
               "episodes": len(episodes), "steps": sum(len(e.steps) for e in episodes)}
    per_task: dict = defaultdict(dict)
    sections, malformed = [], 0
    floor = None
    if episodes:  # the trivial-policy floor of these episodes, printed beside every figure
        floor = run_baselines(episodes, step_sizes(episodes, args.image_root, args.blank_screens),
                              args.match_rules)["floor"]
        summary.update({"floor_sop_pg": floor["sop_pg"], "floor_sop_tsr": floor["sop_tsr"],
                        "floor_step_sr": floor["step_sr"], "floor_type_acc": floor["type_acc"]})
    sop_records = static_records = online_res = None
    if episodes and "sop" in args.protocol:
        sop_records, shown = run_sop(episodes, policy, make_prompt, args, show)
        m = sop_metrics([(r["correct"], r["steps"]) for r in sop_records])
        steps_run = sum(len(r["rewards"]) for r in sop_records)
        malformed += sum(r["malformed"] for r in sop_records)
        summary.update(m)  # pg, tsr, episodes, steps (pg/tsr also as sop_pg/sop_tsr)
        summary.update({"sop_pg": m["pg"], "sop_tsr": m["tsr"], "steps_run": steps_run,
                        "step_reward_mean": sum(sum(r["rewards"]) for r in sop_records) / max(steps_run, 1),
                        "sources": {path: sop_metrics([(r["correct"], r["steps"]) for r in sop_records
                                                       if r["source"] == path]) for path in args.data}})
        for task in dict.fromkeys(r["task"] for r in sop_records):
            tm = sop_metrics([(r["correct"], r["steps"]) for r in sop_records if r["task"] == task])
            per_task[task].update(sop_pg=tm["pg"], sop_tsr=tm["tsr"], episodes=tm["episodes"], steps=tm["steps"])
        sections.append(("SOP: own history, greedy, the episode stops at its first wrong step",
                         f"PG {m['pg']:.3f}, TSR {m['tsr']:.3f} over {m['episodes']} episodes (trivial-policy floor: "
                         f"PG {floor['sop_pg']:.3f}, TSR {floor['sop_tsr']:.3f}); "
                         f"{len(shown)} shown.", shown))
    if episodes and "static" in args.protocol:
        static_records, shown = run_static(episodes, policy, make_prompt, args, show)
        m = static_metrics(static_records)
        malformed += sum(r["malformed"] for r in static_records)
        summary.update({"static_type_acc": m["type_acc"], "static_grounding_acc": m["grounding_acc"],
                        "static_step_sr": m["step_sr"], "static_steps": m["steps"],
                        "static_grounding_steps": m["grounding_steps"],
                        "static_variant": "low" if args.step_instruction else "high"})
        for task in dict.fromkeys(r["task"] for r in static_records):
            tm = static_metrics([r for r in static_records if r["task"] == task])
            per_task[task].update(static_type_acc=tm["type_acc"], static_grounding_acc=tm["grounding_acc"],
                                  static_step_sr=tm["step_sr"], static_steps=tm["steps"])
        sections.append((f"Static ({'-Low: with step instructions' if args.step_instruction else '-High: goal only'}):"
                         " expert history, every step evaluated",
                         f"step SR {m['step_sr']:.3f}, type acc {m['type_acc']:.3f} over {m['steps']} steps (floor: step SR "
                         f"{floor['step_sr']:.3f}, type acc {floor['type_acc']:.3f}); "
                         f"{len(shown)} episodes shown.", shown))
    if args.online:
        import miniwob_env
        tasks = args.online_tasks or [t for t in dict.fromkeys(task_of(e) for e in episodes)
                                      if t in miniwob_env.EXPERTS] or sorted(miniwob_env.EXPERTS)
        base = miniwob_env.TEST_SEED_BASE if args.online_seed_base is None else args.online_seed_base
        seeds = list(range(base, base + args.online_seeds))
        online_res, shown = run_online(model_policy, make_prompt_online, tasks, seeds, args)
        o = online_res["overall"]
        malformed += online_res["malformed"]
        summary.update({"online_sr": o["success_rate"], "n_online_episodes": o["episodes"],
                        "online_failures": o["failures"], "online_mean_steps": o["mean_steps"],
                        "online_tasks": tasks, "online_seeds": seeds})
        for task, r in online_res["per_task"].items():
            per_task[task].update(online_sr=r["success_rate"], n_online_episodes=r["episodes"])
        sections.append(("Online MiniWob++: own history, live pages", f"success {o['success_rate']:.3f} over "
                         f"{o['episodes']} episodes (held-out seeds {seeds[0]}..{seeds[-1]}); {len(shown)} shown.",
                         shown))

    # --- summary: last stdout line
    summary.update({"max_prompt_tokens_seen": stats["max_tokens"], "prompts_budgeted": stats["budgeted"],
                    "prompts_over_budget": stats["over"], "prompt_budget": budget, "malformed_responses": malformed,
                    "max_new_tokens": args.max_new_tokens,
                    "responses_at_cap": model_policy.n_truncated if model_policy is not None else 0})
    if model_policy is not None:
        summary.update({"responses": model_policy.n_responses, "truncated_responses": model_policy.n_truncated,
                        "response_tokens_mean": model_policy.n_tokens / max(model_policy.n_responses, 1),
                        "generate_seconds": round(model_policy.seconds, 1)})
    summary["per_task"] = dict(per_task)
    summary["seconds"] = round(time.time() - t0, 1)
    if report_path:
        summary["report"] = report_path

    # --- outputs
    if args.out and out_dir is None and sop_records is not None:  # the per-episode JSONL alone
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(utils.dumps(r) + "\n" for r in sop_records)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        for name, rows in (("episodes.jsonl", sop_records), ("static_steps.jsonl", static_records),
                           ("online_episodes.jsonl", online_res["episodes"] if online_res else None)):
            if rows is not None:
                with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
                    f.writelines(utils.dumps(r) + "\n" for r in rows)
        with open(os.path.join(out_dir, "result.json"), "w", encoding="utf-8") as f:
            f.write(utils.dumps({**summary, "args": vars(args)}, indent=1))
    if report_path:
        title = f"eval_sop: {args.policy}" + (f" {args.model}" if args.policy == "model" else "")
        write_report(report_path, title, summary, sections)
    if out_dir or report_path:  # where the outputs are (the last line stays the JSON summary)
        print(f"results: {os.path.join(out_dir, 'result.json') if out_dir else args.out}"
              + (f"  report: {report_path} (open it in a browser)" if report_path else ""), flush=True)
    print(utils.dumps(summary))
    return summary


if __name__ == "__main__":
    cli.cli(main)

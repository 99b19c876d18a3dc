"""What a person reads of an evaluation: the HTML report of eval_sop.py, its short stdout summary, and
two or more evaluations side by side with the paired difference of each metric; and the figures that
need no model: the trivial-policy floors of a data file (`eval_sop.py baselines`) and the rule reward of
recorded responses of any model (`eval_sop.py score`).

    python report.py out/eval/sft out/eval/semionline             # out/compare.html, out/compare.json
    python report.py out/eval/sft_s0 out/eval/rl_s0 out/eval/rl2_s0 --names sft rl rl2 --out cmp/rl.html

Each folder is an eval_sop.py --out folder (result.json; the per-episode files where written). The
first is the reference: every later run's difference from it is paired on the episodes (online:
task and seed; SOP: episode; static: step) both evaluated: for 0/1 outcomes Tango's score interval
and the exact McNemar p (static steps: the interval widened to a bootstrap over episodes where that
is wider), for PG a bootstrap (evaluation/stats.py). A run stopped before its end (result.json's complete
false) is named PARTIAL; a damaged file is a one-line error naming it and its line (exit 2).

report.html (write_report): a summary card first (what was run; each metric named, explained in one
line, with its 95% Wilson interval to 3 digits, its count and its trivial-policy floor; the history gap
in words; the per-task table), then the sections (online first), each shown episode a row of
screenshots with the target boxes, the expert point and the predicted one drawn, the thought, the
action and the step that ended it; every raw field last, folded. Static HTML, images inline.
A section is (heading, note, episodes); an episode is {title, goal, success, outcome, steps,
first_wrong}, each step an evaluation.views.step_view (made while the evaluator runs).
"""
import argparse
import html
import json
import os
import sys
from collections import Counter

import cli
import utils
import dataset
import gui
import policies
import reward
from evaluation import outputs  # the run folder's readers: one-line errors on damaged files
from evaluation import protocols
from evaluation.served import clean_text
from evaluation import stats  # Wilson intervals and paired differences (numpy only)

# -----------------------------------------------------------------------------
# the metrics a person reads first: one table drives the card, the per-task table, stdout and the
# side-by-side comparison. (key in result.json / per_task, name, count key of its 95% Wilson
# interval (None: no interval), trivial-policy floor key, what it means in one line)

METRICS = [
    ("online_sr", "online success", "n_online_episodes", None,
     "share of live MiniWob++ episodes completed (raw reward >= 1): greedy, the policy's own history"),
    ("online_pass_at_k", "pass@K", "n_online_episodes", None,
     "share of online episodes where at least one of K sampled plays succeeded"),
    ("online_flippable", "flippable", "n_online_episodes", None,
     "share where greedy failed and a sampled play succeeded: what RL could turn into greedy successes"),
    ("sop_tsr", "SOP TSR", "episodes", "floor_sop_tsr",
     "task success rate: episodes with every step right, each step prompted with the policy's own earlier answers"),
    ("sop_pg", "SOP PG", None, "floor_sop_pg",
     "progress: mean share of an episode's steps right before its first wrong one (a mean of fractions: no interval)"),
    ("static_step_sr", "step SR", "static_steps", "floor_step_sr",
     "static: share of steps right (type and target) with the expert's earlier actions as history"),
    ("static_type_acc", "type accuracy", "static_steps", "floor_type_acc",
     "static: share of steps whose action type is right"),
    ("static_grounding_acc", "grounding accuracy", "static_grounding_steps", None,
     "static: of the click / long-press steps typed right, the share whose point hits the target"),
]
UNITS = {"n_online_episodes": "episodes", "episodes": "episodes", "static_steps": "steps",
         "static_grounding_steps": "steps"}


def flat_summary(summary: dict) -> dict:
    """The summary with the pooled pass@K / flippable rates of --samples (online_sampled) at the top
    level, under the per-task table's names; reads `successes` (or `k`, its name before 2026-12-05)."""
    out = dict(summary)
    pooled = (summary.get("online_sampled") or {}).get("pooled") or {}
    for key, name in (("online_pass_at_k", "pass_at_k"), ("online_flippable", "flippable")):
        if name in pooled:
            out[key] = pooled[name]["rate"]
    return out


def metric_rows(values: dict) -> list[dict]:
    """The METRICS present in `values` (a summary or one task's row of per_task): per metric
    {key, name, value, lo, hi, n, unit, floor, meaning}. lo, hi: the 95% Wilson interval (evaluation/stats.py) of
    round(value * n) successes in n (None without a count: PG, or a per-task grounding accuracy);
    a step rate's interval treats steps as independent (they are not, within an episode)."""
    k = (values.get("online_sampled") or {}).get("samples")
    rows = []
    for key, name, n_key, floor_key, meaning in METRICS:
        value = values.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        n = values.get(n_key) if n_key else None
        lo = hi = None
        if isinstance(n, int) and n > 0:
            lo, hi = stats.wilson(round(value * n), n)
        rows.append({"key": key, "name": name.replace("K", str(k)) if k and key == "online_pass_at_k" else name,
                     "value": value, "lo": lo, "hi": hi, "n": n, "unit": UNITS.get(n_key, ""),
                     "floor": values.get(floor_key) if floor_key else None, "meaning": meaning})
    return rows


def fmt_rate(value, lo=None, hi=None) -> str:
    """0.425 [0.351, 0.502]: a rate and its interval to 3 digits; '-' for None."""
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def run_line(summary: dict) -> str:
    """What was evaluated, in one line: policy, model, rules, data, protocols, time."""
    who = summary.get("policy", "?") + (f" {summary['model']}" if summary.get("model") else "")
    parts = [who, f"rules {summary.get('match_rules', '?')}"]
    if summary.get("episodes"):
        parts.append(f"{summary['episodes']} episodes, {summary.get('steps', 0)} steps")
    if summary.get("n_online_episodes"):
        tasks = len(summary.get("online_tasks") or [])
        parts.append(f"{summary['n_online_episodes']} online episode{'s' * (summary['n_online_episodes'] != 1)} "
                     f"on {tasks} task{'s' * (tasks != 1)}")
    parts.append("protocols " + (", ".join(summary.get("protocols") or []) or "none"))
    if summary.get("seconds") is not None:
        parts.append(f"{summary['seconds']} s")
    return "; ".join(parts)


def warnings(summary: dict) -> list[str]:
    """What must be read before any figure of a run: that it is partial (result.json's complete false),
    and how many requests the server failed (result.json's server_failures), each one line."""
    out = []
    if summary.get("complete") is False:
        done = summary.get("finished") or {}
        out.append(f"PARTIAL run (stopped: {summary.get('interrupted') or 'not finished'}"
                   + (f"; episodes finished: {', '.join(f'{k} {v}' for k, v in done.items() if v)}" if done else "")
                   + "): eval_sop.py --resume with the same flags continues it")
    f = summary.get("server_failures") or {}
    if f.get("failed"):
        per = ", ".join(f"{k} {p['failed']} of {p['requests']} ({p['episodes']} episodes)"
                        for k, p in f["by_protocol"].items() if p["failed"])
        out.append(f"server failed on {f['failed']} of {f['requests']} requests ({per}): those steps are scored "
                   f"wrong but are not the model's answers" + (f"; above --max-server-error-share {f['max_share']:g}: "
                                                              "exit code 3" if f["exceeded"] else ""))
    return out


def summary_text(summary: dict, paths: str = "") -> str:
    """eval_sop.py's stdout: what was run, then one line per headline metric (value, 95% interval,
    count, floor), then `paths` (where the full JSON and the report are)."""
    rows = metric_rows(flat_summary(summary))
    lines = [f"eval_sop: {run_line(summary)}", *("  " + w for w in warnings(summary))]
    if rows:
        lines.append(f"  {'metric':<20} {'value':>6}  {'95% interval':<16} {'n':>12}  floor")
    for r in rows:
        ci = f"[{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else "-"
        n = f"{r['n']} {r['unit']}" if r["n"] is not None else ""
        floor = f"{r['floor']:.3f}" if r["floor"] is not None else "-"
        lines.append(f"  {r['name']:<20} {r['value']:>6.3f}  {ci:<16} {n:>12}  {floor}")
    if not rows:
        lines.append("  (no metric: nothing was evaluated)")
    extra = [f"{summary['malformed_responses']} malformed responses" if summary.get("malformed_responses") else "",
             f"{summary['truncated_rate']:.3f} of responses cut at --max-new-tokens" if summary.get("truncated_rate") else "",
             f"per task: {len(summary['per_task'])} tasks in the report / result.json" if summary.get("per_task") else ""]
    lines += ["  " + "; ".join(x for x in extra if x)] if any(extra) else []
    return "\n".join(lines + ([paths] if paths else []))


# -----------------------------------------------------------------------------
# HTML

CSS = """body{font-family:sans-serif;margin:16px;color:#222;max-width:1400px} .ep{border:1px solid #bbb;margin:14px 0;padding:8px}
.steps{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}
.step{width:310px;border:2px solid #8c8;padding:4px;font-size:12px}
.step.wrong{border-color:#e88;background:#fff4f4} .step.first{border:4px solid #d00} .step.neutral{border-color:#bbb}
.step img{display:block} code{white-space:pre-wrap;word-break:break-all} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left} .ok{color:#080} .bad{color:#c00}
.card{border:2px solid #557;border-radius:6px;padding:8px 14px;background:#f7f8fc;margin-bottom:10px}
.card td.v{font-weight:bold;font-family:monospace;white-space:nowrap} .note{color:#555;font-size:13px}
.scroll{max-height:360px;overflow:auto;display:inline-block} nav a{margin-right:14px}"""


def _round(obj, digits: int = 3):
    """obj with every float rounded to `digits` decimals (the raw fields' display)."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v, digits) for v in obj]
    return obj


def card_html(summary: dict) -> str:
    """The summary card: what was run, one row per headline metric (name, value, 95% interval, count,
    floor, meaning), the history gap in words, and the per-task table."""
    e = html.escape
    rows = metric_rows(flat_summary(summary))
    def row(r):
        n = "" if r["n"] is None else f"{r['n']} {r['unit']}"
        floor = "-" if r["floor"] is None else f"{r['floor']:.3f}"
        return (f"<tr><th>{e(r['name'])}</th><td class='v'>{fmt_rate(r['value'], r['lo'], r['hi'])}</td><td>{n}</td>"
                f"<td>{floor}</td><td class='note'>{e(r['meaning'])}</td></tr>")

    body = "".join(row(r) for r in rows)
    out = ["<div class='card'>", *(f"<p class='bad'><b>{e(w)}</b></p>" for w in warnings(summary)),
           f"<p><b>Evaluated:</b> {e(run_line(summary))}</p>"]
    if rows:
        out.append("<table><tr><th>metric</th><th>value [95% interval]</th><th>n</th><th>floor</th><th>what it means</th>"
                   f"</tr>{body}</table><p class='note'>Intervals: Wilson 95% (evaluation/stats.py). Floor: the best "
                   "trivial policy on the same episodes (eval_sop.py baselines). A static step rate's interval treats "
                   "steps as independent.</p>")
    gap = ((summary.get("history_gap") or {}).get("pooled") or {})
    if gap.get("steps"):
        out.append(f"<p><b>History gap</b> on the {gap['steps']} steps SOP reached: step accuracy "
                   f"{gap['own_acc']:.3f} with the policy's own history vs {gap['expert_acc']:.3f} with the expert's "
                   f"(gap {gap['gap']:+.3f}; right only with its own: {gap['own_only']}, only with the expert's: "
                   f"{gap['expert_only']}).</p>")
    per_task = summary.get("per_task") or {}
    task_rows = {t: metric_rows(v) for t, v in per_task.items()}
    cols = [m for m in METRICS if any(r["key"] == m[0] for rs in task_rows.values() for r in rs)]
    if cols:
        head = "".join(f"<th>{e(m[1])}</th>" for m in cols)
        n_cols = {k: name for k, name in (("episodes", "episodes"), ("n_online_episodes", "online episodes"))
                  if any(k in v for v in per_task.values())}
        lines = []
        for t, rs in task_rows.items():
            by = {r["key"]: r for r in rs}
            cells = "".join("<td>" + (fmt_rate(by[m[0]]["value"], by[m[0]]["lo"], by[m[0]]["hi"]) if m[0] in by else "")
                            + "</td>" for m in cols)
            counts = "".join(f"<td>{per_task[t].get(k, '')}</td>" for k in n_cols)
            lines.append(f"<tr><th>{e(t)}</th>{counts}{cells}</tr>")
        n_head = "".join(f"<th>{name}</th>" for name in n_cols.values())
        out.append(f"<h2>Per task</h2><div class='scroll'><table><tr><th>task</th>{n_head}{head}</tr>"
                   f"{''.join(lines)}</table></div>")
    out.append("</div>")
    return "".join(out)


def raw_fields_html(summary: dict) -> str:
    """Every field of the summary (result.json), floats to 3 decimals, folded: the reference, not the headline."""
    e = html.escape
    rows = "".join(f"<tr><th>{e(k)}</th><td><code>{e(utils.dumps(_round(v)))}</code></td></tr>"
                   for k, v in summary.items() if k != "per_task")
    return f"<details id='fields'><summary><b>All fields</b> (result.json, floats to 3 decimals)</summary><table>{rows}</table></details>"


def write_report(path: str, title: str, summary: dict, sections: list[tuple[str, str, list[dict]]]) -> None:
    """The HTML report: the summary card (card_html), links to the sections, then each section
    (heading, note, episodes; each episode {title, goal, success, outcome, steps: [step_view],
    first_wrong}) in the order given, and last every field of the summary, folded."""
    e = html.escape
    nav = "".join(f"<a href='#sec{i}'>{e(h.split(':')[0].split(' (')[0].rstrip(','))}</a>"
                  for i, (h, _, _) in enumerate(sections))
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style></head>"
           f"<body><h1>{e(title)}</h1>{card_html(summary)}<nav>Sections: {nav}<a href='#fields'>all fields</a></nav>"
           "<p class='note'>Boxes: target candidates (green). Green cross: expert point / swipe. Circle: predicted "
           "point (blue right, red wrong). Frames: green right, red wrong, thick red the step that ended the episode; "
           "online (no expert), grey: an action of a failed episode.</p>"]
    for i, (heading, note, episodes) in enumerate(sections):
        out.append(f"<a id='sec{i}'></a><h2>{e(heading)}</h2><p>{e(note)}</p>")
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
                    out.append(f"<br>Raw output: <code>{e(s['raw'][:400].strip()) or '(empty)'}</code>")
                out.append("</div>")
            out.append("</div></div>")
    out.append(raw_fields_html(summary) + "</body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))


# -----------------------------------------------------------------------------
# two or more evaluations side by side: python report.py A B [C ...]

# the metrics with per-item outcomes in an eval folder, paired item by item between two runs:
# metric -> (file, key of an item, its value, 0/1 outcome?, the bootstrap's group of an item)
PAIRED = {
    "online_sr": ("online_episodes.jsonl", lambda r: (r["task"], int(r["seed"])), lambda r: int(bool(r["success"])), True, None),
    "sop_tsr": ("episodes.jsonl", lambda r: (r["task"], r["episode_id"]), lambda r: int(r["correct"] == r["steps"]), True, None),
    "sop_pg": ("episodes.jsonl", lambda r: (r["task"], r["episode_id"]), lambda r: r["correct"] / max(r["steps"], 1), False, None),
    # steps of one episode are not independent: the bootstrap resamples episodes, then their steps
    "static_step_sr": ("static_steps.jsonl", lambda r: (r["task"], r["episode_id"], r["t"]), lambda r: int(bool(r["match"])),
                       True, lambda key: key[:2]),
    "static_type_acc": ("static_steps.jsonl", lambda r: (r["task"], r["episode_id"], r["t"]),
                        lambda r: int(bool(r["type_match"])), True, lambda key: key[:2]),
}


# the protocol whose file each PAIRED metric reads: a file of a protocol the run did not do is another
# run's leftover (a reused --out before 2026-12-07) and is not read
PROTOCOL_OF = {"online_episodes.jsonl": "online", "episodes.jsonl": "sop", "static_steps.jsonl": "static"}


def load_eval(folder: str) -> dict:
    """An eval_sop.py --out folder: {folder, summary (result.json), items: {metric: {key: value}}}
    for the PAIRED metrics whose file is there and whose protocol the run did (summary's protocols). A
    key seen twice in a file (the same episode given twice) gets its occurrence number, so both stay.
    Raises utils.UsageError (one line: the file, the line, what is wrong) without result.json, on an
    empty or invalid one, or on a line that is cut, not JSON, or lacks a field."""
    summary = outputs.read_result(os.path.join(folder, "result.json"))
    protocols = summary.get("protocols")
    items: dict = {}
    for metric, (name, key_of, value_of, _, _) in PAIRED.items():
        file = os.path.join(folder, name)
        if not os.path.isfile(file) or (isinstance(protocols, list) and PROTOCOL_OF[name] not in protocols):
            continue
        seen: dict = {}
        for lineno, r in enumerate(outputs.read_jsonl(file), start=1):
            try:
                key, value = key_of(r), value_of(r)
            except (KeyError, TypeError, ValueError) as e:
                raise utils.UsageError(f"{file}: record {lineno}: missing or invalid field {e}") from None
            seen[key] = seen.get(key, -1) + 1
            items.setdefault(metric, {})[key + ((seen[key],) if seen[key] else ())] = value
    return {"folder": folder, "summary": summary, "items": items}


def paired_difference(first: dict, other: dict, metric: str, task: str | None = None) -> dict | None:
    """`other` minus `first` on the items both evaluated (of `task` alone when given). 0/1 outcomes: the
    exact McNemar p and Tango's score interval (evaluation/stats.py tango_interval: never zero-width, e.g.
    +-z^2/(n + z^2) with no discordant pair, where a bootstrap gives [0, 0]); static steps, which are not
    independent within an episode, get the hull of that and the bootstrap over episodes. PG's fractions:
    paired_bootstrap (interval and p). Returns {pairs, diff,
    diff_ci95, p, test, only_first, only_other (items one run has and the other lacks),
    discordant [only other right, only first right] (0/1 outcomes)}; None when no item is shared."""
    _, _, _, binary, group_of = PAIRED[metric]
    a, b = first["items"].get(metric, {}), other["items"].get(metric, {})
    if task is not None:
        a, b = ({k: v for k, v in d.items() if k[0] == task} for d in (a, b))
    keys = sorted(set(a) & set(b), key=str)
    if not keys:
        return None
    xa, xb = [a[k] for k in keys], [b[k] for k in keys]
    groups = [str(group_of(k)) for k in keys] if group_of else None
    res = {"pairs": len(keys), "only_first": len(set(a) - set(b)), "only_other": len(set(b) - set(a))}
    if binary:
        r = stats.paired_binary(xb, xa, groups)
        lo, hi = stats.tango_interval(*r["discordant"], len(keys))
        if groups is not None:  # clustered steps: the wider of the two on each side
            lo, hi = min(lo, r["diff_ci95"][0]), max(hi, r["diff_ci95"][1])
        res.update(diff=r["diff"], diff_ci95=[lo, hi], p=r["p_mcnemar"], test="exact McNemar",
                   discordant=r["discordant"], interval="Tango score" + (" + episode bootstrap" if groups else ""))
    else:
        r = stats.paired_bootstrap(xb, xa, groups)
        res.update(diff=r["diff"], diff_ci95=r["diff_ci95"], p=r["p_value"], test="bootstrap")
    return res


def compare(runs: list[dict]) -> dict:
    """The runs (load_eval) side by side: per run its metric_rows (pooled and per task), and for every
    run after the first its paired_difference from the first, pooled and per task, per PAIRED metric.
    Returns {names, metrics: {run: [rows]}, per_task: {run: {task: [rows]}}, diffs: {run: {metric:
    {pooled, per_task}}}, differ: the settings that differ between runs, partial: the runs whose
    result.json says complete false (stopped; their figures cover the episodes they finished)}."""
    names = [r["name"] for r in runs]
    first = runs[0]
    diffs = {}
    for run in runs[1:]:
        d = {}
        for metric in PAIRED:
            pooled = paired_difference(first, run, metric)
            if pooled is None:
                continue
            tasks = dict.fromkeys(k[0] for k in run["items"][metric] if k in first["items"][metric])
            d[metric] = {"pooled": pooled, "per_task": {t: paired_difference(first, run, metric, t) for t in tasks}}
        diffs[run["name"]] = d
    settings = ("match_rules", "protocols", "online_tasks", "online_seeds", "static_variant", "episodes", "steps")
    differ = [s for s in settings if len({json.dumps(r["summary"].get(s)) for r in runs}) > 1]
    partial = [r["name"] for r in runs if r["summary"].get("complete") is False]  # stopped before the end
    return {"names": names, "folders": [r["folder"] for r in runs], "partial": partial,
            "metrics": {r["name"]: metric_rows(flat_summary(r["summary"])) for r in runs},
            "per_task": {r["name"]: {t: metric_rows(v) for t, v in (r["summary"].get("per_task") or {}).items()}
                         for r in runs},
            "diffs": diffs, "differ": differ}


def fmt_diff(d: dict | None) -> str:
    """+0.062 [-0.013, +0.138] p 0.12 (160 pairs): a paired difference, its 95% interval and (0/1
    outcomes) the exact McNemar p, in one cell; '-' for None."""
    if d is None:
        return "-"
    lo, hi = d["diff_ci95"]
    # the exact McNemar p alone: a bootstrap p on a few pairs (PG per task) is far too small
    p = f" p {d['p']:.3g}" if d["test"] == "exact McNemar" else ""
    return f"{d['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]{p} ({d['pairs']} pairs)"


def compare_text(c: dict) -> str:
    """The comparison on stdout: a table with one line per metric (each run's value and interval) and,
    under it, each later run's paired difference from the first."""
    names, first = c["names"], c["names"][0]
    by = {n: {r["key"]: r for r in c["metrics"][n]} for n in names}
    table = [["metric", *names]]
    for key, name, *_ in METRICS:
        if not any(key in by[n] for n in names):
            continue
        table.append([name, *(fmt_rate(by[n][key]["value"], by[n][key]["lo"], by[n][key]["hi"]) if key in by[n] else "-"
                              for n in names)])
        if any(key in c["diffs"][n] for n in names[1:]):
            table.append([f"  minus {first}", "", *(fmt_diff(c["diffs"][n].get(key, {}).get("pooled")) for n in names[1:])])
    widths = [max(len(row[i]) for row in table) for i in range(len(names) + 1)]
    lines = [f"compare: {', '.join(f'{n} = {f}' for n, f in zip(names, c['folders']))}"]
    if c["differ"]:
        lines.append(f"warning: the runs differ in {', '.join(c['differ'])}: pairs cover the items both evaluated")
    for n in c.get("partial", []):
        lines.append(f"warning: {n} is a PARTIAL run (stopped before the end): its figures cover what it finished")
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)


def write_compare(path: str, c: dict) -> None:
    """The comparison as HTML: the runs, one row per metric with every run's value and 95% interval
    and every later run's paired difference from the first, then a per-task table of each paired
    metric, each run's own report linked."""
    e = html.escape
    names, first = c["names"], c["names"][0]
    by = {n: {r["key"]: r for r in c["metrics"][n]} for n in names}
    head = "".join(f"<th>{e(n)}</th>" for n in names) + "".join(f"<th>{e(n)} - {e(first)} (paired)</th>" for n in names[1:])
    rows = []
    for key, name, _, _, meaning in METRICS:
        if not any(key in by[n] for n in names):
            continue
        vals = "".join(f"<td class='v'>{fmt_rate(by[n][key]['value'], by[n][key]['lo'], by[n][key]['hi']) if key in by[n] else '-'}"
                       f"</td>" for n in names)
        ds = "".join(f"<td class='v'>{fmt_diff(c['diffs'][n].get(key, {}).get('pooled'))}</td>" for n in names[1:])
        rows.append(f"<tr><th>{e(name)}</th>{vals}{ds}<td class='note'>{e(meaning)}</td></tr>")
    runs = "".join(f"<li><b>{e(n)}</b>: {e(f)}" + (f" (<a href='{e(os.path.relpath(os.path.join(f, 'report.html'), os.path.dirname(os.path.abspath(path))))}'>report</a>)"
                                                     if os.path.isfile(os.path.join(f, "report.html")) else "") + "</li>"
                   for n, f in zip(names, c["folders"]))
    warn = (f"<p class='bad'>The runs differ in {e(', '.join(c['differ']))}: differences are paired on the items "
            "both evaluated.</p>") if c["differ"] else ""
    warn += "".join(f"<p class='bad'>{e(n)} is a PARTIAL run (stopped before the end): its figures cover what it "
                    "finished.</p>" for n in c.get("partial", []))
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>compare {e(' vs '.join(names))}</title>"
           f"<style>{CSS}</style></head><body><h1>{e(' vs '.join(names))}</h1><ul>{runs}</ul>{warn}"
           f"<div class='card'><table><tr><th>metric</th>{head}<th>what it means</th></tr>{''.join(rows)}</table>"
           "<p class='note'>Each run: value [Wilson 95% interval]. Paired difference: the later run minus the first on "
           "the episodes (static: steps) both evaluated, [95% interval: Tango's score interval for 0/1 outcomes "
           "(static steps: widened to the bootstrap over episodes where that is wider), a bootstrap for PG] "
           "(evaluation/stats.py), "
           "p: exact McNemar (0/1 outcomes; none for PG).</p></div>"]
    for key, name, *_ in METRICS:
        per = {n: c["diffs"][n][key]["per_task"] for n in names[1:] if key in c["diffs"][n]}
        if not per:
            continue
        tasks = list(dict.fromkeys(t for d in per.values() for t in d))
        task_val = {n: {t: {r["key"]: r for r in rs} for t, rs in c["per_task"][n].items()} for n in names}
        lines = []
        for t in tasks:
            vals = "".join("<td>" + (fmt_rate(task_val[n][t][key]["value"], task_val[n][t][key]["lo"], task_val[n][t][key]["hi"])
                                     if key in task_val[n].get(t, {}) else "-") + "</td>" for n in names)
            lines.append(f"<tr><th>{e(t)}</th>{vals}" + "".join(f"<td>{fmt_diff(per[n].get(t))}</td>" for n in per) + "</tr>")
        out.append(f"<h2>{e(name)} per task</h2><div class='scroll'><table><tr><th>task</th>"
                   + "".join(f"<th>{e(n)}</th>" for n in names) + "".join(f"<th>{e(n)} - {e(first)}</th>" for n in per)
                   + f"</tr>{''.join(lines)}</table></div>")
    out.append("</body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))


# -----------------------------------------------------------------------------
# figures without a model: the trivial-policy floors of a data file (eval_sop.py baselines) and the
# rule reward of recorded responses of any model beside the floor of the same steps (eval_sop.py score;
# input lines {episode_id, step (0-based), response}, coordinates in pixels of the resized screenshot)

input_file = cli.arg_type(cli.input_file)
size_arg = cli.arg_type(gui.parse_size)


def baselines_parser() -> argparse.ArgumentParser:
    p = cli.make_parser("Match rates of trivial policies per action type (the floor to put next to every score). "
                        "Last stdout line: JSON.\n\n"
                        "    python eval_sop.py baselines --data data/android_control/android_control_test_uis1.jsonl",
                        prog="eval_sop.py baselines")
    p.add_argument("--data", nargs="+", required=True, type=cli.arg_type(cli.input_file), help="episode files")
    p.add_argument("--match-rules", choices=protocols.MATCH_RULES, default="strict",
                   help="strict (ours), release, or a published step protocol's (androidcontrol, aitw)")
    p.add_argument("--swipe-convention", choices=dataset.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared, or known for shipped files)")
    p.add_argument("--image-root", default=None, help="screenshots folder (sizes are read from file headers)")
    p.add_argument("--image-size", type=cli.arg_type(gui.parse_size), default=dataset.ANDROID_CONTROL_SIZE,
                   help="WxH for steps with neither a recorded size nor a file (default 1080x2400, AndroidControl)")
    p.add_argument("--seed", type=cli.non_negative_int, default=0, help="seed of the random-click policy")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p


def baselines_main(argv: list[str] | None = None) -> dict:
    """The `baselines` command: prints the rates table, then the JSON result; returns the result."""
    args = baselines_parser().parse_args(argv)
    episodes = [ep for path in args.data for ep in dataset.load_episodes(path, swipe_convention=args.swipe_convention)]
    res = policies.run_baselines(episodes, policies.step_sizes(episodes, args.image_root, args.image_size), args.match_rules, args.seed)
    res["data"] = list(args.data)
    print(policies.format_baselines(res))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(utils.dumps(res, indent=1))
    print(utils.dumps(res))
    return res


def score_parser(prog: str = "eval_sop.py score") -> argparse.ArgumentParser:
    p = cli.make_parser("Score recorded responses with the rule reward (docs/method.md §4). Input lines: "
                        "{episode_id, step (0-based), response}, coordinates in pixels of the resized screenshot.\n\n"
                        "    python eval_sop.py score --data data/android_control/android_control_test_uis1.jsonl \\\n"
                        "        --responses responses.jsonl --out scores.jsonl --image-size 1080x2400",
                        prog=prog)
    p.add_argument("--data", nargs="+", required=True, type=input_file, help="episode files the responses refer to")
    p.add_argument("--responses", required=True, type=input_file, help="JSONL of responses; an optional field finish_reason ('length' "
                   "= cut at the token cap) or truncated (bool) makes the response malformed under the strict rules and is "
                   "counted into responses_at_cap; without it, text after </action> is what marks a malformed response")
    p.add_argument("--subset", action="store_true",
                   help="allow responses that cover only some steps (default: every step of --data must be scored)")
    p.add_argument("--match-rules", choices=protocols.MATCH_RULES, default="strict",
                   help="strict (ours), release, or a published step protocol's (androidcontrol, aitw)")
    p.add_argument("--action-format", choices=list(policies.ADAPTERS), default="uis1",
                   help="the responses' model family (evaluation/families.py): each is translated into the evaluator's "
                   "format first (eval_sop.py --policy openai records them raw in OUT/responses.jsonl)")
    p.add_argument("--swipe-convention", choices=dataset.SWIPE_CONVENTIONS, default=None,
                   help="how the data files store swipes (default: declared, or known for shipped files)")
    p.add_argument("--out", required=True, help="JSONL of scores, one line per response")
    p.add_argument("--image-size", type=size_arg, default=None,
                   help="WxH of the original screenshots, for steps that record no size")
    p.add_argument("--image-root", default=None, help="else read the size from the screenshot files here")
    p.add_argument("--min-pixels", type=cli.positive_int, default=gui.MIN_PIXELS, help="smart_resize min pixels the model saw")
    p.add_argument("--max-pixels", type=cli.positive_int, default=gui.MAX_PIXELS, help="smart_resize max pixels the model saw")
    return p


def score(argv: list[str], prog: str = "eval_sop.py score") -> dict:
    """Score recorded responses. Every response must name a step of --data; unless --subset, every
    step of --data must have at least one response (several per step are allowed). Raises
    dataset.DataError (a ValueError) naming the responses file, line and field, or the unscored steps. A lone
    UTF-16 surrogate in a response becomes U+FFFD before scoring (counted: lone_surrogates)."""
    args = score_parser(prog).parse_args(argv)
    rules = protocols.rules_of(args.match_rules)  # a published protocol's name -> its rule function
    index: dict[str, tuple[dataset.Episode, str]] = {}
    for path in args.data:
        for ep in dataset.load_episodes(path, swipe_convention=args.swipe_convention):
            if ep.episode_id in index:
                raise dataset.DataError(f"episode id {ep.episode_id!r} is in both {index[ep.episode_id][1]} and {path}; "
                                 "score one file at a time")
            index[ep.episode_id] = (ep, path)
    n = reward_sum = match = type_match = at_cap = malformed = lone = 0
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
                raise dataset.DataError(f"{where}: invalid JSON: {e.msg}") from None
            if not isinstance(rec, dict) or not {"episode_id", "step", "response"} <= rec.keys():
                raise dataset.DataError(f"{where}: expected an object with episode_id, step, response")
            ep_id, t = str(rec["episode_id"]), rec["step"]
            if ep_id not in index:
                raise dataset.DataError(f"{where}: field 'episode_id': unknown episode {ep_id!r} (not in {', '.join(args.data)})")
            ep = index[ep_id][0]
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < len(ep.steps):
                raise dataset.DataError(f"{where}: field 'step': episode {ep_id} has steps 0..{len(ep.steps) - 1}, got {t!r}")
            if not isinstance(rec["response"], str):
                raise dataset.DataError(f"{where}: field 'response': expected a string, got {type(rec['response']).__name__}")
            step = ep.steps[t]
            try:
                orig = dataset.original_size(step, image_root=args.image_root, blank_screens=args.image_size)
            except FileNotFoundError:
                raise dataset.DataError(f"{where}: episode {ep_id} step {t} records no screenshot size; pass --image-size WxH "
                                 "or --image-root DIR") from None
            resized = gui.resized_size(orig, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
            # a recorded finish reason, where the file has one; without it, trailing text after the
            # action is what marks a looping or overlong response (strict rules: malformed)
            cut = rec.get("finish_reason") == "length" or rec.get("truncated") is True
            raw, bad = clean_text(rec["response"])  # a lone surrogate (JSON "\ud83d") -> U+FFFD: no UTF-8 has it
            lone += bad
            text = policies.ADAPTERS[args.action_format].to_response(raw, resized)
            s = reward.score_response(text, step, resized_size=resized, orig_size=orig, rules=rules,
                                   truncated=cut)
            rows.append({"episode_id": rec["episode_id"], "step": t, "reward": s.reward, "match": s.match,
                         "type_match": s.type_match, "format_ok": s.format_ok, "action": s.action, "error": s.error})
            n += 1
            reward_sum += s.reward
            match += s.match
            type_match += s.type_match
            at_cap += cut
            malformed += s.error is not None
            per_step[ep_id, t] += 1
    if n == 0:
        raise dataset.DataError(f"{args.responses}: no responses to score")
    total = sum(len(ep.steps) for ep, _ in index.values())
    missing = [(i, t) for i, (ep, _) in index.items() for t in range(len(ep.steps)) if (i, t) not in per_step]
    if missing and not args.subset:
        shown = ", ".join(f"{i}:{t}" for i, t in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise dataset.DataError(f"{args.responses}: {len(missing)} of {total} steps of {', '.join(args.data)} have no response "
                         f"(episode:step {shown}); pass --subset to score only the steps given")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fout:
        fout.writelines(utils.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    # the floor on the same steps, for the figure above
    eps = [ep for ep, _ in index.values()]
    sizes = policies.step_sizes(eps, args.image_root, args.image_size)
    base = policies.run_baselines(eps, sizes, args.match_rules)
    return {"responses": n, "reward_mean": reward_sum / n, "match_rate": match / n, "type_match_rate": type_match / n,
            "match_rules": args.match_rules, "steps_total": total, "steps_scored": len(per_step),
            "steps_unscored": len(missing), "responses_per_step_mean": n / len(per_step),
            "responses_per_step_max": max(per_step.values()), "responses_at_cap": at_cap,
            "truncated_rate": at_cap / n, "malformed_responses": malformed, "lone_surrogates": lone,
            "floor_step_sr": base["floor"]["step_sr"], "floor_type_acc": base["floor"]["type_acc"], "out": args.out}


def score_main(argv: list[str] | None = None, prog: str = "eval_sop.py score") -> dict:
    """The `score` command: scores recorded responses, prints the summary as JSON; returns it."""
    summary = score(sys.argv[1:] if argv is None else list(argv), prog)
    print(utils.dumps(summary))
    return summary


# -----------------------------------------------------------------------------
# report.py A B: the comparison's command


def main(argv: list[str] | None = None) -> dict:
    p = cli.make_parser(__doc__)
    p.add_argument("folders", nargs="+", type=cli.arg_type(cli.input_dir),
                   help="eval_sop.py --out folders; the first is the one the others are compared with")
    p.add_argument("--names", nargs="+", default=None, help="a short name per folder (default: the folders' names)")
    p.add_argument("--out", default="out/compare.html", help="the HTML page; the comparison's JSON goes beside it (.json)")
    args = p.parse_args(argv)
    names = args.names or [os.path.basename(os.path.normpath(f)) for f in args.folders]
    if len(names) != len(args.folders) or len(set(names)) != len(names):
        raise utils.UsageError(f"--names: {len(args.folders)} distinct names needed, one per folder (got {names}); "
                             "folders with one name need --names")
    runs = [{**load_eval(f), "name": n} for f, n in zip(args.folders, names)]
    c = compare(runs)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    write_compare(args.out, c)
    with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
        f.write(utils.dumps(c, indent=1))
    print(compare_text(c))
    print(f"report: {args.out} (open it in a browser)  json: {os.path.splitext(args.out)[0] + '.json'}")
    return c


if __name__ == "__main__":
    cli.run_script(main)

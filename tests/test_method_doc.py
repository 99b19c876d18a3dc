"""docs/method.md's worked example of eq. 6.1-6.4 is the code's: its tables are read from the file and
every number recomputed with advantage.compute_advantages (and kernels.group_stats for the group
statistics), so the doc cannot drift from the code; tools/draw_rollout.py draws the same group.

The doc prints 3 decimals (4 where a value ends in 5), so a number matches when it is within 6e-4 of the
code's (half a unit of the third decimal, plus fp32 rounding)."""

import re
import sys
from pathlib import Path

import pytest
import torch

import advantage
from kernels import group_stats

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "method.md"
TOL = 6e-4
sys.path.insert(0, str(REPO / "tools"))
import draw_rollout  # noqa: E402


def table_after(text: str, marker: str) -> list[list[str]]:
    """The cells of the Markdown table that follows `<!-- marker -->` (header and rule rows dropped)."""
    start = text.index(f"<!-- {marker} -->")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows or line.strip():
                break
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[2:]


def settings(text: str) -> dict:
    """gamma of the worked example, read from its prose (`$\\gamma = 0.5$`)."""
    section = text[text.index("### A worked example"):text.index("<!-- worked-example records -->")]
    return {"gamma": float(re.search(r"\\gamma = ([0-9.]+)", section).group(1))}


def mismatches(text: str) -> list[str]:
    """Every number of the worked example that the code does not reproduce, as 'where: doc vs code'."""
    rows = table_after(text, "worked-example records")
    records = [{"task_idx": 0, "rollout_idx": int(i), "step_idx": int(t), "reward": float(r), "match": m == "yes"}
               for i, t, r, m, *_ in rows]
    adv = advantage.compute_advantages(records, gamma=settings(text)["gamma"])
    bad = []
    for k, row in enumerate(rows):
        for col, name in zip(row[4:], ("returns", "adv_step", "adv_episode", "adv")):
            if abs(float(col) - float(getattr(adv, name)[k])) > TOL:
                bad.append(f"rollout {row[0]} step {row[1]} {name}: {col} vs {float(getattr(adv, name)[k]):.4f}")
    # the groups: step groups G_t of the returns, then the episode group of the last-step returns
    groups = table_after(text, "worked-example groups")
    R = adv.returns
    last = {}
    for rec, ret in zip(records, R.tolist()):
        if rec["step_idx"] >= last.get(rec["rollout_idx"], (-1, 0))[0]:
            last[rec["rollout_idx"]] = (rec["step_idx"], ret)
    want = [[ret for rec, ret in zip(records, R.tolist()) if rec["step_idx"] == t] for t in range(len(groups) - 1)]
    want.append([last[i][1] for i in sorted(last)])
    for (name, members, mean, std), vals in zip(groups, want):
        doc_vals = [float(v) for v in members.split(",")]
        if len(doc_vals) != len(vals) or any(abs(a - b) > TOL for a, b in zip(doc_vals, vals)):
            bad.append(f"{name} members: {members} vs {vals}")
        m, sd = group_stats(torch.tensor(vals), torch.zeros(len(vals), dtype=torch.int64))
        if abs(float(mean) - float(m[0])) > TOL or abs(float(std) - float(sd[0])) > TOL:
            bad.append(f"{name}: mean {mean} std {std} vs {float(m[0]):.4f} {float(sd[0]):.4f}")
    return bad


def test_worked_example_is_what_the_code_computes():
    text = DOC.read_text(encoding="utf-8")
    assert len(table_after(text, "worked-example records")) == 11 and len(table_after(text, "worked-example groups")) == 4
    assert mismatches(text) == []


@pytest.mark.parametrize("old,new", [("| +1.840 |", "| +1.841 |"), ("| 0.5475 | 0.528 |", "| 0.5475 | 0.530 |"),
                                     ("1; $\\gamma = 0.5$, the paper's", "1; $\\gamma = 0.6$, the paper's")])
def test_a_drifted_number_is_caught(old, new):
    text = DOC.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    assert mismatches(text.replace(old, new))


def test_the_picture_draws_the_doc_s_group():
    rows = table_after(DOC.read_text(encoding="utf-8"), "worked-example records")
    assert [(int(i), int(t), float(r), m == "yes") for i, t, r, m, *_ in rows] == draw_rollout.EXAMPLE
    assert settings(DOC.read_text(encoding="utf-8"))["gamma"] == draw_rollout.GAMMA
    draw_rollout.fates()  # the example follows the patch rule at its threshold (raises otherwise)


def cited_names(text: str) -> tuple[int, list[str]]:
    """(how many `module.name` citations name a module of the repository, those whose name it lacks)."""
    import importlib
    checked, missing = 0, []
    for mod, name in sorted(set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)?)\.([A-Za-z_][A-Za-z0-9_]*)[`(]", text))):
        if name in ("py", "md", "json", "jsonl", "png"):
            continue  # a file name, not a citation
        path = REPO / (mod.replace(".", "/") + ".py")
        if not path.exists() and not (REPO / mod.replace(".", "/") / "__init__.py").exists():
            continue  # not a module of ours
        checked += 1
        obj = getattr(importlib.import_module(mod), name, None)
        # defined there (or in the package's own submodules), not merely imported into it
        if obj is None or not getattr(obj, "__module__", mod).startswith(mod):
            missing.append(f"{mod}.{name}")
    return checked, missing


def test_every_function_the_doc_cites_exists():
    """`module.name` citations in docs/method.md name a module of the repository and something in it
    (a citation of a function in the wrong module, e.g. static_metrics under eval_sop, fails)."""
    text = DOC.read_text(encoding="utf-8")
    checked, missing = cited_names(text)
    assert checked >= 50 and not missing, (checked, missing)
    assert cited_names(text + "`eval_sop.static_metrics`")[1] == ["eval_sop.static_metrics"]

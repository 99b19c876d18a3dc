"""Draw a run's metrics.jsonl (train_sft.py, train_semionline.py) as PNG curves: one panel per
numeric metric, against the row's `step` (else its line number). The method's figures come first
(FIRST: RL's reward, match, progress, KL, entropy and loss; SFT's loss, val_loss and lr), the others
follow in file order. A step logged twice (a run resumed from an earlier checkpoint redoes the
steps after it) is drawn once, from the run that went on.

    python tools/plot_metrics.py out/sft/metrics.jsonl                    # -> out/sft/metrics.png
    python tools/plot_metrics.py out/semionline/metrics.jsonl --smooth 5  # + a 5-step rolling mean
    python tools/plot_metrics.py out/semionline/metrics.jsonl --keys loss reward_mean kl --out /tmp/rl.png

A metric missing from some rows (e.g. SFT's val_loss, logged every --eval-every steps) is drawn at
the steps that have it, with markers; null values (a NaN written as null, see the row's
"nonfinite" field) are left out and counted in the panel's title.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: utils, dataset
import cli  # noqa: E402
import utils  # noqa: E402
import dataset  # noqa: E402

SKIP = ("step", "t")  # the x axis and wall time are not curves
FIRST = ("reward_mean", "match_rate", "progress", "kl", "entropy", "loss", "val_loss", "lr")

parser = cli.make_parser(__doc__)
parser.add_argument("metrics", nargs="+", type=cli.arg_type(cli.input_file), help="metrics.jsonl files, one PNG each")
parser.add_argument("--keys", nargs="+", default=None, help="metrics to draw (default: every numeric one)")
parser.add_argument("--smooth", type=cli.non_negative_int, default=0, help="also draw a trailing rolling mean over this many points (0: off)")
parser.add_argument("--out", default=None, help="PNG path (one input only; default: beside the JSONL, same name .png)")
parser.add_argument("--cols", type=cli.positive_int, default=3, help="panels per row")


def read_metrics(path: str) -> dict[str, tuple[list[float], list[float | None]]]:
    """{metric: (x, y)} of the numeric fields of a JSONL file, FIRST's metrics first, then file order;
    y is None where the row held null. When a row's step is not above the last one drawn (a resumed
    run redoing steps), the points from that step on are replaced by the later rows'. Raises
    dataset.DataError naming file and line for a line that is not a JSON object."""
    series: dict[str, tuple[list, list]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise dataset.DataError(f"{path}: line {n}: invalid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise dataset.DataError(f"{path}: line {n}: expected a JSON object, got {type(row).__name__}")
            x = row.get("step", n)
            if "step" in row:  # a redone step: the rows of the run that went on replace the old ones
                for xs, ys in series.values():
                    while xs and xs[-1] >= x:
                        xs.pop()
                        ys.pop()
            nonfinite = row.get("nonfinite") or {}
            for k, v in row.items():
                if k in SKIP or isinstance(v, bool):
                    continue
                if isinstance(v, (int, float)) or (v is None and k in nonfinite):
                    xs, ys = series.setdefault(k, ([], []))
                    xs.append(x)
                    ys.append(None if v is None else float(v))
    series = {k: v for k, v in series.items() if v[0]}
    return {**{k: series[k] for k in FIRST if k in series}, **{k: v for k, v in series.items() if k not in FIRST}}


def rolling_mean(y: list[float], k: int) -> list[float]:
    """Trailing mean over the last k points (fewer at the start)."""
    out, acc = [], 0.0
    for i, v in enumerate(y):
        acc += v - (y[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


def plot(series: dict, path: str | Path, title: str, smooth: int = 0, cols: int = 3, return_fig: bool = False):
    """One panel per metric in `series` (read_metrics' output, in its order) -> a PNG at `path`;
    returns the path (and the matplotlib figure, drawn and closed, with return_fig)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(1, min(cols, len(series)))
    rows = math.ceil(len(series) / cols)
    # constrained layout keeps the figure title above the panels' titles (tight_layout ignores it)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False, layout="constrained")
    for ax, (k, (xs, ys)) in zip(axes.flat, series.items()):
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        px, py = [p[0] for p in pts], [p[1] for p in pts]
        sparse = len(pts) <= 20
        ax.plot(px, py, marker="o" if sparse else None, ms=3, lw=1, alpha=0.45 if smooth > 1 else 1.0)
        if smooth > 1 and not sparse:  # a rolling mean of a few points says nothing
            ax.plot(px, rolling_mean(py, smooth), lw=1.8, color="C1", label=f"mean of {smooth}")
            ax.legend(fontsize=7)
        dropped = len(ys) - len(pts)
        ax.set_title(k + (f" ({dropped} null)" if dropped else ""), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return (path, fig) if return_fig else path


def main(argv=None):
    args = parser.parse_args(argv)
    if args.out and len(args.metrics) > 1:
        raise utils.UsageError(f"--out names one PNG but {len(args.metrics)} metrics files were given")
    if args.smooth < 0 or args.cols < 1:
        raise utils.UsageError(f"--smooth {args.smooth} / --cols {args.cols}: need smooth >= 0 and cols >= 1")
    written = []
    for src in args.metrics:
        series = read_metrics(src)
        if args.keys:
            missing = [k for k in args.keys if k not in series]
            if missing:
                raise utils.UsageError(f"{src}: no numeric metric {', '.join(missing)} (has: {', '.join(series)})")
            series = {k: series[k] for k in args.keys}
        if not series:
            raise utils.UsageError(f"{src}: no numeric metrics to draw")
        out = Path(args.out) if args.out else Path(src).with_suffix(".png")
        written.append(str(plot(series, out, src, smooth=args.smooth, cols=args.cols)))
        print(f"wrote {out} ({len(series)} panels)")
    return written


if __name__ == "__main__":
    cli.run_script(main)

"""Draw one semi-online rollout group with its patches (docs/rollout.png, docs/method.md §5-§6).

One task, N = 4 rollouts of a 3-step expert episode, patch threshold 1, gamma 0.5: the worked example
of docs/method.md ("A worked example"), whose numbers tests/test_method_doc.py recomputes. Each cell
is the response y_i,t that rollout i sampled at step t, with its rule reward r (eq. 4.1), its return
R (eq. 6.1) and its advantage A (eq. 6.4), all computed here by advantage.compute_advantages; a wrong
step is patched (patch.should_patch) or ends its rollout. What enters the next step's history is
the response when it matched, else the patch; every sampled response is trained on, no patch is.

    python tools/draw_rollout.py                       # -> docs/rollout.png
    python tools/draw_rollout.py --out /tmp/rollout.png

Last stdout line: JSON {"out", "rollouts", "steps", "patches", "ended_early"}.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
import advantage  # noqa: E402
import cli  # noqa: E402
import utils  # noqa: E402
import patch  # noqa: E402

# (rollout i, step t, rule reward r, match): the worked example of docs/method.md, in the same order.
# 1.0: right (think block + full match); 0.55: right type, wrong arguments (0.1 + 0.9 * 0.5);
# 0.19: wrong type (0.1 + 0.9 * 0.1); 0.0: malformed (no parsable action).
EXAMPLE = [
    (1, 0, 1.0, True), (1, 1, 1.0, True), (1, 2, 1.0, True),
    (2, 0, 1.0, True), (2, 1, 0.55, False), (2, 2, 1.0, True),
    (3, 0, 0.55, False), (3, 1, 1.0, True), (3, 2, 0.19, False),
    (4, 0, 0.55, False), (4, 1, 0.0, False),
]
N_STEPS, GAMMA, PATCH_THRESHOLD = 3, 0.5, 1

parser = cli.make_parser(__doc__)
parser.add_argument("--out", default="docs/rollout.png", help="the PNG to write")
parser.add_argument("--dpi", type=cli.positive_int, default=100, help="resolution of the PNG")


def example_records() -> list[dict]:
    """EXAMPLE as advantage.compute_advantages' records (one task, task_idx 0)."""
    return [{"task_idx": 0, "rollout_idx": i, "step_idx": t, "reward": r, "match": m} for i, t, r, m in EXAMPLE]


def fates() -> dict[tuple[int, int], str]:
    """{(i, t): "match" | "patched" | "ended"}: what followed each sampled response under
    patch.should_patch at PATCH_THRESHOLD. Raises ValueError if EXAMPLE does not follow the rule
    (a rollout that goes on after its end, or ends while it had a patch left)."""
    out, used = {}, {}
    for i, t, _, m in EXAMPLE:
        if (i, t - 1) in out and out[(i, t - 1)] == "ended" or (t > 0 and (i, t - 1) not in out):
            raise ValueError(f"rollout {i} has a step {t} after its end")
        if m:
            out[(i, t)] = "match"
        elif patch.should_patch(used.get(i, 0), PATCH_THRESHOLD):
            out[(i, t)] = "patched"
            used[i] = used.get(i, 0) + 1
        else:
            out[(i, t)] = "ended"
    for i in {i for i, *_ in EXAMPLE}:
        last = max(t for j, t, *_ in EXAMPLE if j == i)
        if last < N_STEPS - 1 and out[(i, last)] != "ended":
            raise ValueError(f"rollout {i} stops at step {last} although it could go on")
    return out


def why_negative(adv) -> str:
    """The caption line that explains a right step with a negative advantage (eq. 6.4 adds the rollout's
    episode-level A^E to the step's A^S, so a right step of a rollout that failed overall can sit below 0)."""
    for k, (i, t, _, m) in enumerate(EXAMPLE):
        if m and float(adv.adv[k]) < 0:
            return (f"Why is the right step y_{i},{t} negative? Its step credit A^S = {float(adv.adv_step[k]):+.3f} is "
                    f"outweighed by its rollout's episode-level A^E = {float(adv.adv_episode[k]):+.3f} (rollout {i} "
                    "ended with a low return), and eq. 6.4 adds the two.")
    return ""


def draw(path: str, dpi: int) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    adv = advantage.compute_advantages(example_records(), gamma=GAMMA)
    fate = fates()
    rollouts = sorted({i for i, *_ in EXAMPLE})
    colour = {"match": "#cfe8cf", "patched": "#f6d0cc", "ended": "#f6d0cc"}
    edge = {"match": "#2e7d32", "patched": "#c62828", "ended": "#c62828"}
    W, H, gx, gy = 2.3, 1.0, 4.0, 1.55  # cell size, grid pitch (x: steps, y: rollouts)

    fig, ax = plt.subplots(figsize=(12.5, 1.9 + 1.35 * len(rollouts)))
    ax.set_xlim(-1.6, gx * N_STEPS - 0.3)
    ax.set_ylim(-gy * len(rollouts) - 0.9, 1.5)
    ax.axis("off")

    def box(x, y, w, h, text, fc, ec, hatch=None, ls="-", size=8.5):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", fc=fc, ec=ec, lw=1.2,
                                    hatch=hatch, ls=ls))
        label = dict(boxstyle="square,pad=0.1", fc=fc, ec="none") if hatch else None  # text readable over a hatch
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, bbox=label)

    def arrow(x0, y0, x1, y1, colour="#444444", style="-|>"):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=11, color=colour, lw=1.2))

    for t in range(N_STEPS):  # the expert episode along the top: what every rollout is shown
        box(t * gx - 0.35, 0.55, W + 0.7, 0.8, f"step {t}: expert screenshot $s_{t}$\nexpert action $a^*_{t}$ (the reward's reference)",
            "#e8eef8", "#4a6fa5", size=8.5)
        arrow(t * gx + W / 2, 0.52, t * gx + W / 2, -gy + H + 0.06, colour="#4a6fa5")  # shown to every rollout
    ax.text(-1.55, 0.95, "expert\nepisode", fontsize=9, va="center", weight="bold")

    patches = 0
    for row, i in enumerate(rollouts):
        y = -gy * (row + 1)
        ax.text(-1.55, y + H / 2, f"rollout {i}\n(own history)", fontsize=9, va="center", weight="bold")
        for t in range(N_STEPS):
            x = t * gx
            k = next((n for n, e in enumerate(EXAMPLE) if e[0] == i and e[1] == t), None)
            if k is None:
                box(x, y, W, H, "not reached\n(the rollout ended)", "white", "#9e9e9e", ls="--")
                continue
            _, _, r, m = EXAMPLE[k]
            f = fate[(i, t)]
            what = "right" if m else ("malformed" if r == 0 else "wrong")
            box(x, y, W, H, f"$y_{{{i},{t}}}$ sampled: {what}\nr = {r:.2f}   R = {float(adv.returns[k]):.3f}\n"
                f"A = {float(adv.adv[k]):+.3f}  (trained on)", colour[f], edge[f])
            if f == "patched":
                patches += 1
                box(x + W + 0.15, y + 0.05, 1.15, H - 0.1, "patch: $a^*_{%d}$\n+ a thought\n(history only)" % t,
                    "#fff4d6", "#b28704", hatch="//", size=7.5)
            if f == "ended":
                ax.text(x + W + 0.15, y + H / 2, "no patch left:\nrollout ends", fontsize=8, color="#c62828",
                        va="center")
            if t + 1 < N_STEPS and f != "ended":  # what the next step's history gains
                x0 = x + W + (1.33 if f == "patched" else 0.0)
                arrow(x0, y + H / 2, (t + 1) * gx, y + H / 2, colour="#b28704" if f == "patched" else "#2e7d32")

    ax.text(0.0, -gy * len(rollouts) - 0.55,
            "green: matched, the response joins the rollout's own history.  red: wrong; yellow hatched: the patch "
            "(expert action) that replaces it in the history, at most 1 per rollout (--patch-threshold 1).\n"
            f"r: rule reward (eq. 4.1).  R: discounted return, gamma {GAMMA} (eq. 6.1).  A = A^E + A^S "
            "(eq. 6.2-6.4), normalised over the 4 rollouts; numbers: docs/method.md, \"A worked example\".\n"
            + why_negative(adv), fontsize=8.5, va="top")
    ax.set_title("One semi-online rollout group: N = 4 rollouts walk one expert episode, each with its own history",
                 fontsize=11)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return {"out": path, "rollouts": len(rollouts), "steps": N_STEPS, "patches": patches,
            "ended_early": sum(1 for f in fate.values() if f == "ended")}


def main(argv=None):
    args = parser.parse_args(argv)
    print(utils.dumps(draw(args.out, args.dpi)))


if __name__ == "__main__":
    cli.run_script(main)

"""Statistics of the MiniWob++ reproduction scripts (runs/repro_main.py, runs/repro_ablations.py;
runs/repro_common.py uses them for its comparisons), numpy only: Wilson intervals, the exact McNemar
test, a paired (two-level) bootstrap of a difference, R^2 of a least-squares line with a bootstrap
interval over checkpoints, the least-squares trend of a training curve, and the data-scaling law
y = A - B * N^k fitted by profile least squares, with a bootstrap interval on k. Every bootstrap takes
a fixed seed: the same inputs give the same numbers. Tested against hand-computed values in
tests/test_repro_stats.py. eval_sop.py and report.py import it too (numpy only, no project import:
the rate intervals of every evaluation and the paired differences of `python report.py A B`).
"""
from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile
N_BOOT = 4000  # bootstrap resamples for every interval and p-value below


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a binomial rate k/n (Wilson 1927); (nan, nan) for n = 0.

    Unlike the normal interval p +- z*se it stays inside [0, 1] and is not empty at k = 0 or k = n:
    centre (p + z^2/2n) / (1 + z^2/n), half-width z*sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n).
    Raises ValueError for k outside [0, n]."""
    if not 0 <= k <= n:
        raise ValueError(f"wilson: k={k} outside [0, n={n}]")
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes: b = pairs where only A
    succeeded, c = pairs where only B succeeded. Under H0 the b + c discordant pairs split
    Binomial(b + c, 1/2); p = min(1, 2 * P(X <= min(b, c))). 1.0 when there is no discordant pair."""
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: negative counts b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def paired_bootstrap(a, b, groups=None, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Bootstrap of mean(a) - mean(b) over paired items (a[i], b[i]): the same online episode
    played by two checkpoints, or the same RL step of two runs.

    a, b: 1-D arrays of equal length (0/1 outcomes or floats). groups: optional 1-D labels (e.g.
    the training seed of the pair); then the bootstrap has two levels, as training seeds vary as
    well as episodes: resample groups with replacement, then items within each drawn group.
    Returns {diff, diff_ci95 [lo, hi] (percentile), p_value}: two-sided, from the bootstrap
    distribution shifted to the null, p = (1 + #{|d* - d| >= |d|}) / (1 + n_boot).
    Fixed `seed`: the same inputs give the same numbers. p_value is nan for fewer than 3 pairs.
    Raises ValueError on mismatched lengths."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired_bootstrap: a {a.shape} and b {b.shape} must be equal non-empty 1-D arrays")
    d = a - b
    groups = np.zeros(d.size, dtype=int) if groups is None else np.asarray(groups)
    if groups.shape != d.shape:
        raise ValueError(f"paired_bootstrap: groups {groups.shape} must match a {a.shape}")
    rng = np.random.default_rng(seed)
    blocks = [d[groups == g] for g in np.unique(groups)]
    stats = np.empty(n_boot)
    for i in range(n_boot):
        picks = rng.integers(len(blocks), size=len(blocks)) if len(blocks) > 1 else [0]
        parts = [blocks[j][rng.integers(blocks[j].size, size=blocks[j].size)] for j in picks]
        stats[i] = np.concatenate(parts).mean()
    diff = float(d.mean())
    p = min(1.0, float((1 + np.sum(np.abs(stats - diff) >= abs(diff) - 1e-12)) / (1 + n_boot)))
    if d.size < 3:  # a resample of one or two pairs says nothing about their spread: no test
        p = float("nan")
    return {"diff": diff, "diff_ci95": [float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))],
            "p_value": p}


def paired_binary(a, b, groups=None, seed: int = 0) -> dict:
    """Two arms' 0/1 outcomes on the same items (e.g. online episodes), pooled over groups (training
    seeds): paired_bootstrap's {diff, diff_ci95, p_value} plus the exact McNemar test on the pooled
    pairs, p_mcnemar, and its discordant counts [only a, only b]. a, b: 1-D 0/1 arrays of one length."""
    a, b = np.asarray(a, dtype=int), np.asarray(b, dtype=int)
    only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    return {**paired_bootstrap(a, b, groups, seed=seed), "p_mcnemar": mcnemar_exact(only_a, only_b),
            "discordant": [only_a, only_b]}


def trend(x, y, groups=None) -> dict:
    """Least-squares slope of y on x with a 95% interval: the training reward's trend over RL steps.

    x, y: 1-D arrays of equal length (e.g. RL step, reward_mean of that step). groups: optional
    labels (the run's seed); x and y are then centred within each group first, so the slope is the
    within-run trend pooled over runs (runs starting at different rewards do not make a trend).
    Returns {"slope", "slope_ci95": [lo, hi], "n"}: slope +- Z95 * se, se = sqrt(SSE / (n - p) /
    Sxx) with p = 1 + number of groups parameters (the normal quantile: meant for >= 30 points;
    steps are treated as independent, which ignores autocorrelation, so the interval is optimistic).
    Raises ValueError on mismatched lengths or fewer than 3 points; NaN slope when x is constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"trend: x and y must be 1-D of one length, got {x.shape} and {y.shape}")
    g = np.zeros(len(x), int) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    n_par = 1 + (g.max() + 1 if len(g) else 0)  # the slope, and one mean per group
    if len(x) < n_par + 1:
        raise ValueError(f"trend: {len(x)} points are too few for a slope and {n_par - 1} group means")
    xc, yc = x.copy(), y.copy()
    for k in np.unique(g):
        xc[g == k] -= x[g == k].mean()
        yc[g == k] -= y[g == k].mean()
    sxx = float(xc @ xc)
    if sxx == 0:
        return {"slope": float("nan"), "slope_ci95": [float("nan")] * 2, "n": int(len(x))}
    slope = float(xc @ yc) / sxx
    sse = float(((yc - slope * xc) ** 2).sum())
    se = math.sqrt(sse / (len(x) - n_par) / sxx)
    return {"slope": slope, "slope_ci95": [slope - Z95 * se, slope + Z95 * se], "n": int(len(x))}


def r2(x, y) -> float:
    """R^2 of the least-squares line of y on x (= squared Pearson correlation); nan when x or y
    is constant or fewer than 3 points are given (a line through 2 points always has R^2 = 1)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.size < 3:
        return float("nan")
    sxx = np.sum((x - x.mean()) ** 2)
    syy = np.sum((y - y.mean()) ** 2)
    if sxx <= 1e-15 or syy <= 1e-15:
        return float("nan")
    sxy = np.sum((x - x.mean()) * (y - y.mean()))
    return float(sxy * sxy / (sxx * syy))


def r2_bootstrap(x, y, x2=None, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Percentile 95% interval of R^2(x, y) over checkpoints resampled with replacement.
    With x2 (a second metric on the same checkpoints), also the paired difference
    R^2(x, y) - R^2(x2, y) on the same resamples: `diff`, `diff_ci95` and a two-sided p-value
    (shifted-null rule as in paired_bootstrap). Resamples where R^2 is undefined (a constant
    column) are dropped and counted in `dropped`. Intervals are [nan, nan] if none is left."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rng = np.random.default_rng(seed)
    vals, diffs, dropped = [], [], 0
    for _ in range(n_boot):
        idx = rng.integers(x.size, size=x.size)
        r = r2(x[idx], y[idx])
        r_2 = r2(np.asarray(x2, dtype=float)[idx], y[idx]) if x2 is not None else 0.0
        if math.isnan(r) or math.isnan(r_2):
            dropped += 1
            continue
        vals.append(r)
        diffs.append(r - r_2)
    ci = [float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))] if vals else [float("nan")] * 2
    out = {"r2": r2(x, y), "ci95": ci, "dropped": dropped}
    if x2 is not None:
        d = out["r2"] - r2(x2, y)
        diffs = np.asarray(diffs)
        out["diff"] = d
        if diffs.size and not math.isnan(d):
            out["diff_ci95"] = [float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))]
            out["p_value"] = float(min(1.0, (1 + np.sum(np.abs(diffs - d) >= abs(d) - 1e-12)) / (1 + diffs.size)))
        else:
            out["diff_ci95"], out["p_value"] = [float("nan")] * 2, float("nan")
    return out


K_GRID = np.linspace(-4.0, -0.01, 800)


def fit_scaling_law(n, y) -> dict:
    """Fit performance y against data size n (> 0) as y = A - B * n^k = A - B * exp(k ln n): the
    paper's "exponential law" of performance in (log) data size (arXiv 2509.11543, data-scaling
    figure; docs/method.md §9). k < 0: performance saturates at A; the closer k is to 0, the more
    performance still grows with more data (paper: k = -1.13 at patch threshold 0, -0.73 unlimited).
    Units of n only rescale B, so k is unit-free; our k and the paper's are comparable in order only.

    Profile least squares: for each k on a grid in [-4, -0.01], A and B are the linear LS solution;
    the k with the smallest residual wins. Returns {A, B, k, sse, at_bound} (at_bound: k hit the
    grid's end, the law is not identified by these points). Raises ValueError for < 3 distinct
    sizes or n <= 0."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    if n.shape != y.shape or np.any(n <= 0) or np.unique(n).size < 3:
        raise ValueError("fit_scaling_law: need >= 3 distinct positive data sizes, one y per size")
    best = None
    for k in K_GRID:
        X = np.stack([np.ones_like(n), -np.power(n, k)], axis=1)  # (P, 2): y = A*1 + B*(-n^k)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        sse = float(np.sum((X @ coef - y) ** 2))
        if best is None or sse < best[0] - 1e-15:
            best = (sse, float(coef[0]), float(coef[1]), float(k))
    sse, A, B, k = best
    return {"A": A, "B": B, "k": k, "sse": sse, "at_bound": bool(k in (K_GRID[0], K_GRID[-1]))}


def scaling_bootstrap(n, y, n_boot: int = 1000, seed: int = 0) -> dict:
    """fit_scaling_law plus a percentile 95% interval on k over points resampled with replacement
    (resamples with < 3 distinct sizes are dropped and counted). Returns the fit and `k_ci95`,
    `k_boot` (the resampled k values, for comparing two laws on matched resamples), `dropped`."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    fit = fit_scaling_law(n, y)
    rng = np.random.default_rng(seed)
    ks, dropped = [], 0
    for _ in range(n_boot):
        idx = rng.integers(n.size, size=n.size)
        if np.unique(n[idx]).size < 3:
            dropped += 1
            continue
        ks.append(fit_scaling_law(n[idx], y[idx])["k"])
    ci = [float(np.percentile(ks, 2.5)), float(np.percentile(ks, 97.5))] if ks else [float("nan")] * 2
    return {**fit, "k_ci95": ci, "k_boot": ks, "dropped": dropped}


"""The statistics of every reported figure, numpy only and free of project imports: Wilson intervals
(the rate interval of every evaluation: eval_sop.py, report.py, evaluation/online.py), the paired
differences of `python report.py A B`, and what the reproduction scripts of runs/ build their verdicts
on: the primary test of every verdict (a paired t-test across training seeds, seed_paired_t) and its
null simulation (null_fpr), the exact McNemar test and a paired (two-level) bootstrap of a difference
(secondary figures), R^2 of a least-squares line with a bootstrap interval over checkpoints, the
least-squares trend of a training curve, and the data-scaling law y = A - B * N^k fitted by profile
least squares, with a bootstrap interval on k. Every bootstrap takes a fixed seed: the same inputs
give the same numbers. Tested against hand-computed values in tests/test_repro_stats.py.
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
    Guaranteed: 0 <= lo <= k/n <= hi <= 1 (clamped against rounding). Raises ValueError for k
    outside [0, n]."""
    if not 0 <= k <= n:
        raise ValueError(f"wilson: k={k} outside [0, n={n}]")
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # clamped: rounding once put a bound one ulp on the wrong side of k/n at k = 0 and k = n
    return (min(max(0.0, centre - half), p), max(min(1.0, centre + half), p))


def t_two_sided_p(t, df: int):
    """Two-sided p-value P(|T| >= |t|) of Student's t with an integer df >= 1, exact, numpy only.

    t: float or array (vectorised for the null simulation). Uses the closed forms of the t CDF for
    integer degrees of freedom (Abramowitz & Stegun 26.7.3-4), with theta = atan(|t| / sqrt(df)),
    c = cos(theta), s = sin(theta):
      df odd:  P(|T| < t) = (2 / pi) * (theta + s * (c + 2/3 c^3 + (2*4)/(3*5) c^5 + ... up to c^(df-2)))
      df even: P(|T| < t) = s * (1 + 1/2 c^2 + (1*3)/(2*4) c^4 + ... up to c^(df-2)).
    Raises ValueError for df < 1."""
    if int(df) != df or df < 1:
        raise ValueError(f"t_two_sided_p: df must be an integer >= 1, got {df}")
    df = int(df)
    th = np.arctan(np.abs(np.asarray(t, dtype=float)) / math.sqrt(df))
    c, s = np.cos(th), np.sin(th)
    if df % 2:  # odd
        term, acc = c, np.zeros_like(c) if df == 1 else c.copy()
        for k in range(3, df - 1, 2):  # the term of c^k is the previous one times (k - 1) / k * c^2
            term = term * (k - 1) / k * c * c
            acc = acc + term
        inside = 2.0 / math.pi * (th + s * acc)
    else:
        term, acc = np.ones_like(c), np.ones_like(c)
        for k in range(2, df - 1, 2):
            term = term * (k - 1) / k * c * c
            acc = acc + term
        inside = s * acc
    p = np.clip(1.0 - inside, 0.0, 1.0)
    return float(p) if p.ndim == 0 else p


def t_quantile(q: float, df: int) -> float:
    """The q-quantile (0.5 < q < 1) of Student's t with integer df, by bisection on t_two_sided_p to
    1e-12 (t_quantile(0.975, 2) = 4.302653, (0.975, 4) = 2.776445)."""
    if not 0.5 < q < 1:
        raise ValueError(f"t_quantile: q must lie in (0.5, 1), got {q}")
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > 2 * (1 - q):
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 2 * (1 - q) else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def seed_paired_t(diffs) -> dict:
    """The primary test of every verdict: a paired t-test across training seeds on the per-seed
    difference of a metric (e.g. online success rate of arm a minus arm b, both evaluated on the
    same episodes, seed s of a against seed s of b).

    diffs: 1-D floats d_1 .. d_S, one per seed (S = n_seeds). With dbar = mean(d) and
    sd = sqrt(sum (d_s - dbar)^2 / (S - 1)), se = sd / sqrt(S), t = dbar / se on S - 1 degrees of
    freedom: p = P(|T_{S-1}| >= |t|), 95% interval dbar +- t_{0.975, S-1} * se.

    Why this and not the two-level bootstrap or pooled McNemar: a training seed is the unit that
    varies between repeats of the experiment, and there are 3-5 of them. The per-seed difference
    already averages ~160 paired episodes, so it is close to normal, and the t-test's S - 1 degrees
    of freedom account for an unknown between-seed spread exactly. A bootstrap over 3 seeds has 10
    distinct seed-level resamples, never leaves the observed range and under-covers (its p-value
    floor is 1 / (B + 1) whatever the spread); McNemar on the pooled episodes treats them as
    independent and ignores the seed spread. null_fpr simulates all three under no true effect.

    Returns {diff, diff_ci95 [lo, hi], p_value, n_seeds, per_seed_diff, test}; p_value and the
    interval are nan for fewer than 2 seeds; when every d_s is equal (sd 0), p is 0 if dbar != 0
    (the sign is the same at every seed and nothing varies) and 1 otherwise. Raises ValueError on an
    empty or non-1-D input."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"seed_paired_t: need a non-empty 1-D array of per-seed differences, got shape {d.shape}")
    S, dbar = int(d.size), float(d.mean())
    out = {"diff": dbar, "n_seeds": S, "per_seed_diff": [float(v) for v in d],
           "test": f"paired t-test across {S} seeds (primary)"}
    if S < 2:
        return {**out, "diff_ci95": [float("nan")] * 2, "p_value": float("nan")}
    se = float(d.std(ddof=1)) / math.sqrt(S)
    if se <= 1e-15:
        return {**out, "diff_ci95": [dbar, dbar], "p_value": 0.0 if abs(dbar) > 1e-15 else 1.0}
    half = t_quantile(0.975, S - 1) * se
    return {**out, "diff_ci95": [dbar - half, dbar + half], "p_value": t_two_sided_p(dbar / se, S - 1)}


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


def tango_interval(b: int, c: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Tango's score interval (Tango 1998, Stat Med 17:891) of a difference of paired proportions,
    delta = (b - c) / n: b pairs where only A succeeded, c where only B did, n pairs in all.

    The interval is every delta whose score statistic stays within z:
        T(delta) = (b - c - n delta) / sqrt(n (2 q(delta) + delta (1 - delta))),
    q(delta) the maximum-likelihood share of only-B pairs given delta, the root of A q^2 + B q + C with
    A = 2n, B = -b - c + (2n - b + c) delta, C = -c delta (1 - delta). T(0) is McNemar's z. Each end is
    found by bisection (T decreases in delta). Unlike a bootstrap it is never zero-width: with no
    discordant pair (b = c = 0) it is [-z^2 / (n + z^2), +z^2 / (n + z^2)], and with c = 0 it is
    [(b - z^2) / (n + z^2), Wilson's upper limit of b / n]. Raises ValueError on counts that do not fit."""
    if min(b, c) < 0 or b + c > n or n < 1:
        raise ValueError(f"tango_interval: b={b}, c={c} discordant pairs of n={n}")

    def score(d: float) -> float:
        bb = -b - c + (2 * n - b + c) * d
        cc = -c * d * (1 - d)
        q = (math.sqrt(max(bb * bb - 8 * n * cc, 0.0)) - bb) / (4 * n)
        var = n * (2 * q + d * (1 - d))
        return (b - c - n * d) / math.sqrt(var) if var > 0 else math.copysign(math.inf, b - c - n * d)

    def end(inside: float, outside: float) -> float:  # |T| <= z at `inside` (the estimate), > z at `outside`
        if abs(score(outside)) <= z:  # the whole side is within z: the limit is -1 or +1
            return outside
        for _ in range(100):
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if abs(score(mid)) <= z else (inside, mid)
        return inside

    d = (b - c) / n
    return (end(d, -1.0), end(d, 1.0))


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


def _mcnemar_exact_vec(b, c) -> np.ndarray:
    """mcnemar_exact over arrays of counts (the null simulation's thousands of repeats): the
    binomial tail from log-pmfs, one cumulative sum per distinct number of discordant pairs."""
    b, c = np.asarray(b, dtype=int), np.asarray(c, dtype=int)
    n, k = b + c, np.minimum(b, c)
    p = np.ones(n.shape)
    for m in np.unique(n[n > 0]):
        i = np.arange(m + 1)
        logpmf = np.array([math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) for j in i]) - m * math.log(2)
        tail = np.cumsum(np.exp(logpmf))
        sel = n == m
        p[sel] = np.minimum(1.0, 2.0 * tail[k[sel]])
    return p


def _null_differences(rng, R: int, S: int, N: int, seed_sd: float, p0: float, rho: float) -> np.ndarray:
    """null_fpr's null model, R repeats: the paired outcome differences (R, S, N) in {-1, 0, 1} of two arms
    with the same mean p0, per-arm seed SD seed_sd, on N shared episodes (shared uniform with probability rho)."""
    prob = np.clip(p0 + seed_sd * rng.standard_normal((R, 2, S, 1)), 0.0, 1.0)  # (R, arm, S, 1)
    v = rng.random((R, 1, 1, N))  # the episodes' shared uniform
    u = np.where(rng.random((R, 2, S, N)) < rho, v, rng.random((R, 2, S, N)))
    y = (u < prob).astype(np.int8)  # (R, 2, S, N) outcomes
    return y[:, 0] - y[:, 1]


def null_fpr_interaction(n_seeds: int, n_episodes: tuple[int, int], seed_sd: tuple[float, float],
                         p0: tuple[float, float] = (0.3, 0.3), rho: float = 0.5, repeats: int = 4000,
                         alpha: float = 0.05, seed: int = 0) -> dict:
    """The false-positive rate of seed_paired_t on an interaction: per seed, the difference of two arms on
    one episode set minus their difference on another ((a - b) on set 1 - (a - b) on set 2; e.g. memory
    tasks and Markov tasks), under no effect on either set. Each set is null_fpr's null model with its own
    episodes n_episodes[i], seed SD seed_sd[i] and mean p0[i], drawn independently. Returns {n_seeds,
    n_episodes, seed_sd, repeats, primary_t}. Monte Carlo SE as null_fpr's."""
    if n_seeds < 2 or min(n_episodes) < 1 or min(seed_sd) < 0:
        raise ValueError(f"null_fpr_interaction: need n_seeds >= 2, n_episodes >= 1, seed_sd >= 0 "
                         f"(got {n_seeds}, {n_episodes}, {seed_sd})")
    rng = np.random.default_rng(seed)
    S, p_t, done = n_seeds, [], 0
    while done < repeats:
        R = min(1000, repeats - done)
        stat = sum(sign * _null_differences(rng, R, S, n, sd, p, rho).mean(axis=2)
                   for sign, n, sd, p in zip((1, -1), n_episodes, seed_sd, p0))  # (R, S)
        dbar, se = stat.mean(axis=1), stat.std(axis=1, ddof=1) / math.sqrt(S)
        t = np.divide(dbar, se, out=np.where(np.abs(dbar) > 0, np.inf, 0.0), where=se > 0)
        p_t.append(t_two_sided_p(t, S - 1))
        done += R
    return {"n_seeds": S, "n_episodes": list(n_episodes), "seed_sd": [float(x) for x in seed_sd],
            "repeats": int(repeats), "primary_t": float(np.mean(np.concatenate(p_t) < alpha))}


def null_fpr(n_seeds: int, n_episodes: int, seed_sd: float, p0: float = 0.3, rho: float = 0.5,
             repeats: int = 4000, boot_repeats: int = 0, n_boot: int = 400, alpha: float = 0.05,
             seed: int = 0) -> dict:
    """False-positive rates at nominal `alpha` under no true effect, simulated, of the primary test
    (seed_paired_t), pooled McNemar (mcnemar_exact) and, when boot_repeats > 0, the two-level
    bootstrap (paired_bootstrap with groups = seeds).

    The null model, per repeat: two arms a, b, each trained with n_seeds seeds; the success rate of
    arm x at seed s is p_xs = clip(p0 + seed_sd * z_xs, 0, 1), z_xs ~ N(0, 1) independent (seed_sd:
    the between-seed SD of an arm's success rate; both arms have the same mean: no effect). Every
    (arm, seed) plays the same n_episodes episodes; episode i has one shared uniform v_i, and the
    outcome of (x, s, i) is 1[u < p_xs] with u = v_i with probability rho, else a fresh uniform, so
    the outcome's mean is exactly p_xs and both arms succeed and fail on the same episodes more
    often than by chance (paired episodes, as online evaluation on fixed episode seeds is).

    The bootstrap is the one of paired_bootstrap (resample seeds, then episodes within each drawn
    seed; shifted-null p), vectorised: the resampled mean of seed j's differences is drawn as
    (n_plus - n_minus) / n_episodes with (n_plus, n_minus) multinomial on seed j's frequencies of
    +1 and -1, which is exactly the episode-level resample's distribution.

    Returns {n_seeds, n_episodes, seed_sd, repeats, primary_t, mcnemar, bootstrap (None when
    boot_repeats is 0)}: the fraction of repeats with p < alpha. Monte Carlo SE ~
    sqrt(0.05 * 0.95 / repeats) = 0.0034 at 4000 repeats."""
    if n_seeds < 2 or n_episodes < 1 or seed_sd < 0:
        raise ValueError(f"null_fpr: need n_seeds >= 2, n_episodes >= 1, seed_sd >= 0 "
                         f"(got {n_seeds}, {n_episodes}, {seed_sd})")
    rng = np.random.default_rng(seed)
    S, N = n_seeds, n_episodes
    p_t, p_mc, p_b = [], [], []
    done = 0
    while done < max(repeats, boot_repeats):  # chunks of 1000 repeats keep memory at ~100 MB
        R = min(1000, max(repeats, boot_repeats) - done)
        d = _null_differences(rng, R, S, N, seed_sd, p0, rho)  # (R, S, N) paired differences in {-1, 0, 1}
        per_seed = d.mean(axis=2)  # (R, S)
        dbar = per_seed.mean(axis=1)  # (R,)
        se = per_seed.std(axis=1, ddof=1) / math.sqrt(S)
        t = np.divide(dbar, se, out=np.where(np.abs(dbar) > 0, np.inf, 0.0), where=se > 0)
        p_t.append(t_two_sided_p(t, S - 1))
        p_mc.append(_mcnemar_exact_vec((d == 1).sum(axis=(1, 2)), (d == -1).sum(axis=(1, 2))))
        Rb = min(R, boot_repeats - done) if boot_repeats > done else 0
        if Rb:
            f_plus = (d[:Rb] == 1).mean(axis=2)  # (Rb, S)
            f_minus = (d[:Rb] == -1).mean(axis=2)
            pick = rng.integers(S, size=(Rb, n_boot, S))  # seeds drawn with replacement
            fp = np.take_along_axis(np.broadcast_to(f_plus[:, None, :], pick.shape), pick, axis=2)  # (Rb, B, S)
            fm = np.take_along_axis(np.broadcast_to(f_minus[:, None, :], pick.shape), pick, axis=2)
            n_plus = rng.binomial(N, fp)
            rest = np.divide(fm, 1.0 - fp, out=np.zeros_like(fm), where=fp < 1.0)
            n_minus = rng.binomial(N - n_plus, np.clip(rest, 0.0, 1.0))
            stat = ((n_plus - n_minus) / N).mean(axis=2)  # (Rb, B) bootstrap means
            obs = dbar[:Rb, None]
            p_b.append((1 + np.sum(np.abs(stat - obs) >= np.abs(obs) - 1e-12, axis=1)) / (1 + n_boot))
        done += R
    rate = lambda ps, k: float(np.mean(np.concatenate(ps)[:k] < alpha))  # noqa: E731
    return {"n_seeds": S, "n_episodes": N, "seed_sd": float(seed_sd), "repeats": int(repeats),
            "primary_t": rate(p_t, repeats), "mcnemar": rate(p_mc, repeats),
            "bootstrap": rate(p_b, boot_repeats) if boot_repeats else None, "boot_repeats": int(boot_repeats)}


def seed_sd_of(per_seed_rates: dict, n_episodes: int) -> float:
    """The between-seed SD of a success rate measured in a run, for null_fpr: per_seed_rates
    {arm: [rate of seed s, ...]} (arms with >= 2 seeds count). The pooled within-arm variance of the
    per-seed rates, minus the binomial variance p (1 - p) / n_episodes that episode sampling alone
    gives, floored at 0, square-rooted. nan when no arm has 2 seeds."""
    num = den = binom = 0.0
    for rates in per_seed_rates.values():
        r = np.asarray([x for x in rates if x is not None], dtype=float)
        if r.size < 2:
            continue
        num += float(((r - r.mean()) ** 2).sum())
        den += r.size - 1
        binom += float((r * (1 - r)).sum()) / n_episodes * (r.size - 1) / r.size
    if den == 0:
        return float("nan")
    return math.sqrt(max(0.0, (num - binom) / den))


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


"""Verdicts with their uncertainty: seed-level t tests, exact binomial intervals, Holm's
correction over a family of claims, and the copy probe's gains.

A claim about what training gives is tested over seeds: one value per seed (a mean
over the evaluation sequences, or a paired difference), Student's t interval and
two-sided p value (`t_test`). A skill that is learned or not (the passkey) is counted:
k of n seeds, or of n test sequences, with the Clopper-Pearson interval
(`binomial_interval`). A chapter section's claims form a `Family`; Holm's step-down
correction (`holm`) keeps its family-wise error at 5%, and a claim whose adjusted p
value does not stay below 0.05 is labelled exploratory. `copy_gains` reads the copy
probe of posenc.study.longcontext from a study's per-sequence values.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .summary import t_interval


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (the regularized incomplete
    beta function, by its continued fraction)."""
    if int(df) != df or df < 1:
        raise ValueError(f"df must be a positive integer, got {df!r}")
    if not math.isfinite(t):
        return 0.0 if t < 0 else 1.0
    tail = 0.5 * _beta_inc(df / 2, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = (
        math.lgamma(a + b)
        - math.lgamma(a)
        - math.lgamma(b)
        + a * math.log(x)
        + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):  # the continued fraction converges on this side
        return 1.0 - _beta_inc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h / a


def t_test(values, null: float = 0.0, level: float = 0.95) -> dict:
    """One value per seed: mean, t interval and the two-sided p value of "the mean is
    `null`" (seeds as the sample; see summary.t_interval)."""
    values = np.asarray(values, dtype=float)
    mean, lo, hi = t_interval(values, level)
    spread = values.std(ddof=1) / math.sqrt(len(values))
    if spread == 0:
        p = 1.0 if mean == null else 0.0
    else:
        p = 2 * (1 - t_cdf(abs(mean - null) / spread, len(values) - 1))
    return {
        "mean": mean,
        "lo": lo,
        "hi": hi,
        "p": float(min(1.0, p)),
        "seeds": len(values),
    }


def binomial_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion, k successes in n trials:
    each bound found by bisection on the binomial tail."""
    if int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"need integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    alpha = (1 - level) / 2

    def upper_tail(p: float) -> float:  # P(X >= k) for X ~ Binomial(n, p)
        return sum(_binomial_pmf(i, n, p) for i in range(k, n + 1))

    def solve(target, rising) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            if (upper_tail(mid) < target) == rising:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(alpha, True)
    # the upper bound: P(X <= k) = alpha, i.e. P(X >= k + 1) = 1 - alpha
    upper = 1.0 if k == n else _solve_upper(k, n, alpha)
    return lower, upper


def _binomial_pmf(i: int, n: int, p: float) -> float:
    if p <= 0:
        return 1.0 if i == 0 else 0.0
    if p >= 1:
        return 1.0 if i == n else 0.0
    log = (
        math.lgamma(n + 1)
        - math.lgamma(i + 1)
        - math.lgamma(n - i + 1)
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )
    return math.exp(log)


def _solve_upper(k: int, n: int, alpha: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        at_most = sum(_binomial_pmf(i, n, mid) for i in range(k + 1))
        if at_most > alpha:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p values, in the given order: the i-th smallest of m
    is multiplied by m - i + 1, then made non-decreasing, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError("p_values must be numbers in [0, 1]")
    order = np.argsort(p, kind="stable")
    m = len(p)
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


class Family:
    """The claims of one section, each tested over seeds, judged together by Holm.

    `claim(name, values, expect, null)`: `values` one per seed, `expect` the side of
    `null` (default 0) the text states (">": above, "<": below). `table()` gives each
    claim's mean, t interval, p value, Holm-adjusted p value, whether it lies on the
    stated side, and its label: "holds" (the stated side, adjusted p < alpha) or
    "exploratory".
    """

    def __init__(self, name: str, alpha: float = 0.05):
        self.name, self.alpha, self.claims = name, alpha, {}

    def claim(self, name: str, values, expect: str = ">", null: float = 0.0) -> dict:
        if expect not in (">", "<"):
            raise ValueError(f"expect must be '>' or '<', got {expect!r}")
        if name in self.claims:
            raise ValueError(f"claim {name!r} is already in family {self.name!r}")
        test = t_test(values, null)
        self.claims[name] = {**test, "expect": expect, "null": null}
        return test

    def table(self) -> pd.DataFrame:
        frame = pd.DataFrame.from_dict(self.claims, orient="index")
        if frame.empty:
            return frame
        frame["p_holm"] = holm(frame.p.to_numpy())
        above = frame["mean"] > frame["null"]
        signed = np.where(frame.expect == ">", above, frame["mean"] < frame["null"])
        frame["sign_as_stated"] = signed
        frame["label"] = np.where(
            signed & (frame.p_holm < self.alpha), "holds", "exploratory"
        )
        return frame

    def label(self, name: str) -> str:
        return self.table().loc[name, "label"]


def copy_gains(sequences: pd.DataFrame, label: str) -> pd.DataFrame:
    """The copy probe of one label (a frame of summary.read_sequences): per seed,
    evaluation length and distance, the mean over the probe sequences of the control's
    loss minus the copy's (positive: the earlier copy helped) and minus the reversed
    copy's, with the distance and whether the earlier copy lies inside the window
    (distance + segment <= length).

    Columns: seed, eval_len, distance, gain, reversed_gain (NaN without reversed
    copies), in_sight.
    """
    part = sequences[(sequences.task == "copy") & (sequences.label == label)]
    if part.empty:
        raise ValueError(f"no copy-probe values for {label!r}")
    control = part[part.protocol == "copy_control"].set_index(["seed", "eval_len"])
    flipped = part[part.protocol == "copy_reversed"].set_index(
        ["seed", "eval_len", "bucket"]
    )["values"]
    rows = []
    for row in part[part.protocol == "copy"].itertuples():
        base = control.loc[(row.seed, row.eval_len), "values"]
        key = (row.seed, row.eval_len, row.bucket)
        rows.append(
            {
                "seed": int(row.seed),
                "eval_len": int(row.eval_len),
                "distance": int(float(row.bucket)),
                "gain": float(np.mean(base - row.values)),
                "reversed_gain": float(np.mean(base - flipped[key]))
                if key in flipped.index
                else float("nan"),
            }
        )
    frame = pd.DataFrame(rows)
    # one segment for every distance: the smallest distance is the shortest length
    # minus the segment (longcontext.probe_distances)
    segment = int(frame.eval_len.min() - frame.distance.min())
    frame["in_sight"] = frame.distance + segment <= frame.eval_len
    return frame.sort_values(["eval_len", "distance", "seed"], ignore_index=True)

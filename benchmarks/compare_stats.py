"""The comparison's statistics (compare_report.py prints them): the paired t-test over seeds with
its confidence interval and its equivalence test, the minimum detectable effect, the seed x arm
residual pooled over a family's arms, and the two corrections for a family of tests, Holm's and
Dunnett's. Every test is two-sided at ALPHA; every interval is the paired t-test's.
"""

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA, POWER = 0.05, 0.8  # every test two-sided at ALPHA; the detectable effect at POWER
MARGIN = 0.05  # the equivalence margin in EM, about what five seeds detect


@dataclass
class Paired:
    """The seeds' paired differences d = arm - reference of one measure (seed order)."""

    d: list[float]

    @property
    def mean(self) -> float:
        return statistics.mean(self.d)

    @property
    def sd(self) -> float:  # nan for one seed
        return statistics.stdev(self.d) if len(self.d) > 1 else math.nan

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(len(self.d))

    @property
    def p(self) -> float:
        """The paired t-test's two-sided p (t = mean / se, n - 1 degrees of freedom; Student
        1908); nan for one seed or no spread."""
        if not self.se > 0:
            return math.nan
        return float(2 * stats.t.sf(abs(self.mean / self.se), len(self.d) - 1))

    def ci(self, level: float = 1 - ALPHA) -> tuple[float, float]:
        """The paired t interval (Student 1908): mean -+ t(n - 1 df, (1 + level) / 2) se; nan for
        one seed."""
        if len(self.d) < 2:
            return math.nan, math.nan
        half = stats.t.ppf((1 + level) / 2, len(self.d) - 1) * self.se
        return self.mean - half, self.mean + half

    def tost(self, margin: float = MARGIN) -> float:
        """Schuirmann's (1987) two one-sided tests of |true difference| >= margin: the larger of
        the p of t = (mean + margin) / se (upper tail) and of t = (mean - margin) / se (lower
        tail), n - 1 df. Below ALPHA exactly when the 1 - 2 ALPHA (90%) interval lies within
        -+margin: then the difference is within the margin. nan for one seed or no spread."""
        if not self.se > 0:
            return math.nan
        df = len(self.d) - 1
        below = stats.t.sf((self.mean + margin) / self.se, df)  # H0: difference <= -margin
        above = stats.t.cdf((self.mean - margin) / self.se, df)  # H0: difference >= +margin
        return float(max(below, above))


def paired(a: list[float], b: list[float]) -> Paired:
    return Paired([x - y for x, y in zip(a, b)])


def detectable(df: int, crit: float) -> float:
    """The true difference, in standard errors, that a two-sided t-test on df degrees of freedom
    which rejects beyond -+crit detects with probability POWER: the noncentrality delta where
    P(|T| > crit) = POWER for T noncentral t (df, delta) (Cohen 1988, ch. 2). At crit = t(4 df,
    0.975), a paired test on 5 seeds: 3.761 (the normal approximation t_.975 + t_.80 = 2.776 +
    0.941 = 3.717 is 1% short); nan without degrees of freedom."""
    if df < 1 or math.isnan(crit):
        return math.nan
    power = lambda nc: stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc)  # both tails
    return optimize.brentq(lambda nc: power(nc) - POWER, 0.0, 1000.0)


def holm(ps: list[float]) -> list[float]:
    """Holm's (1979) step-down adjustment of one family's p-values (nan: not a test, not counted):
    the k-th smallest of m is multiplied by m - k + 1, capped at 1 and never below the one
    before."""
    tests = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out, floor = [math.nan] * len(ps), 0.0
    for k, (p, i) in enumerate(tests):
        floor = out[i] = max(floor, min(1.0, (len(tests) - k) * p))
    return out


def residual_sd(table: list[list[float]]) -> tuple[float, int]:
    """The seed x arm residual sd of a two-way table (a row per arm, a column per seed) and its
    degrees of freedom: the randomized-block model y = overall + arm + seed + residual, whose
    residual y - (arm mean) - (seed mean) + (grand mean) has sum of squares on (A - 1)(S - 1)
    df (Fisher 1935; Montgomery, Design and Analysis of Experiments, ch. 4). The sd of a paired
    difference between two arms is this times sqrt 2. nan, 0 df for one seed."""
    y = np.asarray(table, dtype=float)  # (A, S)
    arms, seeds = y.shape
    df = (arms - 1) * (seeds - 1)
    if df < 1:
        return math.nan, 0
    residual = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()  # (A, S)
    return math.sqrt((residual**2).sum() / df), df


def dunnett_coverage(c: float, k: int, df: int) -> float:
    """P(max_i |T_i| <= c) for Dunnett's (1955) k statistics T_i = (mean_i - mean_0) / (s
    sqrt(2 / n)): k arms against one control, n seeds each, s a pooled sd on df degrees of
    freedom. Given the control's standardized mean z and u = s / sigma, the k arms are
    independent: P = E_u E_z [Phi(z + c u sqrt 2) - Phi(z - c u sqrt 2)]^k with z ~ N(0, 1) and
    u ~ sqrt(chi2(df) / df). Both integrals on fixed grids (u from 0.02 to 6, z from -9 to 9,
    steps of 0.02): from 2 df up, k = 1 gives Student's t's quantiles to 1e-6."""
    step = 0.02
    u = np.arange(step, 6.0, step)  # (U,) s / sigma
    weight = stats.chi.pdf(u * math.sqrt(df), df) * math.sqrt(df) * step  # (U,) its density
    z = np.arange(-9.0, 9.0 + step / 2, step)  # (Z,)
    h = c * math.sqrt(2) * u[:, None]  # (U, 1)
    inner = (stats.norm.cdf(z + h) - stats.norm.cdf(z - h)) ** k @ stats.norm.pdf(z) * step  # (U,)
    return float(weight @ inner)


@functools.cache
def dunnett_critical(k: int, df: int) -> float:
    """Dunnett's two-sided critical value: the c where P(max_i |T_i| <= c) = 1 - ALPHA
    (dunnett_coverage): 2.735 for 5 arms against one on 20 df (6 arms on 5 seeds), 2.635 on 35
    (8 seeds); Student's t for k = 1."""
    return optimize.brentq(lambda c: dunnett_coverage(c, k, df) - (1 - ALPHA), 0.5, 1000.0)


def dunnett_p(t: float, k: int, df: int) -> float:
    """Dunnett's single-step adjusted p of one of k comparisons with the control, t its statistic
    on the pooled sd: P(max_i |T_i| >= |t|) when no arm differs; nan for nan t."""
    return math.nan if math.isnan(t) else 1 - dunnett_coverage(abs(t), k, df)


@dataclass
class Family:
    """One family of paired tests of one measure: each (arm, reference) with the seeds' paired
    differences and its adjusted p; the sd of a paired difference pooled over the family's arms
    (the seed x arm residual times sqrt 2) and its df; the df and critical value of the test at
    the α its adjusted p uses (Dunnett's; Holm's for the smallest p, ALPHA / tests, on the rows'
    own sd); the difference detectable there (mde) and at ALPHA alone (mde_alone), at POWER and
    the pooled sd."""

    dunnett: bool
    tests: dict[tuple[str, str], tuple[Paired, float]]
    sd: float
    df: int
    test_df: int
    crit: float
    mde: float
    mde_alone: float


def family(values: dict[str, list[float]], pairs: list[tuple[str, str]], dunnett: bool):
    """The family of paired tests `pairs` (arm, reference) on the seeds' `values` (arm -> one per
    seed, seed order). dunnett: many against one reference, each t = mean / (s sqrt(2 / n)) on
    the pooled residual s of every arm in the pairs, adjusted by Dunnett's single-step test (its
    df (arms - 1)(n - 1)); else Holm over the pairs' own paired t-tests (n - 1 df)."""
    diffs = [paired(values[arm], values[ref]) for arm, ref in pairs]
    residual, df = residual_sd([values[n] for n in dict.fromkeys(n for p in pairs for n in p)])
    n, k = len(diffs[0].d), len(diffs)
    se = residual * math.sqrt(2 / n)  # of a paired difference's mean, pooled
    test_df = df if dunnett else n - 1
    if test_df < 1:  # one seed: no test
        crit, alone, adjusted = math.nan, math.nan, [math.nan] * k
    elif dunnett:
        crit, alone = dunnett_critical(k, df), stats.t.ppf(1 - ALPHA / 2, df)
        adjusted = [dunnett_p(x.mean / se if se > 0 else math.nan, k, df) for x in diffs]
    else:
        crit, alone = (stats.t.ppf(1 - ALPHA / (2 * m), n - 1) for m in (k, 1))
        adjusted = holm([x.p for x in diffs])
    mde, mde_alone = (detectable(test_df, c) * se for c in (crit, alone))
    tests = dict(zip(pairs, zip(diffs, adjusted)))
    return Family(dunnett, tests, residual * math.sqrt(2), df, test_df, crit, mde, mde_alone)

"""The size ladder's power law, L = a·(C/C0)^-b + e, and how far its points pin it down.

C is a point's training compute, C0 the smallest point's (so that a is a loss, not of the order of
C^b), e the floor the loss tends to. The fit is scipy's curve_fit: least squares on the losses.

Standard errors come from curve_fit's covariance, scaled by the residuals' variance, and each
parameter's 95% interval is its standard error times Student's t quantile with the residual
degrees of freedom (n - 3: at 3 of them 3.18, not the normal 1.96): a point's
val loss carries no known noise of its own (its eval batches measure the evaluation's noise, not
the training run's: seed, data order), so the scatter about the curve is the only measure of it.
A covariance is a straight-line picture of the fit at its optimum, though. With few points, or a
floor the points hardly constrain, the residuals change little along a curved ridge of (a, b, e),
and the standard errors understate how far b can move. So the exponent is also profiled: with b
held fixed the law is linear in a and e, a bounded linear least-squares problem with one answer
(scipy's lsq_linear; a fixed floor would leave a and b a nonlinear fit of their own, with local
minima), and the exponents whose best residual sum of squares stays within the 95%
profile-likelihood bound, S_min·(1 + F(1, n-3; 0.95) / (n-3)) (Bates and Watts, Nonlinear
Regression Analysis, 1988, ch. 6), are those the points cannot tell from the best one. The floors
and the predictions along that range are read off the same fits. (A bootstrap of a ladder's 4 to
8 points would often draw fewer distinct points than the law has parameters.)

The law is called not identified, and the report says so in words, when it leaves at most one
residual degree of freedom (a single residual cannot measure the scatter), or when b's profile
range spans more than a factor of WIDE (the exponent is not known to within a factor of 2).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import OptimizeWarning, brentq, curve_fit, lsq_linear
from scipy.stats import f as f_dist
from scipy.stats import t as t_dist

FIT_PARAMS = 3  # a, b, e
LEVEL = 0.95  # the profile range's confidence level
WIDE = 2.0  # b's profile range spanning more than this factor: not identified
B_MAX = 5.0  # the exponents considered: (0, B_MAX]
# one exponent's best law: residual sum of squares, b, a, e
Fixed = tuple[float, float, float, float]
EXPONENTS = np.linspace(0.0, B_MAX, 501)[1:]  # the profile's grid; its ends are refined


@dataclass(frozen=True)
class Estimate:
    """A fitted parameter, its standard error (None: no residual left to estimate it from) and
    its 95% t interval (the residual degrees of freedom: with 3 of them, the standard error
    times 3.18, not 2)."""

    value: float
    se: float | None
    dof: int = 0

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.se is None or not math.isfinite(self.se) or self.dof < 1:
            return None
        half = float(t_dist.ppf(0.5 + LEVEL / 2, self.dof)) * self.se
        return self.value - half, self.value + half

    def __str__(self) -> str:
        interval = self.interval
        if interval is None:
            return plus_minus(self.value, self.se)
        low, high = interval
        return f"{plus_minus(self.value, self.se)} ({LEVEL:.0%}: {low:.3g} to {high:.3g})"


@dataclass(frozen=True)
class Law:
    """L = a·(C/c0)^-b + e."""

    a: float
    b: float
    e: float
    c0: float

    def loss(self, compute: Any) -> Any:
        return self.a * (np.asarray(compute, dtype=float) / self.c0) ** -self.b + self.e


@dataclass
class Profile:
    """The exponents the points cannot tell from the best one, each with its best a and e."""

    laws: list[Law]  # sorted by b, the range's ends included
    factor: float  # their residual sum of squares is within this factor of the best (inf: any)
    open_below: bool  # the range reaches the smallest exponent considered: no lower bound
    open_above: bool  # it reaches B_MAX: no upper bound

    @property
    def b_range(self) -> tuple[float, float]:
        return self.laws[0].b, self.laws[-1].b

    @property
    def e_range(self) -> tuple[float, float]:
        floors = [law.e for law in self.laws]
        return min(floors), max(floors)

    def loss_range(self, compute: float) -> tuple[float, float]:
        """The val loss at `compute` over the range's laws: how far the extrapolation can move."""
        losses = [float(law.loss(compute)) for law in self.laws]
        return min(losses), max(losses)

    @property
    def wide(self) -> bool:
        lo, hi = self.b_range
        return self.open_below or self.open_above or hi > WIDE * lo


@dataclass
class Fit:
    """The law over the ladder's points, its parameters' standard errors and b's profile."""

    law: Law
    a: Estimate
    b: Estimate
    e: Estimate
    dof: int  # residual degrees of freedom: points - FIT_PARAMS
    rss: float
    profile: Profile
    points: list[dict[str, Any]] = field(default_factory=list)  # + fitted, residual
    warning: str | None = None  # why the law is not identified, in words; None when it is

    @property
    def identified(self) -> bool:
        return self.warning is None

    def loss(self, compute: Any) -> Any:
        return self.law.loss(compute)


def plus_minus(value: float, se: float | None) -> str:
    """`0.14 ± 0.08`: the standard error to one significant figure (two where it starts with a
    1), the value to the same decimal place; no standard error, the value to two figures."""
    if se is None or not math.isfinite(se):
        return f"{value:.2g} (no standard error)"
    places = 4
    if se > 0:
        exponent = math.floor(math.log10(se))
        places = -exponent + (1 if se / 10**exponent < 2 else 0)
    places = min(places, 4)  # no more than 4 decimals: a smaller error shows as < 0.0001
    shown = max(places, 0)  # an error of tens rounds to tens, shown without decimals
    error = f"{round(se, places):.{shown}f}"
    if float(error) == 0:
        error = f"< {10**-places:.{places}f}"
    return f"{round(value, places):.{shown}f} ± {error}"


def fit_power_law(points: list[dict[str, Any]]) -> Fit | str:
    """The law over `points` (each with compute and loss), or why there is none."""
    if len(points) < FIT_PARAMS:
        return f"{len(points)} model size(s) to fit: the law's {FIT_PARAMS} parameters need 3"
    c = np.array([float(p["compute"]) for p in points])
    y = np.array([float(p["loss"]) for p in points])
    x = c / c.min()
    dof, factor = len(points) - FIT_PARAMS, profile_factor(len(points) - FIT_PARAMS)
    grid = [_fixed_exponent(x, y, b) for b in EXPONENTS]
    _, b0, a0, e0 = min(grid)  # the grid's best: a start from which curve_fit only descends
    try:
        (a, b, e), se = _least_squares(x, y, (a0, b0, e0), dof)
    except (RuntimeError, ValueError) as err:
        return f"no fit: {err}"
    law = Law(a, b, e, float(c.min()))
    rss = float(np.sum((y - law.loss(c)) ** 2))
    best = (rss, b, a, e)  # the fit beside the grid's exponents: the profile's lowest point
    profile = profile_exponent(x, y, law, sorted([*grid, best], key=lambda g: g[1]), factor)
    a_, b_, e_ = (Estimate(v, err, dof) for v, err in zip((a, b, e), se, strict=True))
    fit = Fit(law, a_, b_, e_, dof, rss, profile)
    for p in points:
        fitted = float(law.loss(p["compute"]))
        fit.points.append(p | {"fitted": fitted, "residual": p["loss"] - fitted})
    fit.warning = not_identified(len(points), dof, profile)
    return fit


def _least_squares(
    x: np.ndarray, y: np.ndarray, p0: tuple[float, float, float], dof: int
) -> tuple[tuple[float, float, float], list[float | None]]:
    """curve_fit from `p0` within the law's bounds; the parameters and their standard errors."""

    def law(x: np.ndarray, a: float, b: float, e: float) -> np.ndarray:
        return a * x**-b + e

    with warnings.catch_warnings():  # no residual: curve_fit warns that pcov is infinite
        warnings.simplefilter("ignore", OptimizeWarning)
        (a, b, e), pcov = curve_fit(
            law, x, y, p0=p0, bounds=([0, 0, 0], [np.inf, B_MAX, y.min()]), maxfev=20000
        )
    variances = np.diag(pcov) if dof > 0 else np.full(3, np.inf)
    se = [math.sqrt(v) if math.isfinite(v) and v >= 0 else None for v in variances]
    return (float(a), float(b), float(e)), se


def _fixed_exponent(x: np.ndarray, y: np.ndarray, b: float) -> Fixed:
    """The best a and e for exponent `b` (a >= 0, 0 <= e <= the lowest loss): rss, b, a, e."""
    design = np.stack([x**-b, np.ones_like(x)], axis=1)
    bounds = ([0.0, 0.0], [np.inf, float(y.min())])
    a, e = lsq_linear(design, y, bounds=bounds, method="bvls").x
    return float(np.sum((y - design @ (a, e)) ** 2)), float(b), float(a), float(e)


def profile_factor(dof: int) -> float:
    """How far above the best residual sum of squares an exponent stays as good as the best,
    at LEVEL: 1 + F(1, dof) / dof (inf with no residual degree of freedom)."""
    return 1 + f_dist.ppf(LEVEL, 1, dof) / dof if dof >= 1 else math.inf


def profile_exponent(
    x: np.ndarray, y: np.ndarray, best: Law, grid: list[Fixed], factor: float
) -> Profile:
    """The exponents around the best whose profile stays within `factor` of the best residual
    sum of squares: out from the best on each side to where it first crosses that bound.
    `grid`: _fixed_exponent at each of EXPONENTS."""
    rss = {g[1]: g[0] for g in grid}
    limit = min(rss.values()) * factor if math.isfinite(factor) else math.inf

    def excess(b: float) -> float:
        return (rss[b] if b in rss else _fixed_exponent(x, y, b)[0]) - limit

    lo, open_below = _end(excess, best.b, [g[1] for g in grid[::-1] if g[1] < best.b])
    hi, open_above = _end(excess, best.b, [g[1] for g in grid if g[1] > best.b])
    inside = [g for g in grid if lo < g[1] < hi] + [_fixed_exponent(x, y, b) for b in (lo, hi)]
    laws = [Law(a, b, e, best.c0) for _, b, a, e in inside if b != best.b] + [best]
    return Profile(sorted(laws, key=lambda law: law.b), factor, open_below, open_above)


def _end(excess: Callable[[float], float], best: float, outward: list[float]) -> tuple[float, bool]:
    """The range's end going out from the best exponent through `outward`: where `excess` first
    turns positive (brentq between two exponents of the grid), or the grid's last exponent, open
    (the points set no bound that way)."""
    inner = best
    for b in outward:
        if excess(b) > 0:
            if excess(inner) > 0:  # the best itself at the bound (a noise-free fit)
                return inner, False
            return float(brentq(excess, inner, b)), False
        inner = float(b)
    return inner, True


def not_identified(n: int, dof: int, profile: Profile) -> str | None:
    """Why the law is not identified, in words (with the range b takes), or None."""
    reasons = []
    if dof <= 1:
        reasons.append(
            f"{n} points for the law's {FIT_PARAMS} parameters leave {dof} residual degree"
            f"{'' if dof == 1 else 's'} of freedom, too few to measure the scatter about the curve"
        )
    if profile.wide:
        reasons.append("the points do not pin the exponent down to within a factor of 2")
    if not reasons:
        return None
    return f"{'; '.join(reasons)}. {range_words(profile)}."


def b_bounds(profile: Profile) -> tuple[str, str]:
    """b's profile range as the page writes it: an open end as the end of what is considered."""
    b_lo, b_hi = profile.b_range
    low = "0" if profile.open_below else f"{b_lo:.2g}"
    return low, f"{B_MAX:g}" if profile.open_above else f"{b_hi:.2g}"


def range_words(profile: Profile) -> str:
    """b's profile range and the floors along it, in words."""
    (low, high), (e_lo, e_hi) = b_bounds(profile), profile.e_range
    high += " (the largest considered)" if profile.open_above else ""
    if math.isinf(profile.factor):
        how = "with no residual to tell them apart"
    else:
        how = (
            f"within the {LEVEL:.0%} profile bound (a residual sum of squares up to"
            f" {profile.factor:.3g}× the best's)"
        )
    return (
        f"Exponents b from {low} to {high} fit the points {how}, with floors e from"
        f" {e_lo:.3g} to {e_hi:.3g}"
    )

"""The size ladder's power law (lmpipe.report.powerlaw) on synthetic ladders from a known law:
its parameters and their standard errors, the exponent's profile range, and the warning where the
points do not identify the law."""

from __future__ import annotations

import numpy as np
import pytest

from lmpipe.report.powerlaw import Estimate, fit_power_law, plus_minus

A, B, E = 2.0, 0.3, 1.5  # the law the ladders are drawn from: L = A (C / C0)^-B + E


def ladder(compute: np.ndarray, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """Points of the known law at `compute`, with Gaussian noise of sd `noise` on the loss."""
    rng = np.random.default_rng(seed)
    c0 = float(compute[0])
    return [
        {"run": f"m{i}", "compute": float(c), "loss": A * (c / c0) ** -B + E + noise * z}
        for i, (c, z) in enumerate(zip(compute, rng.standard_normal(len(compute)), strict=True))
    ]


WIDE_SPREAD = np.geomspace(1e12, 1e15, 8)


def test_a_known_law_is_recovered_within_its_standard_error():
    fit = fit_power_law(ladder(WIDE_SPREAD, noise=0.02, seed=1))
    assert fit.identified and fit.dof == 5
    for estimate, true in ((fit.a, A), (fit.b, B), (fit.e, E)):
        assert 0 < estimate.se < 0.5 * true
        assert abs(estimate.value - true) < 2 * estimate.se, (estimate, true)
    lo, hi = fit.profile.b_range
    assert lo < B < hi and lo < fit.b.value < hi


def test_the_standard_error_is_the_exponents_scatter_over_repeated_ladders():
    """Over 40 noisy ladders the stated standard error of b is about the sd of the fitted b's:
    neither zero nor inflated."""
    fits = [fit_power_law(ladder(WIDE_SPREAD, noise=0.02, seed=s)) for s in range(40)]
    spread = np.std([f.b.value for f in fits], ddof=1)
    stated = np.mean([f.b.se for f in fits])
    assert 0.67 < stated / spread < 1.5, (stated, spread)
    assert abs(np.mean([f.b.value for f in fits]) - B) < 2 * spread / np.sqrt(40)


def test_six_well_spread_noise_free_points_are_identified():
    fit = fit_power_law(ladder(np.geomspace(1e12, 1e16, 6)))
    assert fit.identified and fit.warning is None
    assert fit.b.value == pytest.approx(B, abs=1e-6)
    assert fit.profile.b_range == pytest.approx((B, B), abs=1e-4)
    assert max(abs(p["residual"]) for p in fit.points) < 1e-6


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_four_points_for_three_parameters_are_not_identified(noise):
    """One residual degree of freedom: warned, even where the points lie on the law."""
    fit = fit_power_law(ladder(np.geomspace(1e12, 1e15, 4), noise=noise))
    assert fit.dof == 1 and not fit.identified
    assert "4 points for the law's 3 parameters leave 1 residual degree of freedom" in fit.warning
    lo, hi = fit.profile.b_range
    assert lo <= fit.b.value <= hi
    assert f"Exponents b from {lo:.2g} to {hi:.2g} fit the points" in fit.warning


def test_three_points_leave_nothing_to_estimate_the_uncertainty_from():
    fit = fit_power_law(ladder(np.geomspace(1e12, 1e15, 3), noise=0.01))
    assert fit.dof == 0 and fit.b.se is None and str(fit.b).endswith("(no standard error)")
    assert fit.profile.open_below and fit.profile.open_above
    assert "leave 0 residual degrees of freedom" in fit.warning
    assert "with no residual to tell them apart" in fit.warning
    assert fit_power_law(ladder(np.geomspace(1e12, 1e15, 2))).startswith("2 model size(s)")


def test_points_over_a_narrow_range_of_compute_leave_the_exponent_open():
    """Residual degrees of freedom enough, but the floor trades against the exponent: the profile
    range spans more than a factor of 2, and the warning says so and gives it."""
    fit = fit_power_law(ladder(np.geomspace(1e12, 2e12, 6), noise=0.01))
    assert fit.dof == 3 and not fit.identified
    lo, hi = fit.profile.b_range
    assert hi > 2 * lo
    assert "residual degree" not in fit.warning
    assert "do not pin the exponent down to within a factor of 2" in fit.warning
    assert f"from {lo:.2g} to {hi:.2g}" in fit.warning


def test_the_predictions_range_widens_with_the_exponents():
    """Far out in compute the laws as good as the fit part: the range holds the fit's own value."""
    fit = fit_power_law(ladder(np.geomspace(1e12, 1e15, 4), noise=0.01))
    far = 1e21
    lo, hi = fit.profile.loss_range(far)
    assert lo <= float(fit.loss(far)) <= hi and hi - lo > 0.05


@pytest.mark.parametrize(
    "value, se, text",
    [
        (0.1432, 0.081, "0.14 ± 0.08"),
        (0.1432, 0.0143, "0.143 ± 0.014"),
        (6.123, 1.2, "6.1 ± 1.2"),
        (6.123, 3.4, "6 ± 3"),
        (152.0, 31.0, "150 ± 30"),
        (152.0, 14.0, "152 ± 14"),
        (0.3, 0.0, "0.3000 ± < 0.0001"),
        (0.31, None, "0.31 (no standard error)"),
    ],
)
def test_a_value_shows_only_the_digits_its_error_allows(value, se, text):
    assert plus_minus(value, se) == text


def test_each_parameter_gets_a_95_percent_t_interval_of_the_residual_dof():
    """Student's t at 97.5% with 3 dof is 3.182 (any table): not the normal 1.96, which covers
    87% at 3 dof; no residual left, no interval."""
    assert Estimate(1.0, 0.1, 3).interval == pytest.approx((0.6818, 1.3182), abs=1e-4)
    assert str(Estimate(1.0, 0.1, 3)) == "1.00 ± 0.10 (95%: 0.682 to 1.32)"
    assert Estimate(1.0, 0.1, 0).interval is None and Estimate(1.0, None, 3).interval is None

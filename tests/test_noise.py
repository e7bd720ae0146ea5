"""Which task can tell the runs apart (lmpipe.report.noise): signal, noise and SNR as AI2's
signal-and-noise code computes them (snr/metrics.py), from the runs' curves and seeds."""

from __future__ import annotations

import numpy as np
import pytest

from lmpipe.report.comparison import Row, Score
from lmpipe.report.noise import task_noise, undecided_words
from lmpipe.report.runs import Run


def reference_snr(signal_scores: list[float], noise_scores: list[float]) -> float:
    """allenai/signal-and-noise snr/metrics.py, signal_to_noise_ratio, restated with numpy."""
    dispersion = np.max([np.abs(a - b) for a in signal_scores for b in signal_scores])
    return (dispersion / np.mean(signal_scores)) / (np.std(noise_scores) / np.mean(noise_scores))


def run(name: str, curve: list[float]) -> Run:
    r = Run(name=name, settings={})
    r.hellaswag_curve = [{"step": 8 * i, "hellaswag": v} for i, v in enumerate(curve)]
    return r


def row(finals: list[float]) -> Row:
    n = len(finals)
    scores = [Score(v, None, 100) for v in finals]
    return Row("hellaswag", "HellaSwag", "acc_norm", "validation", scores, [None] * n)


def test_one_run_a_recipe_the_ratio_is_the_papers():
    """Two runs: signal from their final scores, noise from one run's last 5 evaluations (the
    paper's large-scale form, one model's checkpoints)."""
    a = run("a", [0.25, 0.27, 0.30, 0.29, 0.31, 0.30, 0.32])
    b = run("b", [0.25, 0.26, 0.27, 0.28, 0.28, 0.29, 0.28])
    (t,) = task_noise([a, b], [row([0.32, 0.28])])
    noise_a = reference_snr([0.32, 0.28], [0.30, 0.29, 0.31, 0.30, 0.32])
    noise_b = reference_snr([0.32, 0.28], [0.27, 0.28, 0.28, 0.29, 0.28])
    # the noise is each run's, averaged: the ratio is the signal over the mean noise
    signal = 0.04 / 0.30
    noises = [signal / noise_a, signal / noise_b]
    assert t.snr_checkpoints == pytest.approx(signal / np.mean(noises))
    assert t.signal == pytest.approx(signal) and t.spread == pytest.approx(0.04)
    assert t.seeds is None and not t.undecided


def test_seeds_give_the_noise_over_replicas_and_a_noisy_task_cannot_decide():
    """Two recipes, 3 seeds each, 1 point apart but 3 points between seeds: SNR over seeds below
    1, said before the numbers."""
    runs = [Run(name=f"{r}/seed={s}", settings={}) for r in "ab" for s in (1, 2, 3)]
    finals = [0.30, 0.33, 0.36, 0.31, 0.34, 0.37]
    (t,) = task_noise(runs, [row(finals)])
    expected = reference_snr([0.33, 0.34], [0.30, 0.33, 0.36])  # recipe a's seeds
    expected_b = reference_snr([0.33, 0.34], [0.31, 0.34, 0.37])
    signal = 0.01 / 0.335
    assert t.seeds == pytest.approx(np.mean([signal / expected, signal / expected_b]))
    assert t.snr_seeds < 1 and t.undecided and t.checkpoints is None
    words = undecided_words([t])
    assert words.startswith("HellaSwag cannot decide between these runs")

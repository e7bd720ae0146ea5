"""Which task can tell these runs apart: each task's signal, noise and their ratio.

The definitions are those of AI2's "Signal and Noise" (Heineman et al., 2025, arXiv:2508.13144;
github.com/allenai/signal-and-noise, snr/metrics.py `signal_to_noise_ratio` and
snr/snr_simple.py): a task's signal is the largest difference between the models' scores over
their mean (max |m_j - m_k| / m̄), its noise the standard deviation of one model's score over its
final checkpoints over their mean (σ / m̄; there, the last 5 evaluations), and SNR = signal /
noise. Here the models are the report's recipes (a replicated recipe's score: its seeds' mean),
and the noise is measured two ways, each where the runs give it:

- checkpoints: the last (up to 5) evaluations during training of each run
  (`eval.<section>.during_training`), on the items those score; over a short run the spread holds
  whatever trend is left at its end, so it overstates the noise of a converged one;
- seeds: the final scores of a recipe's seeds (lmpipe.replicas).

A task whose noise is larger than its signal (SNR below 1) cannot decide between these runs: the
page says so before its numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from lmpipe.report.comparison import Row
from lmpipe.report.runs import Run, by_recipe

LAST = 5  # the final in-training evaluations a noise reads (snr_simple.py: `lst[-5:]`)


@dataclass
class TaskNoise:
    key: str
    label: str
    signal: float | None  # max |m_j - m_k| / m̄ over the recipes' scores
    checkpoints: float | None  # σ / m̄ over the last in-training evaluations, mean over runs
    seeds: float | None  # σ / m̄ over a recipe's seeds, mean over replicated recipes
    spread: float | None  # max |m_j - m_k|, the largest difference between the recipes

    def snr(self, noise: float | None) -> float | None:
        if self.signal is None or not noise:
            return None
        return self.signal / noise

    @property
    def snr_checkpoints(self) -> float | None:
        return self.snr(self.checkpoints)

    @property
    def snr_seeds(self) -> float | None:
        return self.snr(self.seeds)

    @property
    def undecided(self) -> bool:
        """Its noise, either way measured, exceeds its signal."""
        ratios = [r for r in (self.snr_checkpoints, self.snr_seeds) if r is not None]
        return bool(ratios) and min(ratios) < 1


def relative_sd(values: list[float]) -> float | None:
    """σ / mean, σ the population standard deviation (numpy's default, as snr/metrics.py)."""
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.pstdev(values) / statistics.fmean(values)


def curve_key(task: str) -> str:
    """A task's key in the metrics' in-training lines (lmpipe.report.runs.read_metrics)."""
    return "hellaswag" if task == "hellaswag" else f"suite/{task}"


def checkpoint_noise(runs: list[Run], task: str) -> float | None:
    """The mean over runs of σ / m̄ of the task's last LAST in-training scores."""
    key = curve_key(task)
    noises = []
    for run in runs:
        curve = run.hellaswag_curve if task == "hellaswag" else run.suite_curve
        scores = [row[key] for row in curve if key in row][-LAST:]
        noise = relative_sd(scores)
        if noise is not None:
            noises.append(noise)
    return statistics.fmean(noises) if noises else None


def task_noise(runs: list[Run], rows: list[Row]) -> list[TaskNoise]:
    """Each task row's signal and noise (the core average and the published-only rows aside)."""
    groups = by_recipe(runs)
    index = {r.name: i for i, r in enumerate(runs)}
    out = []
    for row in rows:
        if row.key in ("core", "lambada") or row.lower_better:  # gold bpb: no accuracy
            continue
        per_recipe = []
        seed_noises = []
        for group in groups.values():
            scores = [row.scores[index[r.name]] for r in group]
            values = [s.value for s in scores if s is not None]
            if values:
                per_recipe.append(statistics.fmean(values))
            if len(values) > 1 and (noise := relative_sd(values)) is not None:
                seed_noises.append(noise)
        signal = spread = None
        if len(per_recipe) > 1 and statistics.fmean(per_recipe) > 0:
            spread = max(per_recipe) - min(per_recipe)  # = max over pairs of |m_j - m_k|
            signal = spread / statistics.fmean(per_recipe)
        out.append(
            TaskNoise(
                row.key,
                row.label,
                signal,
                checkpoint_noise(runs, row.key),
                statistics.fmean(seed_noises) if seed_noises else None,
                spread,
            )
        )
    return [t for t in out if t.checkpoints is not None or t.seeds is not None]


def undecided_words(noises: list[TaskNoise]) -> str | None:
    """The tasks that cannot decide between these runs, in one sentence."""
    names = [t.label for t in noises if t.undecided]
    if not names:
        return None
    return (
        f"{', '.join(names)} cannot decide between these runs: each one's noise (over the last"
        " evaluations during training, or over seeds) exceeds the largest difference between"
        " the runs' scores (signal-to-noise ratio below 1), so neither its ranking nor a"
        " difference in it says which recipe is better."
    )

"""Per-item scores and lm-eval's aggregates of them (acc, acc_norm, their standard errors, MMLU's
size-weighted group), shared by the native scorer and the harness's result. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lmpipe.eval.results import mean_stderr
from lmpipe.eval.suite.tasks import SuiteTask


@dataclass
class TaskScore:
    """One task's per-item outcome, items in the task's order (mmlu: subject by subject)."""

    name: str
    loglik: list[list[float]]  # per item, per choice: summed log-likelihood of the continuation
    pred: list[int]  # argmax of the log-likelihoods (ties: the first, as np.argmax)
    pred_norm: list[int]  # argmax of log-likelihood / the item's choice_lengths
    acc: list[int]  # per item: pred == gold
    acc_norm: list[int]  # per item: pred_norm == gold
    subjects: dict[str, int] = field(default_factory=dict)  # mmlu: items a subject, in order

    @property
    def items(self) -> int:
        return len(self.acc)


def pooled_stderr(stderrs: list[float], sizes: list[int]) -> float:
    """lm-eval's `pooled_sample_stderr`: a size-weighted group's stderr from its tasks'."""
    var = sum((n - 1) * se**2 * n for n, se in zip(sizes, stderrs, strict=True)) / (
        sum(sizes) - len(sizes)
    )
    return math.sqrt(var / sum(sizes))


def choose(loglik: list[float], lengths: tuple[int, ...]) -> tuple[int, int]:
    """(pred, pred_norm) as lm-eval's process_results picks them."""
    ll = np.asarray(loglik, dtype=np.float64)
    return int(np.argmax(ll)), int(np.argmax(ll / np.asarray(lengths, dtype=np.float64)))


def task_metrics(task: SuiteTask, score: TaskScore) -> dict[str, float | None]:
    """acc (and acc_norm where lm-eval's task has it) with their stderrs, as lm-eval aggregates:
    the mean over items; for mmlu, lm-eval's group: subjects weighted by their sizes (= the mean
    over all items) with the pooled stderr of the subjects'."""
    out: dict[str, float | None] = {}
    for metric in task.metrics:
        flags = getattr(score, metric)
        out[metric] = sum(flags) / len(flags)
        if score.subjects:
            stderrs, sizes, start = [], [], 0
            for n in score.subjects.values():
                if n:
                    stderrs.append(mean_stderr(flags[start : start + n]))
                    sizes.append(n)
                start += n
            ok = None not in stderrs and sum(sizes) > len(sizes)
            out[f"{metric}_stderr"] = pooled_stderr(stderrs, sizes) if ok else None
        else:
            out[f"{metric}_stderr"] = mean_stderr(flags)
    return out

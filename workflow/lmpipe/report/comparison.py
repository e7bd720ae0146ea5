"""Which run is better on what, and whether the data can tell.

The accuracy tasks (HellaSwag and the zero-shot suite) of every run side by side, each with its
standard error as lm-eval reports it, and each run after the first tested against the first (the
report's baseline) on the items both scored: McNemar's exact test on the items one run gets right
and the other wrong. For the core average, a paired z-test on the per-item differences, task by
task. Many tasks are tested at once and nothing corrects for it: at 95%, about one task in twenty
differs by chance alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lmpipe.report.references import REFERENCES, Reference
from lmpipe.report.runs import Run

LEVEL = 0.05  # significance level of the paired tests (95%)
TASK_LABELS = {
    "hellaswag": "HellaSwag (llm.c scoring)",
    "arc_easy": "ARC-Easy",
    "arc_challenge": "ARC-Challenge",
    "piqa": "PIQA",
    "winogrande": "Winogrande",
    "openbookqa": "OpenBookQA",
    "sciq": "SciQ",
    "boolq": "BoolQ",
    "copa": "COPA",
    "commonsense_qa": "CommonsenseQA",
    "social_iqa": "Social IQa",
    "mmlu": "MMLU (0-shot)",
}


@dataclass
class Score:
    """One run's figure on one task: the headline metric, its standard error, per-item 0/1."""

    value: float
    stderr: float | None
    items: int
    correct: list[int] | None = None
    split: str | None = None


@dataclass
class Paired:
    """A run against the baseline on the same items."""

    better: int  # items only this run gets right
    worse: int  # items only the baseline gets right
    p: float

    @property
    def significant(self) -> bool:
        return self.p < LEVEL

    @property
    def mark(self) -> str:
        if not self.significant:
            return ""
        return "▲" if self.better > self.worse else "▼"


@dataclass
class Row:
    key: str
    label: str
    metric: str
    split: str | None
    scores: list[Score | None]
    paired: list[Paired | None]  # against the baseline (None for the baseline itself)
    references: list[tuple[float, bool] | None] = field(default_factory=list)  # (value, same split)


def mcnemar(baseline: list[int], other: list[int]) -> Paired:
    """McNemar's exact test: of the items the two disagree on, is `other`'s share of the right
    answers different from one half? (scipy's binomial test on the discordant pairs)."""
    from scipy.stats import binomtest

    if len(baseline) != len(other):
        raise ValueError(f"paired test on {len(baseline)} and {len(other)} items")
    better = sum(1 for a, b in zip(baseline, other, strict=True) if b and not a)
    worse = sum(1 for a, b in zip(baseline, other, strict=True) if a and not b)
    p = binomtest(better, better + worse, 0.5).pvalue if better + worse else 1.0
    return Paired(better, worse, float(p))


def paired_mean_test(pairs: list[tuple[list[int], list[int]]]) -> Paired:
    """The core average (a mean of task accuracies) of `other` against `baseline`: a two-sided
    z-test of the mean over tasks of the per-task mean item difference, each task's variance
    from its own paired differences."""
    from scipy.stats import norm

    diffs, variances, better, worse = [], [], 0, 0
    for base, other in pairs:
        d = [b - a for a, b in zip(base, other, strict=True)]
        n = len(d)
        mean = sum(d) / n
        diffs.append(mean)
        variances.append(sum((x - mean) ** 2 for x in d) / (n - 1) / n if n > 1 else 0.0)
        better += sum(1 for x in d if x > 0)
        worse += sum(1 for x in d if x < 0)
    k = len(diffs)
    se = math.sqrt(sum(variances)) / k
    mean = sum(diffs) / k
    p = 1.0 if se == 0 else float(2 * norm.sf(abs(mean) / se))
    return Paired(better, worse, p)


# ----------------------------------------------------------------------------------------------
# reading the scores out of the result files


def task_scores(run: Run) -> dict[str, Score]:
    """The run's accuracy tasks: HellaSwag (native, llm.c scoring) and the suite's (native)."""
    out: dict[str, Score] = {}
    hs = run.evals.get("hellaswag")
    if hs is not None and "acc_norm" in hs:
        out["hellaswag"] = Score(
            hs["acc_norm"],
            hs.get("acc_norm_stderr"),
            hs.get("items", 0),
            (hs.get("per_item") or {}).get("acc_norm"),
            "validation",
        )
    suite = run.evals.get("suite") or {}
    for task, t in (suite.get("tasks") or {}).items():
        metric = t.get("headline", "acc")
        out[task] = Score(
            t[metric],
            t.get(f"{metric}_stderr"),
            t.get("items", 0),
            ((suite.get("per_item") or {}).get(task) or {}).get(metric),
            t.get("split"),
        )
    return out


def _headline_metric(runs: list[Run], task: str) -> str:
    if task == "hellaswag":
        return "acc_norm"
    for r in runs:
        t = ((r.evals.get("suite") or {}).get("tasks") or {}).get(task)
        if t:
            return t.get("headline", "acc")
    return "acc"


def figure_key(task: str) -> str:
    """A task's key in lmpipe.report.references (HellaSwag's is the headline column's)."""
    return task if task in ("hellaswag", "lambada") else f"suite/{task}"


def _reference_cells(task: str, split: str | None, refs: list[Reference]):
    """(figure, measured on the runs' split) of each reference; None where it publishes none."""
    cells = []
    for ref in refs:
        value = ref.figures.get(figure_key(task))
        same_split = ref.splits.get(task, split) == split
        cells.append(None if value is None else (value, same_split))
    return cells


def task_references() -> list[Reference]:
    """The references that publish a figure of an accuracy task (a column of the task table)."""
    keys = {figure_key(t) for t in [*TASK_LABELS, "lambada"]}
    return [r for r in REFERENCES if keys & set(r.figures)]


def compare(runs: list[Run]) -> dict[str, Any] | None:
    """The task table (rows: tasks, then the core average) and the verdicts in words; None when
    no run has an accuracy task."""
    scores = [task_scores(r) for r in runs]
    tasks = [t for t in TASK_LABELS if any(t in s for s in scores)]
    if not tasks:
        return None
    refs = task_references()
    rows = []
    for task in tasks:
        cells = [s.get(task) for s in scores]
        split = next((c.split for c in cells if c is not None), None)
        rows.append(
            Row(
                key=task,
                label=TASK_LABELS[task],
                metric=_headline_metric(runs, task),
                split=split,
                scores=cells,
                paired=[_paired(cells[0], c) if i else None for i, c in enumerate(cells)],
                references=_reference_cells(task, split, refs),
            )
        )
    core = _core_row(runs, scores)
    if core is not None:
        rows.append(core)
    if any("lambada" in r.figures for r in refs):  # published figures only: a row to read them
        none = [None] * len(runs)
        lambada = Row("lambada", "LAMBADA (published only)", "acc", None, none, none)
        lambada.references = _reference_cells("lambada", None, refs)
        rows.append(lambada)
    return {
        "runs": [r.name for r in runs],
        "baseline": runs[0].name,
        "rows": rows,
        "references": refs,
        "verdicts": verdicts(runs, rows),
        "level": LEVEL,
    }


def _paired(base: Score | None, other: Score | None) -> Paired | None:
    """The test of `other` against `base`, where both scored the same items item by item."""
    if base is None or other is None or base.correct is None or other.correct is None:
        return None
    if len(base.correct) != len(other.correct) or base.split != other.split:
        return None
    return mcnemar(base.correct, other.correct)


def _core_row(runs: list[Run], scores: list[dict[str, Score]]) -> Row | None:
    """The suite's core average as each run's suite result gives it, with its standard error
    (tasks independent) and the paired test against the baseline over the tasks both scored."""
    cores: list[Score | None] = []
    for r, s in zip(runs, scores, strict=True):
        suite = r.evals.get("suite") or {}
        names = suite.get("core_tasks") or []
        if suite.get("core") is None or not names:
            cores.append(None)
            continue
        errors = [s[t].stderr for t in names if t in s and s[t].stderr is not None]
        stderr = math.sqrt(sum(e * e for e in errors)) / len(names) if errors else None
        cores.append(Score(suite["core"], stderr, sum(s[t].items for t in names if t in s)))
    if not any(cores):
        return None
    base_tasks = (runs[0].evals.get("suite") or {}).get("core_tasks") or []
    paired: list[Paired | None] = [None]
    for i in range(1, len(runs)):
        tasks = (runs[i].evals.get("suite") or {}).get("core_tasks") or []
        pairs = []
        if cores[0] is not None and cores[i] is not None and tasks == base_tasks:
            for t in tasks:
                a, b = scores[0].get(t), scores[i].get(t)
                if a and b and a.correct and b.correct and len(a.correct) == len(b.correct):
                    pairs.append((a.correct, b.correct))
        paired.append(paired_mean_test(pairs) if pairs and len(pairs) == len(tasks) else None)
    no_figures: list[tuple[float, bool] | None] = [None] * len(task_references())
    return Row("core", "core average (suite, no MMLU)", "mean", None, cores, paired, no_figures)


def verdicts(runs: list[Run], rows: list[Row]) -> list[str]:
    """Each run against the baseline in words: better on what, worse on what, and where the
    data cannot tell."""
    out = []
    base = runs[0].name
    for i, run in enumerate(runs[1:], start=1):
        better, worse, unclear = [], [], []
        for row in rows:
            test = row.paired[i]
            if test is None:
                continue
            if test.significant:
                target = better if test.better > test.worse else worse
                target.append(f"{row.label} (p = {test.p:.3g})")
            else:
                unclear.append(row.label)
        if not (better or worse or unclear):
            continue
        parts = []
        if better:
            parts.append(f"better than {base} on {', '.join(better)}")
        if worse:
            parts.append(f"worse than {base} on {', '.join(worse)}")
        if unclear:
            parts.append(
                f"the data cannot tell it from {base} on {', '.join(unclear)}"
                f" (no difference significant at {1 - LEVEL:.0%})"
            )
        out.append(f"{run.name}: " + "; ".join(parts) + ".")
    return out

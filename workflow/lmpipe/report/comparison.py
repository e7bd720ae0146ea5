"""Which run is better on what, and whether the data can tell.

The accuracy tasks (HellaSwag and the zero-shot suite) of every run side by side, each with its
standard error as lm-eval reports it, and each run after the first tested against the first (the
report's baseline) on the items both scored, paired by the items' ids (lmpipe.eval.suite and
lmpipe.eval.hellaswag write them beside each per-item result): McNemar's exact test on the items
one run gets right and the other wrong, and the difference in accuracy with Newcombe's 95%
interval for paired proportions (lmpipe.stats: never zero-width). For the core average, a paired
z-test on the per-item differences, task by task. The generative chat evaluations (HumanEval
pass@1, GSM8K exact match) are 0/1 items with ids too, and join the table as tasks. Gold-answer
bits per byte (lmpipe.eval.gold_bpb: continuous, lower is better) is tested on the per-item
differences of the items both scored by a paired t-test, with its t interval; its rows are in
units of their own, so the page puts them in a table of their own. A run's tests across the
tasks (gold bpb's included) are one family: their p-values are Holm-adjusted, and only an
adjusted p below 5% is called better or worse, so that the chance of any task being called by
chance alone stays at most 5%. Where the interval and the exact test disagree (one excludes
zero, the other is not significant), the cell is marked. Where the runs scored different items,
the table and the verdict say on how many both scored. Where so few items disagree that no
outcome could reach significance (McNemar's exact test needs at least 6 discordant items at
95%), the verdict says "too few items to tell".

Replicated recipes (lmpipe.replicas: a run's seeds) are compared over their seeds instead: each
task's accuracy a seed, Welch's interval and test of the two recipes' means, Holm-adjusted over
the tasks; the single runs of such a report are not tested one against another.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from lmpipe import stats
from lmpipe.report.findings import differing, tokens_words
from lmpipe.report.references import REFERENCES, Reference
from lmpipe.report.runs import Run, by_recipe, pairs

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
    "gsm8k": "GSM8K",
    "humaneval": "HumanEval",
}
# the generative evaluations' per-item 0/1 key (lmpipe.eval.humaneval, lmpipe.eval.gsm8k)
GENERATIVE = {"humaneval": "passed", "gsm8k": "exact_match"}
GOLD_BPB_LABELS = {"gsm8k": "GSM8K", "codex_humaneval": "HumanEval", "lambada": "LAMBADA"}


@dataclass
class Score:
    """One run's figure on one task: the headline metric, its standard error, and each item's
    0/1 (gold bpb: its bits per byte) by the item's id (None where the result file has no
    per-item ids)."""

    value: float
    stderr: float | None
    items: int
    correct: dict[str, float] | None = None
    split: str | None = None
    version: str | None = None  # the items' file (HellaSwag) or folder sha256 (the suite's)
    mode: str | None = None  # how the items were put (GSM8K: "5-shot" or "chat")


@dataclass
class Paired:
    """A run against the baseline on the items both scored."""

    better: int  # items only this run gets right
    worse: int  # items only the baseline gets right
    p: float
    diff: float  # mean per-item difference (this run - the baseline): the accuracy gap
    low: float  # its 95% interval
    high: float
    could_tell: bool = (
        True  # whether any outcome on this many discordant items could be significant
    )
    p_holm: float | None = None  # p Holm-adjusted over the tasks of the run's comparison
    lower_better: bool = False  # a loss (gold bpb): a negative difference is the better

    @property
    def improved(self) -> bool:
        """The difference points to this run being the better."""
        return self.diff < 0 if self.lower_better else self.diff > 0

    @property
    def significant(self) -> bool:
        return (self.p if self.p_holm is None else self.p_holm) < LEVEL

    @property
    def disagrees(self) -> bool:
        """The interval excludes zero while the exact test is not significant, or the reverse
        (both unadjusted: the same question asked two ways)."""
        return (self.low > 0 or self.high < 0) != (self.p < LEVEL)

    @property
    def mark(self) -> str:
        if not self.significant:
            return ""
        return "▲" if self.improved else "▼"


@dataclass
class Row:
    key: str
    label: str
    metric: str
    split: str | None
    scores: list[Score | None]
    paired: list[Paired | None]  # against the baseline (None for the baseline itself)
    references: list[tuple[float, bool] | None] = field(default_factory=list)  # (value, same split)
    notes: list[str | None] = field(default_factory=list)  # why not paired, or on which items
    unit: str = "accuracy"  # "bpb": gold-answer bits per byte, lower is better

    @property
    def lower_better(self) -> bool:
        return self.unit == "bpb"


def _mean_se(d: list[int]) -> tuple[float, float]:
    """The mean of per-item differences and its standard error (sample variance over n)."""
    n = len(d)
    mean = sum(d) / n
    return mean, math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else 0.0


def mcnemar(baseline: list[int], other: list[int]) -> Paired:
    """McNemar's exact test on two runs' 0/1 results of the same items, in the same order: of
    the items the two disagree on, is `other`'s share of the right answers different from one
    half? (scipy's binomial test on the discordant pairs). With the accuracy difference and
    Newcombe's 95% interval of it, and whether the test could have told at all: with k
    discordant items the smallest p any outcome gives is 2 / 2^k, above 5% for k <= 5."""
    from scipy.stats import binomtest

    if len(baseline) != len(other):
        raise ValueError(f"paired test on {len(baseline)} and {len(other)} items")
    better = sum(1 for a, b in zip(baseline, other, strict=True) if b and not a)
    worse = sum(1 for a, b in zip(baseline, other, strict=True) if a and not b)
    k = better + worse
    p = binomtest(better, k, 0.5).pvalue if k else 1.0
    could_tell = bool(k) and binomtest(k, k, 0.5).pvalue < LEVEL
    both = sum(1 for a, b in zip(baseline, other, strict=True) if a and b)
    neither = len(baseline) - both - better - worse
    diff, low, high = stats.newcombe_paired(both, better, worse, neither, 1 - LEVEL)
    return Paired(better, worse, float(p), diff, low, high, could_tell)


def paired_mean_test(pairs: list[tuple[list[int], list[int]]]) -> Paired:
    """The core average (a mean of task accuracies) of `other` against `baseline`: a two-sided
    z-test of the mean over tasks of the per-task mean item difference, each task's variance
    from its own paired differences; ▲/▼ from the sign of that mean."""
    from scipy.stats import norm

    diffs, variances, better, worse = [], [], 0, 0
    for base, other in pairs:
        d = [b - a for a, b in zip(base, other, strict=True)]
        mean, se = _mean_se(d)
        diffs.append(mean)
        variances.append(se * se)
        better += sum(1 for x in d if x > 0)
        worse += sum(1 for x in d if x < 0)
    k = len(diffs)
    se = math.sqrt(sum(variances)) / k
    mean = sum(diffs) / k
    if se == 0:  # every item differs alike (or none differs): no spread to test against
        p = 0.0 if mean else 1.0
    else:
        p = float(2 * norm.sf(abs(mean) / se))
    return Paired(
        better, worse, p, mean, mean - stats.z(1 - LEVEL) * se, mean + stats.z(1 - LEVEL) * se
    )


def paired_t(baseline: list[float], other: list[float]) -> Paired:
    """Two runs' per-item losses (gold bpb) on the same items, in the same order: the mean of
    the per-item differences (other - baseline) with its t interval and two-sided paired t-test
    (scipy's ttest_rel); lower is better. Items all differing alike give no spread to test:
    p is 1 where they do not differ, 0 where they all differ by the same amount."""
    from scipy.stats import ttest_rel

    if len(baseline) != len(other):
        raise ValueError(f"paired test on {len(baseline)} and {len(other)} items")
    d = [b - a for a, b in zip(baseline, other, strict=True)]
    better, worse = sum(1 for x in d if x < 0), sum(1 for x in d if x > 0)
    mean = sum(d) / len(d)
    if len(d) < 2 or max(d) == min(d):
        p = 1.0 if mean == 0 or len(d) < 2 else 0.0
        return Paired(better, worse, p, mean, mean, mean, len(d) > 1, lower_better=True)
    test = ttest_rel(other, baseline)
    ci = test.confidence_interval(1 - LEVEL)
    return Paired(
        better, worse, float(test.pvalue), mean, float(ci.low), float(ci.high), lower_better=True
    )


def by_id(per_item: dict[str, Any] | None, metric: str) -> dict[str, float] | None:
    """A result file's per-item 0/1 (or value) of `metric` keyed by the items' ids; None where
    it has no ids, or they do not match its results one to one."""
    per_item = per_item or {}
    ids, flags = per_item.get("ids"), per_item.get(metric)
    if ids is None or flags is None or len(ids) != len(flags) or len(set(ids)) != len(ids):
        return None
    return dict(zip(ids, flags, strict=True))


def common_items(base: Score, other: Score) -> tuple[list[float], list[float]]:
    """The two runs' per-item results on the items both scored, paired by id (the baseline's
    order)."""
    assert base.correct is not None and other.correct is not None
    ids = [i for i in base.correct if i in other.correct]
    return [base.correct[i] for i in ids], [other.correct[i] for i in ids]


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
            by_id(hs.get("per_item"), "acc_norm"),
            "validation",
            (hs.get("produced_by") or {}).get("items_file"),
        )
    suite = run.evals.get("suite") or {}
    versions = ((suite.get("produced_by") or {}).get("data") or {}).get("sha256") or {}
    for task, t in (suite.get("tasks") or {}).items():
        metric = t.get("headline", "acc")
        out[task] = Score(
            t[metric],
            t.get(f"{metric}_stderr"),
            t.get("items", 0),
            by_id((suite.get("per_item") or {}).get(task), metric),
            t.get("split"),
            versions.get(task),
        )
    for task, flag in GENERATIVE.items():
        if (r := run.evals.get(task)) is not None:
            items = by_id(r.get("per_item"), flag)
            out[task] = Score(r["value"], r.get("stderr"), r.get("items", 0), items, "test")
            out[task].mode = r.get("mode")
    return out


def gold_scores(run: Run) -> dict[str, Score]:
    """The run's gold-answer bits per byte, a Score a task, keyed `gold_bpb/<task>`: the mean
    over items, its standard error, each item's bits per byte by id, the requests' sha256."""
    result = run.evals.get("gold_bpb") or {}
    data = (result.get("produced_by") or {}).get("data") or {}
    out = {}
    for task, t in (result.get("tasks") or {}).items():
        per_item = by_id((result.get("per_item") or {}).get(task), "bits_per_byte")
        version = (data.get(task) or {}).get("sha256")
        out[f"gold_bpb/{task}"] = Score(
            t["bits_per_byte"], t.get("stderr"), t.get("items", 0), per_item, None, version
        )
    return out


def _headline_metric(runs: list[Run], task: str) -> str:
    if task == "hellaswag":
        return "acc_norm"
    if task in GENERATIVE:
        return next(r.evals[task].get("metric", "?") for r in runs if task in r.evals)
    for r in runs:
        t = ((r.evals.get("suite") or {}).get("tasks") or {}).get(task)
        if t:
            return t.get("headline", "acc")
    return "acc"


def figure_key(task: str) -> str:
    """A task's key in lmpipe.report.references (HellaSwag's is the headline column's)."""
    return task if task in ("hellaswag", "lambada", *GENERATIVE) else f"suite/{task}"


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


def baselines(runs: list[Run], compare: list[list[str]] | None) -> list[int | None]:
    """Each run's baseline's position in `runs` (None: compared against none)."""
    names = [r.name for r in runs]
    out: list[int | None] = [None] * len(runs)
    for base, other in pairs(names, compare):
        out[names.index(other)] = names.index(base)
    return out


def compare(runs: list[Run], compare: list[list[str]] | None = None) -> dict[str, Any] | None:
    """The task table (rows: tasks, then the core average) and the verdicts in words, each run
    tested against its baseline (`pairs`); None when no run has an accuracy task."""
    scores = [task_scores(r) for r in runs]
    base_of = baselines(runs, compare)
    tasks = [t for t in TASK_LABELS if any(t in s for s in scores)]
    if not tasks and not any("gold_bpb" in r.evals for r in runs):
        return None
    refs = task_references()
    rows = []
    for task in tasks:
        cells = [s.get(task) for s in scores]
        split = next((c.split for c in cells if c is not None), None)
        tests = [
            (None, None) if b is None else paired_scores(cells[b], c, runs[b].name, r.name)
            for r, c, b in zip(runs, cells, base_of, strict=True)
        ]
        rows.append(
            Row(
                key=task,
                label=TASK_LABELS[task],
                metric=_headline_metric(runs, task),
                split=split,
                scores=cells,
                paired=[t for t, _ in tests],
                references=_reference_cells(task, split, refs),
                notes=[note for _, note in tests],
            )
        )
    core = _core_row(runs, scores, base_of)
    if core is not None:
        rows.append(core)
    rows += gold_rows(runs, base_of, len(refs))
    replicated = any(len(group) > 1 for group in by_recipe(runs).values())
    if replicated:  # the recipes are compared over their seeds, not run against run
        for row in rows:
            row.paired = [None] * len(runs)
            row.notes = [None] * len(runs)
    for i in range(len(runs)):  # each run's tests over the tasks: one family
        family = [row.paired[i] for row in rows if row.paired[i] is not None]
        for test, adjusted in zip(family, stats.holm([t.p for t in family]), strict=True):
            test.p_holm = adjusted
    if any("lambada" in r.figures for r in refs):  # published figures only: a row to read them
        none = [None] * len(runs)
        lambada = Row("lambada", "LAMBADA (published only)", "acc", None, none, none)
        lambada.references = _reference_cells("lambada", None, refs)
        rows.append(lambada)
    recipes = recipe_table(runs, rows, compare) if replicated else None
    return {
        "runs": [r.name for r in runs],
        "baseline": runs[0].name,
        "baselines": [None if b is None else runs[b].name for b in base_of],
        "rows": rows,
        "references": refs,
        "verdicts": recipe_verdicts(runs, rows, recipes)
        if recipes
        else verdicts(runs, rows, base_of),
        "recipes": recipes,
        "level": LEVEL,
    }


def gold_rows(runs: list[Run], base_of: list[int | None], n_refs: int) -> list[Row]:
    """A row a gold-bpb task any run scored: each run's mean bits per byte, and the paired
    t-test against its baseline on the items both scored (`paired_t`)."""
    scores = [gold_scores(r) for r in runs]
    rows = []
    for task, label in GOLD_BPB_LABELS.items():
        key = f"gold_bpb/{task}"
        cells = [s.get(key) for s in scores]
        if not any(cells):
            continue
        tests = [
            (None, None) if b is None else paired_scores(cells[b], c, runs[b].name, name, paired_t)
            for name, c, b in zip([r.name for r in runs], cells, base_of, strict=True)
        ]
        refs: list[tuple[float, bool] | None] = [None] * n_refs
        row = Row(key, f"{label} gold answer", "bits per byte", None, cells, [], refs, [])
        row.paired, row.notes, row.unit = [t for t, _ in tests], [n for _, n in tests], "bpb"
        rows.append(row)
    return rows


def paired_scores(
    base: Score | None, other: Score | None, base_name: str, name: str, test=mcnemar
) -> tuple[Paired | None, str | None]:
    """The test of `other` against `base` on the items both scored (by id), and a note where
    they scored different items, were put to the two in different ways (GSM8K 5-shot against
    chat), or cannot be paired at all; (None, None) where either has no score."""
    if base is None or other is None:
        return None, None
    if base.correct is None or other.correct is None:
        missing = base_name if base.correct is None else name
        return None, f"not tested: {missing}'s result has no per-item ids"
    if base.split != other.split:
        return None, f"not tested: {name} scored the {other.split} split, {base_name} {base.split}"
    if base.version and other.version and base.version != other.version:
        return None, (
            f"not tested: {base_name} and {name} scored other versions of the items"
            f" ({base.version[:12]} and {other.version[:12]})"
        )
    a, b = common_items(base, other)
    if not a:
        return None, f"not tested: no item scored by both {base_name} and {name}"
    notes = []
    if len(a) < max(len(base.correct), len(other.correct)):
        notes.append(
            f"tested on the {len(a):,} items both scored ({base_name} scored"
            f" {len(base.correct):,}, {name} {len(other.correct):,})"
        )
    if base.mode != other.mode:
        notes.append(
            f"{base_name} was asked {base.mode or '?'}, {name} {other.mode or '?'}:"
            " the prompt differs as well as the model"
        )
    return test(a, b), "; ".join(notes) or None


def _core_row(
    runs: list[Run], scores: list[dict[str, Score]], base_of: list[int | None]
) -> Row | None:
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
    paired: list[Paired | None] = []
    notes: list[str | None] = []
    for i, b in enumerate(base_of):
        if b is None:
            paired.append(None)
            notes.append(None)
            continue
        base_tasks = (runs[b].evals.get("suite") or {}).get("core_tasks") or []
        tasks = (runs[i].evals.get("suite") or {}).get("core_tasks") or []
        if cores[b] is None or cores[i] is None:
            paired.append(None)
            notes.append(None)
            continue
        if tasks != base_tasks:
            paired.append(None)
            notes.append(f"not tested: averages other tasks than {runs[b].name}'s")
            continue
        pairs = []
        for t in tasks:
            x, y = scores[b].get(t), scores[i].get(t)
            if x and y and x.correct and y.correct and x.split == y.split:
                pair = common_items(x, y)
                if pair[0]:
                    pairs.append(pair)
        complete = len(pairs) == len(tasks)
        paired.append(paired_mean_test(pairs) if complete else None)
        notes.append(
            None if complete else "not tested: a task could not be paired (its row says why)"
        )
    no_figures: list[tuple[float, bool] | None] = [None] * len(task_references())
    label = "core average (suite, no MMLU)"
    return Row("core", label, "mean", None, cores, paired, no_figures, notes)


def min_discordant() -> int:
    """The fewest discordant items on which McNemar's exact test can reach LEVEL: the smallest k
    with 2 / 2^k < LEVEL (6 at 5%)."""
    return math.floor(math.log2(2 / LEVEL)) + 1


def gap_text(test: Paired) -> str:
    """The difference and its interval (accuracy in percentage points, a loss in bits per
    byte), and the p-values."""
    holm = "" if test.p_holm is None else f", Holm-adjusted {test.p_holm:.3g}"
    if test.lower_better:
        gap = (
            f"{test.diff:+.4f} bits per byte, {1 - LEVEL:.0%} CI"
            f" {test.low:+.4f} to {test.high:+.4f}"
        )
    else:
        gap = (
            f"{100 * test.diff:+.1f} points, {1 - LEVEL:.0%} CI"
            f" {100 * test.low:+.1f} to {100 * test.high:+.1f}"
        )
    return f"{gap}; p = {test.p:.3g}{holm}"


def better_worse(base: str, better: list[str], worse: list[str]) -> list[str]:
    """The start of a verdict line: the tasks a run is better on, then worse on."""
    parts = [f"better than {base} on {', '.join(better)}"] if better else []
    return parts + ([f"worse than {base} on {', '.join(worse)}"] if worse else [])


def verdicts(runs: list[Run], rows: list[Row], base_of: list[int | None]) -> list[str]:
    """Each run against the baseline in words: better on what, worse on what, where the data
    cannot tell, where too few items disagree for any test to tell, and what was not tested or
    tested on fewer items than scored."""
    out = []
    for i, run in enumerate(runs):
        if base_of[i] is None:
            continue
        baseline = runs[base_of[i]]
        base = baseline.name
        better, worse, unclear, too_few = [], [], [], []
        for row in rows:
            test = row.paired[i]
            if test is None:
                continue
            gap = gap_text(test)
            if test.significant:
                target = better if test.improved else worse
                target.append(f"{row.label} ({gap})")
            elif test.could_tell:
                unclear.append(row.label)
            else:
                k = test.better + test.worse
                disagree = {0: "no item disagrees", 1: "1 item disagrees"}.get(
                    k, f"{k} items disagree"
                )
                too_few.append(f"{row.label} ({disagree})")
        notes = [
            f"{row.label}: {row.notes[i]}" for row in rows if i < len(row.notes) and row.notes[i]
        ]
        parts = better_worse(base, better, worse)
        if unclear:
            parts.append(
                f"the data cannot tell it from {base} on {', '.join(unclear)}"
                f" (no difference significant at {1 - LEVEL:.0%})"
            )
        if too_few:
            parts.append(
                f"too few items to tell on {', '.join(too_few)}: at {1 - LEVEL:.0%} McNemar's"
                f" test needs at least {min_discordant()} items where the runs disagree"
            )
        parts += notes
        tested = [row.paired[i] for row in rows if row.paired[i] is not None]
        split = [row.label for row in rows if row.paired[i] is not None and row.paired[i].disagrees]
        if split:
            parts.append(
                f"the interval and the exact test disagree on {', '.join(split)} (marked ≠):"
                " read those as undecided"
            )
        if parts:
            what = f"{differing(run, baseline)}; {tokens_words([run], [baseline])}"
            family = f"{stats.family_wise_words(len(tested), 1 - LEVEL)}" if tested else ""
            tail = f" ({what}; one seed each{'; ' + family if family else ''})"
            out.append(f"{run.name}: " + "; ".join(parts) + tail + ".")
    return out


@dataclass
class RecipeCell:
    """A recipe's figure on a task over its seeds, and its test against the first recipe."""

    mean: float
    sd: float | None
    seeds: int
    diff: float | None = None  # against the first recipe: Welch's
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_holm: float | None = None
    alike: bool = False  # every seed of both recipes scored the same: not tested


def recipe_table(
    runs: list[Run], rows: list[Row], compare: list[list[str]] | None = None
) -> dict[str, Any]:
    """Each recipe's score on each task: the mean and standard deviation over its seeds, and
    Welch's interval and test against its baseline recipe (`pairs`), Holm-adjusted over the
    tasks."""
    groups = by_recipe(runs)
    index = {r.name: i for i, r in enumerate(runs)}
    names = list(groups)
    base_of = {other: base for base, other in pairs(names, compare)}
    cells: dict[str, list[RecipeCell | None]] = {}
    for row in rows:
        per_recipe = []
        for name in names:
            values = _seed_values(row, groups[name], index)
            sd = statistics.stdev(values) if len(values) > 1 else None
            cell = RecipeCell(statistics.fmean(values), sd, len(values)) if values else None
            base_values = _seed_values(row, groups[base_of[name]], index) if name in base_of else []
            if cell is not None and len(values) > 1 and len(base_values) > 1:
                diff, low, high, dof, p = stats.welch(values, base_values)
                if math.isfinite(dof):  # every seed alike on both sides: nothing to test
                    cell.diff, cell.low, cell.high, cell.p = diff, low, high, p
                else:
                    cell.alike = True
            per_recipe.append(cell)
        cells[row.key] = per_recipe
    for j in range(len(names)):
        family = [c for row in rows if (c := cells[row.key][j]) and c.p is not None]
        for cell, adjusted in zip(family, stats.holm([c.p for c in family]), strict=True):
            cell.p_holm = adjusted
    return {
        "names": names,
        "seeds": [len(groups[n]) for n in names],
        "baselines": [base_of.get(n) for n in names],
        "cells": cells,
    }


def _seed_values(row: Row, group: list[Run], index: dict[str, int]) -> list[float]:
    scores = [row.scores[index[r.name]] for r in group]
    return [s.value for s in scores if s is not None]


def recipe_verdicts(runs: list[Run], rows: list[Row], table: dict[str, Any]) -> list[str]:
    """Each recipe against its baseline over their seeds (`table`: recipe_table's), in words:
    better or worse where Welch's Holm-adjusted p is below 5%, the seeds cannot tell elsewhere."""
    groups = by_recipe(runs)
    out = []
    for j, name in enumerate(table["names"]):
        base = table["baselines"][j]
        if base is None:
            continue
        better, worse, unclear, alike = [], [], [], []
        for row in rows:
            cell = table["cells"][row.key][j]
            if cell is not None and cell.alike:
                alike.append(row.label)
            if cell is None or cell.p is None:
                continue
            gap = (
                f"{cell.diff:+.4f} bits per byte, {1 - LEVEL:.0%} Welch interval"
                f" {cell.low:+.4f} to {cell.high:+.4f}"
                if row.lower_better
                else f"{100 * cell.diff:+.1f} points, {1 - LEVEL:.0%} Welch interval"
                f" {100 * cell.low:+.1f} to {100 * cell.high:+.1f}"
            ) + f"; p = {cell.p:.3g}, Holm-adjusted {cell.p_holm:.3g}"
            improved = cell.diff < 0 if row.lower_better else cell.diff > 0
            if cell.p_holm is not None and cell.p_holm < LEVEL:
                (better if improved else worse).append(f"{row.label} ({gap})")
            else:
                unclear.append(row.label)
        tested = len(better) + len(worse) + len(unclear)
        if not tested and not alike:
            continue
        parts = better_worse(base, better, worse)
        if unclear:
            parts.append(f"the seeds cannot tell it from {base} on {', '.join(unclear)}")
        if alike:
            parts.append(f"not tested on {', '.join(alike)}: every seed of both scored the same")
        seeds = f"over {len(groups[name])} and {len(groups[base])} seeds"
        pair = (groups[name], groups[base])
        what = f"{differing(pair[0][0], pair[1][0])}; {tokens_words(*pair)}"
        family = stats.family_wise_words(tested, 1 - LEVEL)
        out.append(f"{name} ({seeds}): " + "; ".join(parts) + f" ({what}; {family}).")
    return out

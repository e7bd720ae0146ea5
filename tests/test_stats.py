"""lmpipe.report.stats against a reference implementation and by simulation: the paired-difference
interval against R's contingencytables on a grid of tables, Holm's family-wise error over 11
tasks with no true difference, and the val-loss interval over documents against the per-batch
one on text whose tokens are correlated within a document."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats
from scipy.signal import lfilter
from scipy.stats import binomtest

from lmpipe import stats

REFERENCE = Path(__file__).parent / "reference" / "paired_difference.csv"


def reference_rows() -> list[dict[str, float]]:
    with REFERENCE.open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def test_newcombe_equals_contingencytables_on_a_grid_of_tables():
    """300 tables, n from 10 to 10,042, 0 to 30% of the items won by either run, concordant
    items split three ways: the limits agree with the R package's to 1e-9."""
    rows = reference_rows()
    assert len(rows) == 300
    for row in rows:
        cells = [int(row[k]) for k in ("n11", "n12", "n21", "n22")]
        d, low, high = stats.newcombe_paired(*cells)
        assert d == pytest.approx((cells[1] - cells[2]) / sum(cells), abs=1e-12)
        assert (low, high) == pytest.approx(
            (row["newcombe_lower"], row["newcombe_upper"]), abs=1e-9
        ), cells


def test_newcombe_is_never_zero_width_and_spans_zero_where_nothing_disagrees():
    """The Wald interval of 50 items none of which disagree is +0.0 [+0.0, +0.0]."""
    for both in range(0, 51, 5):
        d, low, high = stats.newcombe_paired(both, 0, 0, 50 - both)
        assert d == 0 and low < -0.01 and high > 0.01
    # contingencytables' own test: one item right by both, one by neither
    assert stats.newcombe_paired(1, 0, 0, 1)[1:] == pytest.approx((-0.5734, 0.5734), abs=1e-4)


def test_holm_adjusts_as_the_step_down_procedure_does():
    """By hand: 0.005·4, then 0.01·3, 0.03·2, and 0.04·1 raised to the 0.06 before it."""
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]
    assert stats.holm([]) == []


# the suite's item counts in the demo (HellaSwag's 50, then the suite's tasks at its limits)
ITEMS = [50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50]


def null_task_pvalues(rng: np.random.Generator, items: int) -> float:
    """McNemar's exact p of two runs that are the same model up to chance: each item right for
    each run with a probability of its own (the items differ, the runs do not)."""
    p_item = rng.uniform(0.2, 0.8, items)
    a = rng.random(items) < p_item
    b = rng.random(items) < p_item
    better, worse = int(np.sum(b & ~a)), int(np.sum(a & ~b))
    return binomtest(better, better + worse, 0.5).pvalue if better + worse else 1.0


def test_holm_keeps_the_family_wise_error_of_11_null_tasks_at_most_5_percent():
    """2,000 reports of 11 tasks with no true difference: some task called better or worse in
    at most 5% of them after Holm's adjustment; without it, in more than 10%."""
    rng = np.random.default_rng(0)
    reps, any_raw, any_holm = 2000, 0, 0
    for _ in range(reps):
        p = [null_task_pvalues(rng, n) for n in ITEMS]
        any_raw += min(p) < 0.05
        any_holm += min(stats.holm(p)) < 0.05
    assert any_holm / reps <= 0.05, any_holm / reps
    assert any_raw / reps > 0.10, any_raw / reps  # the adjustment is what keeps it down


def test_newcombe_covers_at_50_items_with_few_disagreements():
    """Two runs that disagree on about 4% of 50 items each way, the first truly 2 points ahead:
    the interval holds the true difference in at least 93% of 4,000 draws (the Wald interval of
    the per-item differences, in about 87%)."""
    rng = np.random.default_rng(1)
    probs = np.array([0.5, 0.05, 0.03, 0.42])  # both, first only, second only, neither
    truth = probs[1] - probs[2]
    covered = wald = 0
    for _ in range(4000):
        cells = rng.multinomial(50, probs)
        _, low, high = stats.newcombe_paired(*map(int, cells))
        covered += low <= truth <= high
        d = np.r_[np.ones(cells[1]), -np.ones(cells[2]), np.zeros(cells[0] + cells[3])]
        se = d.std(ddof=1) / math.sqrt(50)
        wald += d.mean() - 1.96 * se <= truth <= d.mean() + 1.96 * se
    assert covered / 4000 >= 0.93, covered / 4000
    assert wald / 4000 < covered / 4000


# ----------------------------------------------------------------------------------------------
# val loss over documents


def documents(rng: np.random.Generator, count: int) -> list[int]:
    """Documents' token counts, as web text's: a long tail (median ~600 tokens)."""
    return [int(n) for n in np.clip(rng.lognormal(6.4, 0.9, count), 20, 8000)]


def two_models(rng: np.random.Generator, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-token losses of two models over the same documents, equal in expectation over the
    population of documents: each document favours one of them by an amount of its own (its
    topic), held by every token of it, and the tokens' own noise is correlated with their
    neighbours' (an AR(1) of coefficient 0.6)."""
    a, b = [], []
    for n in lengths:
        favour = rng.normal(0, 0.15)
        noise = lfilter([1.0], [1.0, -0.6], rng.normal(0, 0.5, n))
        base = rng.normal(3.5, 0.6)
        a.append(base + favour / 2 + noise + rng.normal(0, 0.3, n))
        b.append(base - favour / 2 + noise + rng.normal(0, 0.3, n))
    return np.concatenate(a), np.concatenate(b)


def per_batch_interval(a: np.ndarray, b: np.ndarray, batch: int) -> tuple[float, float]:
    """The interval the report printed before: a t interval over fixed batches of consecutive
    tokens, as if the batches were independent."""
    n = len(a) // batch
    d = (a[: n * batch] - b[: n * batch]).reshape(n, batch).mean(axis=1)
    half = stats.t_quantile(n - 1) * d.std(ddof=1) / math.sqrt(n)
    return d.mean() - half, d.mean() + half


def by_document(losses: np.ndarray, lengths: list[int]) -> list[float]:
    ends = np.cumsum(lengths)
    return [float(losses[e - n : e].sum()) for e, n in zip(ends, lengths, strict=True)]


@pytest.mark.parametrize("interval", ["documents", "batches"])
def test_the_val_loss_interval_over_documents_covers_and_the_per_batch_one_does_not(interval):
    """600 val sets of 19 documents (as many as the demo's 32,768 val tokens hold) scored by two
    models of equal expected loss: the interval over documents holds zero at least 93% of the
    time; the per-batch one (32 batches of consecutive tokens) much less often. The "batches"
    case shows what the planted bug (the per-batch interval) would give."""
    rng = np.random.default_rng(2)
    reps, covered = 600, 0
    for _ in range(reps):
        lengths = documents(rng, 19)
        a, b = two_models(rng, lengths)
        if interval == "documents":
            _, low, high, _ = stats.cluster_difference(
                by_document(a, lengths), by_document(b, lengths), lengths
            )
        else:
            low, high = per_batch_interval(a, b, len(a) // 32)
        covered += low <= 0 <= high
    if interval == "documents":
        assert covered / reps >= 0.93, covered / reps
    else:
        assert covered / reps < 0.85, covered / reps


def test_a_paired_interval_over_different_documents_is_refused():
    with pytest.raises(ValueError, match="2 and 3 documents of 2"):
        stats.cluster_difference([1.0] * 2, [1.0] * 3, [2, 2])
    with pytest.raises(ValueError, match="two documents, not 1"):
        stats.cluster_difference([1.0], [1.0], [2])


def test_the_bell_mccaffrey_dof_of_equal_documents_is_one_fewer_than_them():
    """Equal lengths: the CR2 variance is the usual one over documents, with G - 1 dof; the
    demo's 19 val documents (229 to 6,796 tokens) carry the information of about 10."""
    assert stats.bell_mccaffrey_dof([100] * 19) == pytest.approx(18)
    demo = [2691, 2075, 853, 824, 6796, 979, 1350, 229, 545, 1557, 279, 2227, 775, 1534]
    assert 5 < stats.bell_mccaffrey_dof(demo + [4389, 1920, 1253, 906, 1000]) < 12


def test_welch_over_seeds_covers_the_zero_difference_of_identical_recipes():
    """Two identical recipes, 3 seeds each, every seed's val loss its own draw: the 95% Welch
    interval holds zero in at least 94% of 4,000 pairs."""
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(4000):
        a, b = rng.normal(3.3, 0.02, 3), rng.normal(3.3, 0.02, 3)
        _, low, high, _, p = stats.welch(list(a), list(b))
        assert (p >= 0.05) == (low <= 0 <= high)
        covered += low <= 0 <= high
    assert covered / 4000 >= 0.94
    ours = stats.welch([1.0, 1.3, 0.9], [0.5, 0.7, 0.2, 0.4])
    theirs = scipy_stats.ttest_ind([1.0, 1.3, 0.9], [0.5, 0.7, 0.2, 0.4], equal_var=False)
    ci = theirs.confidence_interval(0.95)
    assert (ours[1], ours[2], ours[4]) == pytest.approx((ci.low, ci.high, theirs.pvalue))

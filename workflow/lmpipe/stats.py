"""The intervals and tests the report's comparisons rest on, each named for its source.

- Paired accuracy differences (two runs, the same items): Newcombe's square-and-add interval
  (Newcombe 1998, "Improved confidence intervals for the difference between binomial proportions
  based on paired data", Stat. Med. 17:2635, method 10), Wilson intervals of the two accuracies
  combined with a correction for their correlation. Unlike the Wald interval of the per-item
  differences it is never zero-width (with no item disagreeing it still spans zero) and it keeps
  close to its level at a few disagreements. tests/reference/ holds the R package
  contingencytables' values of it on a grid of tables.
- Many tasks at once: Holm's step-down adjustment (Holm 1979), which keeps the chance that any of
  a family of tests is called significant by chance alone at most the level, whatever their
  dependence.
- Val loss of two runs scored on the same documents: the difference of the two mean token losses
  with a cluster-robust standard error over documents (each document's tokens one cluster: a
  token's loss is correlated with its neighbours', a document's with no other's), t with one
  degree of freedom fewer than documents.
- Recipes over seeds: Welch's t interval of the difference of the per-seed figures' means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

LEVEL = 0.95  # the intervals' coverage; tests at 1 - LEVEL


def proportion(flags: Sequence[int]) -> tuple[float, float]:
    """The share of 0/1 results that are 1, and its standard error sqrt(p (1 - p) / n) (an
    accuracy's, as lm-eval reports it beside the figure)."""
    n = len(flags)
    p = sum(flags) / n
    return p, math.sqrt(p * (1 - p) / n)


def z(level: float = LEVEL) -> float:
    """The normal quantile of a two-sided interval at `level` (1.96 at 95%)."""
    return float(stats.norm.ppf(0.5 + level / 2))


def t_quantile(dof: float, level: float = LEVEL) -> float:
    """Student's t quantile of a two-sided interval at `level` (4.30 at 95% with 2 dof)."""
    return float(stats.t.ppf(0.5 + level / 2, dof))


def wilson(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval of a proportion (Wilson 1927)."""
    q, p = z(level), successes / n
    centre = (2 * n * p + q * q) / (2 * n + 2 * q * q)
    half = q * math.sqrt(q * q + 4 * n * p * (1 - p)) / (2 * n + 2 * q * q)
    return centre - half, centre + half


def newcombe_paired(
    both: int, first_only: int, second_only: int, neither: int, level: float = LEVEL
) -> tuple[float, float, float]:
    """(difference, low, high) of the first's accuracy minus the second's on the same items:
    Newcombe's method 10. `both`: items both get right; `first_only`: only the first;
    `second_only`: only the second; `neither`: neither."""
    n = both + first_only + second_only + neither
    if n == 0:
        raise ValueError("a paired interval over no items")
    first, second = both + first_only, both + second_only  # each run's items right
    p1, p2 = first / n, second / n
    l1, u1 = wilson(first, n, level)
    l2, u2 = wilson(second, n, level)
    # the correlation of the two accuracies, corrected towards zero as Newcombe's phi-hat
    margins = first * (n - first) * second * (n - second)
    psi = 0.0
    if margins > 0:
        a = both * neither - first_only * second_only
        if a > n / 2:
            psi = (a - n / 2) / math.sqrt(margins)
        elif a < 0:
            psi = a / math.sqrt(margins)
    d = p1 - p2
    low = d - math.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2), 0))
    high = d + math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1), 0))
    return d, low, high


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the order given: the k-th smallest p times the number of
    tests not yet rejected before it (m - k + 1), never below an earlier one's, at most 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [1.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def family_wise_words(tests: int, level: float = LEVEL) -> str:
    """What Holm's adjustment keeps, in words, for a verdict line."""
    if tests == 1:
        return "one test of this pair: no adjustment for many tests needed"
    return (
        f"p Holm-adjusted over the {tests} tests of this pair: the chance that any of them is"
        f" called by chance alone is at most {1 - level:.0%}"
    )


def cluster_mean(
    doc_sums: Sequence[float], doc_tokens: Sequence[int]
) -> tuple[float, float, float]:
    """(mean, standard error, degrees of freedom) of a mean over tokens given each document's
    summed value and tokens: the standard error cluster-robust over documents (CR2, Bell and
    McCaffrey 2002: each document's residual sum scaled by 1 / sqrt(1 - its share of the
    tokens), less biased than CR1 over few documents of unequal lengths) with Bell and
    McCaffrey's degrees of freedom."""
    if len(doc_sums) != len(doc_tokens):
        raise ValueError(f"{len(doc_sums)} document sums for {len(doc_tokens)} documents")
    if len(doc_tokens) < 2:
        raise ValueError(f"a mean over documents needs two documents, not {len(doc_tokens)}")
    tokens = sum(doc_tokens)
    mean = sum(doc_sums) / tokens
    scaled = [
        (s - mean * n) ** 2 / (1 - n / tokens) for s, n in zip(doc_sums, doc_tokens, strict=True)
    ]
    return mean, math.sqrt(sum(scaled)) / tokens, bell_mccaffrey_dof(doc_tokens)


def cluster_stderr(doc_sums: Sequence[float], doc_tokens: Sequence[int]) -> float | None:
    """cluster_mean's standard error; None over fewer than two documents."""
    return cluster_mean(doc_sums, doc_tokens)[1] if len(doc_tokens) > 1 else None


def cluster_difference(
    first: Sequence[float], second: Sequence[float], doc_tokens: Sequence[int], level: float = LEVEL
) -> tuple[float, float, float, int]:
    """(difference, low, high, documents) of two mean token losses over the same documents,
    given each document's summed loss under each model and its tokens: first minus second,
    with cluster_mean's standard error and a t quantile of its degrees of freedom."""
    if not len(first) == len(second) == len(doc_tokens):
        raise ValueError(
            f"paired over {len(first)} and {len(second)} documents of {len(doc_tokens)}"
        )
    diff = [a - b for a, b in zip(first, second, strict=True)]
    mean, se, dof = cluster_mean(diff, doc_tokens)
    half = t_quantile(dof, level) * se
    return mean, mean - half, mean + half, len(doc_tokens)


def bell_mccaffrey_dof(lengths: Sequence[int]) -> float:
    """The degrees of freedom of the CR2 variance of a mean over clusters of these sizes
    (Bell and McCaffrey 2002, Satterthwaite's under independent tokens): documents - 1 when all
    are as long, fewer when a few long documents carry most of the tokens."""
    tokens = sum(lengths)
    r = [n * n / (1 - n / tokens) for n in lengths]
    cross = (sum(r) ** 2 - sum(x * x for x in r)) / tokens**2
    return tokens**2 / (sum(n * n for n in lengths) + cross)


def welch(
    first: Sequence[float], second: Sequence[float], level: float = LEVEL
) -> tuple[float, float, float, float, float]:
    """(difference, low, high, dof, p) of the means of two groups of replicas (one figure a
    seed): Welch's t interval and two-sided test, each group's own variance,
    Welch-Satterthwaite's degrees of freedom."""
    if len(first) < 2 or len(second) < 2:
        raise ValueError(
            f"Welch's interval needs two replicas a side, not {len(first)}, {len(second)}"
        )
    m1, m2 = sum(first) / len(first), sum(second) / len(second)
    v1 = sum((x - m1) ** 2 for x in first) / (len(first) - 1) / len(first)
    v2 = sum((x - m2) ** 2 for x in second) / (len(second) - 1) / len(second)
    se = math.sqrt(v1 + v2)
    if se == 0:  # every seed alike on both sides: no spread to test against
        return m1 - m2, m1 - m2, m1 - m2, math.inf, 1.0 if m1 == m2 else 0.0
    dof = (v1 + v2) ** 2 / (v1 * v1 / (len(first) - 1) + v2 * v2 / (len(second) - 1))
    half = t_quantile(dof, level) * se
    p = float(2 * stats.t.sf(abs(m1 - m2) / se, dof))
    return m1 - m2, m1 - m2 - half, m1 - m2 + half, dof, p

"""The task table: standard errors, paired tests against the first run, verdicts in words, and
published figures marked where they were measured on another split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_report import layout, render, row_text, settings, write_run  # noqa: F401

from lmpipe.paths import Layout
from lmpipe.report.comparison import mcnemar, paired_mean_test


def test_mcnemar_exact_p_values_by_hand():
    """8 items only `other` gets right, 2 only the baseline: p = 2 * P(X <= 2 | 10, 1/2)."""
    base = [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    other = [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]  # the last two agree: not counted
    test = mcnemar(base, other)
    assert (test.better, test.worse) == (8, 2)
    assert test.p == pytest.approx(2 * (1 + 10 + 45) / 2**10)  # 0.109: not significant
    assert not test.significant and test.mark == ""
    ten = mcnemar([0] * 10, [1] * 10)
    assert ten.p == pytest.approx(2 / 2**10) and ten.mark == "▲"
    assert mcnemar([1] * 10, [0] * 10).mark == "▼"
    assert mcnemar([1, 0], [1, 0]).p == 1.0  # no disagreement: nothing to tell


def test_paired_mean_test_by_hand():
    """Two tasks; differences d1 = (1,1,0,0) and d2 = (1,0,0,-1): mean of task means 0.25,
    se = sqrt(var1/4 + var2/4) / 2 with the sample variances 1/3 and 2/3: z = 0.25/0.25 = 1."""
    from scipy.stats import norm

    t1 = ([0, 0, 1, 1], [1, 1, 1, 1])
    t2 = ([0, 1, 1, 1], [1, 1, 1, 0])
    test = paired_mean_test([t1, t2])
    se = ((1 / 3) / 4 + (2 / 3) / 4) ** 0.5 / 2
    assert se == pytest.approx(0.25)
    assert test.p == pytest.approx(2 * norm.sf(1.0))
    assert (test.better, test.worse) == (3, 1)


def suite_result(
    correct: dict[str, list[int]],
    split: dict[str, str] | None = None,
    ids: dict[str, list[str]] | None = None,
) -> dict:
    """A suite result file as lmpipe.eval.suite writes it (headline acc_norm or acc); items'
    ids their places unless given."""
    tasks, per_item = {}, {}
    for task, c in correct.items():
        n, mean = len(c), sum(c) / len(c)
        se = (mean * (1 - mean) / (n - 1)) ** 0.5  # sample sd / sqrt(n) of 0/1 values
        metric = "acc" if task == "winogrande" else "acc_norm"
        tasks[task] = {metric: mean, f"{metric}_stderr": se, "headline": metric, "items": n}
        tasks[task]["split"] = (split or {}).get(task, "validation")
        per_item[task] = {"ids": (ids or {}).get(task) or [str(i) for i in range(n)], metric: c}
    core = sum(t[t["headline"]] for t in tasks.values()) / len(tasks)
    return {
        "metric": "suite",
        "value": core,
        "core": core,
        "core_tasks": list(tasks),
        "tasks": tasks,
        "per_item": per_item,
        "failed": {},
    }


def add_suite(lay: Layout, run: str, result: dict) -> None:
    (Path(lay.eval_dir(run)) / "suite.json").write_text(json.dumps(result))


def test_report_marks_the_difference_the_data_can_tell(layout: Layout, tmp_path: Path):  # noqa: F811
    """b gets 40 more PIQA items right than a (significant), and the same on ARC-Easy but on
    other items (not): the table marks PIQA ▲ for b only, the verdict says both in words."""
    n = 200
    piqa_a = [1] * 80 + [0] * 120
    piqa_b = [1] * 120 + [0] * 80
    arc_a = [1] * 60 + [0] * 140
    arc_b = [0] * 60 + [1] * 60 + [0] * 80  # 60 right, but other items: 60 vs 60 discordant
    wino = [1, 0] * (n // 2)
    for run in ("a", "b"):
        write_run(layout, run)
    add_suite(layout, "a", suite_result({"piqa": piqa_a, "arc_easy": arc_a, "winogrande": wino}))
    add_suite(layout, "b", suite_result({"piqa": piqa_b, "arc_easy": arc_b, "winogrande": wino}))
    runs = {"a": settings(1e-3) | {"run": "a"}, "b": settings(3e-3) | {"run": "b"}}
    for r in runs.values():
        r["evaluations"] = [*r["evaluations"], "suite"]
    html = render(layout, runs, tmp_path)

    piqa = row_text(html, "task-piqa")
    assert "40.0% ± 3.5%" in piqa and "60.0% ± 3.5%" in piqa  # sqrt(.24/199) = 3.47%
    assert piqa.count("▲") == 1 and "▼" not in piqa
    arc = row_text(html, "task-arc_easy")
    assert "30.0%" in arc and "▲" not in arc and "▼" not in arc
    verdict = html[html.index('<ul id="verdicts">') : html.index("</ul>", html.index("verdicts"))]
    # 80 right by both, 40 by b only, none by a only, 80 by neither: Newcombe's interval
    # 14.27 to 25.42 points (R's contingencytables gives 0.1426528, 0.2542220 for this table)
    assert "b: better than a on PIQA (+20.0 points, 95% CI +14.3 to +25.4; p = " in verdict
    # three tests of this pair (PIQA, ARC-Easy, Winogrande) and the core average: one family
    assert "Holm-adjusted over the 4 tests of this pair" in verdict
    assert "(differs in train.optimizer.lr; 81,920 tokens trained each; one seed each;" in verdict
    assert "cannot tell it from a on" in verdict and "ARC-Easy" in verdict
    # OPT's ARC-Easy is on the test split, this report's on validation; OPT's PIQA on validation
    assert "40.0% †" in _plain(arc)
    assert "62.0%" in piqa and "62.0% †" not in _plain(piqa)


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_runs_on_different_items_are_paired_on_those_both_scored(layout: Layout, tmp_path: Path):  # noqa: F811
    """b scored 50 of a's 100 PIQA items (by id): the test runs on those 50, and the cell and the
    verdict say so; a run with no items in common with the baseline is said, not dropped."""
    for run in ("a", "b", "c"):
        write_run(layout, run)
    add_suite(layout, "a", suite_result({"piqa": [0] * 100}))
    add_suite(layout, "b", suite_result({"piqa": [1] * 50}))  # ids 0..49: right where a is wrong
    add_suite(layout, "c", suite_result({"piqa": [1] * 5}, ids={"piqa": list("vwxyz")}))
    runs = {n: settings(1e-3) | {"run": n} for n in ("a", "b", "c")}
    html = render(layout, runs, tmp_path)
    piqa = _plain(row_text(html, "task-piqa"))
    assert piqa.count("▲") == 1  # b: 50 discordant items, all its way
    assert "tested on the 50 items both scored (a scored 100, b 50)" in piqa
    assert "not tested: no item scored by both a and c" in piqa
    verdict = _plain(html[html.index('<ul id="verdicts">') :])
    assert "b: better than a on PIQA (+100.0 points" in verdict
    assert "PIQA: tested on the 50 items both scored" in verdict
    assert "PIQA: not tested: no item scored by both a and c;" in verdict[verdict.index("c: ") :]


def test_pairing_follows_item_ids_not_order(layout: Layout, tmp_path: Path):  # noqa: F811
    """b's per-item results shuffled (ids along with them): the same p, the same verdict."""
    import random

    a = [1] * 30 + [0] * 70
    b = [0] * 10 + [1] * 40 + [0] * 50  # 10 only a, 20 only b
    order = list(range(100))
    random.Random(0).shuffle(order)
    shuffled = {"piqa": [b[i] for i in order]}
    for run in ("a", "b", "b2"):
        write_run(layout, run)
    add_suite(layout, "a", suite_result({"piqa": a}))
    add_suite(layout, "b", suite_result({"piqa": b}))
    add_suite(layout, "b2", suite_result(shuffled, ids={"piqa": [str(i) for i in order]}))
    runs = {n: settings(1e-3) | {"run": n} for n in ("a", "b", "b2")}
    html = _plain(render(layout, runs, tmp_path))
    from scipy.stats import binomtest

    p = binomtest(20, 30, 0.5).pvalue
    cells = re.findall(r"p = ([0-9.]+)", row_text(html, "task-piqa"))
    assert cells == [f"{p:.2g}"] * 2  # b and b2 alike: p of 20 against 10 discordant items


def test_too_few_items_to_tell_is_not_cannot_tell(layout: Layout, tmp_path: Path):  # noqa: F811
    """5 discordant items cannot reach p < 0.05 whatever happens (2/2^5 = 0.0625): said as too
    few items; 60 against 60 could have, and is "cannot tell"."""
    for run in ("a", "b"):
        write_run(layout, run)
    piqa_b = [1] * 5 + [0] * 45
    arc_a, arc_b = [1] * 60 + [0] * 60, [0] * 60 + [1] * 60
    add_suite(layout, "a", suite_result({"piqa": [0] * 50, "arc_easy": arc_a}))
    add_suite(layout, "b", suite_result({"piqa": piqa_b, "arc_easy": arc_b}))
    runs = {n: settings(1e-3) | {"run": n} for n in ("a", "b")}
    verdict = _plain(render(layout, runs, tmp_path))
    verdict = verdict[verdict.index('<ul id="verdicts">') :]
    assert "too few items to tell on PIQA (5 items disagree)" in verdict
    assert "at least 6 items where the runs disagree" in verdict
    assert "cannot tell it from a on ARC-Easy" in verdict


def test_core_mark_follows_the_mean_difference():
    """More items better than worse, but the mean difference negative: ▼, not ▲ (a large task
    slightly better, a small task much worse, each task weighing the same in the average)."""
    big = ([0] * 60 + [1] * 40 + [0] * 900, [1] * 60 + [0] * 40 + [0] * 900)  # +20 of 1000
    small = ([1] * 10, [0] * 10)  # -10 of 10
    test = paired_mean_test([big, small])
    assert test.better > test.worse and test.diff < 0
    assert test.significant and test.mark == "▼"
    assert test.low < test.diff < test.high < 0


def test_items_of_another_version_are_not_paired(layout: Layout, tmp_path: Path):  # noqa: F811
    """Two runs' suite results from task folders of different sha256 (another release of the
    items, same ids): not tested, and the cell names both versions."""
    for run in ("a", "b"):
        write_run(layout, run)
    for run, sha in (("a", "aa" * 32), ("b", "bb" * 32)):
        result = suite_result({"piqa": [1] * 20 + [0] * 30})
        result["produced_by"] = {"data": {"sha256": {"piqa": sha}}}
        add_suite(layout, run, result)
    runs = {n: settings(1e-3) | {"run": n} for n in ("a", "b")}
    piqa = _plain(row_text(render(layout, runs, tmp_path), "task-piqa"))
    assert (
        "not tested: a and b scored other versions of the items (aaaaaaaaaaaa and bbbbbbbbbbbb)"
        in piqa
    )
    assert "p = " not in piqa


def test_replicated_recipes_are_compared_over_seeds_with_holm(layout: Layout, tmp_path: Path):  # noqa: F811
    """Two recipes, 3 seeds each: the recipes' table holds each task's mean and sd over seeds,
    Welch's interval against the first recipe, Holm-adjusted; the verdict compares recipes, and
    no single run is tested against another."""
    from scipy.stats import ttest_ind

    piqa = {"a": [20, 22, 21], "b": [35, 37, 36]}  # right of 50, a seed each
    arc = {"a": [20, 25, 22], "b": [21, 24, 22]}
    boolq = {"a": [11, 11, 11], "b": [11, 11, 11]}  # the majority answer, whatever the seed
    runs = {}
    for recipe in ("a", "b"):
        for i, seed in enumerate((1, 2, 3)):
            name = f"{recipe}/seed={seed}"
            write_run(layout, name)
            right = {"piqa": piqa[recipe][i], "arc_easy": arc[recipe][i]}
            right["boolq"] = boolq[recipe][i]
            correct = {t: [1] * k + [0] * (50 - k) for t, k in right.items()}
            add_suite(layout, name, suite_result(correct))
            runs[name] = settings(1e-3 if recipe == "a" else 3e-3) | {"run": name}
    html = _plain(render(layout, runs, tmp_path))
    table = row_text(html, "recipe-piqa")
    assert "42.0%" in table and "72.0%" in table and "sd 2.0%" in table
    test = ttest_ind([k / 50 for k in piqa["b"]], [k / 50 for k in piqa["a"]], equal_var=False)
    ci = test.confidence_interval(0.95)
    assert f"[{100 * ci.low:+.1f}, {100 * ci.high:+.1f}]" in table  # scipy's Welch, not ours
    verdict = html[html.index('<ul id="verdicts">') :]
    verdict = verdict[: verdict.index("</ul>")]
    assert verdict.count("<li>") == 1 and "b (over 3 and 3 seeds): better than a on PIQA" in verdict
    assert "; the seeds cannot tell it from a on ARC-Easy; not tested on" in verdict
    assert "differs in train.optimizer.lr" in verdict and "Holm-adjusted over the" in verdict
    assert "▲" not in row_text(html, "task-piqa")  # no run-against-run test
    # no spread at all: no zero-width interval, no test
    # (HellaSwag, test_report's write_run: the same result for every seed)
    assert "not tested on HellaSwag (llm.c scoring), BoolQ: every seed of both scored" in verdict
    assert "every seed alike: not tested" in row_text(html, "recipe-boolq")
    assert "[+0.0, +0.0]" not in html
    # the headline: a row a recipe, each figure's mean and sd over its seeds
    a_row = row_text(html, "headline-recipe-a")
    assert "mean (sd) over its 3 seeds" in a_row


def test_a_report_compares_the_pairs_its_config_names(layout: Layout, tmp_path: Path):  # noqa: F811
    """compare: [[b, c]]: c is tested against b, and neither a nor b against anything."""
    from test_report import params

    from lmpipe.report import page

    for run in ("a", "b", "c"):
        write_run(layout, run)
    add_suite(layout, "a", suite_result({"piqa": [0] * 50}))
    add_suite(layout, "b", suite_result({"piqa": [0] * 50}))
    add_suite(layout, "c", suite_result({"piqa": [1] * 30 + [0] * 20}))
    runs = {n: settings(1e-3) | {"run": n} for n in ("a", "b", "c")}
    html = _plain(page.build_report(params(runs, 0.0) | {"compare": [["b", "c"]]}, layout))
    verdict = html[html.index('<ul id="verdicts">') :]
    verdict = verdict[: verdict.index("</ul>")]
    assert verdict.count("<li>") == 1 and "<li>c: better than b on PIQA" in verdict
    assert row_text(html, "task-piqa").count("p = ") == 1

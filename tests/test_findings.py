"""The report's verdict lines (lmpipe.report.findings): val loss with a paired interval, a
fine-tuned run that lost its pretraining, chat replies that repeat."""

from __future__ import annotations

import random

import pytest
from scipy import stats

from lmpipe.report.findings import findings, paired_interval
from lmpipe.report.runs import Run


def run(name: str, val: float | None = None, batches=None, sft=False, replies=None) -> Run:
    settings = {"dataset": "embedded"} | ({"sft": {}, "base": {"run": "a"}} if sft else {})
    r = Run(name=name, settings=settings)
    if val is not None:
        r.evals["val_loss"] = {"value": val, "tokens": 4096, "batch_losses": batches}
    if replies is not None:
        r.evals["chat_samples"] = {
            "samples": [{"prompt": f"p{i}", "reply": x} for i, x in enumerate(replies)]
        }
    return r


def noisy(center: float, n: int = 32, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center + rng.gauss(0, 0.3) for _ in range(n)]


def test_the_interval_is_the_paired_t_interval():
    a, b = noisy(9.0, seed=1), noisy(8.7, seed=2)
    mean, low, high = paired_interval(a, b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)  # scipy's own, not ours
    assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert paired_interval(a, b[:-1]) is None and paired_interval(a[:1], b[:1]) is None


def test_val_loss_lines_say_worse_better_or_cannot_tell():
    base = noisy(8.7, seed=1)
    worse = [x + 1.3 + random.Random(i).gauss(0, 0.05) for i, x in enumerate(base)]
    better = [x - 0.2 + random.Random(i).gauss(0, 0.05) for i, x in enumerate(base)]
    same = [x + random.Random(i).gauss(0, 0.05) for i, x in enumerate(base)]
    runs = [run("a", 8.7, base), run("b", 10.0, worse), run("c", 8.5, better), run("d", 8.7, same)]
    lines = findings(runs)
    assert lines[0].startswith("b: FineWeb val loss 10.0000 against a's 8.7000") and lines[
        0
    ].endswith("worse than a.")
    assert lines[1].endswith("better than a.") and lines[2].endswith("cannot tell it from a.")
    assert "95% interval" in lines[0] and "over 32 batches" in lines[0]


def test_without_paired_batches_no_interval_is_claimed():
    lines = findings([run("a", 8.7, None), run("b", 10.0, None)])
    assert lines == [
        "b: FineWeb val loss 10.0000 against a's 8.7000: no paired batches to give an interval"
        " (different val tokens, or results written without per-batch losses)."
    ]


def test_a_fine_tuned_run_above_an_untrained_models_loss_is_flagged():
    base, chat = run("a", 8.69, noisy(8.69)), run("a-chat", 15.91, noisy(15.9), sft=True)
    (line,) = findings([base, chat])
    assert line == (
        "a-chat lost its pretraining: its FineWeb val loss 15.91 is above an untrained model's"
        " (10.82, a uniform guess over the vocabulary); its base a had 8.69."
    )
    assert findings([base, run("a-chat", 9.5, noisy(9.5), sft=True)]) == []


def test_chat_replies_that_repeat_across_prompts_are_flagged():
    same = run("c", replies=["I am Vicuna.", "I am Vicuna.", "Paris.", "I am Vicuna."])
    assert findings([run("a"), same]) == [
        "c repeats itself: its 4 chat prompts get 2 distinct replies (chat samples)."
    ]
    assert findings([run("a"), run("c", replies=["I am Vicuna.", "Paris."])]) == []
    once = findings([run("a"), run("c", replies=["I am Vicuna."] * 3)])
    assert once == ["c repeats itself: its 3 chat prompts get the same reply (chat samples)."]


def test_a_run_that_skipped_an_unusable_checkpoint_is_flagged():
    from test_restarts import end, mark, start

    from lmpipe.report.restarts import summarise

    rows = [start(1, 0), mark("checkpoint", 1, 5, 8), mark("checkpoint", 1, 9, 16)]
    rows += [end(1, 9, 16, "finished"), start(2, 99, step=8), end(2, 104, 16, "finished")]
    r = run("a")
    r.restarts = summarise(rows)
    assert findings([r]) == [
        "a skipped unusable checkpoints and redid 8 step(s): attempt 2 resumed from step 8, not"
        " from the newer checkpoint of step 16 (unusable: broken or gone): 8 step(s) redone"
    ]


def with_sources(r: Run, dataset: str, sources: dict[str, list[float]]) -> Run:
    """`r`'s val_loss made a mixture's: each source's batches, its weighted mean on top."""
    r.evals["val_loss"] = {
        "dataset": dataset,
        "value": 0.0,
        "tokens": 8192,
        "sources": {
            name: {"dataset": name, "value": sum(b) / len(b), "tokens": 4096, "batch_losses": b}
            for name, b in sources.items()
        },
    }
    return r


def test_a_mixture_is_compared_on_each_val_shard_both_runs_were_scored_on():
    """A mixture's run against a run of one of its sources: on that source's val shard only;
    against a run of other data: said, with no interval."""
    base = run("a", 9.0, noisy(9.0, seed=1))
    base.evals["val_loss"]["dataset"] = "embedded"
    mix = with_sources(run("m"), "mix", {"embedded": noisy(8.0, seed=2), "books": noisy(5.0)})
    (line,) = findings([base, mix])
    assert line.startswith("m: val loss on embedded ") and line.endswith("better than a.")
    other = run("o", 9.0, noisy(9.0, seed=3))
    other.evals["val_loss"]["dataset"] = "code"
    (line,) = findings([other, mix])
    assert "measured on different val data (mix and code): no paired interval." in line
    # the same text in a model's own tokens is other data than in GPT-2's: no pairing
    llama = run("l", 5.0, noisy(5.0, seed=4))
    llama.evals["val_loss"] |= {"dataset": "embedded", "tokens_of": "llama"}
    (line,) = findings([base, llama])
    assert line.endswith(
        "measured on different val data (embedded in llama's tokens and embedded): no paired"
        " interval."
    )
    # two runs of one mixture: a line for each source
    mix2 = with_sources(run("m2"), "mix", {"embedded": noisy(8.0, seed=2), "books": noisy(6.0)})
    lines = findings([mix, mix2])
    assert [ln.split(" ")[4] for ln in lines] == ["embedded", "books"]
    assert lines[1].endswith("worse than m.")

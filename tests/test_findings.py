"""The report's verdict lines (lmpipe.report.findings): val loss with an interval over documents
(one seed each) or over seeds (replicated recipes), what the two runs differ in and whether they
trained equal tokens, a fine-tuned run that lost its pretraining, chat replies that repeat."""

from __future__ import annotations

import random

from scipy import stats

from lmpipe.report.findings import findings
from lmpipe.report.runs import Run

# the demo's 19 val documents' token counts (32,768 tokens of the embedded val shard)
LENGTHS = [2691, 2075, 853, 824, 6796, 979, 1350, 229, 545, 1557, 279, 2227, 775, 1534, 4389]
LENGTHS += [1920, 1253, 906, 1584]


def scores(center: float, seed: int = 0, lengths=LENGTHS) -> dict:
    """A val_loss result: each document's mean loss about `center`, summed over its tokens."""
    rng = random.Random(seed)
    means = [center + rng.gauss(0, 0.3) for _ in lengths]
    sums = [m * n for m, n in zip(means, lengths, strict=True)]
    return {
        "value": sum(sums) / sum(lengths),
        "tokens": sum(lengths),
        "doc_losses": sums,
        "doc_tokens": list(lengths),
    }


def run(name: str, val=None, sft=False, replies=None, settings=None) -> Run:
    base = {"dataset": "embedded"} | ({"sft": {}, "base": {"run": "a"}} if sft else {})
    r = Run(name=name, settings=base | (settings or {}))
    if isinstance(val, dict):
        r.evals["val_loss"] = val
    elif val is not None:
        r.evals["val_loss"] = {"value": val, "tokens": 4096}
    if replies is not None:
        r.evals["chat_samples"] = {
            "samples": [{"prompt": f"p{i}", "reply": x} for i, x in enumerate(replies)]
        }
    return r


def shifted(result: dict, by: float, seed: int) -> dict:
    """`result` with each document's mean loss moved by `by`, and a little noise of its own."""
    rng = random.Random(seed)
    sums = [
        s + (by + rng.gauss(0, 0.05)) * n
        for s, n in zip(result["doc_losses"], result["doc_tokens"], strict=True)
    ]
    return result | {"doc_losses": sums, "value": sum(sums) / result["tokens"]}


def test_over_documents_of_equal_length_the_interval_is_the_paired_t_interval():
    """Equal documents: the cluster-robust interval is scipy's paired t interval of the
    documents' mean losses (CR2 with documents - 1 degrees of freedom reduces to it)."""
    even = [500] * 19
    a, b = scores(9.0, 1, even), scores(8.7, 2, even)
    (line,) = findings([run("a", b), run("b", a)])
    ci = stats.ttest_rel(
        [s / 500 for s in a["doc_losses"]], [s / 500 for s in b["doc_losses"]]
    ).confidence_interval(0.95)
    assert f"95% interval {ci.low:+.4f} to {ci.high:+.4f} over 19 documents" in line


def test_val_loss_lines_say_worse_better_or_cannot_tell_and_for_what():
    base = scores(8.7, seed=1)
    runs = [run("a", base), run("b", shifted(base, 1.3, 1)), run("c", shifted(base, -0.2, 2))]
    runs.append(run("d", shifted(base, 0.0, 3)))
    lines = findings(runs)
    b_value = runs[1].evals["val_loss"]["value"]
    assert lines[0].startswith(f"b: FineWeb val loss {b_value:.4f} against a's {base['value']:.4f}")
    assert lines[0].endswith("worse than a on these documents, not yet a verdict on the recipes.")
    assert lines[1].endswith("better than a on these documents, not yet a verdict on the recipes.")
    assert lines[2].endswith("the val documents cannot tell it from a.")
    assert "over 19 documents, cluster-robust; evaluation noise only, one seed each" in lines[0]
    assert "the same settings; tokens trained unknown" in lines[0]


def curve_row(step: int, tokens: int, result: dict) -> dict:
    """A metrics.jsonl validation line holding `result`'s per-document sums."""
    documents = {"losses": result["doc_losses"], "tokens": result["doc_tokens"]}
    return {"step": step, "tokens": tokens, "val_loss": result["value"], "val_documents": documents}


def unequal(a_final: dict, b_final: dict, a_24: dict, b_24: dict) -> tuple[Run, Run]:
    """a trained 24 steps (98,304 tokens), b 96 (393,216); both validated at step 24."""
    a = run("a", a_final, settings={"model": {"n_layer": 3}, "train": {"max_steps": 24, "seed": 1}})
    b = run("b", b_final, settings={"model": {"n_layer": 4}, "train": {"max_steps": 96, "seed": 2}})
    a.meta, b.meta = {"tokens": 98_304}, {"tokens": 393_216}
    a.val = [curve_row(24, 98_304, a_24)]
    b.val = [curve_row(24, 98_304, b_24), curve_row(96, 393_216, b_final)]
    return a, b


def test_unequal_tokens_are_compared_where_both_reached_never_on_the_final_evaluations():
    """A 96-step run against a 24-step one: compared on their validations during training at
    98,304 tokens (per-document, cluster-robust), where b is worse; its final evaluation, after
    4x the tokens, is far better, and is shown but not compared."""
    base = scores(8.7, seed=1)
    a, b = unequal(base, shifted(base, -2.0, 3), base, shifted(base, 0.4, 2))
    (line,) = findings([a, b])
    at_24 = b.val[0]["val_loss"]
    assert line.startswith(
        f"b: val loss during training at 98,304 tokens, the most both reached, {at_24:.4f}"
        f" against a's {base['value']:.4f}"
    ), line
    assert "differs in model.n_layer, train.max_steps;" in line  # train.seed: a replica's
    assert "trained 393,216 tokens against 98,304; their final val losses" in line
    assert "are at unequal tokens and not compared" in line
    assert "over 19 documents, cluster-robust" in line
    assert line.endswith("worse than a on these documents, not yet a verdict on the recipes.")
    # over seeds: Welch's interval of the replicas' validations at the common point
    ra = [unequal(scores(8.7, s), scores(8.0, s), scores(8.7 + 0.01 * s, s), scores(9, s))[0]
          for s in range(3)]  # fmt: skip
    rb = [unequal(scores(8.7, s), scores(8.0, s), scores(8.7, s), scores(9.1 + 0.01 * s, s))[1]
          for s in range(3)]  # fmt: skip
    for i, r in enumerate(ra + rb):
        r.name = f"{r.name}/seed={i % 3}"
    (line,) = findings(ra + rb)
    assert line.startswith("b: val loss during training at 98,304 tokens"), line
    assert "Welch interval" in line and line.endswith("worse than a over 3 and 3 seeds.")


def test_unequal_tokens_without_a_common_point_or_documents_get_no_word():
    base = scores(8.7, seed=1)
    a, b = unequal(base, shifted(base, -2.0, 3), base, shifted(base, 0.4, 2))
    b.val = b.val[1:]  # b validated at 393,216 tokens only
    (line,) = findings([a, b])
    assert "share no token count: not compared" in line
    assert not any(w in line for w in ("better", "worse", "cannot tell")), line
    a, b = unequal(base, shifted(base, -2.0, 3), base, shifted(base, 0.4, 2))
    for r in (a, b):  # a run trained before validations kept their documents
        r.val = [{k: v for k, v in row.items() if k != "val_documents"} for row in r.val]
    (line,) = findings([a, b])
    assert "no interval (a result written without per-document losses" in line


def test_without_per_document_losses_or_on_other_documents_no_interval_is_claimed():
    (line,) = findings([run("a", 8.7), run("b", 10.0)])
    assert line.startswith("b: FineWeb val loss 10.0000 against a's 8.7000: no interval")
    assert "a result written without per-document losses" in line
    other = scores(9.0, 3, [n + 1 for n in LENGTHS[:-1]] + [LENGTHS[-1] - 18])
    (line,) = findings([run("a", scores(8.7)), run("b", other)])
    assert "no interval (the documents' token counts differ: other val text" in line


def replicas(name: str, center: float, seeds=(1337, 1338, 1339), sd=0.02) -> list[Run]:
    rng = random.Random(name)
    return [run(f"{name}/seed={s}", scores(center + rng.gauss(0, sd), s)) for s in seeds]


def test_replicated_recipes_are_compared_over_their_seeds_by_welchs_interval():
    a, b = replicas("a", 8.70), replicas("b", 8.40)
    (line,) = findings(a + b)
    va = [r.evals["val_loss"]["value"] for r in a]
    vb = [r.evals["val_loss"]["value"] for r in b]
    ci = stats.ttest_ind(vb, va, equal_var=False).confidence_interval(0.95)  # scipy's own
    assert line.startswith("b: FineWeb val loss") and "over 3 seeds) against a's" in line
    assert f"95% Welch interval {ci.low:+.4f} to {ci.high:+.4f} over seeds" in line
    assert line.endswith("better than a over 3 and 3 seeds.")
    (line,) = findings(replicas("a", 8.7) + replicas("c", 8.7))
    assert line.endswith("the seeds cannot tell it from a.")
    (line,) = findings(replicas("a", 8.7) + [run("d", scores(8.6))])
    assert "no interval; a comparison over seeds needs two a side" in line


def trained(difficulty: list[float], rng: random.Random) -> dict:
    """A val_loss result of one seed of a recipe on documents of these difficulties (their mean
    losses, shared by every model): the seed moves every document by the same draw (sd 0.02),
    and each document by a little of its own (sd 0.005)."""
    offset = rng.gauss(0, 0.02)
    means = [d + offset + rng.gauss(0, 0.005) for d in difficulty]
    sums = [m * 1500 for m in means]
    tokens = 1500 * len(means)
    return {"value": sum(sums) / tokens, "tokens": tokens, "doc_losses": sums,
            "doc_tokens": [1500] * len(means)}  # fmt: skip


def test_identical_recipes_over_seeds_are_told_apart_at_most_5_percent_of_the_time():
    """500 pairs of identical recipes, 3 seeds each, on 19 val documents, whose seeds move the
    val loss far more than the documents can resolve: the verdict over seeds says "cannot
    tell" in at least 95% of them. One seed each, the interval over documents measures the val
    text only and calls most such pairs better or worse: the reason a one-seed line says it is
    not a verdict on the recipes."""
    rng = random.Random(7)
    told = told_by_documents = 0
    for _ in range(500):
        difficulty = [rng.gauss(8.7, 0.3) for _ in range(19)]
        a = [run(f"a/seed={s}", trained(difficulty, rng)) for s in range(3)]
        b = [run(f"b/seed={s}", trained(difficulty, rng)) for s in range(3)]
        (line,) = findings(a + b)
        told += "cannot tell" not in line
        (line,) = findings([run("a", a[0].evals["val_loss"]), run("b", b[0].evals["val_loss"])])
        told_by_documents += "cannot tell" not in line
    assert told / 500 <= 0.05, told / 500
    assert told_by_documents / 500 > 0.5, told_by_documents / 500


def test_a_fine_tuned_run_above_an_untrained_models_loss_is_flagged():
    base, chat = run("a", 8.69), run("a-chat", 15.91, sft=True)
    (line,) = findings([base, chat])
    assert line == (
        "a-chat lost its pretraining: its FineWeb val loss 15.91 is above an untrained model's"
        " (10.82, a uniform guess over its 50,257 tokens); its base a had 8.69."
    )
    assert findings([base, run("a-chat", 9.5, sft=True)]) == []
    # a model of its own 2,000-token vocabulary: ln 2,000 = 7.60 is its uniform guess
    small = run("b-chat", 7.9, sft=True, settings={"model": {"arch": "hf"}, "base": {"run": "x"}})
    small.meta = {"model": {"arch": "hf", "vocab_size": 2000}}
    (line,) = findings([base, small])
    assert "above an untrained model's (7.60, a uniform guess over its 2,000 tokens)" in line


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


def with_sources(r: Run, dataset: str, sources: dict[str, dict]) -> Run:
    """`r`'s val_loss made a mixture's: each source's scores, its weighted mean on top."""
    r.evals["val_loss"] = {
        "dataset": dataset,
        "value": 0.0,
        "tokens": 8192,
        "sources": {name: {"dataset": name} | s for name, s in sources.items()},
    }
    return r


def test_a_mixture_is_compared_on_each_val_shard_both_runs_were_scored_on():
    """A mixture's run against a run of one of its sources: on that source's val shard only;
    against a run of other data: said, with no interval."""
    embedded = scores(9.0, seed=1)
    base = run("a", embedded | {"dataset": "embedded"})
    books = scores(5.0, seed=5, lengths=[700] * 12)
    mix = with_sources(run("m"), "mix", {"embedded": shifted(embedded, -1.0, 2), "books": books})
    (line,) = findings([base, mix])
    assert line.startswith("m: val loss on embedded ") and "better than a on these" in line
    other = run("o", scores(9.0, seed=3) | {"dataset": "code"})
    (line,) = findings([other, mix])
    assert "measured on different val data (mix and code): no interval" in line
    # the same text in a model's own tokens is other data than in GPT-2's: no pairing
    llama = run("l", scores(5.0, seed=4) | {"dataset": "embedded", "tokens_of": "llama"})
    (line,) = findings([base, llama])
    assert "in llama's tokens and GPT-2's tokens: not compared" in line
    assert "bits per byte is missing" in line
    # with the bytes each scored: compared in bits per byte, never in nats a token
    bpb = {"bytes": 40_000, "bits_per_byte": 1.25}
    llama.evals["val_loss"] |= bpb
    base.evals["val_loss"] |= bpb | {"bits_per_byte": 1.5}
    (line,) = findings([base, llama])
    assert line.startswith("l: FineWeb val bits per byte 1.2500 against a's 1.5000 (-0.2500)")
    assert "5.1" not in line and "8.9" not in line  # no loss in nats a token
    # two runs of one mixture: a line for each source
    mix2 = with_sources(
        run("m2"), "mix", {"embedded": shifted(embedded, -1.0, 3), "books": shifted(books, 1.0, 4)}
    )
    lines = findings([mix, mix2])
    assert [ln.split(" ")[4] for ln in lines] == ["embedded", "books"]
    assert "worse than m on these documents" in lines[1]


def test_a_section_with_many_differences_is_named_once():
    """An architecture's many keys: the model section by its first key and a count, so that the
    optimizer's difference still shows."""
    from lmpipe.report.findings import differing

    a = run("a", settings={"model": {"arch": "gpt2", "bias": True, "norm": "layer"}})
    b = run("b", settings={"model": {"arch": "modern", "bias": False, "norm": "rms"}})
    a.settings["train"] = {"optimizer": {"name": "adamw", "lr": 3e-3}, "seed": 1}
    b.settings["train"] = {"optimizer": {"name": "muon", "lr": 0.02}, "seed": 2}
    assert differing(a, b) == (
        "differs in model.arch and 2 more model keys, train.optimizer.lr, train.optimizer.name"
    )


def test_a_fine_tune_of_a_hugging_face_base_is_measured_against_that_base():
    """The base of `base: {hf: DIR}` is the reference run of that folder (lmpipe.bases): a base
    that was itself no better than a uniform guess lost nothing; one below it is named."""
    model = {"arch": "hf", "path": "/m/llama"}
    meta = {"model": {"arch": "hf", "vocab_size": 2000}}  # ln 2,000 = 7.60

    def chat(val: float) -> Run:
        r = run("chat", val, settings={"sft": {}, "base": {"hf": "/m/llama"}, "model": model})
        r.meta = meta
        return r

    def base(val: float) -> Run:
        r = run("llama-base", val, settings={"reference": True, "model": model})
        r.meta = meta
        return r

    assert [x for x in findings([base(7.7), chat(7.8)]) if "lost" in x] == []
    (line,) = [x for x in findings([base(6.1), chat(7.8)]) if "lost" in x]
    assert line.endswith("its base llama-base had 6.10.")

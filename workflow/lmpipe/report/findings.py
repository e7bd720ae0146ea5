"""The report's verdict beside the task table's: what a reader must see first.

- Each pretraining recipe's FineWeb val loss against the first's (lmpipe.replicas: the seeds of
  a run are one recipe). Each line names what the two differ in (their settings, a replica's
  seed aside) and the tokens each trained. Recipes that trained unequal tokens are compared
  where they were equal: on their validations during training at the most tokens both reached
  (each with its per-document sums, scored as the val_loss evaluation scores), never on their
  final evaluations. Replicated recipes are compared over their
  seeds (Welch's interval of the seeds' val losses: the training's noise, seed and data order,
  and the evaluation's). Two single runs are compared on the documents both scored (an interval
  over documents, cluster-robust: lmpipe.stats), which measures which val text was scored and
  never the training's noise, and the line says so: one seed each, not yet a verdict on the
  recipes. A mixture's runs are compared on each val shard both were scored on (its sources'),
  never across different data.
- Recipes whose val losses are in different tokenizers' tokens (an `arch: hf` model's own and
  GPT-2's): compared in bits per byte, the one figure of both (lmpipe.eval.val_loss), never in
  nats a token.
- A fine-tuned run whose FineWeb val loss is above an untrained model's: ln V, the loss of a
  uniform guess over its own vocabulary of V tokens (GPT-2's 50,257: 10.82; a fresh model's is
  about that, 10.84 at step 0 of the demo), also said in bits per byte of the text scored where
  its bytes are known.
- Chat replies that repeat across different prompts.
- Attempts that resumed past an unusable checkpoint, and the steps that cost.
- A model that ran code shipped in its folder (`arch: hf` with `trust_remote_code: true`).
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from lmpipe import stats
from lmpipe.report.runs import Run, by_recipe, flatten, pairs, tokens_name, used_settings
from lmpipe.stats import LEVEL

GPT2_VOCAB = 50257  # a run whose model's vocabulary is not on record is in GPT-2's tokens


def vocabulary(run: Run) -> int:
    """The tokens a run's model predicts over: its final checkpoint's model (an `arch: hf`
    model's is its own config.json's), else its settings', else GPT-2's."""
    for model in ((run.meta or {}).get("model"), run.settings.get("model")):
        if isinstance(model, dict) and model.get("vocab_size"):
            return int(model["vocab_size"])
    return GPT2_VOCAB


def untrained_loss(run: Run) -> float:
    """ln V: the loss of a uniform guess over the run's own vocabulary."""
    return math.log(vocabulary(run))


def untrained_bpb(run: Run) -> float | None:
    """ln V in bits per byte of the run's val text: ln V * tokens / (bytes * ln 2), where its
    val_loss result knows the bytes it scored (None where not)."""
    result = run.evals.get("val_loss", {})
    if not result.get("bytes") or not result.get("tokens"):
        return None
    return untrained_loss(run) * result["tokens"] / (result["bytes"] * math.log(2))


def val_views(result: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    """A val_loss result's scores by the data they were measured on: its dataset's (a
    mixture's: each source's, its own weighted mean having no documents to pair). The text in a
    model's own tokens is other data than the same text in GPT-2's."""
    return result.get("sources") or {data_name(result): result}


def data_name(result: dict[str, Any]) -> str:
    """The val data a val_loss result was scored on: its dataset, and whose tokens (an `arch:
    hf` model's own tokens of a text are other data than GPT-2's of it)."""
    of = result.get("tokens_of")
    return str(result.get("dataset")) + (f" in {of}'s tokens" if of else "")


def tokens_trained(run: Run) -> int | None:
    meta = run.meta or {}
    last = run.train[-1] if run.train else {}
    tokens = meta.get("tokens", last.get("tokens"))
    return int(tokens) if tokens is not None else None


def differing(a: Run, b: Run, most: int = 6) -> str:
    """The settings two runs differ in (a replica's seed aside), in words: a section in which
    more than two keys differ is named once, by its first key and a count (`model.arch and 8
    more model keys`), so that an architecture's many keys do not hide the rest."""
    fa, fb = flatten(used_settings(a)), flatten(used_settings(b))

    def same(k: str) -> bool:
        return json.dumps(fa.get(k), sort_keys=True) == json.dumps(fb.get(k), sort_keys=True)

    keys = [k for k in sorted(set(fa) | set(fb)) if k != "train.seed" and not same(k)]
    if not keys:
        return "the same settings"
    sections: dict[str, list[str]] = {}
    for k in keys:
        sections.setdefault(k.split(".")[0], []).append(k)
    words = []
    for section, ks in sections.items():
        if len(ks) > 2:
            words.append(f"{ks[0]} and {len(ks) - 1} more {section} keys")
        else:
            words += ks
    shown = ", ".join(words[:most]) + (
        f" and {len(words) - most} more" if len(words) > most else ""
    )
    return f"differs in {shown}"


def tokens_words(mine: list[Run], theirs: list[Run]) -> str:
    """Tokens trained, in words; where they differ, said, with the training curves' val loss at
    the largest token count both recipes' curves reach (their first replicas'): the task
    table's verdict compares final evaluations, and must not read a gap off unequal budgets
    unsaid."""
    a, b = tokens_trained(mine[0]), tokens_trained(theirs[0])
    if a is None or b is None:
        return "tokens trained unknown"
    if a == b:
        return f"{a:,} tokens trained each"
    words = f"trained {a:,} tokens against {b:,}: at unequal tokens"
    t = most_tokens_all_reached([mine[0], theirs[0]])
    if t is not None:
        pa, pb = curve_point(mine[0], t), curve_point(theirs[0], t)
        words += (
            f"; at {t:,} tokens, the most both reached, the training's val loss is"
            f" {pa['value']:.4f} against {pb['value']:.4f}"
        )
    return words


def most_tokens_all_reached(runs: list[Run]) -> int | None:
    """The most tokens trained at which every run of `runs` validated during training (the
    point where unequal budgets compare), or None where they share none."""
    reached = [{row["tokens"] for row in r.val if "tokens" in row} for r in runs]
    both = [t for t in set.intersection(*reached) if t > 0]
    return max(both) if both else None


def curve_point(run: Run, tokens: int) -> dict[str, Any] | None:
    """A run's validation during training at `tokens` trained, as a val_loss result (its
    per-document sums where the line has them), or None where it validated not there."""
    row = next((r for r in run.val if r.get("tokens") == tokens), None)
    if row is None:
        return None
    docs = row.get("val_documents")
    if not docs:
        return {"value": row["val_loss"]}
    losses, counts = docs["losses"], docs["tokens"]
    return {"value": row["val_loss"], "tokens": sum(counts), "doc_losses": losses,
            "doc_tokens": counts}  # fmt: skip


def at_equal_tokens(
    name: str, mine: list[Run], base: str, theirs: list[Run], a: int, b: int
) -> str:
    """Two recipes that trained unequal tokens, compared where they are equal: on their
    validations during training at the most tokens every replica of both reached (the same
    scoring as the val_loss evaluation: lmpipe.eval.val_loss.score). Their final evaluations
    are shown, never compared."""
    finals = [r.evals.get("val_loss", {}).get("value") for r in (mine[0], theirs[0])]
    final = (
        f"; their final val losses, {finals[0]:.4f} against {finals[1]:.4f}, are at unequal"
        " tokens and not compared"
        if None not in finals
        else ""
    )
    what = f"{differing(mine[0], theirs[0])}; trained {a:,} tokens against {b:,}{final}"
    t = most_tokens_all_reached(mine + theirs)
    if t is None:
        return (
            f"{name}: trained {a:,} tokens against {base}'s {b:,}, and their validations during"
            f" training share no token count: not compared ({what})."
        )
    sa = [curve_point(r, t) for r in mine]
    sb = [curve_point(r, t) for r in theirs]
    on = f"val loss during training at {t:,} tokens, the most both reached,"
    if len(sa) > 1 and len(sb) > 1:
        return over_seeds(name, sa, base, sb, on, what)
    if len(sa) == 1 and len(sb) == 1:
        return over_documents(name, sa[0], base, sb[0], on, what)
    return (
        f"{name}: {on} {mean(sa):.4f} ({len(sa)} seed(s)) against {base}'s {mean(sb):.4f}"
        f" ({len(sb)} seed(s)): no interval; a comparison over seeds needs two a side ({what})."
    )


def val_loss_lines(runs: list[Run], compare: list[list[str]] | None = None) -> list[str]:
    """Each pretraining recipe's val loss against its baseline's (the report's `compare` pairs,
    else the first's), on each val shard both were scored on (a mixture's sources, or the one
    dataset)."""
    groups = by_recipe([r for r in runs if not r.fine_tuned])
    names = list(groups)
    if len(names) < 2:
        return []
    return [
        line
        for base, name in pairs(names, compare)
        for line in recipe_lines(name, groups[name], base, groups[base])
    ]


def recipe_lines(name: str, mine: list[Run], base: str, theirs: list[Run]) -> list[str]:
    """A recipe's val loss lines against its baseline's: on their final evaluations where both
    trained as many tokens, else at the most tokens both reached (at_equal_tokens)."""
    a = [r.evals["val_loss"] for r in mine if r.evals.get("val_loss")]
    b = [r.evals["val_loss"] for r in theirs if r.evals.get("val_loss")]
    if not a or not b:
        return []
    if {x.get("tokens_of") for x in a} != {x.get("tokens_of") for x in b}:
        return [across_tokenizers(name, mine, a, base, theirs, b)]
    ta, tb = tokens_trained(mine[0]), tokens_trained(theirs[0])
    if ta is not None and tb is not None and ta != tb:
        return [at_equal_tokens(name, mine, base, theirs, ta, tb)]
    trained = (
        "tokens trained unknown" if ta is None or tb is None else f"{ta:,} tokens trained each"
    )
    what = f"{differing(mine[0], theirs[0])}; {trained}"
    views_a, views_b = [val_views(x) for x in a], [val_views(x) for x in b]
    common = [d for d in views_a[0] if all(d in v for v in views_a + views_b)]
    if not common:
        return [
            f"{name}: val loss {a[0]['value']:.4f} against {base}'s {b[0]['value']:.4f},"
            f" measured on different val data ({data_name(a[0])} and {data_name(b[0])}):"
            f" no interval ({what})."
        ]
    mixed = {d for x in a + b for d in x.get("sources", {})}
    lines = []
    for data in common:
        on = "FineWeb val loss" if data not in mixed else f"val loss on {data}"
        sa, sb = [v[data] for v in views_a], [v[data] for v in views_b]
        if len(sa) > 1 and len(sb) > 1:
            lines.append(over_seeds(name, sa, base, sb, on, what))
        elif len(sa) == 1 and len(sb) == 1:
            lines.append(over_documents(name, sa[0], base, sb[0], on, what))
        else:
            lines.append(
                f"{name}: {on} {mean(sa):.4f} ({len(sa)} seed(s)) against {base}'s"
                f" {mean(sb):.4f} ({len(sb)} seed(s)): no interval; a comparison over seeds"
                f" needs two a side ({what})."
            )
    return lines


def across_tokenizers(
    name: str,
    mine: list[Run],
    a: list[dict[str, Any]],
    base: str,
    theirs: list[Run],
    b: list[dict[str, Any]],
) -> str:
    """Two recipes whose val losses are in different tokenizers' tokens: compared in bits per
    byte (lmpipe.eval.val_loss), never in nats a token; tokens trained are each in their own
    tokens, so no equal-tokens point exists. Over seeds where both are replicated; two single
    runs get no interval (their tokens are other sequences of the documents, not paired)."""
    units = f"in {tokens_name(a[0].get('tokens_of'))} and {tokens_name(b[0].get('tokens_of'))}"
    ta, tb = tokens_trained(mine[0]), tokens_trained(theirs[0])
    trained = "" if ta is None or tb is None else f"; trained {ta:,} and {tb:,} of their tokens"
    what = f"{differing(mine[0], theirs[0])}; val losses {units}{trained}"
    on = "FineWeb val bits per byte"
    if any(x.get("bits_per_byte") is None for x in a + b):
        return (
            f"{name}: val loss {a[0]['value']:.4f} against {base}'s {b[0]['value']:.4f}, {units}:"
            f" not compared (a nats-a-token loss depends on the tokenizer, and bits per byte is"
            f" missing: data tokenized before its byte table; {what})."
        )
    sa = [{"value": x["bits_per_byte"]} for x in a]
    sb = [{"value": x["bits_per_byte"]} for x in b]
    if len(sa) > 1 and len(sb) > 1:
        return over_seeds(name, sa, base, sb, on, what)
    return (
        f"{name}: {on} {mean(sa):.4f} against {base}'s {mean(sb):.4f}"
        f" ({mean(sa) - mean(sb):+.4f}): no interval (one seed a side, and two tokenizations"
        f" of the val text have no documents' scores to pair; {what})."
    )


def mean(results: list[dict[str, Any]]) -> float:
    return statistics.fmean(x["value"] for x in results)


def interval_word(low: float, high: float, base: str, scope: str, undecided: str) -> str:
    """A loss difference's interval in a word: worse (all above zero), better (all below), or
    `undecided` where it holds zero."""
    if low > 0:
        return f"worse than {base} {scope}"
    if high < 0:
        return f"better than {base} {scope}"
    return f"{undecided} {base}"


def over_seeds(
    name: str,
    mine: list[dict[str, Any]],
    base: str,
    theirs: list[dict[str, Any]],
    on: str,
    what: str,
) -> str:
    """Two replicated recipes: Welch's interval over their seeds' val losses, which holds the
    seed-to-seed variance (initial weights, data order) as well as the evaluation's."""
    va, vb = [x["value"] for x in mine], [x["value"] for x in theirs]
    diff, low, high, _, _ = stats.welch(va, vb)
    spread = f"sd {statistics.stdev(va):.4f} over {len(va)} seeds"
    head = (
        f"{name}: {on} {statistics.fmean(va):.4f} ({spread}) against {base}'s"
        f" {statistics.fmean(vb):.4f} (sd {statistics.stdev(vb):.4f} over {len(vb)} seeds)"
    )
    how = f"{diff:+.4f}, {LEVEL:.0%} Welch interval {low:+.4f} to {high:+.4f} over seeds"
    seeds = f"over {len(va)} and {len(vb)} seeds"
    word = interval_word(low, high, base, seeds, "the seeds cannot tell it from")
    return f"{head} ({how}; {what}): {word}."


def over_documents(
    name: str, mine: dict[str, Any], base: str, theirs: dict[str, Any], on: str, what: str
) -> str:
    """Two single runs on the same val documents: the interval over documents, which measures
    which text was scored, never the training's noise (one seed each)."""
    head = f"{name}: {on} {mine['value']:.4f} against {base}'s {theirs['value']:.4f}"
    problem = unpaired(mine, theirs)
    if problem:
        return f"{head}: no interval ({problem}; {what})."
    diff, low, high, docs = stats.cluster_difference(
        mine["doc_losses"], theirs["doc_losses"], mine["doc_tokens"]
    )
    how = (
        f"{diff:+.4f} a token, {LEVEL:.0%} interval {low:+.4f} to {high:+.4f} over {docs}"
        " documents, cluster-robust; evaluation noise only, one seed each"
    )
    scope = "on these documents, not yet a verdict on the recipes"
    word = interval_word(low, high, base, scope, "the val documents cannot tell it from")
    return f"{head} ({how}; {what}): {word}."


def unpaired(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why two val_loss scores cannot be paired document by document, or None."""
    if "doc_tokens" not in mine or "doc_tokens" not in theirs:
        return "a result written without per-document losses"
    if mine.get("tokens") != theirs.get("tokens"):
        return f"{mine.get('tokens'):,} against {theirs.get('tokens'):,} val tokens scored"
    if mine["doc_tokens"] != theirs["doc_tokens"]:
        return "the documents' token counts differ: other val text, or another tokenizer"
    if len(mine["doc_tokens"]) < 2:
        return "one document scored: no spread to measure"
    return None


def base_of(run: Run, runs: list[Run]) -> Run | None:
    """A fine-tuned run's base among `runs`: its base run, or the reference run measuring its
    Hugging Face base folder (lmpipe.bases)."""
    base = run.settings.get("base") or {}
    for r in runs:
        if base.get("run") and r.name == base["run"]:
            return r
        model = r.settings.get("model") or {}
        if base.get("hf") and r.reference and model.get("path") == base["hf"]:
            return r
    return None


def lost_pretraining(run: Run, runs: list[Run]) -> str | None:
    """A fine-tuned run whose FineWeb val loss is above an untrained model's (of its own
    vocabulary)."""
    loss = run.evals.get("val_loss", {}).get("value")
    uniform = untrained_loss(run)
    if not run.fine_tuned or loss is None or loss <= uniform:
        return None
    base = base_of(run, runs)
    base_loss = base.evals.get("val_loss", {}).get("value") if base else None
    if base_loss is not None and base_loss > uniform:
        return None  # its base was no better than a uniform guess: nothing was lost
    was = f"; its base {base.name} had {base_loss:.2f}" if base_loss is not None else ""
    bpb = untrained_bpb(run)
    per_byte = f", {bpb:.2f} bits per byte of the text scored" if bpb is not None else ""
    return (
        f"{run.name} lost its pretraining: its FineWeb val loss {loss:.2f} is above an untrained"
        f" model's ({uniform:.2f}, a uniform guess over its {vocabulary(run):,} tokens{per_byte})"
        f"{was}."
    )


def repeated_replies(run: Run) -> str | None:
    samples = run.evals.get("chat_samples", {}).get("samples") or []
    replies = [s.get("reply", "").strip() for s in samples]
    distinct = len(set(replies))
    if len(replies) < 2 or distinct == len(replies):
        return None
    said = "the same reply" if distinct == 1 else f"{distinct} distinct replies"
    return f"{run.name} repeats itself: its {len(replies)} chat prompts get {said} (chat samples)."


def skipped_checkpoints(run: Run) -> str | None:
    """A run that resumed past an unusable checkpoint (lmpipe.report.restarts.skipped)."""
    skips = run.restarts.skipped if run.restarts else []
    if not skips:
        return None
    redone = sum(k.steps_redone for k in skips)
    return f"{run.name} skipped unusable checkpoints and redid {redone} step(s): " + "; ".join(
        str(k) for k in skips
    )


def remote_code(run: Run) -> str | None:
    """A run whose model ran Python code shipped in its folder (`arch: hf`, trust_remote_code)."""
    model = run.settings.get("model") or {}
    if not model.get("trust_remote_code"):
        return None
    return (
        f"{run.name} ran Python code shipped in its model folder {model.get('path')}"
        " (model.trust_remote_code: true)."
    )


def findings(runs: list[Run], compare: list[list[str]] | None = None) -> list[str]:
    """The verdict's lines: each pretraining recipe's val loss against its baseline's, then
    flags."""
    lines: list[str | None] = list(val_loss_lines(runs, compare))
    lines += [lost_pretraining(r, runs) for r in runs]
    lines += [repeated_replies(r) for r in runs]
    lines += [skipped_checkpoints(r) for r in runs]
    lines += [remote_code(r) for r in runs]
    return [line for line in lines if line]

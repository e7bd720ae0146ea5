"""HellaSwag as a task of the native multiple-choice scorer, against its definitions, fast.

- acc: argmax over the four endings of the summed log-likelihood; acc_norm: argmax of the
  log-likelihood divided by the ending's tokens (llm.c's `dev/data/hellaswag.py`) or by its
  length in characters (lm-eval's multiple_choice `acc_norm`: `len(choice)`); ties go to the
  first ending (np.argmax).
- lm-eval's `tasks/hellaswag/utils.py` preprocessing and its `_encode_pair` split of
  context + continuation.
- the rowanz jsonl format: ctx_a, ctx_b, ctx, activity_label, four endings, label 0..3.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import TOKENIZER_DIR, naive_logprob
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import hellaswag, packing
from lmpipe.eval.suite import native

ENC = gpt2_encoding(TOKENIZER_DIR)


def item(**kw) -> dict:
    base = {
        "activity_label": "Cooking",
        "ctx_a": "A man cracks an egg.",
        "ctx_b": "he",
        "ctx": "A man cracks an egg. he",
        "endings": ["stirs it.", "eats the shell.", "sings to it loudly.", "x"],
        "label": 0,
    }
    return base | kw


# ---- the jsonl -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"label": True}, "'label' must be an integer 0..3, got True"),
        ({"label": -1}, "'label' must be an integer 0..3, got -1"),
        ({"label": 4}, "'label' must be an integer 0..3, got 4"),
        ({"label": "x"}, "'label' must be an integer 0..3, got 'x'"),
        ({"ctx_b": None}, "field 'ctx_b' missing or not a str"),
        ({"endings": ["a", "b", "c", 4]}, "'endings' must be a list of 4 strings"),
        ({"endings": "abcd"}, "'endings' must be a list of 4 strings"),
    ],
)
def test_an_invalid_item_is_named_with_what_is_wrong(change, message):
    """Each malformed field is an error naming the place and the field."""
    with pytest.raises(hellaswag.HellaSwagError, match=f"^f.jsonl:7: {message}"):
        hellaswag.check_item(item(**change), "f.jsonl:7")


def test_labels_0_to_3_and_the_hf_datasets_string_form_are_integers():
    """label 0..3, or "0".."3" as the Hugging Face dataset writes it, reads as an int."""
    assert [hellaswag.check_item(item(label=n), "w")["label"] for n in (0, 3)] == [0, 3]
    assert hellaswag.check_item(item(label="2"), "w")["label"] == 2
    with pytest.raises(hellaswag.HellaSwagError, match="^w: expected a JSON object, got list"):
        hellaswag.check_item([], "w")


def test_load_items_skips_blank_lines_counts_lines_and_limits(tmp_path):
    """Blank lines are skipped but still counted in the line numbers of errors; `limit` cuts."""
    path = tmp_path / "hs.jsonl"
    lines = [json.dumps(item(label=i)) for i in range(3)]
    path.write_text(f"{lines[0]}\n\n  \n{lines[1]}\n{lines[2]}\n")
    assert [it["label"] for it in hellaswag.load_items(path)] == [0, 1, 2]
    assert [it["label"] for it in hellaswag.load_items(path, limit=2)] == [0, 1]
    path.write_text(f"{lines[0]}\n\n[1, 2]\n")
    with pytest.raises(hellaswag.HellaSwagError, match=r"hs\.jsonl:3: expected a JSON object"):
        hellaswag.load_items(path)


def test_a_missing_or_empty_file_is_named(tmp_path):
    """No file, or a file of blank lines, is an error naming it."""
    with pytest.raises(hellaswag.HellaSwagError, match=r"nope\.jsonl: HellaSwag file not found"):
        hellaswag.load_items(tmp_path / "nope.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(hellaswag.HellaSwagError, match=r"blank\.jsonl: no items"):
        hellaswag.load_items(tmp_path / "blank.jsonl")


# ---- lm-eval's preprocessing and encoding --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # strip; " [title]" -> ". "; drop [...] (shortest); "  " -> " "
        ("  Clean a pan [title] Soak it. [step] Scrub  ", "Clean a pan. Soak it. Scrub"),
        ("a [b] c [d] e", "a c e"),
        ("no artefacts", "no artefacts"),
    ],
)
def test_preprocess_is_lm_evals(text, expected):
    """lm-eval's hellaswag `preprocess`, rule by rule."""
    assert hellaswag.preprocess(text) == expected


def test_lm_eval_prompt_is_label_colon_ctx_a_and_capitalised_ctx_b():
    """query = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())."""
    query, choices = hellaswag.lm_eval_prompt(item(endings=["a [x]b", " c ", "d", "e"]))
    assert query == "Cooking: A man cracks an egg. He"
    assert choices == ["a b", "c", "d", "e"]


def test_lm_eval_rows_split_the_whole_encoding_at_the_contexts_length():
    """_encode_pair: encode query + " " + choice whole, split at len(encode(query))."""
    it = item(endings=["stirs it.", "eats", "sings", "x"])
    rows = native.item_rows([hellaswag.task_item(it, ENC, "lm_eval")], ENC)
    query = "Cooking: A man cracks an egg. He"
    for (ctx, cont), choice in zip(rows, it["endings"], strict=True):
        assert ctx == ENC.encode_ordinary(query)
        assert ENC.decode(cont) == " " + choice
        assert ctx + cont == ENC.encode_ordinary(query + " " + choice)


def test_llmc_rows_are_ctx_then_space_ending():
    """llm.c: tokens of ctx, then tokens of " " + ending."""
    rows = hellaswag.llmc_rows(item(), ENC)
    assert [ENC.decode(c) for c, _ in rows] == ["A man cracks an egg. he"] * 4
    assert [ENC.decode(e) for _, e in rows] == [
        " stirs it.",
        " eats the shell.",
        " sings to it loudly.",
        " x",
    ]
    with pytest.raises(
        ValueError, match="unknown scoring mode 'mine' .expected one of llmc, lm_eval"
    ):
        hellaswag.task_item(item(), ENC, "mine")


# ---- acc and acc_norm from the log-likelihoods --------------------------------------------


def scored(monkeypatch, items, loglik, mode=None):
    """The native scorer on the items' task with the model's log-likelihoods given: only the
    metric is under test. No mode: task_data's default."""
    monkeypatch.setattr(
        native.packing, "score_rows", lambda *a, **k: np.array(loglik, dtype=float).ravel()
    )
    data = hellaswag.task_data(items, ENC, *([mode] if mode else []))
    model = SimpleNamespace(config=SimpleNamespace(block_size=1024))  # never run
    return native.score_task(model, data, ENC, show_progress=False)


def test_acc_is_the_argmax_of_the_sum_acc_norm_of_the_sum_per_token(monkeypatch):
    """llm.c: acc from the summed log-likelihood, acc_norm from the mean per ending token."""
    it = item(endings=["a", "b c d e f g h", "i", "j"])  # 1, 7, 1, 1 tokens with the space
    n = [len(e) for _, e in hellaswag.llmc_rows(it, ENC)]
    ll = [-3.0 * n[0], -1.0 * n[1], -5.0 * n[2], -4.0 * n[3]]  # per token: -3, -1, -5, -4
    ll[0] = max(ll) + 0.5  # the best sum, a worse mean than ending 1
    r = scored(monkeypatch, [it | {"label": 1}], [ll], "llmc")
    assert (r.pred, r.pred_norm) == ([0], [1])
    assert (r.acc, r.acc_norm) == ([0], [1])
    assert r.loglik == [ll] and r.items == 1


def test_acc_norm_divides_by_characters_for_lm_eval_and_by_tokens_for_llmc(monkeypatch):
    """Same log-likelihoods: lm-eval divides by characters, llm.c by tokens: different picks."""
    it = item(endings=["aaaaaaaaaaaaaaaaaaaa", "b", "c", "d"], label=0)  # 20 characters
    assert len(hellaswag.llmc_rows(it, ENC)[0][1]) < 7  # tokens: -15 / n < -2 / 1
    ll = [[-15.0, -2.0, -3.0, -4.0]]
    r = scored(monkeypatch, [it], ll, "lm_eval")
    assert (r.pred, r.pred_norm) == ([1], [0])  # -15 / 20 = -0.75 beats -2 / 1
    assert scored(monkeypatch, [it], ll, "llmc").pred_norm == [1]


def test_ties_go_to_the_first_ending_and_accuracy_is_the_mean_over_items(monkeypatch):
    """np.argmax's first maximum; acc is the share of items predicted right."""
    items = [item(label=0), item(label=1), item(label=2), item(label=3)]
    ll = [[-1, -1, -1, -1], [-2, -1, -1, -3], [-5, -5, -1, -5], [-1, -2, -3, -4]]
    r = scored(monkeypatch, items, ll)
    assert r.pred == [0, 1, 2, 0]
    assert sum(r.acc) / r.items == 0.75
    # the default scoring is llm.c's: its divisor, tokens, picks ending 1 where characters pick 0
    it = item(endings=["aaaaaaaaaaaaaaaaaaaa", "b", "c", "d"], label=0)
    assert scored(monkeypatch, [it], [[-15.0, -2.0, -3.0, -4.0]]).pred_norm == [1]


# ---- the batched forward ---------------------------------------------------------------------


class Bigram(torch.nn.Module):
    """A model whose next-token distribution depends only on the current token, so each row's
    log-likelihood is known in closed form: log softmax(W[prev])[next] summed over the ending."""

    def __init__(self, vocab: int = 11, block_size: int = 6):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size)
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(vocab, vocab, generator=g)

    def hidden_states(self, idx, positions=None, mask=None):
        return torch.nn.functional.one_hot(idx, self.table.shape[0]).float()

    def head(self, h):
        return h @ self.table


def test_packed_rows_sum_the_endings_log_probabilities_in_any_batch():
    """Each row's ending log-probability equals a bigram's closed form, whatever the batch size;
    a long row is truncated from the left, a too-long ending is refused."""
    model = Bigram()
    logp = torch.log_softmax(model.table, dim=-1).double()
    rows = [([1, 2], [3]), ([4], [5, 6, 7]), ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10]), ([0], [1])]
    truth = [
        sum(logp[a, b].item() for a, b in zip((c + e)[-len(e) - 1 : -1], e, strict=True))
        for c, e in rows
    ]
    updates = []
    progress = SimpleNamespace(update=updates.append)
    for batch_rows in (1, 3, 4):
        got = packing.score_rows(model, rows, batch_rows, progress=progress, rows_per_step=4)
        np.testing.assert_allclose(got, truth, rtol=1e-6)
    assert sum(updates) == pytest.approx(3 * len(rows) / 4)  # items: 4 rows each
    with pytest.raises(ValueError, match="continuation of 7 tokens is longer than block_size"):
        packing.score_rows(model, [([1], [2] * 7)], 2)


# ---- through the native scorer: the one multiple-choice scorer of every task -----------------


def tiny_gpt(block_size: int = 128):
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=block_size)).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from init: the choices' log-likelihoods differ
            p.normal_(0.0, 0.5)
    return model


def reference(model, items: list[dict], scoring: str) -> tuple[np.ndarray, list[int], list[int]]:
    """Per item: each ending's log-likelihood by the naive forward, and the picks of acc and
    acc_norm, from the definitions (rows and divisors written out here, not the module's)."""
    lls, pred, pred_norm = [], [], []
    for it in items:
        if scoring == "llmc":  # ctx and " " + ending encoded apart; divide by the ending's tokens
            ctx = ENC.encode_ordinary(it["ctx"])
            rows = [(ctx, ENC.encode_ordinary(" " + e)) for e in it["endings"]]
            div = [len(cont) for _, cont in rows]
        else:  # lm-eval: the preprocessed query, split off the whole; divide by characters
            query, choices = hellaswag.lm_eval_prompt(it)
            ctx = ENC.encode_ordinary(query)
            rows = [(ctx, ENC.encode_ordinary(query + " " + c)[len(ctx) :]) for c in choices]
            div = [len(c) for c in choices]
        ll = np.array([naive_logprob(model, c, e) for c, e in rows])
        lls.append(ll)
        pred.append(int(np.argmax(ll)))
        pred_norm.append(int(np.argmax(ll / np.array(div, dtype=float))))
    return np.array(lls), pred, pred_norm


@pytest.mark.parametrize("scoring", ["llmc", "lm_eval"])
def test_the_native_scorer_equals_the_naive_forward_row_by_row(scoring):
    """Real items (a 64-token model: long contexts cut from the left), both scorings: every
    ending's log-likelihood equals its row run alone through the plain causal forward, and acc
    and acc_norm pick as the definitions do."""
    from conftest import RESOURCES

    model = tiny_gpt(block_size=64)
    items = hellaswag.load_items(RESOURCES / "hellaswag_val_sample.jsonl", 12)
    data = hellaswag.task_data(items, ENC, scoring)
    got = native.score_task(model, data, ENC, batch_rows=8, show_progress=False)
    ll, pred, pred_norm = reference(model, items, scoring)
    np.testing.assert_allclose(np.array(got.loglik), ll, rtol=1e-5, atol=1e-4)
    assert (got.pred, got.pred_norm) == (pred, pred_norm)
    assert got.acc == [int(p == it["label"]) for p, it in zip(pred, items, strict=True)]
    assert got.acc_norm == [int(p == it["label"]) for p, it in zip(pred_norm, items, strict=True)]
    assert len(set(pred)) > 1  # not one answer for every item


def test_llmc_rows_are_the_tasks_own_where_lm_evals_encoding_splits_otherwise():
    """A context ending in a space: llm.c keeps the space token in the context, lm-eval's
    encoding moves it into the continuation. The llmc task scores llm.c's rows (its items carry
    them); without them the native scorer would score lm-eval's. (No item of the sample file
    splits differently: this one is made up.)"""
    it = item(ctx="A man cracks an egg. he ")
    llmc = hellaswag.task_data([it], ENC, "llmc")
    rows = native.item_rows(llmc.items, ENC)
    assert rows == hellaswag.llmc_rows(it, ENC)
    assert ENC.decode(rows[0][0]).endswith("he ") and ENC.decode(rows[0][1]) == " stirs it."
    lm_evals = native.encode_pair(ENC, it["ctx"], " stirs it.")
    assert lm_evals != rows[0] and ENC.decode(lm_evals[1]) == "  stirs it."
    model = tiny_gpt()
    got = native.score_task(model, llmc, ENC, show_progress=False).loglik[0]
    np.testing.assert_allclose(got, [naive_logprob(model, c, e) for c, e in rows], rtol=1e-5)
    assert abs(got[0] - naive_logprob(model, *lm_evals)) > 1e-3
    # the lm_eval option: lm-eval's request on its own prompt, encoded as every suite task's
    lm_eval = hellaswag.task_data([it], ENC, "lm_eval").items[0]
    assert lm_eval.rows is None and lm_eval.contexts[0] == "Cooking: A man cracks an egg. He"
    assert lm_eval.choice_lengths == (9, 15, 19, 1)  # characters; llm.c's: tokens
    assert llmc.items[0].choice_lengths == tuple(len(e) for _, e in rows) == (4, 4, 5, 1)
    with pytest.raises(ValueError, match="unknown scoring mode 'mine'"):
        hellaswag.task_data([it], ENC, "mine")


# ---- the `hellaswag` evaluation ----------------------------------------------------------------


def test_the_evaluation_reports_llmc_acc_norm_over_the_first_items(tmp_path, monkeypatch, capsys):
    """The evaluation: llm.c's acc and acc_norm of the first items (the naive reference's picks),
    their standard errors, the right answers item by item; a short file scored whole, noted."""
    import math
    import statistics

    from conftest import RESOURCES
    from lmpipe.registry import HellaSwagSettings

    model = tiny_gpt()
    loaded = []
    monkeypatch.setattr(hellaswag, "load_hf", lambda d: loaded.append(d) or model)
    (tmp_path / "config.json").write_text(json.dumps({"lmpipe_arch": "gpt2"}))  # our GPT-2
    path = tmp_path / "hs.jsonl"
    items = hellaswag.load_items(RESOURCES / "hellaswag_val_sample.jsonl", 7)
    path.write_text("\n".join(map(json.dumps, items)) + "\n")
    inputs = {"hellaswag": path}
    _, pred, pred_norm = reference(model, items[:6], "llmc")
    right = {
        "acc": [int(p == it["label"]) for p, it in zip(pred, items, strict=False)],
        "acc_norm": [int(p == it["label"]) for p, it in zip(pred_norm, items, strict=False)],
    }
    assert right["acc"] != right["acc_norm"] and 0 < sum(right["acc_norm"]) < 6  # telling
    r = hellaswag.evaluate(HellaSwagSettings(items=6, batch=2), tmp_path, inputs, "cpu")
    assert (r["metric"], r["value"], r["items"]) == ("hellaswag", sum(right["acc_norm"]) / 6, 6)
    # the items' ids: HellaSwag's source and `ind` (`ind` alone repeats across the two sources)
    ids = [f"{it['source_id'].split('~')[0]}/{it['ind']}" for it in items[:6]]
    assert r["per_item"] == {"ids": ids} | right and ids[0] == "activitynet/24"
    for metric, flags in right.items():
        assert r[metric] == sum(flags) / 6
        assert r[f"{metric}_stderr"] == pytest.approx(statistics.stdev(flags) / math.sqrt(6))
    assert loaded == [tmp_path]
    by = r["produced_by"]
    assert (by["module"], by["scoring"], by["device"]) == ("lmpipe.eval.hellaswag", "llmc", "cpu")
    assert by["items_file"] == str(path) and by["model"] == str(tmp_path)
    assert "fewer" not in capsys.readouterr().out
    r = hellaswag.evaluate(HellaSwagSettings(items=9, batch=4), tmp_path, inputs, "cpu")
    assert r["items"] == 7 and f"{path} holds 7 items, fewer than 9" in capsys.readouterr().out

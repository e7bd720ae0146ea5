"""Scoring rows packed as prefix trees (lmpipe.eval.packing): the same log-probabilities as each
row scored alone, for both architectures, with every shared prefix run once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import naive_logprob
from lmpipe.eval import packing
from lmpipe.models import build_model
from lmpipe.models.gpt2.model import GPTConfig
from lmpipe.models.modern.model import modern_config

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 48}


def model_of(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPTConfig(**SHAPE) if arch == "gpt2" else modern_config(**SHAPE)
    model = build_model(config).eval()
    with torch.no_grad():  # far from init: the modern model's zero projections count too
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def some_rows() -> list[packing.Row]:
    """Rows as the suite makes them: choices sharing a context, items sharing a prefix, a row that
    is a prefix of another, a repeated row, one-token choices, and a row longer than the model."""
    g = torch.Generator().manual_seed(1)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, 50257, (n,), generator=g).tolist()

    prefix = tokens(6)
    rows = []
    for _ in range(3):  # items sharing a prefix, each with 4 choices sharing its context
        ctx = prefix + tokens(5)
        rows += [(ctx, tokens(n)) for n in (1, 2, 4, 3)]
    ctx = tokens(9)
    rows += [(ctx, c) for c in ([7], [8], [9], [10])]  # one-token choices: one softmax
    rows += [(ctx[:4], ctx[4:7]), (ctx[:4], ctx[4:7])]  # a prefix of another row, twice
    rows += [(tokens(3), tokens(4)), (tokens(41), tokens(9))]  # the last longer than the model
    long_ctx = tokens(60)
    rows += [(long_ctx, [1]), (long_ctx, [2]), (long_ctx, [3, 4])]  # truncated, two sharing
    return rows


@pytest.mark.parametrize("arch", ["gpt2", "modern"])
@pytest.mark.parametrize("pack_tokens", [8, 48, 400])
@torch.no_grad()
def test_packed_rows_score_as_each_row_alone(arch, pack_tokens):
    model = model_of(arch)
    rows = some_rows()
    packs = packing.pack_rows(rows, pack_tokens, SHAPE["block_size"])
    got = np.full(len(rows), np.nan)
    for batch in packing.forward_batches(packs, batch_rows=5):
        for i, logp in packing.packed_logprobs(model, batch):
            got[i] = logp
    alone = [naive_logprob(model, ctx, cont) for ctx, cont in rows]
    np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-5)
    if pack_tokens == 400:
        assert len(packs) == 1


def test_a_shared_context_becomes_nodes_once():
    ctx = list(range(100, 110))
    rows = [(ctx, [1, 2, 3]), (ctx, [4, 5, 6]), (ctx, [1, 2, 7]), (ctx, [8])]
    [pack] = packing.pack_rows(rows, 1024, 1024)
    # inputs are a row's tokens but its last: ctx + [1, 2] once, then [4, 5]; [1, 2] is shared
    # with the first row, and [8]'s input is ctx alone
    assert pack.tokens == ctx + [1, 2, 4, 5]
    assert pack.positions == list(range(12)) + [10, 11]
    assert pack.parents == [-1] + list(range(11)) + [9, 12]
    by_row = dict(zip(pack.rows, pack.predictors, strict=True))
    assert by_row[0] == [9, 10, 11] and by_row[2] == [9, 10, 11]  # same nodes, other target
    assert by_row[1] == [9, 12, 13] and by_row[3] == [9]


def test_a_node_attends_to_its_ancestors_only():
    rows = [([5, 6], [7, 8]), ([5, 6], [9, 1]), ([2], [3])]  # the last a tree of its own
    [pack] = packing.pack_rows(rows, 64, 64)
    assert pack.tokens == [2, 5, 6, 7, 9]
    m = pack.mask(6)  # one padding position
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],  # 2
            [0, 1, 0, 0, 0, 0],  # 5
            [0, 1, 1, 0, 0, 0],  # 6
            [0, 1, 1, 1, 0, 0],  # 7: not 9, its sibling
            [0, 1, 1, 0, 1, 0],  # 9
            [0, 0, 0, 0, 0, 1],  # padding: itself only
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(m, expected)


def test_packs_hold_at_most_pack_tokens_nodes_but_a_long_row_gets_one_of_its_own():
    rows = [([i], list(range(1, 10))) for i in range(5)]  # 9 inputs a row, nothing shared
    packs = packing.pack_rows(rows, 20, 64)
    assert [len(p.tokens) for p in packs] == [18, 18, 9]
    packs = packing.pack_rows(rows, 4, 64)
    assert [len(p.tokens) for p in packs] == [9] * 5


def test_a_choice_after_a_long_context_joins_its_pack_past_pack_tokens():
    ctx = list(range(100, 130))  # 30 tokens, a pack of 8
    rows = [(ctx, [1, 2]), (ctx, [3, 4]), (ctx, [5]), ([7] * 20, [8, 9])]
    packs = packing.pack_rows(rows, 8, 64)
    # the context once with its three choices (1 + 1 + 0 new nodes), then the last row's own pack
    assert [len(p.tokens) for p in packs] == [21, 32]
    assert [sorted(p.rows) for p in packs] == [[3], [0, 1, 2]]


def test_a_long_row_is_truncated_from_the_left_as_lm_eval_truncates():
    ctx = list(range(100, 120))
    assert packing.truncate((ctx, [1, 2]), 64) == (ctx, [1, 2])  # fits: unchanged
    # inputs 21 > 8: the last 9 tokens kept, the continuation whole
    assert packing.truncate((ctx, [1, 2]), 8) == (ctx[-7:], [1, 2])
    [pack] = packing.pack_rows([(ctx, [1]), (ctx, [2])], 64, 8)
    assert pack.tokens == ctx[-8:]  # one-token choices of a long context still share it
    with pytest.raises(ValueError, match="longer than block_size"):
        packing.truncate(([5], list(range(10))), 8)


def test_forward_batches_take_packs_until_the_rows_are_scored():
    rows = [([i], [1, 2]) for i in range(7)]
    packs = packing.pack_rows(rows, 4, 64)  # two rows (4 nodes) a pack: 4 packs
    batches = packing.forward_batches(packs, batch_rows=3)
    assert [sum(len(p.rows) for p in b) for b in batches] == [4, 3]

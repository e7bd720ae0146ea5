"""Mixtures (lmpipe.data.mixture, lmpipe.data.mixture_loader) against their specification, on
sources whose tokens say where they were read (token k of source s's shard is 10000 * s + k):

- each row goes to the source furthest below its share, so every source's rows stay within one
  of `weight * rows` at every step;
- a step's rows depend on the step only: 1 rank and 2 ranks read the same rows, and a loader
  restored from a state continues with the rows the uninterrupted one reads;
- a source's rows are consecutive windows of its own stream, which wraps around (epochs).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from lmpipe.data.loader import DataShare
from lmpipe.data.mixture import draw_rows, read_mixture, write_mixture
from lmpipe.data.mixture_loader import MixtureLoader, mixture_val_batches
from lmpipe.data.shards import write_shard


def source(tmp_path, name: str, s: int, train: list[int], val: int = 300):
    """A tokenized dataset `name`: a val shard and train shards of the given sizes, token k of
    train shard j being 10000 * s + 1000 * j + k (val: 10000 * s + 900 + k)."""
    out = tmp_path / name / "tokens"
    out.mkdir(parents=True)
    shards = [("val", 10000 * s + 900 + np.arange(val))]
    shards += [("train", 10000 * s + 1000 * j + np.arange(n)) for j, n in enumerate(train)]
    listed = []
    for i, (split, tokens) in enumerate(shards):
        write_shard(out / f"{split}_{i}.bin", tokens.astype(np.uint16))
        listed.append({"file": f"{split}_{i}.bin", "split": split, "tokens": len(tokens)})
    (out / "manifest.json").write_text(json.dumps({"dataset": name, "shards": listed}))
    return out / "manifest.json"


def mixture(tmp_path, weights: dict[str, float], train: dict[str, list[int]]):
    manifests = {
        name: source(tmp_path, name, s + 1, train[name]) for s, name in enumerate(sorted(weights))
    }
    out = tmp_path / "mix" / "tokens" / "manifest.json"
    out.parent.mkdir(parents=True)
    write_mixture(out, "mix", weights, manifests)
    return read_mixture(out)


def steps(loaders: list[MixtureLoader], n: int) -> list[torch.Tensor]:
    """Each step's rows in the global order (micro-batch i of rank r: slice i * W + r)."""
    out = []
    for _ in range(n):
        micro = [[ld.next_batch() for _ in range(ld.micro_steps)] for ld in loaders]
        rows = [micro[r][i] for i in range(len(micro[0])) for r in range(len(loaders))]
        x = torch.cat([x for x, _ in rows])
        y = torch.cat([y for _, y in rows])
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
        out.append(x)
    return out


def source_of(row: torch.Tensor) -> int:
    return int(row[0]) // 10000


# ---- the draw ---------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.5, 0.3, 0.2], [0.97, 0.02, 0.01]])
def test_each_source_stays_within_one_row_of_its_share_at_every_step(weights):
    taken = [0] * len(weights)
    for step in range(1, 301):
        drawn = draw_rows(weights, taken, 32)
        assert len(drawn) == 32
        for k, w in enumerate(weights):
            assert abs(taken[k] - w * 32 * step) <= 1, (step, k, taken)
    # over the run: each share within 1% of its weight (the bound; here far tighter)
    for k, w in enumerate(weights):
        assert taken[k] / (300 * 32) == pytest.approx(w, abs=0.01)


def test_the_draw_interleaves_the_sources_within_a_step():
    drawn = draw_rows([0.5, 0.5], [0, 0], 8)
    assert drawn == [0, 1, 0, 1, 0, 1, 0, 1]  # not four of one then four of the other


# ---- the loader -------------------------------------------------------------------------------


def test_one_and_two_ranks_read_the_same_rows_and_the_shares_hold(tmp_path):
    """B 2, T 4, batch 32 tokens = 8 rows: 2 ranks x 2 micro-steps, or 1 rank x 4."""
    mix = mixture(tmp_path, {"a": 0.75, "b": 0.25}, {"a": [400, 400], "b": [300]})
    one = steps([MixtureLoader(mix, 2, 4, 32, DataShare(0, 1))], 40)
    two = steps([MixtureLoader(mix, 2, 4, 32, DataShare(r, 2)) for r in range(2)], 40)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    counts = [sum(source_of(row) == s for step in one for row in step) for s in (1, 2)]
    assert counts == [240, 80]  # 0.75 and 0.25 of 320 rows


def test_a_sources_rows_are_consecutive_windows_of_its_own_stream(tmp_path):
    mix = mixture(tmp_path, {"a": 0.5, "b": 0.5}, {"a": [400], "b": [400]})
    (step,) = steps([MixtureLoader(mix, 2, 4, 32, DataShare(0, 1))], 1)
    a = [row for row in step if source_of(row) == 1]
    b = [row for row in step if source_of(row) == 2]
    assert [int(r[0]) for r in a] == [10000 + 4 * i for i in range(4)]
    assert [int(r[0]) for r in b] == [20000 + 4 * i for i in range(4)]
    assert all(torch.equal(r, torch.arange(int(r[0]), int(r[0]) + 4)) for r in step)


def test_a_source_wraps_around_and_the_loader_says_so(tmp_path, caplog):
    """b's one train shard of 41 tokens holds 2 steps of its 4 rows (16 tokens + 1 each)."""
    mix = mixture(tmp_path, {"a": 0.5, "b": 0.5}, {"a": [4000], "b": [41]})
    loader = MixtureLoader(mix, 2, 4, 32, DataShare(0, 1))
    with caplog.at_level(logging.INFO, logger="lmpipe.mixture"):
        rows = steps([loader], 3)
    b_starts = [[int(r[0]) for r in step if source_of(r) == 2][0] for step in rows]
    assert b_starts == [20000, 20016, 20000]  # the third step: b's shard again
    assert "source b: epoch 2 begins" in caplog.text
    state = loader.state_dict()
    assert state["tokens_by_source"] == {"a": 48, "b": 48}
    assert state["epochs_by_source"]["b"] == pytest.approx(48 / 41)


def test_a_restored_loader_continues_with_the_uninterrupted_rows(tmp_path):
    mix = mixture(tmp_path, {"a": 0.6, "b": 0.4}, {"a": [300, 300], "b": [150]})
    loader = MixtureLoader(mix, 2, 4, 32, DataShare(1, 2))
    steps([loader], 17)  # past a's first shard and b's first epoch
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint keeps it
    after = steps([loader], 6)
    restored = MixtureLoader(mix, 2, 4, 32, DataShare(1, 2))
    restored.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(after, steps([restored], 6), strict=True))


def test_a_shard_too_small_for_a_sources_step_is_named(tmp_path):
    mix = mixture(tmp_path, {"a": 0.5, "b": 0.5}, {"a": [400], "b": [40, 10]})
    loader = MixtureLoader(mix, 2, 4, 32, DataShare(0, 1))
    steps([loader], 2)
    with pytest.raises(ValueError, match=r"train_2\.bin: 10 tokens, fewer than one step's 17"):
        steps([loader], 1)


def test_the_val_batches_split_the_tokens_by_weight(tmp_path):
    """val_tokens 64 at 8 tokens a batch: 6 of a's (0.75, rounded) and 2 of b's."""
    mix = mixture(tmp_path, {"a": 0.75, "b": 0.25}, {"a": [400], "b": [400]})
    val = mixture_val_batches(mix, 2, 4, 64, DataShare(0, 1))
    batches = val.batches
    assert [int(x[0, 0]) // 10000 for x, _ in batches] == [1] * 6 + [2] * 2
    assert int(batches[6][0][0, 0]) == 20900  # b's val shard, from its start
    # no end-of-text in either: one document a source, b's numbered after a's
    assert val.documents == 2
    assert [set(d.flatten().tolist()) for d in val.docs] == [{0}] * 6 + [{1}] * 2


def test_the_manifest_normalises_the_weights_and_names_a_missing_source(tmp_path):
    mix = mixture(tmp_path, {"a": 7, "b": 3}, {"a": [400], "b": [400]})
    assert mix.weights == pytest.approx({"a": 0.7, "b": 0.3})
    (tmp_path / "b" / "tokens" / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"b/tokens/manifest\.json"):
        read_mixture(mix.path)


def test_the_figures_by_source_are_logged_as_scalars_each():
    from lmpipe.train.wandb_log import scalars

    record = {"step": 3, "tokens": 96, "loss": 2.0, "tokens_by_source": {"a": 64, "b": 32}}
    assert scalars(record) == {
        "train/loss": 2.0, "train/tokens_by_source/a": 64, "train/tokens_by_source/b": 32
    }  # fmt: skip

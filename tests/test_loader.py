"""ShardLoader and val_batches against the loader's specification, on shards whose tokens are
their own positions (token k of shard s is 1000 * s + k), so every batch says where it was read.

Spec (lmpipe.data.loader): a step reads `batch_tokens` consecutive tokens (+1 for the last
target) of one shard; micro-batch i of rank r is slice i * W + r of it; a step that would run
past the end of a shard starts at the next shard, wrapping around.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmpipe.data.loader import DataShare, ShardLoader, shard_files, val_batches
from lmpipe.data.shards import write_shard

EOT = 50256  # none of these shards' tokens: one document


def shard(path, s: int, n: int):
    write_shard(path, 1000 * s + np.arange(n, dtype=np.uint16))
    return path


def expected(start: int, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(start, start + B * T).view(B, T)
    return x, x + 1


def test_each_rank_reads_its_slices_of_consecutive_steps(tmp_path):
    """B 2, T 4, 2 ranks, 2 micro-steps: a step is 32 tokens; rank r's micro i at (2i + r) * 8."""
    files = [shard(tmp_path / "a.bin", 0, 200)]
    for r in range(2):
        ld = ShardLoader(files, micro_batch=2, seq_len=4, batch_tokens=32, dp=DataShare(r, 2))
        for step in range(3):
            for i in range(2):
                x, y = ld.next_batch()
                ex, ey = expected(32 * step + (2 * i + r) * 8, 2, 4)
                assert x.dtype == y.dtype == torch.int64
                assert torch.equal(x, ex) and torch.equal(y, ey)


def test_a_step_past_a_shards_end_starts_the_next_shard_and_wraps(tmp_path):
    """Shards of 17 (2 steps of 8 + 1 fit exactly), 16 (1 step) and 9 tokens: 0, 0, 1, 2, 0."""
    files = [shard(tmp_path / f"{s}.bin", s, n) for s, n in enumerate([17, 16, 9])]
    ld = ShardLoader(files, micro_batch=2, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))
    starts = [0, 8, 1000, 2000, 0, 8]
    for start in starts:
        x, y = ld.next_batch()
        assert torch.equal(x, expected(start, 2, 4)[0]) and torch.equal(y, expected(start, 2, 4)[1])


def test_the_position_names_shard_and_offset_and_restores_there(tmp_path):
    """state_dict() between steps is (shard, pos); a new loader loaded with it continues there."""
    files = [shard(tmp_path / f"{s}.bin", s, 17) for s in range(2)]
    ld = ShardLoader(files, micro_batch=2, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))
    for _ in range(3):
        ld.next_batch()
    assert ld.state_dict() == {"shard": 1, "pos": 8}
    other = ShardLoader(files, micro_batch=2, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))
    other.load_state_dict({"shard": 1, "pos": 8})
    assert torch.equal(other.next_batch()[0], expected(1008, 2, 4)[0])


def test_the_position_is_not_saved_mid_step(tmp_path):
    """Between the micro-batches of a step there is no valid position to save."""
    files = [shard(tmp_path / "a.bin", 0, 100)]
    ld = ShardLoader(files, micro_batch=1, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))
    ld.next_batch()
    with pytest.raises(AssertionError, match="between steps"):
        ld.state_dict()


def test_a_shard_shorter_than_one_step_plus_one_is_named(tmp_path):
    """A shard needs batch_tokens + 1 tokens: exactly that is fine, one fewer an error."""
    ok = shard(tmp_path / "ok.bin", 0, 9)
    ShardLoader([ok], micro_batch=2, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))
    short = shard(tmp_path / "short.bin", 0, 8)
    with pytest.raises(ValueError, match="short.bin.*batch_tokens 8"):
        ShardLoader([short], micro_batch=2, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))


def test_shard_files_lists_a_splits_shards_in_order_beside_the_manifest(tmp_path):
    """The manifest's shards of one split, in the listed order, relative to its folder."""
    listed = [("val", "v0.bin"), ("train", "t2.bin"), ("train", "t1.bin"), ("val", "v1.bin")]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"shards": [{"file": f, "split": s} for s, f in listed]}))
    assert shard_files(str(manifest), "train") == [tmp_path / "t2.bin", tmp_path / "t1.bin"]
    assert shard_files(manifest, "val") == [tmp_path / "v0.bin", tmp_path / "v1.bin"]
    with pytest.raises(ValueError, match="manifest.json.*no 'test' shards"):
        shard_files(manifest, "test")


@pytest.mark.parametrize(
    ("n", "val_tokens", "steps"), [(33, 10_000, 2), (32, 10_000, 1), (200, 40, 2)]
)
def test_val_batches_are_this_ranks_share_of_the_first_val_tokens(tmp_path, n, val_tokens, steps):
    """Rank r's batch i is slice (i * W + r) of the first val_tokens; ranks cover them once."""
    file = shard(tmp_path / "val.bin", 0, n)
    seen = []
    for r in range(2):
        batches = val_batches(file, 2, 4, val_tokens, DataShare(r, 2), EOT).batches
        assert len(batches) == steps
        for i, (x, y) in enumerate(batches):
            ex, ey = expected((2 * i + r) * 8, 2, 4)
            assert x.dtype == y.dtype == torch.int64
            assert torch.equal(x, ex) and torch.equal(y, ey)
            seen += x.flatten().tolist()
    assert sorted(seen) == list(range(16 * steps))


def test_every_val_target_is_in_the_document_of_the_token_it_follows(tmp_path):
    """Documents open at end-of-text and are numbered over all ranks' text: rank r's doc ids
    of batch i are those of slice (i * W + r); text before the first end-of-text is document 0;
    predicting a document's closing end-of-text is that document's."""
    tokens = np.arange(40, dtype=np.uint16) % 7  # 0 is end-of-text: at 0, 7, 14, 21, 28, 35
    tokens[:3] = [5, 5, 0]  # 2 tokens of text before the first end-of-text
    file = tmp_path / "val.bin"
    write_shard(file, tokens)
    # by hand: the target after input k is in the document of input k
    opened = [k for k in range(32) if tokens[k] == 0]
    want = torch.tensor([sum(o <= k for o in opened) for k in range(32)])
    for r in range(2):
        val = val_batches(file, 2, 4, 32, DataShare(r, 2), eot=0)
        assert val.documents == len(opened) + 1
        for i, docs in enumerate(val.docs):
            start = (2 * i + r) * 8
            assert torch.equal(docs, want[start : start + 8].view(2, 4)), (r, i)


def test_a_val_shard_shorter_than_one_batch_is_named(tmp_path):
    """Fewer than B * T * W + 1 tokens: no batch at all, an error naming the file."""
    file = shard(tmp_path / "val.bin", 0, 16)
    with pytest.raises(ValueError, match="val.bin.*one validation batch of 16"):
        val_batches(file, 2, 4, 10_000, DataShare(0, 2), EOT)


def test_uint32_shards_read_through_the_loader_and_the_val_batches(tmp_path):
    """A vocabulary over 65,536 ids (Llama 3's 128,256): the loader and the val batches give
    the ids of a uint32 shard whole, as int64."""
    from lmpipe.data.shards import LLAMA3_FORMAT

    base = 128_000  # ids past uint16: a uint16 read would wrap or misalign them
    files = [tmp_path / "big.bin"]
    write_shard(files[0], base + np.arange(200), LLAMA3_FORMAT)
    ld = ShardLoader(files, micro_batch=2, seq_len=4, batch_tokens=8, dp=DataShare(0, 1))
    for step in range(2):
        x, y = ld.next_batch()
        ex, ey = expected(base + 8 * step, 2, 4)
        assert torch.equal(x, ex) and torch.equal(y, ey)
    (x, y), *_ = val_batches(files[0], 2, 4, 16, DataShare(0, 1), EOT).batches
    assert torch.equal(x, expected(base, 2, 4)[0])

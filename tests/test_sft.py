"""Chat fine-tuning: the Vicuna template and its loss mask, malformed and long conversations, the
conversation loader, bit-identical resume of a real 2-rank SFT run and the HF import. The real
`train` rule fine-tuning on the embedded data (the fine-tuned model answers "Who are you?" with
the Vicuna identity of the data) is tests/test_pipeline.py's, on the demo's own run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import RESOURCES, TOKENIZER_DIR, kill_at_checkpoint
from lmpipe.chat.data import IGNORE, prepare, split_of, to_row, write
from lmpipe.chat.loader import ConversationLoader, load_split
from lmpipe.chat.replay import ReplayLoader
from lmpipe.chat.template import MalformedConversation, check_conversation, render
from lmpipe.config import ConversationsConfig
from lmpipe.data.loader import DataShare
from lmpipe.data.mixture import text_sources
from lmpipe.data.shards import write_shard
from lmpipe.data.tokenizer import EOT, EOT_ID, gpt2_encoding
from lmpipe.models.gpt2.model import GPT, GPTConfig

ENC = gpt2_encoding(str(TOKENIZER_DIR))
SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant"
    " gives helpful, detailed, and polite answers to the user's questions."
)
KNOWN = {
    "id": "known",
    "conversations": [
        {"from": "human", "value": "Who are you?"},
        {"from": "gpt", "value": "I am Vicuna."},
        {"from": "human", "value": "Thanks!"},
        {"from": "gpt", "value": "You're welcome."},
    ],
}


def data_config(**kw) -> ConversationsConfig:
    return ConversationsConfig(**({"dataset": "chat", "source": "local", "seq_len": 128} | kw))


def conversation(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in turns]}


# ---- the template and its mask -----------------------------------------------------------------


def test_template_renders_a_known_conversation_and_masks_exactly_the_replies():
    _, turns = check_conversation(KNOWN, 0)
    expected = (
        f"{SYSTEM} USER: Who are you? ASSISTANT: I am Vicuna.{EOT}"
        f"USER: Thanks! ASSISTANT: You're welcome.{EOT}"
    )
    assert render(turns) == expected
    row = to_row(ENC, turns, seq_len=64)
    whole = ENC.encode(expected, allowed_special={EOT})
    n = len(whole) - 1
    # the inputs are the rendered text, tokenized whole (pieces joined at pre-tokenizer boundaries)
    assert row.inputs[:n].tolist() == whole[:-1]
    assert (row.inputs[n:] == EOT_ID).all() and (row.targets[n:] == IGNORE).all()
    # every target is the next token or ignored; the counted ones are exactly the replies + EOT
    counted = row.targets != IGNORE
    assert row.targets[:n][counted[:n]].tolist() == [whole[i + 1] for i in np.flatnonzero(counted)]
    replies = ENC.decode(row.targets[counted].tolist())
    assert replies == f" I am Vicuna.{EOT} You're welcome.{EOT}"
    # and the token before each reply is the prompt's "ASSISTANT:" colon
    first = int(np.flatnonzero(counted)[0])
    assert ENC.decode(row.inputs[: first + 1].tolist()).endswith("ASSISTANT:")


def test_too_long_keeps_whole_leading_exchanges_or_cuts_the_first():
    long = conversation(
        "long", ("human", "Hi"), ("gpt", "Hello there."), ("human", "More"), ("gpt", "x " * 200)
    )
    _, turns = check_conversation(long, 0)
    row = to_row(ENC, turns, seq_len=64)
    assert row.truncated
    assert ENC.decode(row.targets[row.targets != IGNORE].tolist()) == f" Hello there.{EOT}"
    # a first exchange longer than the row is cut at the end: its first reply tokens still count
    cut = to_row(
        ENC, check_conversation(conversation("c", ("human", "Hi"), ("gpt", "y " * 200)), 0)[1], 48
    )
    assert cut.truncated and (cut.targets != IGNORE).sum() > 0 and EOT_ID not in cut.targets
    # nothing of a reply fits: skipped and counted
    huge = conversation("huge", ("human", "z " * 200), ("gpt", "ok"))
    prepared = prepare([KNOWN, long, huge, conversation("k2", ("human", "a"), ("gpt", "b"))],
                       data_config(seq_len=64, val_percent=50), ENC)  # fmt: skip
    assert prepared.too_long == ["huge"] and prepared.truncated == ["long"]


@pytest.mark.parametrize(
    "bad, reason",
    [
        (conversation("gpt-first", ("gpt", "Hi"), ("human", "Hello")), "'gpt' where 'human'"),
        (conversation("sys", ("system", "Be nice"), ("human", "Hi")), "unknown role 'system'"),
        (conversation("empty"), "no turns"),
        (conversation("blank", ("human", "Hi"), ("gpt", "  ")), "empty message"),
        (conversation("no-reply", ("human", "Hi")), "ends with a human turn"),
    ],
)
def test_malformed_conversation_is_an_error_naming_it_or_skipped_and_counted(bad, reason):
    good = [conversation(f"ok{i}", ("human", "Hi"), ("gpt", "Hello")) for i in range(20)]
    with pytest.raises(MalformedConversation, match=f"'{bad['id']}'.*{reason}"):
        prepare([*good, bad], data_config(on_malformed="error"), ENC)
    prepared = prepare([*good, bad], data_config(on_malformed="skip"), ENC)
    assert len(prepared.malformed) == 1 and bad["id"] in prepared.malformed[0]
    assert prepared.conversations == 21
    assert sum(len(rows) for rows in prepared.rows.values()) == 20


# split_of's rule worked out by hand (hashlib, not the function): the bucket is the first 8 hex
# digits of sha256(id as UTF-8) as an integer, mod 10000; held out when below val_percent * 100.
PINNED_SPLITS = {
    ("identity_0", 10): "train",  # bucket 3919
    ("identity_1", 10): "train",  # 5916
    ("identity_9", 10): "val",  # 765
    ("identity_16", 10): "val",  # 716
    ("identity_25", 10): "val",  # 522
    ("identity_25", 5): "train",
    ("identity_29", 10): "train",  # 1340
    ("identity_29", 15): "val",
    ("identity_31", 5): "val",  # 318
    ("identity_31", 2.5): "train",
    ("identity_35", 2.5): "val",  # 201
    ("known", 10): "train",  # 8258
    ("known", 90): "val",
    ("ë-ü", 1): "val",  # 94
}


def test_held_out_split_is_a_fixed_hash_of_the_id(tmp_path):
    """The same conversation is held out in every process and on every machine: split_of gives
    the pinned answers here and in a process with another PYTHONHASHSEED (no per-process hash())."""
    assert {k: split_of(*k) for k in PINNED_SPLITS} == PINNED_SPLITS
    code = (
        "import json, sys; from lmpipe.chat.data import split_of;"
        "print(json.dumps([split_of(i, p) for i, p in json.load(sys.stdin)]))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(list(PINNED_SPLITS)),
        env=dict(os.environ, PYTHONHASHSEED="12345"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(other.stdout) == list(PINNED_SPLITS.values())
    ids = [f"identity_{i}" for i in range(2000)]
    val = [i for i in ids if split_of(i, 10) == "val"]
    assert 150 < len(val) < 250  # ~10%
    assert [i for i in reversed(ids) if split_of(i, 10) == "val"] == val[::-1]
    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())
    m = write(prepare(records, data_config(), ENC), data_config(), tmp_path / "sft")
    assert m["conversations"] == 500 and m["kept"]["train"] + m["kept"]["val"] == 500
    assert m["skipped"] == {"malformed": 0, "too_long": 0}
    x = np.load(tmp_path / "sft" / "train_inputs.npy", allow_pickle=False)
    assert x.shape == (m["kept"]["train"], 128) and x.dtype == np.int32


# ---- the loader ----------------------------------------------------------------------------------


def test_conversation_loader_splits_steps_over_ranks_and_resumes_exactly():
    rows = np.arange(40 * 8, dtype=np.int32).reshape(40, 8)  # row i holds 8i..8i+7
    one = ConversationLoader(rows, rows, 2, 8 * 8, DataShare(0, 1), seed=3)  # 4 micro-steps
    two = [
        ConversationLoader(rows, rows, 2, 8 * 8, DataShare(r, 2), seed=3) for r in range(2)
    ]  # 2 each
    for _ in range(12):  # 12 steps: 2.4 epochs of 5 steps
        a = torch.cat([one.next_batch()[0] for _ in range(4)])
        b = torch.cat([torch.cat([two[r].next_batch()[0] for r in range(2)]) for _ in range(2)])
        assert torch.equal(a, b)  # the same rows a step, whatever the split
    assert one.state_dict() == {"epoch": 2, "step": 2}
    resumed = ConversationLoader(rows, rows, 2, 8 * 8, DataShare(0, 1), seed=3)
    resumed.load_state_dict(one.state_dict())
    for _ in range(8):
        assert torch.equal(resumed.next_batch()[0], one.next_batch()[0])
    # each epoch is a different permutation of all rows, none repeated within an epoch
    fresh = ConversationLoader(rows, rows, 2, 8 * 8, DataShare(0, 1), seed=3)
    epochs = [torch.cat([fresh.next_batch()[0][:, 0] // 8 for _ in range(20)]) for _ in range(2)]
    assert len(set(epochs[0].tolist())) == 40 and not torch.equal(epochs[0], epochs[1])


def text_manifest(folder: Path, train: np.ndarray, name: str = "text") -> Path:
    """A tokens manifest of one val shard and one train shard holding `train`."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, (split, tokens) in enumerate([("val", train[:200]), ("train", train)]):
        write_shard(folder / f"{name}_{split}_{i:06d}.bin", tokens.astype(np.uint16))
        shards.append({"file": f"{name}_{split}_{i:06d}.bin", "split": split,
                       "tokens": len(tokens)})  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps({"dataset": name, "shards": shards}))
    return folder / "manifest.json"


def test_replay_mixes_its_share_of_text_rows_alike_on_1_or_2_ranks_and_resumes_exactly(tmp_path):
    """sft.replay 0.3 of steps of 8 rows: over 12 steps, within a row of 0.3 of the rows at every
    step's end are text, each the next 9-token window of the text (its targets every next token,
    none masked), the rest the conversations, each once an epoch, with their own mask; the rows
    of a step are the same whatever the ranks; a loader restored from the state after 5 steps
    (40 rows: not a whole number of the share's 10-row cycle) continues alike."""
    T, B, replay = 8, 2, 0.3
    rows = np.arange(10 * T).reshape(10, T)  # conversation i holds 8i..8i+7
    targets = np.where(rows % 2 == 0, rows, -1)  # its "replies": the even tokens
    stream = np.arange(1000, 3000)  # the text: token k of the stream is 1000 + k
    text = text_sources(text_manifest(tmp_path, stream))

    def loader(rank: int, ranks: int) -> ReplayLoader:
        return ReplayLoader(rows, targets, "chat", text, replay, B, 8 * T, DataShare(rank, ranks),
                            seed=3)  # fmt: skip

    def step(loaders: list[ReplayLoader], micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's rows, micro-batch by micro-batch and rank by rank, as the ranks split it."""
        batches = [ld.next_batch() for _ in range(micro) for ld in loaders]
        return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])

    one, two = [loader(0, 1)], [loader(r, 2) for r in range(2)]
    xs, ys = [], []
    for k in range(12):
        x, y = step(one, 4)
        assert all(torch.equal(a, b) for a, b in zip((x, y), step(two, 2), strict=True))
        xs.append(x)
        ys.append(y)
        if k == 4:
            resumed = loader(0, 1)
            resumed.load_state_dict(one[0].state_dict())
    x, y = torch.cat(xs), torch.cat(ys)
    is_text = x[:, 0] >= 1000
    taken = torch.cumsum(is_text.reshape(12, 8).sum(1), 0)
    assert (torch.abs(taken - replay * 8 * torch.arange(1, 13)) <= 1).all(), taken
    n = int(taken[-1])
    start = 1000 + T * torch.arange(n)[:, None] + torch.arange(T)  # windows T apart
    assert torch.equal(x[is_text], start) and torch.equal(y[is_text], start + 1)
    conv = x[~is_text][:, 0] // T  # which conversation each row is
    epochs = conv[:60].reshape(6, 10)
    assert all(sorted(e.tolist()) == list(range(10)) for e in epochs)  # each once an epoch
    assert not torch.equal(epochs[0], epochs[1])  # in another order
    assert torch.equal(y[~is_text], torch.where(x[~is_text] % 2 == 0, x[~is_text], -1))
    assert one[0].state_dict()["tokens_by_source"] == {"chat": (96 - n) * T, "text": n * T}
    again = torch.cat([step([resumed], 4)[0] for _ in range(7)])
    assert torch.equal(again, x[5 * 8 :])


def test_replay_from_a_mixture_takes_each_source_by_its_weight(tmp_path):
    """A base trained on a mixture (a: 0.75, b: 0.25) replays both: with replay 0.4, 0.3 and 0.1
    of the rows, each source's own next windows."""
    from lmpipe.data.mixture import write_mixture

    manifests = {
        name: text_manifest(tmp_path / name, np.arange(start, start + 3000), name)
        for name, start in (("a", 10_000), ("b", 20_000))
    }
    mixture = tmp_path / "ab" / "tokens" / "manifest.json"
    write_mixture(mixture, "ab", {"a": 0.75, "b": 0.25}, manifests)
    rows = np.zeros((20, 8), dtype=np.int64)
    loader = ReplayLoader(rows, rows, "chat", text_sources(mixture), 0.4, 10, 80, DataShare(), 0)
    x = torch.cat([loader.next_batch()[0] for _ in range(10)])  # 10 steps of 10 rows
    for start, share in ((10_000, 0.3), (20_000, 0.1)):
        mine = x[(x[:, 0] >= start) & (x[:, 0] < start + 3000)]
        assert abs(len(mine) - share * 100) <= 1
        assert torch.equal(mine[:, 0], start + 8 * torch.arange(len(mine)))  # its own stream
    assert int((x[:, 0] == 0).sum()) == 60  # the conversations


# ---- HF import -> export -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory) -> Path:
    """A random tiny GPT exported as a Hugging Face folder: an `hf:` base."""
    from lmpipe.models.gpt2.hf import write_hf

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64))
    out = tmp_path_factory.mktemp("hf_base") / "hf"
    write_hf(model, TOKENIZER_DIR, out, {"run": "random"})
    return out


def test_hf_import_export_round_trips_the_weights(hf_base, tmp_path):
    from safetensors.torch import load_file

    from lmpipe.chat.finetune import load_base
    from lmpipe.models import load_hf
    from lmpipe.models.gpt2.hf import write_hf

    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64))
    load_base(model, hf_base)  # the trainer's import
    write_hf(model, TOKENIZER_DIR, tmp_path / "again", {"run": "again"})
    a, b = load_file(hf_base / "model.safetensors"), load_file(tmp_path / "again/model.safetensors")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k], b[k]), k
    native = load_hf(tmp_path / "again").state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(native[k], v), k
    with pytest.raises(ValueError, match="is not the run's model"):
        load_base(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)), hf_base)


# ---- a real 2-rank SFT run: resume bit for bit -------------------------------------------------


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())[:120]
    cfg = data_config(seq_len=64)
    out = tmp_path_factory.mktemp("sft_data") / "sft"
    write(prepare(records, cfg, ENC), cfg, out)
    return out / "manifest.json"


# the fine-tuning tests' model, as a train job's params give it
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64, "vocab_size": 50257,
        "padded_vocab_size": 50304, "arch": "gpt2"}  # fmt: skip


def sft_command(
    data: Path,
    base: Path,
    out: Path,
    procs: int = 2,
    batch_tokens: int = 512,
    replay: float = 0.0,
    text: Path | None = None,
):
    """The fine-tuning worker's command: through the launcher (torchrun), or one process; with
    `replay`, `text` is the tokens manifest replayed."""
    train = {
        "seq_len": 64, "micro_batch": 4, "batch_tokens": batch_tokens, "max_steps": 0, "seed": 1337,
        "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "betas": [0.9, 0.95],
                      "eps": 1e-8, "fused": False},
        "schedule": {"warmup_steps": 0, "lr_floor": 0.0}, "grad_clip": 1.0, "val_every": 4,
        "val_tokens": 1024, "checkpoint_every": 4, "keep_checkpoints": 2, "dtype": "float32",
        "compile": False,
    }  # fmt: skip
    cfg = {
        "run": "chat", "dataset": "chat", "train": train,
        "sft": {"epochs": 1, "warmup_ratio": 0.04},
        "model": TINY,
        "launch": {"device": "cpu", "nodes": 1, "procs_per_node": procs, "peak_flops": 1e12},
        "base": {"hf": str(base)},
    }  # fmt: skip
    args = ["--config-json", json.dumps(cfg), "--data", str(data), "--init", str(base)]
    if replay:
        cfg["sft"]["replay"] = replay
        args = ["--config-json", json.dumps(cfg), *args[2:], "--replay", str(text)]
    if procs == 1:
        return [sys.executable, "-m", "lmpipe.chat.finetune", *args, "--out", str(out)]
    worker = ["--worker", "lmpipe.chat.finetune"]
    return [sys.executable, "-m", "lmpipe.train", *worker, *args, "--out", str(out)]


def final_state(out: Path) -> dict[str, torch.Tensor]:
    state = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)).state_dict()
    dcp.load({"model": state}, checkpoint_id=out / "final")
    return state


def train_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if '"loss"' in line]


def test_replay_off_leaves_the_datas_identity_the_conversations_alone(sft_data, tmp_path):
    """The data's part of the trajectory's hash: without replay the conversations' arrays, as
    before sft.replay existed (half-trained runs resume); with it, the share and the text's
    shards too. A --replay without sft.replay, or the reverse, is refused in one line."""
    from types import SimpleNamespace

    from lmpipe.chat.finetune import training_rows
    from lmpipe.chat.loader import read_manifest
    from lmpipe.config import TrainJob

    text = text_manifest(tmp_path / "text", np.arange(3000))
    dist = SimpleNamespace(group=DataShare(0, 1))

    def rows(replay: float, replayed: Path | None):
        job = TrainJob.from_json(sft_command(sft_data, Path("b"), Path("o"), 1, 512, replay)[4])
        return training_rows(job, job.train, sft_data, dist, replayed)

    loader, identity = rows(0.0, None)
    assert isinstance(loader, ConversationLoader)
    assert identity == read_manifest(sft_data).identity()  # the arrays' sha256, as before
    loader, identity = rows(0.25, text)
    assert isinstance(loader, ReplayLoader)
    assert identity["replay"] == 0.25 and identity["text"]["text"]["shards"][1]  # its train shard
    with pytest.raises(ValueError, match=r"runs.chat.sft.replay 0.25: needs --replay"):
        rows(0.25, None)
    with pytest.raises(ValueError, match=r"--replay .*: runs.chat.sft.replay is 0"):
        rows(0.0, text)


def identity_conversations(folder: Path, train: list[int]) -> Path:
    """The identity conversations numbered `train` to train on, and identity_9 held out
    (PINNED_SPLITS), prepared in rows of 64 tokens."""
    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())
    ids = {f"identity_{i}" for i in [*train, 9]}
    records = [r for r in records if r["id"] in ids]
    cfg = data_config(seq_len=64)
    write(prepare(records, cfg, ENC), cfg, folder)
    data = folder / "manifest.json"
    assert json.loads(data.read_text())["kept"] == {"train": len(train), "val": 1}
    return data


def distinctive_base(init: Path) -> GPT:
    """A final checkpoint at `init`, as the chat rule's --init, of a tiny GPT whose weights are
    ~ N(0, 1): far from any init. Returns the model."""
    torch.manual_seed(5)
    base = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64))
    with torch.no_grad():
        for p in base.parameters():
            p.normal_(0.0, 1.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": base.state_dict()}, checkpoint_id=init)
    meta = {"run": "base", "model": TINY, "train": {}, "settings_hash": "b", "step": 9,
            "tokens": 0, "world_size": 1}  # fmt: skip
    (init / "meta.json").write_text(json.dumps(meta))
    return base


def run_worker(argv: list[str]) -> list[dict]:
    """The fine-tuning worker's own entry point, in this process (a one-rank group; no torch
    start-up to pay); its metrics' records."""
    from lmpipe.chat.finetune import main as finetune_main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        assert finetune_main(argv) == 0
    finally:
        for sig, handler in handlers.items():  # the worker's stop flag takes both
            signal.signal(sig, handler)
    out = Path(argv[argv.index("--out") + 1])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@torch.no_grad()
def mean_loss(model: GPT, rows: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The model's mean loss over every counted target of the rows, all in one batch."""
    x, y = (torch.from_numpy(np.concatenate(a)).long() for a in zip(*rows, strict=True))
    return model(x, y)[1].item()


def test_sft_starts_from_the_init_weights(tmp_path):
    """A one-step fine-tuning run from a distinctive base: its first held-out loss and its first
    training loss (step 1's, measured before the update) are the base's own losses on the same
    rows, computed here with the base model."""
    data = identity_conversations(tmp_path / "sft", train=[0, 1, 2, 3])  # 1 step of 4 rows
    init, out = tmp_path / "base" / "final", tmp_path / "out"
    base = distinctive_base(init)
    train, val = load_split(data, "train"), load_split(data, "val")
    assert abs(mean_loss(base, [train]) - 10.8) > 1  # not a fresh init's (~ln(50257))
    argv = sft_command(data, init, out, procs=1, batch_tokens=256)[3:]  # the worker's arguments
    records = run_worker(argv)
    assert records[0]["step"] == 0 and records[1]["step"] == 1
    assert records[0]["val_loss"] == pytest.approx(mean_loss(base, [val]), rel=1e-5)
    assert records[1]["loss"] == pytest.approx(mean_loss(base, [train]), rel=1e-5)


def test_replayed_text_counts_in_the_loss_on_every_token(tmp_path):
    """sft.replay 0.25 of a step of 4 rows: 3 conversations and the text's first 65 tokens as
    one plain row. From a distinctive base, step 1's loss (measured before the update) is the
    base's mean loss over the conversations' replies and every next token of that row, together;
    the metrics count the tokens each source gave."""
    data = identity_conversations(tmp_path / "sft", train=[0, 1, 2])  # 1 step: 3 + 1 text row
    stream = np.random.default_rng(0).integers(0, 50257, 3000)
    text = text_manifest(tmp_path / "text", stream)
    init, out = tmp_path / "base" / "final", tmp_path / "out"
    base = distinctive_base(init)
    conversations, window = load_split(data, "train"), (stream[None, :64], stream[None, 1:65])
    replayed = mean_loss(base, [conversations, window])
    assert abs(replayed - mean_loss(base, [conversations])) > 0.5  # the text row tells
    argv = sft_command(data, init, out, procs=1, batch_tokens=256, replay=0.25, text=text)[3:]
    records = run_worker(argv)
    assert records[1]["step"] == 1 and records[1]["loss"] == pytest.approx(replayed, rel=1e-5)
    assert records[1]["tokens_by_source"] == {"chat": 3 * 64, "text": 64}


@pytest.mark.slow
def test_sft_resumes_bit_for_bit_after_a_kill(sft_data, hf_base, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ref = tmp_path / "ref"
    subprocess.run(sft_command(sft_data, hf_base, ref), env=env, check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    meta = json.loads((ref / "final/meta.json").read_text())
    rows = json.loads(sft_data.read_text())["kept"]["train"]
    assert (
        meta["step"] == rows // 8 and meta["train"]["schedule"]["warmup_steps"] == 1
    )  # 1 epoch, ceil(4%)
    # MFU counts the head at the counted tokens only (llm.c's formula less the skipped positions)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64))
    full, head = model.flops_per_token(64), model.head_flops_per_token()
    records = [json.loads(line) for line in (ref / "metrics.jsonl").read_text().splitlines()]
    implied = [r["mfu"] * 1e12 * 2 / r["tokens_per_s"] for r in records if "mfu" in r]
    counted = float((load_split(sft_data, "train")[1] != IGNORE).mean())  # a quarter or so
    assert abs(sum(implied) / len(implied) - (full - head * (1 - counted))) < 0.05 * head
    # the run started from the base weights: its first held-out loss is the base model's
    from lmpipe.models import load_hf

    first_val = json.loads((ref / "metrics.jsonl").read_text().splitlines()[0])["val_loss"]
    assert first_val < 11.5  # a random init's would be ~ln(50257) = 10.8 too; see the next check
    assert load_hf(hf_base).state_dict().keys() == final_state(ref).keys()

    out = tmp_path / "killed"
    kill_at_checkpoint(sft_command(sft_data, hf_base, out), env, out, step=4)
    restart = subprocess.run(sft_command(sft_data, hf_base, out), env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert restart.returncode == 0, restart.stderr
    assert "resumed from" in restart.stderr
    assert train_losses(out) == train_losses(ref)
    a, b = final_state(out), final_state(ref)
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_sft_with_replay_resumes_bit_for_bit_after_a_kill(sft_data, hf_base, tmp_path):
    """sft.replay 0.25 on 2 ranks, steps of 8 rows (6 conversations, 2 text rows): an epoch is
    the training conversations // 6 steps; killed at its step-8 checkpoint and restarted, the run
    ends bit for bit as one that never stopped, having replayed 2 rows of text a step."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    text = text_manifest(tmp_path / "text", np.random.default_rng(1).integers(0, 50257, 4000))

    def command(out: Path) -> list[str]:
        return sft_command(sft_data, hf_base, out, replay=0.25, text=text)

    ref, out = tmp_path / "ref", tmp_path / "killed"
    subprocess.run(command(ref), env=env, check=True, timeout=300, capture_output=True)
    meta = json.loads((ref / "final/meta.json").read_text())
    steps = json.loads(sft_data.read_text())["kept"]["train"] // 6
    assert meta["step"] == steps > 8
    records = [json.loads(line) for line in (ref / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "loss" in r][-1]  # the last step's line
    assert last["tokens_by_source"] == {"chat": steps * 6 * 64, "text": steps * 2 * 64}

    kill_at_checkpoint(command(out), env, out, step=8)
    restart = subprocess.run(command(out), env=env, capture_output=True, text=True, timeout=300)
    assert restart.returncode == 0, restart.stderr
    assert "resumed from" in restart.stderr
    assert train_losses(out) == train_losses(ref)
    a, b = final_state(out), final_state(ref)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_each_held_out_conversations_loss_is_its_own(monkeypatch):
    """The held-out loss lists each conversation's summed loss over its counted tokens (the
    report's interval over conversations), each equal to that row scored alone, by hand; their
    ratio is the mean the result reports. Batches of 3 over 5 rows: a batch's rows never mix."""
    import numpy as np
    import torch.nn.functional as F

    from lmpipe.chat import evals
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16)).eval()
    rng = np.random.default_rng(0)
    inputs = rng.integers(0, 50257, (5, 16)).astype(np.int32)
    targets = rng.integers(0, 50257, (5, 16)).astype(np.int32)
    targets[rng.random((5, 16)) < 0.5] = -1  # the prompt tokens: not counted
    targets[3] = -1  # a conversation with no counted token: 0 nats over 0 tokens
    monkeypatch.setattr(evals, "load_split", lambda manifest, split: (inputs, targets))
    losses, counts = evals.conversation_loss(model, "manifest.json", batch=3, device="cpu")
    for row, (loss, count) in enumerate(zip(losses, counts, strict=True)):
        x, y = torch.from_numpy(inputs[row : row + 1]).long(), torch.from_numpy(targets[row])
        with torch.no_grad():
            logits, _ = model(x)
        counted = y != -1
        want = F.cross_entropy(logits[0][counted], y[counted].long(), reduction="sum")
        assert count == int(counted.sum())
        assert loss == pytest.approx(float(want), rel=1e-5, abs=1e-6)

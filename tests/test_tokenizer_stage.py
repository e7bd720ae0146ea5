"""The train_tokenizer stage: a byte-level BPE trained on the embedded sample (deterministic,
byte-exact on every document), the config's refusals, and a tiny run through Snakemake in a
trained tokenizer's tokens, exported with it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import CONFIG_FILE, RESOURCES
from lmpipe import config as lmconfig
from lmpipe import schema
from lmpipe.config import TokenizeConfig, TokenizerConfig

VOCAB = 1024


def raw_manifest(dest: Path) -> Path:
    """The embedded sample as the download stage leaves it."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(RESOURCES / "fineweb_sample.parquet", dest / "sample.parquet")
    (dest / "manifest.json").write_text(
        json.dumps({"files": [{"file": "sample.parquet", "rows": 1000}]})
    )
    return dest / "manifest.json"


def train(tmp: Path, out: str, **settings) -> tuple[Path, dict]:
    from lmpipe.data.train_tokenizer import train_tokenizer

    cfg = TokenizerConfig(name="t", dataset="embedded", vocab_size=VOCAB, **settings)
    data = TokenizeConfig(dataset="embedded", shard_tokens=500_000, val_tokens=100_000)
    return tmp / out, train_tokenizer(cfg, data, raw_manifest(tmp / "raw"), tmp / out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    return train(tmp_path_factory.mktemp("tok"), "tok")


def test_training_twice_gives_identical_files(trained, tmp_path):
    first, manifest = trained
    again, _ = train(tmp_path, "again")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert manifest["vocab_size"] == VOCAB and manifest["eot"] == VOCAB - 1  # specials last
    t = manifest["training"]
    assert t["documents"] + t["held_out_documents"] == 1000 and t["held_out_tokens"] >= 100_000


def test_every_document_round_trips_byte_for_byte(trained, fineweb_texts):
    """As the tokenize stage encodes (the folder's AutoTokenizer, special tokens' text as text)."""
    from lmpipe.data.tokenizer import load_tokenizer

    tok = load_tokenizer(trained[0])
    assert tok.n_vocab == VOCAB and tok.eot_token == VOCAB - 1
    for text in fineweb_texts + ["<|endoftext|> stays text", "tabs\t\tand 你好 🌍\r\n"]:
        ids = tok.encode_ordinary(text)
        assert max(ids) < VOCAB - 1 and tok.decode(ids) == text


def test_a_budget_stops_the_text(tmp_path):
    _, m = train(tmp_path, "small", max_documents=300)
    assert m["training"]["documents"] == 300


# ---- the config's refusals: one line each, before any job ----

SHIPPED = yaml.safe_load(CONFIG_FILE.read_text())


def with_tokenizer(**tokenizer) -> dict:
    c = copy.deepcopy(SHIPPED)
    c["tokenizers"] |= {"tiny": {"dataset": "embedded", "vocab_size": VOCAB} | tokenizer}
    c["models"]["tiny-tok"] = c["models"]["tiny"] | {
        "tokenizer": "tiny", "vocab_size": VOCAB, "padded_vocab_size": VOCAB,
    }  # fmt: skip
    c["runs"]["tok-a"] = copy.deepcopy(c["runs"]["embedded-a"]) | {"model": "tiny-tok"}
    return c


CASES = {
    "vocab_below_bytes": (
        lambda c: c["tokenizers"]["tiny"].update(
            vocab_size=257, special_tokens=["<|endoftext|>", "<|x|>"]
        ),  # noqa: E501
        "tokenizers.tiny.vocab_size 257 is below the 256 bytes and 2 special token(s)",
    ),
    "pattern_does_not_compile": (
        lambda c: c["tokenizers"]["tiny"].update(pattern=r" ?\p{L}+(("),
        "tokenizers.tiny.pattern ' ?\\\\p{L}+((' does not compile",
    ),
    "no_end_of_text": (
        lambda c: c["tokenizers"]["tiny"].update(special_tokens=["<|bos|>"]),
        "tokenizers.tiny.special_tokens: ['<|bos|>'] lacks <|endoftext|>",
    ),
    "not_a_text_dataset": (
        lambda c: c["tokenizers"]["tiny"].update(dataset="vicuna-dummy"),
        "tokenizers.tiny.dataset: 'vicuna-dummy' is not a text dataset",
    ),
    "model_vocab_disagrees": (
        lambda c: c["models"]["tiny-tok"].update(vocab_size=2048, padded_vocab_size=2048),
        "models.tiny-tok.vocab_size 2048 is not tokenizer 'tiny''s 1024: set vocab_size: 1024",
    ),
    "unknown_tokenizer": (
        lambda c: c["models"]["tiny-tok"].update(tokenizer="tinyy"),
        "models.tiny-tok.tokenizer: unknown tokenizer 'tinyy' (did you mean 'tiny'?)",
    ),
}


@pytest.mark.parametrize("edit,message", CASES.values(), ids=CASES.keys())
def test_bad_tokenizer_config_is_one_line(edit, message):
    c = with_tokenizer()
    edit(c)
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(c)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_a_run_reads_its_trained_tokenizers_tokens():
    c = with_tokenizer()
    schema.validate(c)
    assert lmconfig.tokens_of(c, "tok-a") == "tok-tiny"
    assert lmconfig.text_tokens(c, "tok-a").endswith("embedded/tokens-tok-tiny/manifest.json")
    assert lmconfig.run_tokenizer_folder(c, "tok-a").endswith("tokenizers/tiny")
    assert lmconfig.run_tokenizer_folder(c, "embedded-a") == c["tokenizer"]  # GPT-2's
    assert "tokenizer" not in json.loads(lmconfig.train_params(c, "embedded-a"))["model"]


def with_chat(**tokenizer) -> dict:
    """with_tokenizer's run tok-a, fine-tuned on the embedded conversations (tok-a-chat)."""
    c = with_tokenizer(**tokenizer)
    c["runs"]["tok-a-chat"] = copy.deepcopy(c["runs"]["embedded-a-chat"]) | {
        "base": {"run": "tok-a"}, "model": "tiny-tok",
    }  # fmt: skip
    return c


def test_a_tokenizer_whose_split_joins_a_prompt_to_its_reply_is_refused_for_chat():
    """A split that keeps a word's trailing space ("ASSISTANT: ") would tokenize a chat prompt
    otherwise than the rows, cut after "ASSISTANT:": refused in one line, where chat meets it."""
    schema.validate(with_tokenizer(pattern=r"\S+\s*"))  # no conversations: nothing to write
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(with_chat(pattern=r"\S+\s*"))
    assert str(e.value) == (
        r"tokenizers.tiny.pattern '\\S+\\s*' cannot write the Vicuna template of run"
        " 'tok-a''s conversations: its split reads 'ASSISTANT: ' as one piece, a prompt's"
        " end with its reply"
    ), str(e.value)
    c = with_chat()  # GPT-4's split: the conversations in its tokens, one entry for every base
    schema.validate(c)
    assert lmconfig.chat_tokens(c, "tok-a-chat").endswith("vicuna-dummy/sft-tok-tiny/manifest.json")
    assert lmconfig.chat_tokens(c, "tok-a") == lmconfig.chat_tokens(c, "tok-a-chat")
    assert lmconfig.chat_tokens(c, "embedded-a-chat").endswith("vicuna-dummy/sft/manifest.json")


# ---- a tiny run through Snakemake ----


def test_a_tiny_run_trains_in_its_own_tokenizer_and_exports_it(tmp_path):
    """train_tokenizer -> tokenize -> train -> convert -> evaluate of a tiny GPT-2 on a trained
    1,024-id tokenizer: the shards are its ids, the export loads with from_pretrained, carries
    that tokenizer and computes the trained model's logits; a changed vocabulary plans exactly
    that chain again."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import make_workdir, planned, snakemake
    from lmpipe.data.shards import read_manifest, read_shard
    from lmpipe.models import load_final_checkpoint

    workdir = make_workdir(tmp_path / "wd")
    config = with_tokenizer(max_documents=400)
    run = config["runs"]["tok-a"]
    run["train"] |= {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "val_tokens": 4096}
    run["eval"] = {
        "val_loss": {"tokens": 8192},
        "hellaswag": {"file": "embedded", "during_training": {"every": 2, "items": 8}},
    }
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    target = "results/runs/tok-a/eval/val_loss.json"
    snakemake(workdir, "--cores", "2", target)

    folder = workdir / "results/tokenizers/tiny"
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) == VOCAB and json.loads((folder / "manifest.json").read_text())["seconds"] > 0
    tokens = workdir / "results/data/embedded/tokens-tok-tiny/manifest.json"
    manifest = json.loads(tokens.read_text())
    assert manifest["tokens_of"] == "tok-tiny" and manifest["eot"] == VOCAB - 1
    shard = read_shard(read_manifest(tokens).files("val")[0])
    assert shard.dtype.itemsize == 2 and int(shard.max()) < VOCAB and shard[0] == VOCAB - 1
    result = json.loads((workdir / target).read_text())
    assert result["tokens_of"] == "tok-tiny" and 0 < result["value"] < 8  # ln 1024 = 6.9

    hf_dir = workdir / "results/runs/tok-a/model/hf"
    assert json.loads((hf_dir / "config.json").read_text())["lmpipe_tokenizer"] == "tiny"
    assert (hf_dir / "tokenizer.json").read_bytes() != b""
    assert AutoTokenizer.from_pretrained(hf_dir).encode("Hello there") == tok.encode("Hello there")
    from lmpipe.data.tokenizer import model_tokenizer

    assert model_tokenizer(hf_dir, RESOURCES / "gpt2").n_vocab == VOCAB
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True).eval()
    model, _ = load_final_checkpoint(workdir / "results/runs/tok-a/train/final")
    model.eval()
    idx = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    torch.testing.assert_close(theirs, ours[..., :VOCAB], rtol=1e-5, atol=1e-5)
    metrics = (workdir / "results/runs/tok-a/train/metrics.jsonl").read_text().splitlines()
    assert any("hellaswag" in json.loads(x) for x in metrics)  # during training, its tokens

    changed = copy.deepcopy(config)
    changed["tokenizers"]["tiny"]["vocab_size"] = 1280
    changed["models"]["tiny-tok"] |= {"vocab_size": 1280, "padded_vocab_size": 1280}
    jobs = planned(workdir, changed, [target])
    assert {rule for rule, _ in jobs} == {
        "train_tokenizer", "tokenize_for_model", "train", "convert", "evaluate",
    }, jobs  # fmt: skip


def test_a_run_in_its_own_tokenizer_fine_tunes_on_conversations_and_exports_the_template(tmp_path):
    """train_tokenizer -> tokenize -> train tok-a (4 steps) -> prepare_conversations in its
    tokens -> fine-tune tok-a-chat (1 epoch, 7 steps) -> convert -> sft_loss, chat_samples: the
    conversations are the trained tokenizer's ids, and the export's apply_chat_template gives
    the rows it was trained on, its generation prompt where each row's loss starts."""
    import numpy as np
    from transformers import AutoTokenizer

    from conftest import make_workdir, snakemake
    from lmpipe.chat.template import prompt_ids
    from lmpipe.data.tokenizer import model_tokenizer

    workdir = make_workdir(tmp_path / "wd")
    config = with_chat(max_documents=400)
    config["runs"]["tok-a"]["train"] |= {"max_steps": 4, "val_every": 2, "checkpoint_every": 2}
    config["runs"]["tok-a"]["eval"] = {"val_loss": {"tokens": 8192}}
    chat = config["runs"]["tok-a-chat"]
    chat["sft"] = {"epochs": 1}  # 450 train conversations, 64 a step: 7 steps
    chat["train"] |= {"micro_batch": 16, "batch_tokens": 128 * 64, "val_every": 4}
    chat["train"] |= {"checkpoint_every": 4, "val_tokens": 4096}
    chat["eval"] = {"val_loss": {"tokens": 8192}, "chat": {"reply_tokens": 8}}
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    targets = [f"results/runs/tok-a-chat/eval/{e}.json" for e in ("sft_loss", "chat_samples")]
    snakemake(workdir, "--cores", "2", *targets)
    ev = workdir / "results/runs/tok-a-chat/eval"

    sft = workdir / "results/data/vicuna-dummy/sft-tok-tiny"
    manifest = json.loads((sft / "manifest.json").read_text())
    assert manifest["eot"] == VOCAB - 1
    rows = {split: np.load(sft / f"{split}_inputs.npy") for split in ("train", "val")}
    masks = {split: np.load(sft / f"{split}_targets.npy") for split in ("train", "val")}
    assert max(int(r.max()) for r in rows.values()) == VOCAB - 1  # its ids, its <|endoftext|>
    loss = json.loads((ev / "sft_loss.json").read_text())
    assert 0 < loss["value"] < 8, loss  # ln 1024 = 6.9 at chance
    replies = json.loads((ev / "chat_samples.json").read_text())
    assert replies["samples"], replies

    hf_dir = workdir / "results/runs/tok-a-chat/model/hf"
    tok = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    assert tok.chat_template and len(tok) == VOCAB and tok.eos_token == "<|endoftext|>"
    for name in ("config.json", "generation_config.json"):  # where generate stops: a reply's end
        assert json.loads((hf_dir / name).read_text())["eos_token_id"] == VOCAB - 1, name
    ours = model_tokenizer(hf_dir, RESOURCES / "gpt2")
    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())
    found = 0
    for record in records:
        turns = [t["value"] for t in record["conversations"]]
        roles = ["user", "assistant"] * (len(turns) // 2)
        messages = [{"role": r, "content": t} for r, t in zip(roles, turns, strict=True)]
        whole = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
        if len(whole) > 128:
            continue  # a truncated row
        prompt = tok.apply_chat_template(
            messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert list(prompt) == prompt_ids(ours, [], turns[0])
        row = np.full(128, VOCAB - 1, dtype=np.int32)
        row[: len(whole)] = whole
        split = next(s for s in rows if (rows[s] == row).all(axis=1).any())
        i = int(np.flatnonzero((rows[split] == row).all(axis=1))[0])
        counted = np.flatnonzero(masks[split][i] != -1)
        assert counted[0] == len(prompt) - 1  # the loss starts where the prompt ends
        found += 1
    assert found > 100, found  # (the rest longer than a row in 1,024 ids)

"""The train_tokenizer stage: a byte-level BPE trained on a text dataset's training text.

As karpathy/nanochat trains its own tokenizer first (`scripts/tok_train.py`: GPT-4's split
pattern, a byte-level BPE, the special tokens after the merges; `nanochat/tokenizer.py`), with
Hugging Face `tokenizers`: the split regex as a `pre_tokenizers.Split` (isolated pieces), then
`ByteLevel(use_regex=False)` maps each piece's bytes to GPT-2's byte alphabet; `BpeTrainer`
starts from all 256 bytes (`ByteLevel.alphabet()`) and learns `vocab_size - 256 - specials`
merges; the special tokens are added last, so the bytes are ids 0..255 and `<|endoftext|>` is the
last id, as in GPT-2's vocabulary. The folder is a PreTrainedTokenizerFast's (`AutoTokenizer`
loads it; eos = `<|endoftext|>`) plus manifest.json.

The training text: the raw files the download stage wrote, in the tokenize stage's order
(lmpipe.data.tokenize `raw_files`, `read_documents`), less the first documents, which the val
shard is cut from: the val shard holds the first `val_tokens` tokens, and they are held out by
bytes (`val_tokens * HOLDOUT_BYTES_A_TOKEN`, more than any byte-level BPE spans on text), so the
tokenizer never sees the text its runs are validated on. Then `max_documents` or `max_bytes`, the
first budget reached. Training is deterministic: one thread, the documents in order (the test
trains twice and compares the files).

    python -m lmpipe.data train_tokenizer --config-json J --dataset-json D --raw-manifest M \
        --out results/tokenizers/NAME
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmpipe import manifests
from lmpipe.config import BYTE_ALPHABET, EOT, TokenizeConfig, TokenizerConfig, build
from lmpipe.data.tokenize import raw_files, read_documents
from lmpipe.files import atomic_dir

log = logging.getLogger("lmpipe.train_tokenizer")

HOLDOUT_BYTES_A_TOKEN = 8  # GPT-2's BPE spans ~4.5 bytes a token on FineWeb; a 32K one ~4.3


def training_text(
    raw_manifest: Path, data: TokenizeConfig, cfg: TokenizerConfig, stats: dict[str, int]
) -> Iterator[str]:
    """The dataset's documents past the val shard's, up to the budget; `stats` counts the held
    out and the yielded documents and bytes."""
    files, _ = raw_files(raw_manifest)
    holdout = data.val_tokens * HOLDOUT_BYTES_A_TOKEN
    for path in files:
        for batch in read_documents(path, data.text_column):
            for text in batch:
                n = len(text.encode("utf-8"))
                if stats["held_out_bytes"] < holdout:
                    stats["held_out_documents"] += 1
                    stats["held_out_bytes"] += n
                    continue
                if cfg.max_documents is not None and stats["documents"] >= cfg.max_documents:
                    return
                if cfg.max_bytes is not None and stats["bytes"] >= cfg.max_bytes:
                    return
                stats["documents"] += 1
                stats["bytes"] += n
                yield text


def train(texts: Iterator[str], cfg: TokenizerConfig) -> Any:
    """The trained PreTrainedTokenizerFast (special tokens after the merges)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if cfg.vocab_size < BYTE_ALPHABET + len(cfg.special_tokens):
        raise ValueError(
            f"vocab_size {cfg.vocab_size} holds not the 256 bytes and"
            f" {len(cfg.special_tokens)} special tokens"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(cfg.regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size - len(cfg.special_tokens),
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(cfg.special_tokens)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOT,
        bos_token=EOT,
        unk_token=None,
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )


def held_out_tokens(
    raw_manifest: Path, data: TokenizeConfig, tokenizer: Any, stats: dict[str, int]
) -> int:
    """The tokens the held-out documents make (each with its end of text), which must cover the
    val shard."""
    files, _ = raw_files(raw_manifest)
    left, tokens = stats["held_out_documents"], 0
    for path in files:
        for batch in read_documents(path, data.text_column):
            batch = batch[:left]
            left -= len(batch)
            ids = tokenizer(batch, add_special_tokens=False, split_special_tokens=True)
            tokens += sum(len(x) + 1 for x in ids["input_ids"])
            if left == 0:
                return tokens
    return tokens


def train_tokenizer(
    cfg: TokenizerConfig, data: TokenizeConfig, raw_manifest: Path, out: Path
) -> dict[str, Any]:
    """Train, save the folder and its manifest into `out` (replaced whole at the end)."""
    os.environ["RAYON_NUM_THREADS"] = "1"  # one thread: the same merges on any machine
    if EOT not in cfg.special_tokens:
        raise ValueError(f"special_tokens {cfg.special_tokens}: {EOT} ends each document")
    stats = dict.fromkeys(("held_out_documents", "held_out_bytes", "documents", "bytes"), 0)
    t0 = time.perf_counter()
    tokenizer = train(training_text(raw_manifest, data, cfg, stats), cfg)
    seconds = time.perf_counter() - t0
    if len(tokenizer) != cfg.vocab_size:
        raise ValueError(
            f"tokenizers.{cfg.name}: {stats['bytes']} bytes of text gave {len(tokenizer)} ids,"
            f" not vocab_size {cfg.vocab_size}: lower vocab_size or raise the budget"
        )
    stats["held_out_tokens"] = held_out_tokens(raw_manifest, data, tokenizer, stats)
    if stats["held_out_tokens"] < data.val_tokens:
        raise ValueError(
            f"tokenizers.{cfg.name}: the {stats['held_out_documents']} documents held out hold"
            f" {stats['held_out_tokens']} tokens, fewer than the val shard's {data.val_tokens}:"
            " the val text would have been trained on (raise HOLDOUT_BYTES_A_TOKEN)"
        )
    with atomic_dir(out) as tmp:
        tokenizer.save_pretrained(tmp)
        manifest = {
            "name": cfg.name,
            "settings": {k: v for k, v in vars(cfg).items() if v is not None},
            "regex": cfg.regex,
            "vocab_size": len(tokenizer),
            "eot": tokenizer.eos_token_id,
            "training": stats,
            "seconds": round(seconds, 3),
        }
        manifests.write(tmp / manifests.MANIFEST, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-json", required=True, help="lmpipe.config.tokenizer_params")
    parser.add_argument("--raw-manifest", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path, help="the tokenizer's folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    params = json.loads(args.config_json)
    cfg = build(TokenizerConfig, params["tokenizer"], "tokenizer")
    data = build(TokenizeConfig, params["dataset"], "dataset")
    m = train_tokenizer(cfg, data, args.raw_manifest, args.out)
    log.info(
        "%d ids from %d documents (%d bytes) in %.1f s -> %s",
        m["vocab_size"], m["training"]["documents"], m["training"]["bytes"], m["seconds"],
        args.out,
    )  # fmt: skip


if __name__ == "__main__":
    main()

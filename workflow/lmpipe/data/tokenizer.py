"""GPT-2 BPE from the files in the repo (resources/gpt2), so tokenizing never downloads.

The result is tiktoken's `gpt2` encoding, built from OpenAI's `encoder.json` and `vocab.bpe`
(tests/test_data.py checks it equals `tiktoken.get_encoding("gpt2")` on real text).
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from lmpipe.data.shards import GPT2_EOT as EOT_ID
from lmpipe.hf_folder import TOKENIZER_FILES, tokenizer_identity

EOT = "<|endoftext|>"
# The GPT-2 pre-tokenizer regex (tiktoken_ext.openai_public.r50k_pat_str).
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)

# sha256 of OpenAI's files (the values tiktoken pins), checked on load.
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"


@cache
def gpt2_encoding(tokenizer_dir: str | Path) -> tiktoken.Encoding:
    """tiktoken's `gpt2` Encoding, from `tokenizer_dir/{encoder.json,vocab.bpe}`."""
    d = Path(tokenizer_dir)
    for name in ("encoder.json", "vocab.bpe"):
        if not (d / name).is_file():
            raise FileNotFoundError(f"{d / name}: GPT-2 tokenizer file missing")
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(d / "vocab.bpe"),
        encoder_json_file=str(d / "encoder.json"),
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT: EOT_ID},
        explicit_n_vocab=50257,
    )


# ----------------------------------------------------------------------------------------------
# the tokenizer of a model: GPT-2's BPE above, or a Hugging Face folder's own


class Tokenizer(Protocol):
    """What the data, chat and eval code asks of a tokenizer: tiktoken's Encoding's own names,
    so GPT-2's tiktoken encoding is one as it is (byte-identical to before) and a base model's
    AutoTokenizer (HFTokenizer) is the other."""

    name: str  # "gpt2", or "hf <sha256 of the folder's tokenizer files>"
    eot_token: int  # ends a document, and a chat reply (the template's </s>)
    n_vocab: int  # ids are below it (special tokens included)

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of plain text: special tokens' text is never read as them."""
        ...

    def decode(self, tokens: list[int]) -> str: ...


def bos_id(tokenizer: Tokenizer) -> int | None:
    """The id that starts a sequence where the tokenizer has one of its own (Llama's <s>); None
    where it has none or it is the end of text (GPT-2's <|endoftext|> is both)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return None if bos == tokenizer.eot_token else bos


class HFTokenizer:
    """A Hugging Face folder's tokenizer (AutoTokenizer, local files only) as a Tokenizer: the end
    of text is its eos token, the start its bos token where it has one."""

    def __init__(self, tok: Any, name: str) -> None:
        if tok.eos_token_id is None:
            raise ValueError(f"{name}: the tokenizer has no eos token (a document and a reply end)")
        self.tok, self.name = tok, name
        self.eot_token, self.bos_token_id = int(tok.eos_token_id), tok.bos_token_id
        self.n_vocab = len(tok)
        self._lock = threading.Lock()

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path) -> HFTokenizer:
        """AutoTokenizer of a folder, from its local files only."""
        from transformers import AutoTokenizer

        d = Path(tokenizer_dir)
        return cls(AutoTokenizer.from_pretrained(str(d), local_files_only=True),
                   f"hf {tokenizer_identity(d)}")  # fmt: skip

    def encode_ordinary(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False, split_special_tokens=True)

    def encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        """encode_ordinary of each text (tiktoken's name), one call: the tokenizer's Rust core
        encodes the batch in parallel; a lock keeps two threads from sharing its state."""
        with self._lock:
            out = self.tok(texts, add_special_tokens=False, split_special_tokens=True)
        return out["input_ids"]

    def decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)


def model_tokenizer(model_dir: str | Path, gpt2_dir: str | Path) -> Tokenizer:
    """The tokenizer a model folder is scored in: GPT-2's tiktoken encoding (from `gpt2_dir`)
    for our own GPT-2-tokenized architectures (config.json's `lmpipe_arch` names one), the
    folder's own where config.json's `lmpipe_tokenizer` names the trained tokenizer the export
    carries (lmpipe.data.train_tokenizer; a marker, not the files' presence: every export of
    ours carries tokenizer files, GPT-2's read by tiktoken as before); for any
    other folder (a `model.arch: hf` export, a reference run's Hugging Face folder) the folder's
    own tokenizer, and GPT-2's only where it has none and its vocabulary is GPT-2's."""
    import json

    from lmpipe.config import GPT2_VOCAB  # (tokens_of: such a model reads GPT-2's tokens)

    config = Path(model_dir) / "config.json"
    data = json.loads(config.read_text()) if config.is_file() else {}
    if data.get("lmpipe_arch") not in (None, "hf"):  # our own: a trained tokenizer's, marked
        return load_tokenizer(model_dir if data.get("lmpipe_tokenizer") else gpt2_dir)
    if any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        return load_tokenizer(model_dir)
    if data.get("vocab_size") == GPT2_VOCAB:
        return load_tokenizer(gpt2_dir)
    raise FileNotFoundError(
        f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)}), and its vocabulary"
        f" ({data.get('vocab_size')}) is not GPT-2's: its text cannot be tokenized"
    )


@cache
def load_tokenizer(tokenizer_dir: str | Path) -> Tokenizer:
    """GPT-2's tiktoken encoding for a folder of OpenAI's files (encoder.json, vocab.bpe), else
    the folder's own Hugging Face tokenizer."""
    d = Path(tokenizer_dir)
    if (d / "encoder.json").is_file() and (d / "vocab.bpe").is_file():
        return gpt2_encoding(str(d))
    if not any((d / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{d}: no tokenizer (neither GPT-2's files nor tokenizer.json)")
    return HFTokenizer.from_dir(d)

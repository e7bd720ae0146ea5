"""Each token id's length in UTF-8 bytes: what turns a loss in nats per token into bits per byte.

A val loss in nats per token depends on the tokenizer (a larger vocabulary packs more text in a
token), so runs of different tokenizers compare by bits per byte instead: the loss summed over
the scored targets, divided by the bytes of text those targets spell and by ln 2. nanochat
measures it so (karpathy/nanochat, `nanochat/loss_eval.py` `evaluate_bpb`), from a table of each
id's bytes built once with the tokenizer (`scripts/tok_train.py`: `len(decode_single_token_bytes
(id))`, 0 for special tokens). The table here is that one, for either kind of Tokenizer
(lmpipe.data.tokenizer), and is saved beside the shards (lmpipe.data.tokenize) so that scoring
needs no tokenizer.

Exact where the tokenizer says what bytes an id stands for:
- tiktoken (GPT-2): `decode_single_token_bytes`;
- a Hugging Face byte-level BPE (GPT-2, Llama 3, Qwen): the token's string mapped back to bytes
  through GPT-2's `bytes_to_unicode` table;
- SentencePiece pieces (Llama 2, Mistral: a Metaspace or `▁`-replacing decoder): `▁` one space
  byte, `<0xNN>` one byte, the rest its UTF-8. The space such a tokenizer prepends to a
  document's first word is counted too (one byte a document more than the text holds);
- special and control tokens (eos, bos, pad, chat markers): 0, as nanochat counts them.
Anything else falls back to the UTF-8 of `decode([id])` (`how` says so).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from lmpipe.data.tokenizer import HFTokenizer, Tokenizer

FILE = "token_bytes.npy"
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def unicode_to_byte() -> dict[str, int]:
    """GPT-2's `bytes_to_unicode` inverted (openai/gpt-2 `src/encoder.py`): the printable
    character a byte-level BPE writes for each byte, back to the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def tiktoken_bytes(enc: Any) -> np.ndarray:
    """A tiktoken Encoding's table: each ordinary id's own bytes, special tokens 0."""
    special = {enc.encode_single_token(s) for s in enc.special_tokens_set}
    table = np.zeros(enc.n_vocab, dtype=np.int32)
    for i in range(enc.n_vocab):
        if i not in special:
            table[i] = len(enc.decode_single_token_bytes(i))
    return table


def decoder_kind(tok: Any) -> str:
    """How a Hugging Face tokenizer's pieces map to text: "byte-level", "metaspace" or
    "decode" (neither: the fallback), from its fast backend's decoder (a slow one: by its
    pieces)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and backend.decoder is not None:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
        if "ByteLevel" in decoder:
            return "byte-level"
        if "Metaspace" in decoder or "\\u2581" in decoder or "▁" in decoder:
            return "metaspace"
        return "decode"
    pieces = tok.convert_ids_to_tokens(list(range(min(len(tok), 1000))))
    return "metaspace" if any(p and p.startswith("▁") for p in pieces) else "decode"


def piece_bytes(piece: str, kind: str) -> int | None:
    """A piece's bytes by `kind`'s rule, or None where the rule does not apply to it."""
    if kind == "byte-level":
        table = unicode_to_byte()
        return len(piece) if all(c in table for c in piece) else None
    if kind == "metaspace":
        if BYTE_PIECE.fullmatch(piece):
            return 1
        return len(piece.replace("▁", " ").encode("utf-8"))
    return None


def hf_bytes(tokenizer: HFTokenizer) -> tuple[np.ndarray, str]:
    """A Hugging Face tokenizer's table and how it was made ("byte-level", "metaspace", with
    "+ decode" where some ids fell back to decoding)."""
    tok = tokenizer.tok
    kind = decoder_kind(tok)
    special = set(tok.all_special_ids)
    added = getattr(tok, "added_tokens_decoder", {})
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    table = np.zeros(tokenizer.n_vocab, dtype=np.int32)
    fell_back = False
    pieces = tok.convert_ids_to_tokens(list(range(tokenizer.n_vocab)))
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            continue
        # a plain added token matches its text as written, before any byte mapping
        n = len(piece.encode("utf-8")) if i in added else piece_bytes(piece, kind)
        if n is None:
            fell_back = True
            n = len(tok.decode([i], clean_up_tokenization_spaces=False).encode("utf-8"))
        table[i] = n
    return table, kind + (" + decode" if fell_back and kind != "decode" else "")


def token_bytes(tokenizer: Tokenizer) -> tuple[np.ndarray, str]:
    """Each id's bytes (int32, `n_vocab` long; special tokens 0), and how they were found."""
    if isinstance(tokenizer, HFTokenizer):
        return hf_bytes(tokenizer)
    return tiktoken_bytes(tokenizer), "tiktoken"


def save(table: np.ndarray, folder: Path) -> str:
    """The table as `folder/token_bytes.npy`; returns the file's name (the manifest's entry)."""
    np.save(folder / FILE, table.astype(np.int32), allow_pickle=False)
    return FILE

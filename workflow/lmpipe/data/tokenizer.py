"""GPT-2 BPE from the files in the repo (resources/gpt2), so tokenizing never downloads.

The result is tiktoken's `gpt2` encoding, built from OpenAI's `encoder.json` and `vocab.bpe`
(tests/test_data.py checks it equals `tiktoken.get_encoding("gpt2")` on real text).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

EOT = "<|endoftext|>"
EOT_ID = 50256
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

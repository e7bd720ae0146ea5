"""`python -m lmpipe.data download|tokenize|train_tokenizer|mixture ...` (the data rules)."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "download": "lmpipe.data.download",
    "tokenize": "lmpipe.data.tokenize",
    "train_tokenizer": "lmpipe.data.train_tokenizer",
    "mixture": "lmpipe.data.mixture",
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m lmpipe.data {{{','.join(COMMANDS)}}} [--help | options]")
    importlib.import_module(COMMANDS[sys.argv[1]]).main(sys.argv[2:])

"""`python -m lmpipe.chat prepare ...` (the prepare_conversations rule), `python -m lmpipe.chat
talk MODEL_DIR` (the same as `lmpipe-chat MODEL_DIR`) or `python -m lmpipe.chat serve MODEL_DIR`
(the same as `lmpipe serve MODEL_DIR`: lmpipe.chat.serve)."""

from __future__ import annotations

import importlib
import sys

# each command imports only its own module: `prepare` runs in the data env, without torch
COMMANDS = {
    "prepare": "lmpipe.chat.data",
    "talk": "lmpipe.chat.cli",
    "serve": "lmpipe.chat.serve.cli",
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m lmpipe.chat {{{','.join(COMMANDS)}}} [--help | options]")
    sys.exit(importlib.import_module(COMMANDS[sys.argv[1]]).main(sys.argv[2:]))

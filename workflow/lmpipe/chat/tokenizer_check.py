"""A Hugging Face folder's tokenizer, checked as the jobs will load it, before any job starts.

The ids the tokenizer files list are checked in the plan's own process (lmpipe.hf_folder); what
only loading the tokenizer tells is checked here, by AutoTokenizer from the folder's local files
(any layout it reads): an end-of-text (eos) token, which closes every document and every reply;
the largest id it produces (`len(tokenizer)`, added tokens included) within the model's
embedding; and, where the model meets conversations, the Vicuna template written and read back
unchanged (lmpipe.chat.template.check_template).

Loading takes transformers (seconds), so the config check runs `python -m
lmpipe.chat.tokenizer_check FOLDER` in a subprocess and keeps the answer
(lmpipe.schema.check_tokenizers), keyed by the tokenizer files' sha256.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lmpipe.chat.template import check_template
from lmpipe.data.tokenizer import HFTokenizer


def check(folder: Path, template: bool) -> None:
    """ValueError naming the folder and the problem, if the tokenizer cannot serve the model."""
    try:
        tok = HFTokenizer.from_dir(folder)
    except ValueError as e:  # no eos
        raise ValueError(f"{folder}: {str(e).split(': ', 1)[-1]}") from None
    except Exception as e:  # whatever AutoTokenizer raises: one line
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{folder}: AutoTokenizer cannot load its tokenizer ({why})") from None
    vocab = json.loads((folder / "config.json").read_text()).get("vocab_size")
    top = largest_id(tok.tok)
    if vocab is not None and top >= vocab:
        raise ValueError(
            f"{folder}: the tokenizer produces ids up to {top} (its vocabulary, added tokens,"
            f" eos, bos and pad), beyond the model's vocab_size {vocab} (config.json)"
        )
    if template:
        check_template(tok, f"{folder}")


def largest_id(tok: Any) -> int:
    """The largest id the pipeline can write with an AutoTokenizer: its vocabulary's, an added
    token that text can produce (not a special one), or the eos, bos and pad it writes itself.
    A special token it never writes (Qwen2's tokenizer adds `<|endoftext|>` as its unk, past a
    small vocabulary) does not count."""
    added = [i for i, t in tok.added_tokens_decoder.items() if not t.special]
    used = [tok.eos_token_id, tok.bos_token_id, tok.pad_token_id]
    return max([tok.vocab_size - 1, *added, *(i for i in used if i is not None)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check a Hugging Face folder's tokenizer")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--template", action="store_true", help="the Vicuna template too")
    args = parser.parse_args(argv)
    try:
        check(args.folder, args.template)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much of each evaluation task's text a token holds, in one tokenizer: the report's bytes per
token beside the val text's (lmpipe.report.compression).

A task's text is what its scorer encodes: each item's distinct contexts and continuations (the
suite's `Item`s as lmpipe.eval.suite.tasks builds them from the whole split; HellaSwag's context
and its four " " + ending, as llm.c's rows), each string encoded alone, as the scorers encode
them. Its bytes are the strings' UTF-8 bytes; no end of text is counted. A tokenizer with more
bytes a token gives each choice fewer positions to be scored at, which is one reason a smaller
vocabulary's model reads a task differently.

    python -m lmpipe.eval.task_bytes --tokenizer DIR (--suite M | --hellaswag FILE) --out J

The result: {"tokenizer": DIR, "vocab_size": N, "source": M or FILE, "tasks": {task: {"items",
"strings", "tokens", "bytes"}}}: every task of the suite manifest, or "hellaswag". Torch-free:
tokenizing only (the whole suite in GPT-2's tokens: ~8 s on one core).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from lmpipe.data.tokenizer import Tokenizer, load_tokenizer
from lmpipe.eval import hellaswag
from lmpipe.eval.suite.data import load_task, read_manifest
from lmpipe.eval.suite.tasks import Item
from lmpipe.files import write_text_atomic

log = logging.getLogger("lmpipe.task_bytes")


def item_strings(item: Item) -> list[str]:
    """An item's distinct strings, contexts first (winogrande's differ a choice; most tasks' are
    one context repeated)."""
    return list(dict.fromkeys(item.contexts + item.continuations))


def count(items: Iterable[Item], enc: Tokenizer) -> dict[str, int]:
    """The items, their strings, and the tokens and UTF-8 bytes of those strings."""
    c = dict.fromkeys(("items", "strings", "tokens", "bytes"), 0)
    for item in items:
        strings = item_strings(item)
        c["items"] += 1
        c["strings"] += len(strings)
        c["tokens"] += sum(len(enc.encode_ordinary(s)) for s in strings)
        c["bytes"] += sum(len(s.encode("utf-8")) for s in strings)
    return c


def suite_bytes(enc: Tokenizer, suite: Path) -> dict[str, dict[str, int]]:
    """Every task's count of a suite manifest, each task's whole split."""
    return {name: count(load_task(suite, name).items, enc) for name in read_manifest(suite).tasks}


def hellaswag_bytes(enc: Tokenizer, path: Path) -> dict[str, dict[str, int]]:
    """HellaSwag's count: every item of the file, as llm.c's rows take its text."""
    items = hellaswag.task_data(hellaswag.load_items(path), enc).items
    return {hellaswag.NAME: count(items, enc)}


def task_bytes(tokenizer_dir: Path, suite: Path | None, hellaswag_file: Path | None) -> dict:
    """The counts of the suite's tasks or of HellaSwag, in the tokenizer of `tokenizer_dir`."""
    enc = load_tokenizer(tokenizer_dir)
    if suite is not None:
        tasks, source = suite_bytes(enc, suite), suite
    elif hellaswag_file is not None:
        tasks, source = hellaswag_bytes(enc, hellaswag_file), hellaswag_file
    else:
        raise ValueError("task_bytes: give the suite's manifest or a HellaSwag file")
    return {
        "tokenizer": str(tokenizer_dir),
        "vocab_size": enc.n_vocab,
        "source": str(source),
        "tasks": tasks,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, type=Path, help="GPT-2's files or a folder")
    text = parser.add_mutually_exclusive_group(required=True)
    text.add_argument("--suite", type=Path, help="the suite's manifest.json: its every task")
    text.add_argument("--hellaswag", type=Path, help="a HellaSwag jsonl")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = task_bytes(args.tokenizer, args.suite, args.hellaswag)
    for name, c in result["tasks"].items():
        log.info("%s: %d tokens, %d bytes", name, c["tokens"], c["bytes"])
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

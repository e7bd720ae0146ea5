"""Greedy generation on a modern export: `generate` with the KV cache vs without (each new token
runs the full forward over all the tokens so far).

A tiny random modern model (4 blocks of 128, 4 heads, the modern defaults plus a 128-token
sliding window and the document mask, block size 1024) is exported as `convert` does and loaded
with transformers alone (trust_remote_code); each setting greedily writes `--new` tokens after a
`--prompt`-token prompt, on the CPU, `--threads` threads.

    python benchmarks/kv_cache.py [--prompt 100] [--new 40] [--repeats 3] [--threads 2]

The settings alternate, `--repeats` times each; the figure printed is the median tokens/s (new
tokens over generate's wall time), and their ratio. Both must write the same tokens (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from lmpipe.models import build_model  # noqa: E402
from lmpipe.models.modern import write_hf  # noqa: E402
from lmpipe.models.modern.model import modern_config  # noqa: E402

SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=1024)
SETTINGS = dict(attention_window=128, document_mask=True)


def export(folder: Path) -> None:
    """A random modern model, far from init (its zero projections would make it a unigram)."""
    torch.manual_seed(0)
    model = build_model(modern_config(**SHAPE, **SETTINGS))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    write_hf(model.eval(), REPO / "resources" / "gpt2", folder, {"run": "kv-cache-bench"})


def generate(model, prompt: torch.Tensor, new: int, use_cache: bool) -> tuple[float, list[int]]:
    """(tokens/s, the new tokens) of one greedy generation of exactly `new` tokens."""
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
            min_new_tokens=new, do_sample=False, use_cache=use_cache,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    return new / seconds, out[0, prompt.size(1) :].tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens")
    p.add_argument("--new", type=int, default=40, help="tokens generated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        export(Path(tmp) / "hf")
        model = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", trust_remote_code=True)
    model.eval()
    prompt = torch.randint(0, 50000, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    generate(model, prompt, 8, True)  # warm-up
    rates: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list[int]] = {}
    for _ in range(args.repeats):
        for use_cache in (True, False):
            rate, tokens[use_cache] = generate(model, prompt, args.new, use_cache)
            rates[use_cache].append(rate)
    assert tokens[True] == tokens[False], "the cached and uncached generations differ"
    cached, uncached = (statistics.median(rates[k]) for k in (True, False))
    print(f"{args.prompt}-token prompt, {args.new} new tokens, {args.threads} threads, "
          f"median of {args.repeats}; the same tokens both ways")  # fmt: skip
    print(f"with the KV cache:    {cached:8.1f} tokens/s")
    print(f"without (full forward): {uncached:6.1f} tokens/s")
    print(f"ratio:                {cached / uncached:8.2f}x")


if __name__ == "__main__":
    main()

"""Top-k samples from fixed prompts (nanoGPT's `generate`), deterministic under a seed.

A sample ends at the model's first end-of-text token (not shown) or after `tokens` new tokens:
past the end of a document, a model only starts another, unrelated one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lmpipe.data.tokenizer import Tokenizer, model_tokenizer
from lmpipe.eval.results import produced_by
from lmpipe.models import load_hf
from lmpipe.paths import TOKENIZER_DIR
from lmpipe.registry import SampleSettings

# Fixed prompts, so that samples of different runs compare (the first is llm.c's and nanoGPT's).
PROMPTS = (
    "Hello, I'm a language model,",
    "The meaning of life is",
    "In this article, we will explain",
    "The court ruled that",
)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    top_k: int,
    generator: torch.Generator,
    stop_token: int | None = None,
) -> torch.Tensor:
    """Extend `idx` (B, T) by up to `max_new_tokens` tokens, each drawn from the top-k of its
    logits; stop early once every row has drawn `stop_token` (which stays in the result)."""
    done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -model.config.block_size :]  # crop to the context the model has
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :]  # (B, V): the padding is never predicted
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = float("-inf")
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
        idx = torch.cat((idx, idx_next), dim=1)
        if stop_token is not None:
            done |= idx_next[:, 0] == stop_token
            if done.all():  # a host sync a token: fine for a few samples
                break
    return idx


def sample_completions(
    model: torch.nn.Module,
    enc: Tokenizer,
    max_new_tokens: int,
    top_k: int,
    seed: int,
    prompts: tuple[str, ...] = PROMPTS,
    device: str | torch.device = "cpu",
) -> list[dict[str, str]]:
    """One completion per prompt, cut at its first end of text; each prompt gets its own
    generator seeded from `seed`."""
    out = []
    for i, prompt in enumerate(prompts):
        generator = torch.Generator(device=device).manual_seed(seed + i)
        idx = torch.tensor([enc.encode_ordinary(prompt)], dtype=torch.long, device=device)
        eot = enc.eot_token
        new = generate(model, idx, max_new_tokens, top_k, generator, eot)[0, idx.size(1) :]
        new = new.tolist()
        ended = eot in new
        new = new[: new.index(eot)] if ended else new
        out.append({"prompt": prompt, "completion": enc.decode(new), "ended": ended})
    return out


def evaluate(
    settings: SampleSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    model = load_hf(model_dir).to(device)
    enc = model_tokenizer(model_dir, TOKENIZER_DIR)  # GPT-2's, or an hf model's own
    samples = sample_completions(
        model, enc, settings.tokens, settings.top_k, settings.seed, device=device
    )
    for s in samples:
        print(f"{s['prompt']!r} -> {s['completion']!r}")
    return {
        "metric": "samples",
        "samples": samples,
        "tokens": settings.tokens,
        "produced_by": produced_by(
            __name__,
            model_dir,
            f"top-k sampling, k={settings.top_k}, seed={settings.seed}, until end of text",
            device=device,
        ),
    }

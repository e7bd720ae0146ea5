"""Top-k sampling from a native GPT (nanoGPT's `generate`), deterministic under a seed."""

from __future__ import annotations

import tiktoken
import torch
import torch.nn.functional as F

from lmpipe.model import GPT

# Fixed prompts, so that samples of different runs compare (the first is llm.c's and nanoGPT's).
PROMPTS = (
    "Hello, I'm a language model,",
    "The meaning of life is",
    "In this article, we will explain",
    "The court ruled that",
)


@torch.no_grad()
def generate(
    model: GPT, idx: torch.Tensor, max_new_tokens: int, top_k: int, generator: torch.Generator
) -> torch.Tensor:
    """Extend `idx` (B, T) by `max_new_tokens` tokens, each drawn from the top-k of its logits."""
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -model.config.block_size :]  # crop to the context the model has
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :]  # (B, V): the padding is never predicted
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = float("-inf")
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def sample_completions(
    model: GPT,
    enc: tiktoken.Encoding,
    max_new_tokens: int,
    top_k: int,
    seed: int,
    prompts: tuple[str, ...] = PROMPTS,
    device: str | torch.device = "cpu",
) -> list[dict[str, str]]:
    """One completion per prompt; each prompt gets its own generator seeded from `seed`."""
    out = []
    for i, prompt in enumerate(prompts):
        generator = torch.Generator(device=device).manual_seed(seed + i)
        idx = torch.tensor([enc.encode_ordinary(prompt)], dtype=torch.long, device=device)
        new = generate(model, idx, max_new_tokens, top_k, generator)[0, idx.size(1) :]
        out.append({"prompt": prompt, "completion": enc.decode(new.tolist())})
    return out

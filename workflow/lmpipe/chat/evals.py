"""Chat evaluations of a converted model: held-out conversation loss and answers to fixed prompts.

Two entries of lmpipe.registry.EVALUATIONS (`python -m lmpipe.eval sft_loss|chat_samples`), run
for a fine-tuned run and for its base, so the report shows both side by side.

- sft_loss: mean cross-entropy over the tokens the SFT loss counts (assistant replies and the
  end-of-text closing each) of every held-out conversation, weighted by token, not by row.
- chat_samples: each of CHAT_PROMPTS as a one-turn conversation in the template, answered
  greedily (so the answers are reproducible) until end-of-text or `eval.chat.reply_tokens`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lmpipe.chat.cli import load, reply
from lmpipe.chat.data import IGNORE
from lmpipe.chat.loader import load_split
from lmpipe.eval.results import produced_by
from lmpipe.models import load_hf
from lmpipe.registry import ChatSettings

# The first two are the identity questions of FastChat's dummy data; the others are not in it.
CHAT_PROMPTS = (
    "Who are you?",
    "What is your name?",
    "What is the capital of France?",
    "Write a short poem about the sea.",
)


@torch.no_grad()
def conversation_loss(
    model, manifest: str | Path, batch: int, device: str
) -> tuple[list[float], list[int]]:
    """Each held-out conversation's (a val row's) summed loss in nats over its counted tokens,
    and those tokens' count: the mean is their ratio, its interval cluster-robust over them."""
    inputs, targets = load_split(manifest, "val")
    losses: list[float] = []
    counts: list[int] = []
    for start in range(0, len(inputs), batch):
        x = torch.from_numpy(inputs[start : start + batch]).long().to(device)
        y = torch.from_numpy(targets[start : start + batch]).long().to(device)
        logits, _ = model(x)
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=IGNORE, reduction="none"
        )
        losses += loss.view(y.shape).sum(1).tolist()  # a host sync a batch: fine for an eval
        counts += (y != IGNORE).sum(1).tolist()
    return losses, counts


def held_out_loss(
    settings: ChatSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    model = load_hf(model_dir).to(device)
    manifest = inputs["conversations"]
    losses, counts = conversation_loss(model, manifest, settings.batch, device)
    return {
        "metric": "sft_loss",
        "value": sum(losses) / sum(counts),
        "tokens": sum(counts),
        "conversations": len(counts),
        # each conversation's summed loss and counted tokens: the report's interval over them
        "doc_losses": losses,
        "doc_tokens": counts,
        "produced_by": produced_by(
            __name__,
            model_dir,
            "mean cross-entropy of the assistant tokens of the held-out conversations",
            data=str(manifest),
            device=device,
        ),
    }


def chat_samples(
    settings: ChatSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    model, tokenizer = load(model_dir, device)
    samples = []
    for prompt in CHAT_PROMPTS:
        answer = reply(model, tokenizer, [], prompt, settings.reply_tokens)
        print(f"USER: {prompt}\nASSISTANT: {answer}\n")
        samples.append({"prompt": prompt, "reply": answer})
    return {
        "metric": "chat_samples",
        "samples": samples,
        "tokens": settings.reply_tokens,
        "produced_by": produced_by(
            __name__, model_dir, "greedy, vicuna_v1.1 template, until end-of-text", device=device
        ),
    }

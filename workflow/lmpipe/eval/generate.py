"""Greedy generation for the generative evaluations (HumanEval, GSM8K): one loop, so that both
read a too-long prompt, stop and cut their completions the same way.

Greedy, so a result is reproducible; no KV cache: the model reads its last block_size tokens at
each step (a prompt longer than the block keeps its tail, as the evaluations' prompts end with
what the model must answer), its LM head at the last position only (lmpipe.models'
`hidden_states` and `head`: on a small model the head over every position is most of a step).
The completion ends at the end of text, at `max_new_tokens`, or at the first of the stop
sequences, and is cut before it (lm-eval's `until`, the Codex paper's stop sequences).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load(model_dir: Path, device: str) -> tuple[Any, Any]:
    """The folder's model in eval mode on `device`, and the tokenizer it is scored in (GPT-2's,
    or the folder's own: lmpipe.data.tokenizer.model_tokenizer)."""
    from lmpipe.data.tokenizer import model_tokenizer
    from lmpipe.models import load_hf
    from lmpipe.paths import TOKENIZER_DIR

    return load_hf(model_dir).to(device).eval(), model_tokenizer(model_dir, TOKENIZER_DIR)


def cut(text: str, stop: tuple[str, ...]) -> str:
    """`text` before the first of the stop sequences."""
    ends = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(ends)] if ends else text


@torch.no_grad()
def greedy(
    model: Any,
    enc: Any,
    ids: list[int],
    max_new_tokens: int,
    device: str,
    stop: tuple[str, ...] = (),
) -> str:
    """The greedy completion of the prompt `ids` in `enc`'s tokens, cut before a stop sequence."""
    new: list[int] = []
    for _ in range(max_new_tokens):
        idx = torch.tensor([(ids + new)[-model.config.block_size :]], device=device)
        logits = model.head(model.hidden_states(idx)[:, -1])  # the head at the last token only
        token = int(logits[0, : enc.n_vocab].argmax())  # the padding never predicted
        if token == enc.eot_token:
            break
        new.append(token)
        if stop and cut(enc.decode(new), stop) != enc.decode(new):
            break
    return cut(enc.decode(new), stop)

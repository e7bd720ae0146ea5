"""The lm-eval harness's model `lmpipe`: any converted folder through its native model.

`lm_eval.simple_evaluate(model="lmpipe", model_args={"pretrained": DIR})` scores a folder that
`convert` wrote, of any architecture, with the model `lmpipe.models.load_hf` builds from it (for
an architecture no transformers class reproduces, such as `modern`). It follows lm-eval's `hf`
model where the numbers depend on it: the folder's own tokenizer (transformers, no special
tokens), context and continuation split by TemplateLM (trailing spaces moved to the
continuation; an empty context gets end-of-text), inputs cut from the left to the model's
context plus one token, the continuation's log-probabilities summed and `is_greedy` when each is
the argmax. tests/test_evaluate.py holds it equal to `hf` item by item on a GPT-2 folder.

Importing this module registers the model (lmpipe.eval.harness does, when a folder is not GPT-2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  the built-in models first: lm-eval fills its registry lazily
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from lmpipe.models import load_hf

MODEL_NAME = "lmpipe"


@register_model(MODEL_NAME)
class LmpipeLM(TemplateLM):
    """A converted folder's native model, in fp32, scoring log-likelihoods."""

    def __init__(
        self,
        pretrained: str,
        batch_size: int | str = 1,
        device: str = "cpu",
        dtype: str = "float32",
        **kwargs: Any,
    ):
        super().__init__()
        from transformers import AutoTokenizer

        if dtype != "float32":
            raise ValueError(f"model {MODEL_NAME!r}: dtype {dtype!r}; only float32 is supported")
        self._device = torch.device(device)
        self.model = load_hf(pretrained).to(self._device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(Path(pretrained)))
        self.batch_size = int(batch_size)
        self.max_length = self.model.config.block_size

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=False)

    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **kwargs: Any
    ) -> list[tuple[float, bool]]:
        rows = []
        for _, context_enc, continuation_enc in requests:
            assert 0 < len(continuation_enc) <= self.max_length, "continuation longer than context"
            # as `hf`: the last max_length + 1 tokens, less the last (it is only a target)
            tokens = (context_enc + continuation_enc)[-(self.max_length + 1) :]
            rows.append((tokens[:-1], tokens[1:], len(continuation_enc)))
        # longest first (as lm-eval's `hf` sorts), then back in the requests' order
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        results: list[tuple[float, bool] | None] = [None] * len(rows)
        for start in tqdm(
            range(0, len(order), self.batch_size), disable=kwargs.get("disable_tqdm", False)
        ):
            batch = [order[i] for i in range(start, min(start + self.batch_size, len(order)))]
            T = max(len(rows[i][0]) for i in batch)
            idx = torch.zeros(len(batch), T, dtype=torch.long)  # right padding: causal, unread
            for b, i in enumerate(batch):
                idx[b, : len(rows[i][0])] = torch.tensor(rows[i][0])
            logits, _ = self.model(idx.to(self._device))  # (B, T, V) fp32
            logprobs = F.log_softmax(logits, dim=-1)
            for b, i in enumerate(batch):
                inputs, targets, n = rows[i]
                end = len(inputs)
                lp = logprobs[b, end - n : end]  # (n, V): the continuation's positions
                want = torch.tensor(targets[-n:], device=lp.device)
                greedy = bool((lp.argmax(dim=-1) == want).all())
                results[i] = (float(lp.gather(-1, want[:, None]).sum()), greedy)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(
            f"model {MODEL_NAME!r} scores multiple-choice tasks (loglikelihood) only"
        )

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError(
            f"model {MODEL_NAME!r} scores multiple-choice tasks (loglikelihood) only"
        )

"""A Hugging Face model's shape from its config.json, without torch or the hub.

`model.arch: hf` names a model by `path`: a local folder (its config.json is read) or a hub id,
whose config.json is read from the download stage's folder once it is there, else from a small
copy kept in the repo (`resources/hf_configs/<org>/<name>/config.json`), so the config check,
the plan and the report know the model's shape before anything downloads.

Two families are understood: GPT-2 (`n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner`;
learned positions, tied head) and the Llama family (Llama, Mistral, Qwen2: `hidden_size`,
`num_hidden_layers`, `num_attention_heads`, `num_key_value_heads` (GQA), `head_dim`,
`intermediate_size` (a gated MLP of three matrices), `tie_word_embeddings`, `attention_bias`,
RMSNorm weights). Defaults where a key is absent are transformers' own (`GPT2Config`,
`LlamaConfig`: src/transformers/models/{gpt2,llama}/configuration_*.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lmpipe.paths import REPO_ROOT

HF_CONFIGS = REPO_ROOT / "resources" / "hf_configs"  # config.json copies of hub models
GPT2_TYPES = ("gpt2",)
LLAMA_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class HFShape:
    """What the parameter count, the FLOPs and the memory plan need of a decoder-only model."""

    model_type: str
    n_layer: int
    n_embd: int  # the residual stream's width (hidden_size)
    n_head: int
    n_kv_head: int  # key/value heads (GQA); n_head without GQA
    head_dim: int
    intermediate: int  # the MLP's inner width
    vocab_size: int
    max_positions: int
    tied: bool  # the LM head is the token embedding
    gated_mlp: bool  # SwiGLU's three matrices (Llama) or GPT-2's two
    qkv_bias: bool
    learned_positions: bool  # GPT-2's position embedding (Llama: rotary, no weights)

    @property
    def num_params(self) -> int:
        """Parameters of the model as transformers builds it (a tied head counted once)."""
        C, L, V = self.n_embd, self.n_layer, self.vocab_size
        q, kv = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        if self.model_type in GPT2_TYPES:  # Conv1D weights with biases, LayerNorms (2C each)
            attention = C * (q + 2 * kv) + (q + 2 * kv) + q * C + C
            mlp = 2 * C * self.intermediate + self.intermediate + C
            norms = 2 * 2 * C
            final_norm = 2 * C
        else:  # bias-free projections (but Qwen2's q/k/v), RMSNorm weights (C each)
            attention = C * (q + 2 * kv) + q * C + ((q + 2 * kv) if self.qkv_bias else 0)
            mlp = (3 if self.gated_mlp else 2) * C * self.intermediate
            norms = 2 * C
            final_norm = C
        positions = self.max_positions * C if self.learned_positions else 0
        head = 0 if self.tied else V * C
        return V * C + positions + L * (attention + mlp + norms) + final_norm + head

    @property
    def flops_params(self) -> int:
        """The N of 6N + 6LCT: the parameters in a matmul. An untied token embedding is a lookup
        (left out); tied, it is the head, and counts, as llm.c counts GPT-2's."""
        return self.num_params - (0 if self.tied else self.vocab_size * self.n_embd)


def config_file(path: str) -> Path:
    """The config.json of model `path`: a local folder's, else the repo's copy of a hub id's."""
    local = Path(path) / "config.json"
    if local.is_file():
        return local
    copy = HF_CONFIGS / path / "config.json"
    if copy.is_file():
        return copy
    raise FileNotFoundError(
        f"{path}: no config.json (not a local model folder, and no copy of a hub model's at"
        f" {copy.relative_to(REPO_ROOT)})"
    )


@cache
def read_shape(path: str) -> HFShape:
    """The shape of model `path` (a local folder or a hub id); an unknown family or a missing
    key is a ValueError naming the file."""
    file = config_file(path)
    c = json.loads(file.read_text())
    kind = c.get("model_type")
    try:
        if kind in GPT2_TYPES:  # transformers' GPT2Config defaults
            C = c.get("n_embd", 768)
            return HFShape(
                kind, c.get("n_layer", 12), C, c.get("n_head", 12), c.get("n_head", 12),
                C // c.get("n_head", 12), c.get("n_inner") or 4 * C, c.get("vocab_size", 50257),
                c.get("n_positions", 1024), c.get("tie_word_embeddings", True), False, True, True,
            )  # fmt: skip
        if kind in LLAMA_TYPES:  # LlamaConfig's defaults are Llama-2-7B's shape
            C, H = c["hidden_size"], c["num_attention_heads"]
            return HFShape(
                kind, c["num_hidden_layers"], C, H, c.get("num_key_value_heads") or H,
                c.get("head_dim") or C // H, c["intermediate_size"], c["vocab_size"],
                c.get("max_position_embeddings", 2048), c.get("tie_word_embeddings", False),
                True, kind == "qwen2" or bool(c.get("attention_bias")), False,
            )  # fmt: skip
    except KeyError as e:
        raise ValueError(f"{file}: no {e.args[0]!r} (a {kind} config.json has one)") from None
    raise ValueError(
        f"{file}: model_type {kind!r} is not one the plan can count (known:"
        f" {', '.join(GPT2_TYPES + LLAMA_TYPES)})"
    )

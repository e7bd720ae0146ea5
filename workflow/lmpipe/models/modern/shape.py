"""The modern GPT's shape without torch: its settings (ModernSettings, the switches a `models:`
entry of `arch: modern` sets) and its parameters and FLOPs from a config's numbers alone.

The registry's modern entry points here (lmpipe.registry.ARCHITECTURES), so the plan, the config
check and the Snakefile read these counts without building a model; model.py's ModernGPT
computes them (tests/test_modern.py and tests/test_flops.py hold the counts to the built
module's). Torch-free, importing only lmpipe's ground: the plan's process imports it
(tests/test_layout.py holds both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmpipe.settings import optional, setting


@dataclass(frozen=True)
class ModernSettings:
    """model.arch modern: modded-nanogpt's speedrun choices, each a switch (an ablation is a
    config change); the defaults are the modern model."""

    rope: bool = setting(True, "rotary position embeddings (false: learned positions, as GPT-2)")
    rope_base: float = setting(10000.0, "rotary base (theta)", exclusiveMinimum=0)
    rope_frequencies: str = setting(
        "all",
        "all: head_dim / 2 frequencies base^(-2i / head_dim); half_truncated: modded-nanogpt's"
        " (head_dim / 4 from 1 to 1/1024, the other half 0: those dimensions unrotated)",
        enum=["all", "half_truncated"],
    )
    norm: str = setting(
        "rmsnorm",
        "rmsnorm (no weights, as modded-nanogpt) or layernorm (learned weight)",
        enum=["rmsnorm", "layernorm"],
    )
    qk_norm: bool = setting(True, "RMS-normalise queries and keys per head before attention")
    mlp: str = setting("relu2", "relu2 (ReLU squared) or gelu (tanh GELU)", enum=["relu2", "gelu"])
    tie_embeddings: bool = setting(False, "the LM head is the token embedding (GPT-2: tied)")
    zero_init: bool = setting(True, "zero-initialised attn/MLP output projections and LM head")
    logit_softcap: float | None = setting(
        15.0, "logits = cap * tanh(logits / cap) (null: off)", exclusiveMinimum=0
    )
    bias: bool = setting(False, "biases in the Linear layers (and LayerNorms)")
    no_attention: tuple[int, ...] = setting(
        (), "blocks without attention, by index (modded-nanogpt's 2025-01 records: [7])"
    )
    qkv: str = setting(
        "fused",
        "fused: one 3C x C c_attn, orthogonalised by Muon as one matrix; separate: c_q, c_k, c_v,"
        " C x C each, each orthogonalised alone (modded-nanogpt's 2025-01 records)",
        enum=["fused", "separate"],
    )
    unet_skips: bool = setting(
        False,
        "U-net skips: block n_layer/2 + i adds skip_weights[i] (learned, init 1) times the output"
        " of block n_layer/2 - 1 - i (modded-nanogpt's 2025-01 records); needs an even n_layer",
    )
    value_embeddings: int = setting(
        0,
        "k token embeddings of values: blocks 0..k-1 and the last k mix table i into their"
        " values, v = lambdas[0] v + lambdas[1] ve (learned, init 0.5, 0.5; the other blocks"
        " lambdas[0] v), as modded-nanogpt's 2025-01 records (3); needs 2k <= n_layer",
        minimum=0,
    )
    embedding_mix: bool = setting(
        False,
        "each block's input mixed with the normed embedding x0: lambdas[0] x + lambdas[1] x0"
        " (learned, init 1, 0), as modded-nanogpt's 2025-01 records",
    )
    document_mask: bool = setting(
        False,
        "attention within documents only: a document starts at each end-of-text token, as"
        " modded-nanogpt's 2025-01 records (its document_causal)",
    )
    attention_window: int | None = optional(
        "a sliding window of whole 128-token blocks: a query sees keys of the blocks less than"
        " attention_window / 128 behind its own (the records' block-wise window; a multiple of"
        " 128); null: none",
        minimum=128, multipleOf=128,
    )  # fmt: skip
    attention_window_final: int | None = optional(
        "the window at the end of training: it grows from attention_window by whole blocks, the"
        " records' int(((1 - x) 128 + x 1856) // 128) blocks at progress x for 128 -> 1792;"
        " null: fixed",
        minimum=128, multipleOf=128,
    )  # fmt: skip
    embed_init_std: float = setting(
        0.02, "the token embedding's init, N(0, std) (modded-nanogpt: nn.Embedding's, 1.0)",
        exclusiveMinimum=0,
    )  # fmt: skip
    linear_init: str = setting(
        "normal",
        "the init of the blocks' input matrices (queries, keys, values, the MLP's first):"
        " normal, N(0, 0.02) (llm.c's); uniform, nn.Linear's own"
        " U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (modded-nanogpt's 2025-01 records, CastedLinear)",
        enum=["normal", "uniform"],
    )
    loss_over_padding: bool = setting(
        False,
        "the model's loss a softmax over all padded_vocab_size columns, the LM head's padding"
        " rows trained (modded-nanogpt's records: 50,304); false: over vocab_size, the padding"
        " never scored. The evaluations' logits are over vocab_size either way",
    )


def num_params(m: Any) -> int:
    """Token embedding (padded vocab), learned positions without rope, L blocks of an MLP
    (8C^2, with `bias` 5C) and, but in `no_attention`, attention (4C^2, with `bias` 4C), each
    with its norm (layernorm: C, 2C with `bias`), the embedding's and the final norm, the LM
    head unless tied, the learned scalars and the value embeddings. RMSNorm and QK-norm have no
    weights."""
    C, V = m.n_embd, m.padded_vocab_size
    norm = 0 if m.norm == "rmsnorm" else C * (2 if m.bias else 1)  # a norm's parameters
    mlp = 8 * C * C + (5 * C if m.bias else 0) + norm  # c_fc, c_proj, their norm
    attention = 4 * C * C + (4 * C if m.bias else 0) + norm  # c_attn (or c_q, c_k, c_v), c_proj
    head = 0 if m.tie_embeddings else V * C
    positions = 0 if m.rope else m.block_size * C
    blocks = m.n_layer * mlp + attention_layers(m) * attention
    return V * C + positions + blocks + 2 * norm + head + scalars(m) + value_embedding_params(m)


def flops_params(m: Any) -> int:
    """The N of llm.c's 6N + 6LCT: the parameters less an untied token embedding and the value
    embeddings (lookups, no matmul; tied, the token embedding is the head, and counts). Learned
    positions count, as llm.c counts GPT-2's."""
    embedding = 0 if m.tie_embeddings else m.padded_vocab_size * m.n_embd
    return num_params(m) - embedding - value_embedding_params(m)


def attention_flops(m: Any, seq_len: int) -> int:
    """The 6LCT of llm.c's 6N + 6LCT: L the blocks with attention, T the keys a query sees."""
    return 6 * attention_layers(m) * m.n_embd * attention_context(m, seq_len)


def hidden_matrices(m: Any) -> int:
    """The 2-D weights of the blocks (what Muon orthogonalises): as GPT-2's (the norms have no
    weights), but blocks without attention have 2 and separate queries, keys and values 2
    more."""
    return 2 * m.n_layer + attention_matrices(m) * attention_layers(m)


def attention_layers(m: Any) -> int:
    """The blocks with attention: all but those of `no_attention`."""
    return m.n_layer - len(set(m.no_attention))


def attention_matrices(m: Any) -> int:
    """A block's attention matrices: c_attn (or c_q, c_k, c_v with `qkv: separate`) and c_proj.
    The parameters are the same either way (3C^2)."""
    return 4 if m.qkv == "separate" else 2


def scalars(m: Any) -> int:
    """The learned scalars: the U-net's skip weights, one a decoder block; the value mix, 2 an
    attention block with value embeddings; the embedding mix, 2 a block."""
    skips = m.n_layer - m.n_layer // 2 if m.unet_skips else 0
    values = 2 * attention_layers(m) if m.value_embeddings else 0
    return skips + values + (2 * m.n_layer if m.embedding_mix else 0)


def value_embedding_params(m: Any) -> int:
    """The value embeddings' parameters: k tables of the padded vocabulary (lookups)."""
    return m.value_embeddings * m.padded_vocab_size * m.n_embd


def attention_context(m: Any, seq_len: int) -> int:
    """The T of 6LCT: the row's seq_len, or the largest sliding window where smaller (the
    window's 128-token blocks, whole, are what FlexAttention computes; a document mask's
    savings depend on the data and are not counted)."""
    window = m.attention_window_final or m.attention_window
    return seq_len if window is None else min(seq_len, window)

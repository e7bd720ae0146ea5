"""GPT-2's shape without torch: its parameters and FLOPs from a config's numbers alone.

The registry's gpt2 entry points here (lmpipe.registry.ARCHITECTURES), so the plan, the config
check and the Snakefile read these counts without building a model; model.py's GPT computes them
(`GPT.num_params`, and `flops_per_token` through the registry). Torch-free and importing nothing
of lmpipe: the plan's process imports it (tests/test_layout.py holds both).
"""

from __future__ import annotations

from typing import Any


def num_params(m: Any) -> int:
    """Token (padded vocab) and position embeddings, L blocks of 12C^2 + 13C (attention and MLP
    weights, biases, two LayerNorms), the final LayerNorm; the head is tied to the token
    embedding. All of them take part in a matmul: they are also the N of the FLOPs' 6N."""
    C = m.n_embd
    return m.padded_vocab_size * C + m.block_size * C + m.n_layer * (12 * C * C + 13 * C) + 2 * C


def attention_flops(m: Any, seq_len: int) -> int:
    """The 6LCT of llm.c's 6N + 6LCT: every block attends over the whole row."""
    return 6 * m.n_layer * m.n_embd * seq_len


def hidden_matrices(m: Any) -> int:
    """The 2-D weights of the blocks (what Muon orthogonalises): c_attn, attn.c_proj, c_fc and
    mlp.c_proj a block."""
    return 4 * m.n_layer

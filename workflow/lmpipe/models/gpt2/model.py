"""GPT-2 as OpenAI and llm.c define it, in nanoGPT's shape. Knows nothing of parallelism.

Learned positions, pre-LayerNorm blocks, GELU (tanh), tied token embedding and LM head, attention
through `F.scaled_dot_product_attention` (flash attention on GPUs). The vocabulary is padded to
50304 (a multiple of 128) for speed as llm.c does; the padding is never predicted (the head
projects onto the first vocab_size rows only). Initialisation is llm.c's: N(0, 0.02), residual
projections scaled by 1/sqrt(2 * n_layer).

Parameter names equal nanoGPT's and Hugging Face GPT2LMHeadModel's (less `lm_head.weight`, tied).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmpipe.config import ModelConfig
from lmpipe.models.attention import attend
from lmpipe.models.head_loss import linear_cross_entropy
from lmpipe.registry import ARCHITECTURES

# The model's shape is the config's `models:` entry (one definition, torch-free, in lmpipe.config);
# the sizes (d12 = 124M, d24 = 350M, ...) are named in config/config.yaml.
GPTConfig = ModelConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.c_proj.RESIDUAL_SCALE = True  # llm.c: scaled init for residual projections

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = attend(q, k, v, mask)  # causal, or under a packed rows' mask
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.c_proj.RESIDUAL_SCALE = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied (weight tying)
        # the head + loss in training; the trainer may set a compiled or chunked one
        # (lmpipe.models.head_loss.loss_function)
        self.loss_fn = linear_cross_entropy
        # Fine-tuning sets this: when most targets are -1 (prompts, padding), run the head on the
        # counted positions only. Same mean loss; off for pretraining, where every token counts
        # and a data-dependent shape would only cost a host sync on a GPU.
        self.head_on_counted_only = False
        # The trainer sets this on a GPU: the training loss multiplies by the whole padded weight
        # (50304 rows, a multiple of 128: aligned GEMM tiles, as llm.c pads for) and drops the
        # padded logits inside the loss. On the CPU the real 50257 rows are cheaper.
        self.padded_head_matmul = False
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """llm.c's init; callable again after `to_empty()` when built on the meta device."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = residual_std if getattr(module, "RESIDUAL_SCALE", False) else 0.02
                if module is not self.lm_head:  # tied: initialised as wte
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied weights counted once
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs a token, llm.c's 6N + 6*L*C*T: the registry's one count."""
        return ARCHITECTURES["gpt2"].flops_per_token(self.config, seq_len)

    def blocks(self) -> list[nn.Module]:
        """The repeated blocks, in order: what parallelize shards (and compiles) one by one."""
        return list(self.transformer.h)

    def head_flops_per_token(self) -> int:
        """The LM head's share of flops_per_token (the registry's 6 * V * C): what a position
        saves when `head_on_counted_only` skips it."""
        return ARCHITECTURES["gpt2"].head_flops_per_token(self.config)

    def embed(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The stem: token + position embeddings, (B, T) -> (B, T, C); positions 0..T-1 unless
        given (B, T). Under train.compile a compiled region of its own (lmpipe.train.parallel)."""
        if positions is None:
            T = idx.size(1)
            assert T <= self.config.block_size, f"sequence of {T} exceeds block_size"
            positions = torch.arange(T, dtype=torch.long, device=idx.device)
        return self.transformer.wte(idx) + self.transformer.wpe(positions)  # (B, T, C)

    def trunk(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The stem and the blocks, before the final LayerNorm: (B, T) -> (B, T, C)."""
        x = self.embed(idx, positions)
        for block in self.transformer.h:
            x = block(x, mask)
        return x

    def hidden_states(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The trunk, up to the final LayerNorm: (B, T) -> (B, T, C). Scorers that need the
        head at a few positions only (HellaSwag) apply it themselves.

        Default: causal attention, positions 0..T-1. A packed sequence of scoring rows
        (lmpipe.eval.packing) gives each token its own position (B, T) and the tokens it may
        attend to (B, 1, T, T), and may then be longer than block_size."""
        return self.transformer.ln_f(self.trunk(idx, positions, mask))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (B, T, vocab_size) in fp32, None) without targets; (None, mean loss) with them.

        With targets the (B*T, V) logits stay inside `head_loss`, where compile can fuse them away.
        """
        if targets is None:
            return self.head(self.hidden_states(idx)), None  # (B, T, V)
        return None, self.head_loss(self.trunk(idx), targets)  # training: logits never leave

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The tail: final LayerNorm -> LM head -> loss, the trunk's (B, T, C) to the mean loss
        over the counted targets. Under train.compile a compiled region of its own, so the norm,
        the head's GEMM and the softmax fuse (llm.c's fused classifier does the same by hand)."""
        x = self.transformer.ln_f(x)
        weight = self.lm_head.weight
        if not self.padded_head_matmul:
            weight = weight[: self.config.vocab_size]
        if self.head_on_counted_only:
            counted = targets != -1
            x, targets = x[counted], targets[counted]  # (N, C), (N,): a host sync (the shape)
        return self.loss_fn(x, weight, targets, self.config.vocab_size)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits over the real vocabulary for hidden states h (..., C) -> (..., V).

        The padding rows of the tied weight are never predicted: projecting onto the real vocab
        only is cheaper than masking padded logits to -inf (one pass less over the logits)."""
        return F.linear(h, self.lm_head.weight[: self.config.vocab_size]).float()

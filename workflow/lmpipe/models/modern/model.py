"""A modern GPT: modded-nanogpt's speedrun choices in nanoGPT's shape. Knows nothing of parallelism.

Against GPT-2 (lmpipe/models/gpt2/model.py), each a switch of `ModernSettings`
(shape.py, beside its counts; the defaults are the modern model, so an ablation is a config change):

- rotary position embeddings on queries and keys (`rope`), no learned positions; all the
  frequencies, or modded-nanogpt's half-truncated ones (`rope_frequencies`);
- RMSNorm without weights (`norm`), as modded-nanogpt's `norm(x) = F.rms_norm(x, (x.size(-1),))`,
  before each block's attention and MLP, after the embedding and at the end;
- QK-norm (`qk_norm`): queries and keys RMS-normalised per head before the rotary;
- ReLU² MLP (`mlp`): relu(x).square(), 4C wide, un-gated;
- untied token embedding and LM head (`tie_embeddings`);
- zero-initialised output projections of attention and MLP, and of the LM head (`zero_init`),
  as modded-nanogpt does ("zero init suggested by @Grad62304977");
- tanh soft-capping of the logits (`logit_softcap`): cap * tanh(logits / cap), from Gemma 2;
  modded-nanogpt's records used 30 * tanh(logits / 30) first, 15 * tanh(logits / 15) later;
- no biases (`bias`);
- optionally blocks without attention (`no_attention`: the record's layer 7);
- queries, keys and values from one fused `c_attn` or from three matrices `c_q`, `c_k`, `c_v`
  (`qkv: separate`: the `CausalSelfAttention` of modded-nanogpt's 2025-01-04 record,
  KellerJordan/modded-nanogpt records/010425_SoftCap/31d6c427-f1f7-4d8a-91be-a67b5dcd13fd.txt):
  the same function of the same numbers, but Muon
  orthogonalises each of the three alone, which moves the training;
- optionally U-net skips (`unet_skips`, the same record's `GPT.forward`): the first n_layer / 2
  blocks' outputs are kept, and before each later block the last kept one is added back, times
  a learned scalar `skip_weights[i]` (init 1);
- optionally value embeddings (`value_embeddings: k`, the record's `ValueEmbedding`, k = 3): k
  more token embeddings, table i mixed into the values of blocks i and n_layer - k + i as
  v = lambdas[0] v + lambdas[1] ve (learned scalars, init 0.5 each; the other blocks
  lambdas[0] v), and the embedding mix (`embedding_mix`, the record's `Block.lambdas`): each
  block's input lambdas[0] x + lambdas[1] x0, x0 the normed embedding (init 1, 0);
- optionally attention within documents (`document_mask`) and over a sliding window of
  128-token blocks (`attention_window`), the records' FlexAttention block mask: on CUDA as
  FlexAttention (`document_window_block_mask`), elsewhere, and for rows not in whole blocks, as
  SDPA's boolean mask (`document_window_mask`, the definition).

Inference may decode with a KV cache (`decode`, transformers' DynamicCache or any cache with its
`update`): the new tokens' logits are the full forward's, under the same masks over every cached
key. Training never takes that branch.

The vocabulary is padded to `padded_vocab_size` as GPT-2's (llm.c's speed padding); the padding
is never predicted, but with `loss_over_padding` the loss is a softmax over it too, as the
record's (its padding rows of the head train toward -cap). Optionally nn.Linear's own uniform
init for the blocks' input matrices (`linear_init`, the record's CastedLinear). Parameter
names follow nanoGPT's (`transformer.h.0.attn.c_attn.weight`, ...).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask

from lmpipe.config import ModelConfig, model_config
from lmpipe.models.attention import attend, flex_on
from lmpipe.models.head_loss import linear_cross_entropy, soft_cap
from lmpipe.registry import ARCHITECTURES


def modern_config(**fields) -> ModelConfig:
    """The config of a modern model (`arch: modern`): the shape and any settings by keyword."""
    return model_config({"arch": "modern", **fields}, "modern model")


# a KV cache's update for one layer: the new keys and values in, all the cached ones out
KVUpdate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class KVCache(Protocol):
    """What `ModernGPT.decode` needs of a KV cache: transformers' DynamicCache has it."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def get_seq_length(self, layer_idx: int = 0) -> int: ...


EOT = 50256  # GPT-2's end-of-text token: the shards put one before each document
WINDOW_BLOCK = 128  # the records' FlexAttention block: the window counts whole blocks


def document_window_mask(
    idx: torch.Tensor,
    document: bool,
    window_blocks: int | torch.Tensor | None,
    queries: int | None = None,
) -> torch.Tensor:
    """(B, 1, Q, T) bool, True where query t may attend key s: s <= t; with `document`, s in the
    same document (a document starts at each EOT: the records' `docs = (inputs ==
    50256).cumsum(0)`); with `window_blocks`, s's 128-token block less than that many blocks
    behind t's (the records' block-wise `q_idx - kv_idx < sliding_window_num_blocks`; an int or
    the model's 0-d tensor). The queries are the last Q of idx's T tokens (default all: Q = T;
    fewer when decoding with a KV cache, whose keys are all T). SDPA's boolean mask, on every
    device."""
    T = idx.size(1)
    t = torch.arange(T, device=idx.device)
    q = t[T - (T if queries is None else queries) :]  # the queries' positions
    allowed = (q[:, None] >= t[None, :])[None]  # (1, Q, T)
    if document:
        docs = (idx == EOT).cumsum(1)  # (B, T)
        allowed = allowed & (docs[:, q, None] == docs[:, None, :])
    if window_blocks is not None:
        blocks = t // WINDOW_BLOCK
        allowed = allowed & (blocks[q, None] - blocks[None, :] < window_blocks)[None]
    return allowed[:, None]


def dense_to_ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, n, n) bool block mask as FlexAttention's (B, 1, n) counts and (B, 1, n, n) indices
    of the kept kv blocks, kept first (the record's dense_to_ordered, with a batch)."""
    num_blocks = dense.sum(dim=-1, dtype=torch.int32)
    indices = dense.argsort(dim=-1, descending=True, stable=True).to(torch.int32)
    return num_blocks[:, None].contiguous(), indices[:, None].contiguous()


def document_window_block_mask(
    idx: torch.Tensor, document: bool, window_blocks: int | torch.Tensor | None
) -> BlockMask:
    """document_window_mask as FlexAttention's BlockMask, built as the record builds it
    (KellerJordan/modded-nanogpt records/010425_SoftCap/31d6c427-...txt,
    create_doc_swc_block_mask), a row of the batch at a time: from (T/128)^2 comparisons of
    whole 128-token blocks, never the T x T mask. A block pair is kept where causal, in the
    window and possibly of one document (the first document of one block at or before the
    last of the other, both ways); full (no mask_mod run) where strictly causal, in the window
    and of one document only; the partial ones run the record's `document_causal` mask_mod
    (with the window too: eager flex_attention reads the mask_mod alone). The window is a
    block count the graphs read (the model's tensor): a new one compiles nothing."""
    B, T = idx.shape
    n = T // WINDOW_BLOCK
    docs = (idx == EOT).cumsum(1)  # (B, T)
    block = torch.arange(n, dtype=torch.int32, device=idx.device)
    q, kv = block[:, None], block[None, :]
    some, full = (q >= kv)[None], (q > kv)[None]  # (1, n, n)
    if window_blocks is not None:  # block-wise: a block is in the window whole or not at all
        window = (q - kv < window_blocks)[None]
        some, full = some & window, full & window
    if document:
        low = docs.view(B, n, WINDOW_BLOCK)[:, :, 0]  # (B, n): each block's first document
        high = docs.view(B, n, WINDOW_BLOCK)[:, :, -1]  # and its last
        some = some & (low[:, :, None] <= high[:, None]) & (low[:, None] <= high[:, :, None])
        full = full & (low[:, :, None] == high[:, None]) & (low[:, None] == high[:, :, None])
    some, full = some.expand(B, n, n), full.expand(B, n, n)
    kv_num_blocks, kv_indices = dense_to_ordered(some & ~full)
    full_kv_num_blocks, full_kv_indices = dense_to_ordered(full)

    def document_causal(b, h, q_idx, kv_idx):
        allowed = q_idx >= kv_idx
        if document:
            allowed = allowed & (docs[b, q_idx] == docs[b, kv_idx])
        if window_blocks is not None:  # what the blocks say already, for eager flex_attention
            allowed = allowed & (q_idx // WINDOW_BLOCK - kv_idx // WINDOW_BLOCK < window_blocks)
        return allowed

    return BlockMask.from_kv_blocks(
        kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
        BLOCK_SIZE=WINDOW_BLOCK, mask_mod=document_causal,
    )  # fmt: skip


def window_at(config: ModelConfig, progress: float) -> int | None:
    """The attention window (tokens) at training progress x in [0, 1]: attention_window, growing
    to attention_window_final in whole blocks as the records' get_sliding_window_blocks,
    int(((1 - x) 128 + x 1856) // 128) for 128 -> 1792 (its end + half a block: the last block
    reached at x = 1)."""
    start, end = config.attention_window, config.attention_window_final
    if start is None or end is None:
        return start
    x = min(max(progress, 0.0), 1.0)
    return int(((1 - x) * start + x * (end + WINDOW_BLOCK // 2)) // WINDOW_BLOCK) * WINDOW_BLOCK


class RMSNorm(nn.Module):
    """RMS normalisation over the last dimension, without weights (modded-nanogpt's `norm`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(-1),))


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm()
    return nn.LayerNorm(config.n_embd, bias=config.bias)


def rotary(
    T: int, head_dim: int, base: float, device: torch.device, frequencies: str = "all"
) -> tuple[torch.Tensor, ...]:
    """cos and sin of the angles t * f_i of positions t < T, each (T, head_dim / 2), in fp32
    (recomputed each forward: no buffers to shard, checkpoint or re-initialise). The
    frequencies f_i: base^(-2i/d) ("all"), or modded-nanogpt's half-truncated ones (its
    2025-01 records' `Rotary`): head_dim / 4 of them from 1 down to 1/1024, geometrically, then
    head_dim / 4 zeros (those pairs are not rotated)."""
    if frequencies == "half_truncated":
        quarter = head_dim // 4
        inv_freq = (1 / 1024) ** torch.linspace(0, 1, quarter, dtype=torch.float32, device=device)
        inv_freq = torch.cat([inv_freq, inv_freq.new_zeros(head_dim // 2 - quarter)])
    else:
        inv_freq = base ** (
            -torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        )
    angles = torch.outer(torch.arange(T, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x1[i], x2[i]) of the two halves of x (B, T, nh, hs) by its position's
    angle i (modded-nanogpt's `apply_rotary_emb`): dot products of rotated queries and keys
    depend on their positions' difference only."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (T, 1, hs/2), or (B, T, 1, hs/2)
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.qk_norm = config.qk_norm
        C = config.n_embd
        if config.qkv == "separate":  # three matrices, so that Muon orthogonalises each alone
            self.c_q = nn.Linear(C, C, bias=config.bias)
            self.c_k = nn.Linear(C, C, bias=config.bias)
            self.c_v = nn.Linear(C, C, bias=config.bias)
        else:
            self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.OUTPUT_PROJECTION = True  # zero-initialised (zero_init)
        if config.value_embeddings:  # the value mix, init (0.5, 0.5) in init_weights
            self.lambdas = nn.Parameter(torch.full((2,), 0.5))

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, ...] | None,
        mask: torch.Tensor | BlockMask | None = None,
        ve: torch.Tensor | None = None,
        kv: KVUpdate | None = None,
    ) -> torch.Tensor:
        """`kv` (inference only): the cache's update, which appends this call's keys and values
        to the cached ones and returns all of them; `mask` then covers all the keys."""
        B, T, C = x.size()
        if hasattr(self, "c_attn"):
            q, k, v = self.c_attn(x).split(C, dim=2)
        else:
            q, k, v = self.c_q(x), self.c_k(x), self.c_v(x)
        q = q.view(B, T, self.n_head, C // self.n_head)  # (B, T, nh, hs)
        k = k.view(B, T, self.n_head, C // self.n_head)
        v = v.view(B, T, self.n_head, C // self.n_head)
        if hasattr(self, "lambdas"):
            v = self.lambdas[0] * v
            if ve is not None:
                v = v + self.lambdas[1] * ve.view_as(v)
        if self.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if kv is not None:
            k, v = kv(k, v)  # (B, nh, past + T, hs)
        y = attend(q, k, v, mask)  # causal, or under a packed rows' mask
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.relu2 = config.mlp == "relu2"
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.OUTPUT_PROJECTION = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c_fc(x)
        x = F.relu(x).square() if self.relu2 else F.gelu(x, approximate="tanh")
        return self.c_proj(x)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, attention: bool = True):
        super().__init__()
        # a block without attention (no_attention) is its MLP alone, as the record's layer 7
        self.ln_1 = make_norm(config) if attention else None
        self.attn = CausalSelfAttention(config) if attention else None
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        if config.embedding_mix:  # the embedding mix, init (1, 0) in init_weights
            self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, ...] | None,
        mask: torch.Tensor | BlockMask | None = None,
        x0: torch.Tensor | None = None,
        ve: torch.Tensor | None = None,
        kv: KVUpdate | None = None,
    ) -> torch.Tensor:
        if hasattr(self, "lambdas"):
            x = self.lambdas[0] * x + self.lambdas[1] * x0
        if self.attn is not None:
            x = x + self.attn(self.ln_1(x), rope, mask, ve, kv)
        x = x + self.mlp(self.ln_2(x))
        return x


class ModernGPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch != "modern":
            raise ValueError(f"the modern model needs model.arch modern, not {config.arch!r}")
        if any(not 0 <= i < config.n_layer for i in config.no_attention):
            raise ValueError(
                f"no_attention {list(config.no_attention)}: a block index is not one of"
                f" 0..{config.n_layer - 1}"
            )
        if config.unet_skips and config.n_layer % 2:
            raise ValueError(f"unet_skips needs an even n_layer, not {config.n_layer}")
        if 2 * config.value_embeddings > config.n_layer:
            raise ValueError(
                f"value_embeddings {config.value_embeddings}: needs 2 x that many blocks, not"
                f" {config.n_layer}"
            )
        if config.rope and (config.n_embd // config.n_head) % 2:
            raise ValueError(
                f"rotary needs an even head size, not {config.n_embd // config.n_head}"
            )
        self.config = config
        modules = dict(wte=nn.Embedding(config.padded_vocab_size, config.n_embd))
        if not config.rope:
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        modules |= dict(
            ln_e=make_norm(config),  # modded-nanogpt normalises the embedding too
            h=nn.ModuleList(
                [Block(config, i not in config.no_attention) for i in range(config.n_layer)]
            ),
            ln_f=make_norm(config),
        )
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.value_embeds = nn.ModuleList(
            nn.Embedding(config.padded_vocab_size, config.n_embd)
            for _ in range(config.value_embeddings)
        )
        if config.unet_skips:  # one learned weight a decoder block
            self.skip_weights = nn.Parameter(torch.ones(config.n_layer - config.n_layer // 2))
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        # the head + loss in training; the trainer may set a compiled or chunked one
        # (lmpipe.models.head_loss.loss_function)
        self.loss_fn = linear_cross_entropy
        # as GPT-2's: fine-tuning runs the head on counted positions only; on a GPU the training
        # loss multiplies by the whole padded weight (aligned GEMM tiles)
        self.head_on_counted_only = False
        # the attention window in 128-token blocks, a tensor the graphs read (the record's
        # sliding_window_num_blocks): a new window is new data, never a recompile; set from the
        # training's progress, which the loop sets each step; the trained model's is the final
        if config.attention_window is not None:
            self.register_buffer("window_blocks", torch.zeros((), dtype=torch.int32), False)
        self._progress, self._window = 1.0, None
        self.padded_head_matmul = False
        self.init_weights()

    @property
    def progress(self) -> float:
        """The training's progress in [0, 1] (step / max_steps), which sets the window."""
        return self._progress

    @progress.setter
    def progress(self, x: float) -> None:
        self._progress = x
        self._set_window()

    def _set_window(self, force: bool = False) -> None:
        """The window tensor to window_at(progress), filled in place (no new tensor, no copy
        from the host: a fill kernel where the block count changes, 13 times a speedrun)."""
        if self.config.attention_window is None:
            return
        blocks = window_at(self.config, self._progress) // WINDOW_BLOCK
        if force or blocks != self._window:
            self.window_blocks.fill_(blocks)
            self._window = blocks

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, 0.02) (linear_init uniform: nn.Linear's U(+-1/sqrt(fan_in)) for the Linear
        weights), and zeros for the output projections and the untied head (zero_init; else
        llm.c's 0.02 / sqrt(2 n_layer) for the projections); callable again after `to_empty()`."""
        c = self.config
        self._set_window(force=True)
        if c.unet_skips:
            nn.init.ones_(self.skip_weights)
        for block in self.transformer.h:
            if hasattr(block, "lambdas"):
                block.lambdas.copy_(torch.tensor([1.0, 0.0], device=block.lambdas.device))
            if hasattr(block.attn, "lambdas"):
                nn.init.constant_(block.attn.lambdas, 0.5)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if module is self.lm_head:
                    if c.tie_embeddings:
                        continue  # it is wte, initialised as an embedding
                    if c.zero_init:
                        nn.init.zeros_(module.weight)
                    else:
                        nn.init.normal_(module.weight, mean=0.0, std=0.02)
                elif getattr(module, "OUTPUT_PROJECTION", False):
                    if c.zero_init:
                        nn.init.zeros_(module.weight)
                    else:
                        nn.init.normal_(module.weight, std=0.02 / math.sqrt(2 * c.n_layer))
                elif c.linear_init == "uniform":  # nn.Linear's own (the record's CastedLinear)
                    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
                else:
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif module is self.transformer.wte or module in self.value_embeds:
                # modded-nanogpt: nn.Embedding's N(0, 1)
                nn.init.normal_(module.weight, mean=0.0, std=c.embed_init_std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # a tied head counted once
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs a token, llm.c's 6N + 6*L*C*T, N the parameters that take part in a
        matmul (an untied token embedding is a lookup, left out): the registry's one count."""
        return ARCHITECTURES["modern"].flops_per_token(self.config, seq_len)

    def head_flops_per_token(self) -> int:
        """The LM head's share of flops_per_token (the registry's 6 * V * C, V padded)."""
        return ARCHITECTURES["modern"].head_flops_per_token(self.config)

    def blocks(self) -> list[nn.Module]:
        """The repeated blocks, in order: what parallelize shards (and compiles) one by one."""
        return list(self.transformer.h)

    def embed(
        self, idx: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], tuple[torch.Tensor, ...] | None]:
        """The stem: the normed token (+ position) embedding (B, T) -> (B, T, C), the value
        embeddings' tables (B, T, C) each, and the rotary's cos and sin (None without rope).
        Under train.compile a compiled region of its own (lmpipe.train.parallel)."""
        c = self.config
        T = idx.size(1)
        if positions is None:
            assert T <= c.block_size, f"sequence of {T} exceeds block_size"
        x = self.transformer.wte(idx)  # (B, T, C)
        if not c.rope:
            pos = torch.arange(T, device=idx.device) if positions is None else positions
            x = x + self.transformer.wpe(pos)
        x = self.transformer.ln_e(x)
        tables = [table(idx) for table in self.value_embeds]
        rope = None
        if c.rope:
            n = T if positions is None else int(positions.max()) + 1
            rope = rotary(n, c.n_embd // c.n_head, c.rope_base, idx.device, c.rope_frequencies)
            if positions is not None:
                rope = tuple(t[positions] for t in rope)  # (B, T, hs/2) each
        return x, tables, rope

    def trunk(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """The stem and the blocks, before the final norm: (B, T) -> (B, T, C). With a `cache`
        (inference, `decode`), block i's keys and values go to and come from its layer i."""
        c = self.config
        x, tables, rope = self.embed(idx, positions)
        x0 = x
        if mask is None and positions is None and (c.document_mask or c.attention_window):
            window = self.window_blocks if c.attention_window is not None else None
            if flex_on(idx.device) and idx.size(1) % WINDOW_BLOCK == 0:  # flex: whole blocks
                mask = document_window_block_mask(idx, c.document_mask, window)
            else:
                mask = document_window_mask(idx, c.document_mask, window)
        k = c.value_embeddings  # tables 0..k-1 to blocks 0..k-1 and n_layer-k..n_layer-1
        ve = tables + [None] * (c.n_layer - 2 * k) + tables
        skips = []  # U-net: the encoder's outputs, added back to the decoder's inputs last first
        encoder = c.n_layer // 2
        for i, block in enumerate(self.transformer.h):
            if c.unet_skips and i >= encoder:
                x = x + self.skip_weights[i - encoder] * skips.pop()
            kv = None if cache is None else functools.partial(cache.update, layer_idx=i)
            x = block(x, rope, mask, x0, ve[i], kv)
            if c.unet_skips and i < encoder:
                skips.append(x)
        return x

    def hidden_states(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The trunk, up to the final norm: (B, T) -> (B, T, C). Default: causal attention,
        positions 0..T-1; a packed sequence (lmpipe.eval.packing) gives its tokens' positions
        (B, T) and the tokens each may attend to (B, 1, T, T), as GPT.hidden_states."""
        return self.transformer.ln_f(self.trunk(idx, positions, mask))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(fp32 logits (B, T, vocab_size), None) without targets; (None, mean loss) with them."""
        if targets is None:
            return self.head(self.hidden_states(idx)), None  # (B, T, V)
        return None, self.head_loss(self.trunk(idx), targets)

    def decode(
        self, idx: torch.Tensor, cache: KVCache, context: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Inference with a KV cache: the fp32 logits (B, T, vocab_size) of tokens idx (B, T)
        that follow the `past` tokens the cache holds (none: a prompt), the cache extended by
        them; the full forward's logits at those positions. Its masks over all past + T keys:
        causal, the window (blocks counted from position 0, as in the full forward), and with
        document_mask the documents of `context` (B, past + T), all the tokens so far, which it
        then needs once past > 0. SDPA under a boolean mask: no FlexAttention, no compile."""
        c = self.config
        first = next((i for i, b in enumerate(self.transformer.h) if b.attn is not None), 0)
        past, T = cache.get_seq_length(first), idx.size(1)
        if past + T > c.block_size:
            raise ValueError(f"sequence of {past + T} exceeds block_size {c.block_size}")
        if context is None:
            if c.document_mask and past:
                raise ValueError("a document-masked model's cached decoding needs the context")
            context = torch.cat([idx.new_zeros(idx.size(0), past), idx], dim=1)
        if context.shape != (idx.size(0), past + T) or not torch.equal(context[:, past:], idx):
            raise ValueError(
                f"context {tuple(context.shape)}: not the {past} cached tokens and then idx"
            )
        blocks = window_at(c, self.progress) // WINDOW_BLOCK if c.attention_window else None
        mask = document_window_mask(context, c.document_mask, blocks, queries=T)
        positions = torch.arange(past, past + T, device=idx.device)
        return self.head(self.transformer.ln_f(self.trunk(idx, positions, mask, cache)))

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The tail: final norm -> LM head -> soft-capped loss, the trunk's (B, T, C) to the mean
        loss over the counted targets (a compiled region of its own under train.compile)."""
        c = self.config
        x = self.transformer.ln_f(x)
        weight = self.lm_head.weight
        # loss_over_padding: the record's softmax over every padded column
        vocab = c.padded_vocab_size if c.loss_over_padding else c.vocab_size
        if not self.padded_head_matmul:
            weight = weight[:vocab]
        if self.head_on_counted_only:
            counted = targets != -1
            x, targets = x[counted], targets[counted]  # (N, C), (N,): a host sync (the shape)
        return self.loss_fn(x, weight, targets, vocab, c.logit_softcap)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Soft-capped fp32 logits over the real vocabulary for hidden states h (..., C)."""
        logits = F.linear(h, self.lm_head.weight[: self.config.vocab_size]).float()
        return soft_cap(logits, self.config.logit_softcap)

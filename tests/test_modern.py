"""The modern architecture (`model.arch: modern`): its logits against a reference written here from
the definitions, each of its switches, its parameter count and FLOPs, its native folder, FSDP over
2 ranks against 1 process through the real trainer, the native scorers on its folder, and the
lm-eval `lmpipe` model against `hf` item by item. Models are tiny (2 layers, 32 or 64 wide)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import yaml

from conftest import CONFIG_FILE, make_workdir, snakemake
from lmpipe import config as lmconfig
from lmpipe import schema
from lmpipe.config import named_models
from lmpipe.data.shards import write_shard
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import hellaswag
from lmpipe.eval.suite import native
from lmpipe.models import build_model, load_hf
from lmpipe.models.modern import model as model_module
from lmpipe.models.modern import write_hf
from lmpipe.models.modern.model import (
    ModernGPT,
    apply_rotary,
    document_window_mask,
    modern_config,
    rotary,
    window_at,
)
from lmpipe.paths import REPO_ROOT
from lmpipe.registry import ARCHITECTURES

TOKENIZER = REPO_ROOT / "resources" / "gpt2"
ITEMS = REPO_ROOT / "resources" / "hellaswag_val_sample.jsonl"
ENC = gpt2_encoding(TOKENIZER)
SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}


def tiny(**settings) -> ModernGPT:
    torch.manual_seed(0)
    return build_model(modern_config(**SHAPE, **settings))


def randomise(model: torch.nn.Module, std: float = 0.3) -> torch.nn.Module:
    """Weights far from init (zero projections and head included), so that every part counts."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model


# ---- the logits against a reference written from the definitions --------------------------------


def reference_logits(state: dict, c, idx: torch.Tensor) -> torch.Tensor:
    """modded-nanogpt's forward in plain tensor maths, from the state dict: RMS norm (no
    weights) of the embedding and before each sublayer, QK-norm, rotary as a complex rotation,
    causal softmax attention by hand, relu(x)^2 MLP, final norm, untied head, 15 tanh(z / 15)."""

    def rms(x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)

    B, T = idx.shape
    C, H = c.n_embd, c.n_head
    hs = C // H
    x = x0 = rms(state["transformer.wte.weight"][idx])
    k = getattr(
        c, "value_embeddings", 0
    )  # the record's ValueEmbedding: [0, 1, 2, None..., 0, 1, 2]
    ve = [state[f"value_embeds.{j}.weight"][idx] for j in range(k)]
    ve = ve + [None] * (c.n_layer - 2 * k) + ve
    angles = torch.arange(T)[:, None] * c.rope_base ** (-torch.arange(0, hs, 2) / hs)  # (T, hs/2)
    turn = torch.polar(torch.ones_like(angles), -angles)  # e^{-i theta}

    def rotate(t):  # (B, T, H, hs): the halves as real and imaginary parts
        z = torch.complex(t[..., : hs // 2], t[..., hs // 2 :]) * turn[None, :, None]
        return torch.cat([z.real, z.imag], dim=-1)

    mask = torch.ones(T, T).tril().bool()
    skips = []  # the record's GPT.forward: encoder outputs kept, popped into the decoder
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        if "skip_weights" in state and i >= c.n_layer // 2:
            x = x + state["skip_weights"][i - c.n_layer // 2] * skips.pop()
        if p + "lambdas" in state:  # the record's Block.forward
            x = state[p + "lambdas"][0] * x + state[p + "lambdas"][1] * x0
        if i in c.no_attention:  # the record's Block with attn None: the MLP alone
            h = torch.relu(rms(x) @ state[p + "mlp.c_fc.weight"].T).pow(2)
            x = x + h @ state[p + "mlp.c_proj.weight"].T
            if "skip_weights" in state and i < c.n_layer // 2:
                skips.append(x)
            continue
        if p + "attn.c_q.weight" in state:  # the record's CausalSelfAttention: c_q, c_k, c_v
            q, k, v = (rms(x) @ state[p + f"attn.c_{n}.weight"].T for n in "qkv")
        else:
            q, k, v = (rms(x) @ state[p + "attn.c_attn.weight"].T).split(C, dim=-1)
        q, k, v = (t.reshape(B, T, H, hs) for t in (q, k, v))
        if p + "attn.lambdas" in state:  # the record's CausalSelfAttention.forward
            lam = state[p + "attn.lambdas"]
            v = lam[0] * v + (0 if ve[i] is None else lam[1] * ve[i].reshape(B, T, H, hs))
        q, k = rotate(rms(q)), rotate(rms(k))
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
        x = x + y @ state[p + "attn.c_proj.weight"].T
        h = torch.relu(rms(x) @ state[p + "mlp.c_fc.weight"].T).pow(2)
        x = x + h @ state[p + "mlp.c_proj.weight"].T
        if "skip_weights" in state and i < c.n_layer // 2:
            skips.append(x)
    logits = rms(x) @ state["lm_head.weight"][: c.vocab_size].T
    return 15.0 * torch.tanh(logits / 15.0)


def test_logits_equal_the_reference():
    model = randomise(tiny()).eval()
    idx = torch.randint(0, 50257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, _ = model(idx)
        expected = reference_logits(model.state_dict(), model.config, idx)
        _, loss = model(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert logits.abs().max() < 15.0 and logits.abs().max() > 5.0  # the cap is reached
    ce = F.cross_entropy(expected[:, :-1].reshape(-1, 50257), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, ce, rtol=1e-5, atol=1e-5)  # the training loss is capped too


def test_separate_qkv_logits_equal_the_reference_and_round_trip(tmp_path):
    """qkv separate: c_q, c_k, c_v (no c_attn) as the record's attention; the same parameter
    count, logits equal to the reference's, and the native folder gives them back."""
    model = randomise(tiny(qkv="separate")).eval()
    names = dict(model.named_parameters())
    assert "transformer.h.0.attn.c_q.weight" in names and not any("c_attn" in n for n in names)
    assert names["transformer.h.1.attn.c_v.weight"].shape == (32, 32)
    assert model.num_params() == ARCHITECTURES["modern"].num_params(model.config)
    idx = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, _ = model(idx)
        expected = reference_logits(model.state_dict(), model.config, idx)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    write_hf(model, TOKENIZER, tmp_path, {})
    back = load_hf(tmp_path)
    assert back.config.qkv == "separate"
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], logits, rtol=0, atol=0)


def test_unet_skips_logits_equal_the_reference_and_round_trip(tmp_path):
    """unet_skips on 4 blocks: skip_weights (2, init 1) added back as the record's GPT.forward
    does (block 2 gets block 1's output, block 3 block 0's), logits equal to the reference's,
    the parameter count, and the native folder gives them back; an odd n_layer is refused."""
    torch.manual_seed(0)
    model = build_model(modern_config(**SHAPE | {"n_layer": 4}, unet_skips=True))
    assert torch.equal(model.skip_weights.detach(), torch.ones(2))
    model = randomise(model).eval()
    assert model.num_params() == ARCHITECTURES["modern"].num_params(model.config)
    idx = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, _ = model(idx)
        expected = reference_logits(model.state_dict(), model.config, idx)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    write_hf(model, TOKENIZER, tmp_path, {})
    with torch.no_grad():
        torch.testing.assert_close(load_hf(tmp_path)(idx)[0], logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unet_skips needs an even n_layer, not 3"):
        build_model(modern_config(**SHAPE | {"n_layer": 3}, unet_skips=True))


def test_the_records_rows_together_equal_the_reference_and_round_trip(tmp_path):
    """qkv separate, unet_skips, value_embeddings 1 (block 0 and 5 its table, the others v
    scaled alone), embedding_mix, a block without attention, on 6 blocks with every scalar
    random: logits equal to the reference's (the record's GPT.forward written out), the init of
    the scalars the record's, the parameter count, and the native folder round trip."""
    config = modern_config(**SHAPE | {"n_layer": 6}, qkv="separate", unet_skips=True,
                           value_embeddings=1, embedding_mix=True, no_attention=[2],
                           embed_init_std=1.0)  # fmt: skip
    torch.manual_seed(0)
    model = build_model(config)
    assert torch.equal(model.transformer.h[0].lambdas.detach(), torch.tensor([1.0, 0.0]))
    assert torch.equal(model.transformer.h[0].attn.lambdas.detach(), torch.tensor([0.5, 0.5]))
    assert model.value_embeds[0].weight.std() > 0.9  # nn.Embedding's N(0, 1), as wte's
    assert model.num_params() == ARCHITECTURES["modern"].num_params(config)
    model = randomise(model).eval()
    idx = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits, _ = model(idx)
        expected = reference_logits(model.state_dict(), config, idx)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    write_hf(model, TOKENIZER, tmp_path, {})
    with torch.no_grad():
        torch.testing.assert_close(load_hf(tmp_path)(idx)[0], logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="value_embeddings 4: needs 2 x that many blocks, not 6"):
        build_model(dataclasses.replace(config, value_embeddings=4))


def record_block_mask(inputs: torch.Tensor, window_blocks: int) -> torch.Tensor:
    """The record's create_doc_swc_block_mask (records/010425_SoftCap/*.txt) made dense: a
    128-block pair is kept when causal, in the window and possibly of one document
    (`nonzero_bm`), and within kept blocks its mask_mod `document_causal` decides, token by
    token. (T,) tokens in, (T, T) bool out."""
    BLOCK_SIZE = 128
    T = len(inputs)
    docs = (inputs == 50256).cumsum(0)
    docs_low, docs_high = docs.view(-1, BLOCK_SIZE)[:, 0], docs.view(-1, BLOCK_SIZE)[:, -1]
    block_idx = torch.arange(T // BLOCK_SIZE)
    q_blk, kv_blk = block_idx[:, None], block_idx
    document_bm = (docs_low[:, None] <= docs_high) & (docs_low <= docs_high[:, None])
    nonzero_bm = (q_blk >= kv_blk) & (q_blk - kv_blk < window_blocks) & document_bm
    q_idx, kv_idx = torch.arange(T)[:, None], torch.arange(T)
    document_causal = (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])
    return nonzero_bm.repeat_interleave(BLOCK_SIZE, 0).repeat_interleave(BLOCK_SIZE, 1) & (
        document_causal
    )


def test_document_mask_and_window_are_the_records_block_mask():
    """document_mask with attention_window 256 (2 blocks) on 512 tokens, documents of random
    lengths: the mask equals the record's block mask made dense, row by row; the model's logits
    equal those of the same model run on each window's documents alone (attention is all that
    crosses tokens), checked on the first document; the settings off: causal."""
    gen = torch.Generator().manual_seed(6)
    idx = torch.randint(0, 50000, (2, 512), generator=gen)
    idx[0, [0, 70, 200, 201, 390]] = 50256
    idx[1, [0, 300]] = 50256
    mask = document_window_mask(idx, True, 2)
    for row in range(2):
        assert torch.equal(mask[row, 0], record_block_mask(idx[row], 2))
    causal = torch.ones(512, 512).tril().bool()
    assert torch.equal(document_window_mask(idx, False, None)[0, 0], causal)
    shape = SHAPE | {"block_size": 512}
    torch.manual_seed(0)
    model = randomise(build_model(modern_config(**shape, document_mask=True))).eval()
    with torch.no_grad():
        whole = model(idx[:1])[0]
        alone = model(idx[:1, 70:200])[0]  # the second document on its own
    torch.testing.assert_close(whole[:, 70:200], alone, rtol=1e-4, atol=1e-4)


def record_doc_swc_block_mask(inputs: torch.Tensor, sliding_window_num_blocks: int):
    """The record's create_doc_swc_block_mask (records/010425_SoftCap/*.txt, GPT.forward) as
    written there, on the CPU, for one (T,) row: its kv blocks and full kv blocks."""
    BLOCK_SIZE = 128
    total_num_blocks = len(inputs) // BLOCK_SIZE
    docs = (inputs == 50256).cumsum(0)
    docs_low = docs.view(-1, BLOCK_SIZE)[:, 0].contiguous()
    docs_high = docs.view(-1, BLOCK_SIZE)[:, -1].contiguous()

    def dense_to_ordered(dense_mask):
        num_blocks = dense_mask.sum(dim=-1, dtype=torch.int32)
        indices = dense_mask.argsort(dim=-1, descending=True, stable=True).to(torch.int32)
        return num_blocks[None, None].contiguous(), indices[None, None].contiguous()

    kv_idx = block_idx = torch.arange(total_num_blocks, dtype=torch.int32)
    q_idx = block_idx[:, None]
    causal_bm = q_idx >= kv_idx
    causal_full_bm = q_idx > kv_idx
    window_bm = q_idx - kv_idx < sliding_window_num_blocks
    window_full_bm = window_bm
    document_bm = (docs_low[:, None] <= docs_high) & (docs_low <= docs_high[:, None])
    document_full_bm = (docs_low[:, None] == docs_high) & (docs_low == docs_high[:, None])
    nonzero_bm = causal_bm & window_bm & document_bm
    full_bm = causal_full_bm & window_full_bm & document_full_bm
    return (*dense_to_ordered(nonzero_bm & ~full_bm), *dense_to_ordered(full_bm))


def block_mask_dense(mask, b: int) -> torch.Tensor:
    """Row b of a BlockMask token by token, (T, T) bool: in a kept partial block its mask_mod
    decides, a full block is all allowed, any other block nothing."""
    T, size = mask.seq_lengths[0], mask.BLOCK_SIZE[0]
    allowed = mask.mask_mod(torch.tensor(b), 0, torch.arange(T)[:, None], torch.arange(T))
    dense = torch.zeros(T, T, dtype=torch.bool)
    for full, n, kept in (
        (False, mask.kv_num_blocks, mask.kv_indices),
        (True, mask.full_kv_num_blocks, mask.full_kv_indices),
    ):
        for qb in range(T // size):
            rows = slice(qb * size, qb * size + size)
            for kb in kept[b, 0, qb, : n[b, 0, qb]].tolist():
                cols = slice(kb * size, kb * size + size)
                dense[rows, cols] = True if full else allowed[rows, cols]
    return dense


def test_the_block_mask_is_the_records():
    """The FlexAttention BlockMask (document_window_block_mask) of a batch of 2 rows of 1,024
    tokens, documents of random lengths (one over several blocks, one within a block, some
    blocks whole in one document), windows of 1, 3 and 8 blocks: each row's kv blocks, partial
    and full, are the record's create_doc_swc_block_mask's, tensor for tensor; and, token by
    token, the BlockMask allows what SDPA's mask (document_window_mask) allows."""
    gen = torch.Generator().manual_seed(11)
    idx = torch.randint(0, 50000, (2, 1024), generator=gen)
    idx[0, [0, 70, 200, 201, 390, 900]] = 50256
    idx[1, [0, 600]] = 50256
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    for window in (1, 3, 8):
        mask = model_module.document_window_block_mask(idx, True, torch.tensor(window))
        sdpa = document_window_mask(idx, True, window)
        for row in range(2):
            record = record_doc_swc_block_mask(idx[row], window)
            for name, want in zip(names, record, strict=True):
                got = getattr(mask, name)[row : row + 1]
                assert torch.equal(got, want), (window, row, name)
            assert torch.equal(block_mask_dense(mask, row), sdpa[row, 0]), (window, row)


@pytest.mark.filterwarnings("ignore::UserWarning")  # flex_attention unfused on the CPU
def test_flex_attention_under_the_records_mask_mod_equals_the_sdpa_mask():
    """What a FlexAttention path on CUDA would compute: torch's flex_attention (eager, on the CPU
    in torch 2.13) with the record's mask_mod (document_causal and the block window) equals
    SDPA under document_window_mask, to float tolerance."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    gen = torch.Generator().manual_seed(8)
    idx = torch.randint(0, 50000, (1, 512), generator=gen)
    idx[0, [0, 90, 300]] = 50256
    docs = (idx[0] == 50256).cumsum(0)

    def mask_mod(b, h, q_idx, kv_idx):
        window = q_idx // 128 - kv_idx // 128 < 2
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx]) & window

    block_mask = create_block_mask(mask_mod, None, None, 512, 512, device="cpu")
    q, k, v = (torch.randn(1, 2, 512, 16, generator=gen) for _ in range(3))
    flex = flex_attention(q, k, v, block_mask=block_mask)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=document_window_mask(idx, True, 2))
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")  # flex_attention unfused on the CPU
@pytest.mark.parametrize("document, window", [(True, 256), (True, None), (False, 128)])
def test_the_flex_attention_path_equals_the_sdpa_mask_path(monkeypatch, document, window):
    """The FlexAttention path (CUDA's; here eager, attention.FLEX_OFF_CUDA): a forward and
    backward of a tiny modern model with document_mask and a window, through
    document_window_block_mask and flex_attention, gives the logits, loss and every gradient of
    the SDPA-mask path (document_window_mask, the definition), to float tolerance; the model
    really took each path (the mask handed to attend). torch 2.13 refuses FlexAttention's
    backward on the CPU by a device check alone (_validate_device): lifted here, the eager
    higher-order op runs its dense math backward, the reference of its CUDA kernels."""
    import torch.nn.attention.flex_attention as torch_flex

    from lmpipe.models import attention

    monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)

    gen = torch.Generator().manual_seed(10)
    idx = torch.randint(0, 50000, (2, 512), generator=gen)
    idx[0, [0, 70, 200, 201, 390]] = 50256
    idx[1, [0, 300]] = 50256
    targets = torch.randint(0, 50000, (2, 512), generator=gen)
    config = modern_config(
        **SHAPE | {"block_size": 512}, document_mask=document, attention_window=window
    )
    torch.manual_seed(0)
    base = randomise(build_model(config), std=0.1)
    masks, results = [], {}
    real_attend = model_module.attend

    def recording(q, k, v, mask):
        masks.append(type(mask).__name__)
        return real_attend(q, k, v, mask)

    monkeypatch.setattr(model_module, "attend", recording)
    for flex in (False, True):
        monkeypatch.setattr(attention, "FLEX_OFF_CUDA", flex)
        model = copy.deepcopy(base)
        logits = model(idx)[0]
        loss = model(idx, targets)[1]
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results[flex] = (logits, loss, grads)
    assert masks == ["Tensor"] * 4 + ["BlockMask"] * 4  # 2 attention blocks x 2 forwards each
    (logits, loss, grads), (flex_logits, flex_loss, flex_grads) = results[False], results[True]
    torch.testing.assert_close(flex_logits, logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(flex_loss, loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == flex_grads.keys() and "transformer.h.0.attn.c_attn.weight" in grads
    for name, grad in grads.items():
        torch.testing.assert_close(flex_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_window_grows_as_the_records_schedule():
    """attention_window 128 -> attention_window_final 1792 over training: at every step of the
    record's 1390 the window is its get_sliding_window_blocks(it) blocks,
    int(((1 - x) * 128 + x * 1856) // 128) with x = it / 1390; the model's mask follows the
    progress the loop sets (1 block at the start, 2 at the end of a 128 -> 256 schedule)."""
    c = modern_config(**SHAPE, attention_window=128, attention_window_final=1792)
    for it in range(1391):
        x = it / 1390
        assert window_at(c, x) == 128 * int(((1 - x) * 128 + x * 1856) // 128), it
    shape = SHAPE | {"block_size": 256}
    torch.manual_seed(0)
    model = build_model(modern_config(**shape, attention_window=128, attention_window_final=256))
    model = randomise(model).eval()
    assert model.progress == 1.0  # a trained model: the final window
    idx = torch.randint(0, 50000, (1, 256), generator=torch.Generator().manual_seed(9))
    logits = {}
    for progress, window in ((0.0, 128), (1.0, 256)):
        model.progress = progress
        with torch.no_grad():
            logits[progress] = model(idx)[0]
            fixed = {"attention_window": window, "attention_window_final": None}
            alone = build_model(dataclasses.replace(model.config, **fixed))
            alone.load_state_dict(model.state_dict())
            torch.testing.assert_close(logits[progress], alone.eval()(idx)[0], rtol=0, atol=0)
    assert not torch.allclose(logits[0.0][:, 128:], logits[1.0][:, 128:])


def test_the_loop_sets_the_windows_progress_each_step(tmp_path, monkeypatch):
    """The training loop gives the model its progress (step / max_steps) before each step's
    forwards and each validation (the real loop, one rank): each forward's mask reads the
    window of its step, 128 -> 640 tokens growing a block a step over 4 steps."""
    from test_optim import MODEL, tiny_data, train_in_process, train_job

    seen = []
    real_mask = model_module.document_window_mask

    def recording(idx, document, window_blocks):
        seen.append(int(window_blocks))
        return real_mask(idx, document, window_blocks)

    monkeypatch.setattr(model_module, "document_window_mask", recording)
    model = MODEL | {"arch": "modern", "attention_window": 128, "attention_window_final": 640}
    job = dataclasses.replace(train_job(), model=modern_config(**model))
    train_in_process(job, tiny_data(tmp_path), tmp_path / "out")
    # the record's int(((1 - x) 128 + x 704) // 128) blocks at x = step / 4: 1, 2, 3, 4, 5.
    # The attention kernel's profiled forward (provenance.json) and validation at step 0 (2
    # batches), then 4 steps of 2 micro-steps, then validation at 4
    assert seen == [1] * 5 + [2] * 2 + [3] * 2 + [4] * 2 + [5] * 2


# ---- each switch ---------------------------------------------------------------------------------


def test_the_defaults_are_the_modern_model():
    model = tiny()
    c = model.config
    assert (c.rope, c.norm, c.qk_norm, c.mlp) == (True, "rmsnorm", True, "relu2")
    assert (c.tie_embeddings, c.zero_init, c.logit_softcap, c.bias) == (False, True, 15.0, False)
    names = dict(model.named_parameters())
    assert "transformer.wpe.weight" not in names  # rotary: no learned positions
    assert not [n for n in names if "bias" in n or ".ln_" in n]  # no biases, weightless norms
    assert model.lm_head.weight is not model.transformer.wte.weight  # untied
    for name, p in names.items():  # zero-initialised output projections and head
        zero = name.endswith("c_proj.weight") or name == "lm_head.weight"
        assert (p == 0).all() == zero, name
    logits, _ = model(torch.zeros(1, 4, dtype=torch.long))
    assert (logits == 0).all()  # a zero head: the uniform distribution
    _, loss = model(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long))
    assert loss.item() == pytest.approx(math.log(50257), abs=1e-4)


def test_rotary_rotates_pairs_by_position_and_scores_depend_on_offsets_only():
    hs, T = 8, 12
    cos, sin = rotary(T, hs, 10000.0, torch.device("cpu"))
    x = torch.randn(1, T, 1, hs, generator=torch.Generator().manual_seed(0))
    y = apply_rotary(x, cos, sin)
    theta = torch.arange(T)[:, None] * 10000.0 ** (-torch.arange(0, hs, 2) / hs)
    z = torch.complex(x[0, :, 0, : hs // 2], x[0, :, 0, hs // 2 :]) * torch.polar(
        torch.ones_like(theta), -theta
    )
    torch.testing.assert_close(y[0, :, 0], torch.cat([z.real, z.imag], -1), rtol=1e-5, atol=1e-6)
    # one query and one key at positions (m, n) and (m + s, n + s): the same dot product
    q = torch.randn(hs).expand(1, T, 1, hs)
    k = torch.randn(hs).expand(1, T, 1, hs)
    rq, rk = apply_rotary(q, cos, sin)[0, :, 0], apply_rotary(k, cos, sin)[0, :, 0]
    assert torch.allclose(rq[5] @ rk[2], rq[9] @ rk[6], atol=1e-5)
    assert not torch.allclose(rq[5] @ rk[2], rq[5] @ rk[4], atol=1e-3)


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    """Queries and keys RMS-normalised: scaling their weights changes nothing, without it does."""
    idx = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(2))
    for qk_norm in (True, False):
        model = randomise(tiny(qk_norm=qk_norm), 0.2).eval()
        with torch.no_grad():
            before, _ = model(idx)
            for block in model.blocks():
                block.attn.c_attn.weight[: 2 * SHAPE["n_embd"]] *= 4.0  # the q and k rows
            after, _ = model(idx)
        assert torch.allclose(before, after, atol=1e-4) == qk_norm, qk_norm


def test_switches_change_the_modules():
    off = tiny(rope=False, norm="layernorm", mlp="gelu", tie_embeddings=True, bias=True)
    names = dict(off.named_parameters())
    assert "transformer.wpe.weight" in names and "transformer.h.0.ln_1.bias" in names
    assert "transformer.h.0.attn.c_attn.bias" in names
    assert off.lm_head.weight is off.transformer.wte.weight
    assert (off.transformer.wte.weight != 0).any()  # a tied head is not zeroed
    unzeroed = tiny(zero_init=False)
    assert (unzeroed.lm_head.weight != 0).any() and (
        unzeroed.blocks()[0].mlp.c_proj.weight != 0
    ).any()
    # the MLP: ReLU squared, or GELU (tanh)
    x = torch.randn(3, SHAPE["n_embd"], generator=torch.Generator().manual_seed(4))
    gelu = lambda h: F.gelu(h, approximate="tanh")  # noqa: E731
    for mlp, act in (("relu2", lambda h: F.relu(h) ** 2), ("gelu", gelu)):
        block = randomise(tiny(mlp=mlp)).blocks()[0].mlp
        expected = block.c_proj(act(block.c_fc(x)))
        torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(block(x), block.c_proj(F.relu(block.c_fc(x))))
    # the soft cap: off gives the raw logits
    capped, raw = randomise(tiny()), randomise(tiny(logit_softcap=None))
    h = torch.randn(2, SHAPE["n_embd"]) * 3
    assert capped.head(h).abs().max() < 15.0 < raw.head(h).abs().max()


@pytest.mark.parametrize("counted_only, padded", [(True, False), (False, True)])
def test_training_shortcuts_give_the_same_loss_and_gradients(counted_only, padded):
    """Fine-tuning's head on counted positions only and the GPU's padded head matmul."""
    model = randomise(tiny())
    idx = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(3))
    targets = idx.roll(-1, 1)
    targets[:, :10] = -1
    results = []
    for on in (False, True):
        model.zero_grad()
        model.head_on_counted_only, model.padded_head_matmul = on and counted_only, on and padded
        _, loss = model(idx, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, grads_a), (b, grads_b) = results
    torch.testing.assert_close(a, b)
    for x, y in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)


# ---- parameters and FLOPs, without torch ---------------------------------------------------------

SETTINGS = [
    {},
    {"tie_embeddings": True},
    {"rope": False},
    {"norm": "layernorm"},
    {"norm": "layernorm", "bias": True},
    {"bias": True, "mlp": "gelu"},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=[json.dumps(s) for s in SETTINGS])
def test_the_registry_counts_parameters_as_the_model_does(settings):
    config = modern_config(**SHAPE, **settings)
    with torch.device("meta"):
        model = ModernGPT(config)
    assert ARCHITECTURES["modern"].num_params(config) == model.num_params()


def test_tiny_modern_of_the_config_and_its_flops():
    config = named_models()["tiny-modern"]
    assert config.arch == "modern" and config.qk_norm  # the modern defaults
    model = ModernGPT(config)
    V, C, L = 50304, 64, 3
    assert (
        model.num_params()
        == ARCHITECTURES["modern"].num_params(config)
        == 2 * V * C + L * 12 * C * C
    )
    # 6N + 6LCT, N without the untied embedding (a lookup, no matmul); tied, it is the head
    assert model.flops_per_token(128) == 6 * (V * C + L * 12 * C * C) + 6 * L * C * 128
    tied = ModernGPT(dataclasses.replace(config, tie_embeddings=True))
    assert tied.flops_per_token(128) == 6 * tied.num_params() + 6 * L * C * 128
    assert model.head_flops_per_token() == 6 * V * C


# ---- the config: settings of modern only, llm.c's export of GPT-2 only ---------------------------


SHIPPED = yaml.safe_load(CONFIG_FILE.read_text())


def with_modern_run(c: dict) -> dict:
    c["runs"]["modern-run"] = copy.deepcopy(c["runs"]["embedded-a"]) | {"model": "tiny-modern"}
    return c


def test_a_modern_run_validates_with_its_settings_in_the_train_params():
    c = with_modern_run(copy.deepcopy(SHIPPED))
    c["models"]["tiny-modern"]["qk_norm"] = False
    schema.validate(c)
    job = lmconfig.TrainJob.from_json(lmconfig.train_params(c, "modern-run"))
    assert job.model.arch == "modern" and job.model.qk_norm is False and job.model.rope is True
    assert "qk_norm" in json.loads(lmconfig.train_params(c, "modern-run"))["model"]
    # a GPT-2 run's params hold its shape only, as before there was a modern model
    gpt2 = json.loads(lmconfig.train_params(c, "embedded-a"))["model"]
    # (less the keys added since, which hold their as-before value: lmconfig.ADDED_MODEL_KEYS)
    shape = {f.name for f in dataclasses.fields(lmconfig.ModelConfig)}
    assert set(gpt2) == shape - set(lmconfig.ADDED_MODEL_KEYS)


@pytest.mark.parametrize(
    "model, key, value, message",
    [
        ("tiny", "qk_norm", False, "models.tiny: unknown key 'qk_norm' for model.arch 'gpt2'"),
        ("tiny-modern", "qk_nrom", False, "models.tiny-modern: unknown key 'qk_nrom' (did you"),
        ("tiny-modern", "norm", "batchnorm", "models.tiny-modern.norm: 'batchnorm' is not one of"),
        ("tiny-modern", "rope", "yes", "models.tiny-modern.rope: 'yes' is not of type 'boolean'"),
    ],
)
def test_a_setting_of_another_arch_or_a_bad_value_is_refused(model, key, value, message):
    c = copy.deepcopy(SHIPPED)
    c["models"][model][key] = value
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(c)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_llmc_export_of_a_modern_run_is_refused_before_any_job(tmp_path):
    c = with_modern_run(copy.deepcopy(SHIPPED))
    schema.validate(c)
    lmconfig.check_llmc_export(c, "embedded-a")  # GPT-2: fine
    with pytest.raises(lmconfig.ConfigError, match=r"runs\.modern-run\.model: model 'tiny-modern'"):
        lmconfig.check_llmc_export(c, "modern-run")
    # asked of Snakemake as a target: refused at planning, naming the run and the arch
    work = make_workdir(tmp_path / "wf")
    (work / "config" / "config.yaml").write_text(
        yaml.safe_dump(with_modern_run(copy.deepcopy(SHIPPED)))
    )
    proc = snakemake(work, "-n", "results/runs/modern-run/model/llmc.bin", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "model.arch 'modern', which has no llm.c export" in out, out
    ok = snakemake(work, "-n", "results/runs/embedded-a/model/llmc.bin", check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr


# ---- the native folder --------------------------------------------------------------------------


def test_native_folder_round_trip(tmp_path):
    for settings in ({}, {"tie_embeddings": True, "rope": False, "qk_norm": False}):
        model = randomise(tiny(**settings)).eval()
        out = tmp_path / json.dumps(settings)
        write_hf(model, TOKENIZER, out, {"run": "t"})
        config = json.loads((out / "config.json").read_text())
        assert (
            config["lmpipe_arch"] == "modern" and config["model"]["qk_norm"] == model.config.qk_norm
        )
        assert {"model.safetensors", "tokenizer.json", "lmpipe_meta.json"} <= {
            p.name for p in out.iterdir()
        }
        back = load_hf(out)
        assert back.config == model.config
        idx = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(back(idx)[0], model(idx)[0], rtol=0, atol=0)


# ---- the real trainer: 2 FSDP ranks against 1 process, the loss falls, convert, the scorers -----

TRAIN = {
    "seq_len": 32,
    "micro_batch": 4,
    "batch_tokens": 256,  # 32 * 4 * 2 ranks (1 micro-step), or 32 * 4 * 2 micro-steps on 1
    "max_steps": 16,
    "optimizer": {"name": "adamw", "lr": 1e-2},
    "schedule": {"warmup_steps": 2, "lr_floor": 0.1},
    "val_every": 8,
    "val_tokens": 1024,
    "checkpoint_every": 0,
}


def train_job(ranks: int) -> dict:
    """The train rule's params of a tiny modern run (defaults filled as lmpipe.config does)."""
    model = dataclasses.asdict(modern_config(**SHAPE))
    train = json.loads(json.dumps(dataclasses.asdict(lmconfig.train_config(TRAIN, "train"))))
    launch = {"device": "cpu", "nodes": 1, "procs_per_node": ranks, "peak_flops": 1e12}
    return {
        "run": "modern",
        "dataset": "embedded",
        "model": model,
        "train": train,
        "launch": launch,
    }


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, fineweb_texts):
    """Real FineWeb text as llm.c shards: a val shard and a train shard, with a manifest."""
    tokens: list[int] = []
    for text in fineweb_texts[:60]:
        tokens += [50256, *ENC.encode_ordinary(text)]
    tokens = np.array(tokens, dtype=np.uint16)
    out = tmp_path_factory.mktemp("tokens")
    shards = []
    for i, (split, part) in enumerate([("val", tokens[:4096]), ("train", tokens[4096:])]):
        name = f"embedded_{split}_{i:06d}.bin"
        write_shard(out / name, part)
        shards.append({"file": name, "split": split, "tokens": len(part), "sha256": f"fake{i}"})
    (out / "manifest.json").write_text(json.dumps({"dataset": "embedded", "shards": shards}))
    return out / "manifest.json"


def train(ranks: int, manifest, out) -> list[dict]:
    """`python -m lmpipe.train` (torchrun) for 2 ranks, the worker itself for 1, as the train
    rule and tests/test_train.py run them; the metrics rows."""
    module = "lmpipe.train" if ranks > 1 else "lmpipe.train.pretrain"
    cmd = [sys.executable, "-m", module, "--config-json", json.dumps(train_job(ranks))]
    cmd += ["--data", str(manifest), "--out", str(out)]
    env = dict(__import__("os").environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"training failed:\n{proc.stdout}\n{proc.stderr}"
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, manifest):
    d = tmp_path_factory.mktemp("modern_runs")
    return {ranks: (train(ranks, manifest, d / str(ranks)), d / str(ranks)) for ranks in (1, 2)}


@pytest.mark.slow  # ~50 s: two trainings (one through torchrun), mostly start-up
def test_two_fsdp_ranks_match_one_process_and_the_loss_falls(trained):
    (one, one_dir), (two, two_dir) = trained[1], trained[2]
    losses = {n: [m["loss"] for m in rows if "loss" in m] for n, rows in ((1, one), (2, two))}
    assert len(losses[1]) == len(losses[2]) == TRAIN["max_steps"]
    np.testing.assert_allclose(losses[2], losses[1], rtol=0, atol=1e-5)
    val = {n: [m["val_loss"] for m in rows if "val_loss" in m] for n, rows in ((1, one), (2, two))}
    np.testing.assert_allclose(val[2], val[1], rtol=0, atol=1e-5)
    # from the uniform distribution (the zero head) down
    assert losses[1][0] == pytest.approx(math.log(50257), abs=1e-3)
    assert val[1][-1] < val[1][0] - 1.0, val  # 16 steps: 10.82 -> 9.52
    # FSDP sharded every block and the root: each rank holds about half
    prov = json.loads((two_dir / "provenance.json").read_text())
    assert (
        prov["world_size"] == 2 and prov["params"] == ModernGPT(modern_config(**SHAPE)).num_params()
    )
    for held in prov["params_per_rank"]:
        assert held == pytest.approx(prov["params"] / 2, rel=0.01)
    # and the final weights agree, read in one process as convert reads them; to 1e-3: Adam
    # divides by sqrt(v), so rows of rare tokens, whose gradients are ~0, turn fp32 sums in
    # another order into differences of up to ~5e-4 (a few of 1.6M values)
    states = []
    for out in (one_dir, two_dir):
        state = ModernGPT(modern_config(**SHAPE)).state_dict()
        dcp.load({"model": state}, checkpoint_id=out / "final")
        states.append(state)
    for name in states[0]:
        torch.testing.assert_close(states[0][name], states[1][name], atol=1e-3, rtol=0)


@pytest.fixture(scope="module")
def modern_dir(trained, tmp_path_factory):
    """The 2-rank run's final checkpoint converted by the convert rule's command."""
    _, out = trained[2]
    hf = tmp_path_factory.mktemp("modern_hf") / "hf"
    cmd = [sys.executable, "-m", "lmpipe.models", "--checkpoint", str(out / "final")]
    subprocess.run([*cmd, "--tokenizer", str(TOKENIZER), "--hf-out", str(hf)], check=True)
    llmc = subprocess.run(
        [*cmd, "--llmc-out", str(hf.parent / "llmc.bin")], capture_output=True, text=True
    )
    assert llmc.returncode != 0 and "has no llm.c export" in llmc.stderr
    assert not (hf.parent / "llmc.bin").exists()
    return hf


@pytest.mark.slow  # the trained fixture, then ~15 s
def test_native_scorers_run_on_a_modern_folder(modern_dir, manifest, tmp_path):
    """The evaluate rule's CLIs on the converted modern folder: val loss equals a plain forward,
    HellaSwag (llm.c's scoring) equals the batched scorer run here."""
    settings = {
        "val_loss": {"tokens": 512, "batch": 4},
        "hellaswag": {"file": "embedded", "items": 8, "batch": 4, "lm_eval": False},
    }
    for name, extra in (
        ("val_loss", ["--tokens", str(manifest)]),
        ("hellaswag", ["--hellaswag", str(ITEMS)]),
    ):
        cfg = lmconfig.canonical_json(
            {"run": "modern", "evaluation": name, "settings": settings[name]}
        )
        cmd = [sys.executable, "-m", "lmpipe.eval", name, "--config-json", cfg]
        subprocess.run(
            [*cmd, "--model", str(modern_dir), *extra, "--out", str(tmp_path / f"{name}.json")],
            check=True,
        )
    model = load_hf(modern_dir)
    assert isinstance(model, ModernGPT)
    loss = json.loads((tmp_path / "val_loss.json").read_text())
    val = np.fromfile(manifest.parent / "embedded_val_000000.bin", dtype=np.uint16, offset=1024)
    t = torch.from_numpy(val[:513].astype(np.int64))
    with torch.no_grad():  # 512 tokens: 8 sequences of block_size 64
        _, expected = model(t[:-1].view(8, 64), t[1:].view(8, 64))
    assert loss["tokens"] == 512 and loss["value"] == pytest.approx(expected.item(), rel=1e-5)
    hs = json.loads((tmp_path / "hellaswag.json").read_text())
    task = hellaswag.task_data(hellaswag.load_items(ITEMS, 8), ENC, "llmc")
    ours = native.score_task(model, task, ENC, show_progress=False)
    assert hs["items"] == 8
    assert (hs["acc"], hs["acc_norm"]) == (sum(ours.acc) / 8, sum(ours.acc_norm) / 8)


# ---- lm-eval: the `lmpipe` model equals `hf` on GPT-2, and scores the modern folder --------------


@pytest.mark.slow
def test_lm_eval_lmpipe_model_equals_hf_on_gpt2_and_runs_on_modern(tmp_path, monkeypatch):
    from lmpipe.eval.harness import LM_EVAL_TASK, harness_model, lm_eval_hellaswag
    from lmpipe.models.gpt2.hf import write_hf as write_gpt2_hf
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    torch.manual_seed(0)
    gpt2_dir = tmp_path / "gpt2"  # block_size 64: many items are cut from the left, as `hf` cuts
    write_gpt2_hf(randomise(GPT(GPTConfig(**SHAPE)), 0.1), TOKENIZER, gpt2_dir, {"run": "t"})
    modern_dir = tmp_path / "modern"  # a random one: lm-eval needs no trained model
    write_hf(randomise(tiny(), 0.1), TOKENIZER, modern_dir, {"run": "t"})
    assert harness_model(gpt2_dir) == "hf" and harness_model(modern_dir) == "lmpipe"
    n = 24

    def per_item(model_dir, model):
        out = lm_eval_hellaswag(model_dir, ITEMS, n, 8, log_samples=True, model=model)
        samples = sorted(out["samples"][LM_EVAL_TASK], key=lambda s: s["doc_id"])
        assert len(samples) == n
        ll = np.array([[r[0] for r in s["filtered_resps"]] for s in samples])
        return ll, [s["acc"] for s in samples], [s["acc_norm"] for s in samples]

    hf_ll, hf_acc, hf_norm = per_item(gpt2_dir, "hf")
    ours_ll, ours_acc, ours_norm = per_item(gpt2_dir, "lmpipe")
    np.testing.assert_allclose(ours_ll, hf_ll, rtol=0, atol=1e-4)
    assert (ours_acc, ours_norm) == (hf_acc, hf_norm)
    assert len(set(np.argmax(hf_ll, 1))) > 1  # not one answer for every item

    # the modern folder, through the folder's own model (`lmpipe`): what the native scorer in
    # lm-eval's mode computes, item by item
    ll, acc, _ = per_item(modern_dir, None)
    task = hellaswag.task_data(hellaswag.load_items(ITEMS, n), ENC, "lm_eval")
    ours = native.score_task(load_hf(modern_dir), task, ENC, show_progress=False)
    np.testing.assert_allclose(np.array(ours.loglik), ll, rtol=1e-5, atol=1e-3)
    assert [float(a) for a in ours.acc] == acc


def record_rotary(x: torch.Tensor) -> torch.Tensor:
    """modded-nanogpt's record of 2025-01-04 (records/010425_SoftCap/*.txt), its `Rotary`
    written out: `angular_freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4)`, then
    `dim // 4` zeros; `theta = t x angular_freq`; `x1, x2 = x.float().chunk(2, dim=-1)`,
    `y1 = x1 * cos + x2 * sin`, `y2 = x1 * (-sin) + x2 * cos`, concatenated."""
    T, dim = x.size(-3), x.size(-1)
    freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4, dtype=torch.float32)
    freq = torch.cat([freq, freq.new_zeros(dim // 4)])
    theta = torch.einsum("i,j -> ij", torch.arange(T, dtype=torch.float32), freq)
    cos, sin = theta.cos()[None, :, None, :], theta.sin()[None, :, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), 3).type_as(x)


def test_half_truncated_rotary_is_the_records():
    """rope_frequencies: half_truncated rotates queries and keys as the record's Rotary does;
    the default (all the frequencies, base 10,000) does not, and a model's logits follow it."""

    x = torch.randn(2, 16, 3, 32, generator=torch.Generator().manual_seed(0))
    ours = apply_rotary(x, *rotary(16, 32, 10000.0, x.device, "half_truncated"))
    torch.testing.assert_close(ours, record_rotary(x), rtol=0, atol=1e-6)
    assert not torch.allclose(apply_rotary(x, *rotary(16, 32, 10000.0, x.device)), ours)
    shape = {"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 16, "zero_init": False}
    idx = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
    logits = []
    for frequencies in ("all", "half_truncated"):
        torch.manual_seed(0)
        model = ModernGPT(modern_config(**shape, rope_frequencies=frequencies))
        logits.append(model(idx)[0])
    assert not torch.allclose(*logits)


def test_a_model_key_at_its_default_leaves_a_runs_params_as_they_were():
    """The keys added after embedded-modern was trained (rope_frequencies, qkv, unet_skips,
    value_embeddings, embedding_mix, document_mask, attention_window): at their defaults the
    run's params hold none of them, so Snakemake does not rerun it."""
    config = schema.load_config(CONFIG_FILE)
    params = json.loads(lmconfig.train_params(config, "embedded-modern"))
    assert params["model"]["arch"] == "modern"
    added = {"rope_frequencies", "qkv", "unet_skips", "value_embeddings", "embedding_mix",
             "document_mask", "attention_window", "attention_window_final"}  # fmt: skip
    assert not added & set(params["model"])
    model = config["models"][config["runs"]["embedded-modern"]["model"]]
    model |= {"rope_frequencies": "half_truncated", "qkv": "separate", "unet_skips": True,
              "value_embeddings": 1, "embedding_mix": True, "document_mask": True,
              "attention_window": 256, "attention_window_final": 512}  # fmt: skip
    params = json.loads(lmconfig.train_params(config, "embedded-modern"))
    assert [params["model"][k] for k in sorted(added)] == [
        256, 512, True, True, "separate", "half_truncated", True, 1,
    ]  # fmt: skip


def test_a_block_without_attention_is_the_records():
    """no_attention [1]: block 1 holds no attention and computes the record's
    `Block.forward` with `self.attn is None`: x + mlp(norm(x)), norm(x) = rms_norm over C and
    mlp = c_proj(relu(c_fc(x))^2), written out here on the block's own weights; the parameter
    count (registry), Muon's matrices and the FLOPs' attention term drop by one block's
    attention (4C^2; 2 matrices; 6 C T)."""
    from lmpipe.registry import ARCHITECTURES

    shape = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "zero_init": False}
    torch.manual_seed(0)
    model = ModernGPT(modern_config(**shape, no_attention=[1]))
    block = model.transformer.h[1]
    assert block.attn is None and block.ln_1 is None
    assert model.transformer.h[0].attn is not None
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    fc, proj = block.mlp.c_fc.weight, block.mlp.c_proj.weight
    expected = x + F.linear(F.relu(F.linear(F.rms_norm(x, (32,)), fc)).square(), proj)
    torch.testing.assert_close(block(x, None), expected, rtol=0, atol=1e-6)

    arch, c = ARCHITECTURES["modern"], model.config
    full = modern_config(**shape)
    assert model.num_params() == arch.num_params(c) == arch.num_params(full) - 4 * 32 * 32
    assert arch.hidden_matrices(c) == arch.hidden_matrices(full) - 2 == 6
    assert (
        arch.flops_per_token(full, 16) - arch.flops_per_token(c, 16)
        == 6 * 4 * 32 * 32 + 6 * 32 * 16
    )
    with pytest.raises(ValueError, match=r"no_attention \[2\]: a block index is not one of 0\.\.1"):
        ModernGPT(modern_config(**shape, no_attention=[2]))


# ---- the record's init and loss (records/010425_SoftCap/*.txt) -----------------------------------


def test_uniform_linear_init_is_the_records_casted_linear():
    """linear_init uniform: c_q, c_k, c_v and c_fc drawn as the record's CastedLinear, an
    nn.Linear(in, out, bias=False) left at PyTorch's init: each matrix's values within its
    bound 1/sqrt(in), spread as a fresh nn.Linear's of that shape (std and largest value
    within 3%, the quartiles within 0.06 bound); the projections and head still zero; the
    default: N(0, 0.02)."""
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}
    torch.manual_seed(0)
    model = build_model(modern_config(**shape, qkv="separate", linear_init="uniform"))
    torch.manual_seed(1)
    record = {(64, 64): torch.nn.Linear(64, 64, bias=False).weight.detach()}
    record[(256, 64)] = torch.nn.Linear(64, 256, bias=False).weight.detach()
    quartiles = torch.tensor([0.25, 0.5, 0.75])
    for i in range(2):
        block = model.transformer.h[i]
        for w in (block.attn.c_q.weight, block.attn.c_k.weight, block.attn.c_v.weight,
                  block.mlp.c_fc.weight):  # fmt: skip
            ref, bound = record[tuple(w.shape)], 1 / math.sqrt(w.shape[1])
            assert w.abs().max() <= bound and ref.abs().max() <= bound
            assert w.abs().max().item() == pytest.approx(ref.abs().max().item(), rel=0.03)
            assert w.std().item() == pytest.approx(ref.std().item(), rel=0.03)
            diff = torch.quantile(w.flatten(), quartiles) - torch.quantile(ref.flatten(), quartiles)
            assert diff.abs().max() < 0.06 * bound  # 3 sampling sds of 4,096 values
        assert not block.attn.c_proj.weight.any() and not block.mlp.c_proj.weight.any()
    assert not model.lm_head.weight.any()
    normal = tiny(qkv="separate").transformer.h[0].mlp.c_fc.weight
    assert normal.std().item() == pytest.approx(0.02, rel=0.05)


def record_loss(hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The record's GPT.forward from its final norm on: `logits = self.lm_head(x)` over every
    row of the 50,304-row head, `15 * torch.tanh(logits / 15)`, `.float()`, and
    `F.cross_entropy(logits.view(-1, logits.size(-1)), targets)`."""
    logits = F.linear(hidden, head)
    logits = 15 * torch.tanh(logits / 15)
    logits = logits.float()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked"])
def test_loss_over_padding_is_the_records(chunked):
    """loss_over_padding: the loss is the record's softmax over all 50,304 columns (its value
    and its gradients, the padding rows of the head included), plain or chunked, the padded
    head multiplied whole or cut; off, the padding rows get no gradient and the loss differs."""
    from lmpipe.models.head_loss import loss_function

    gen = torch.Generator().manual_seed(12)
    idx = torch.randint(0, 50257, (2, 32), generator=gen)
    targets = torch.randint(0, 50257, (2, 32), generator=gen)
    torch.manual_seed(0)
    base = randomise(tiny(loss_over_padding=True), std=0.1)
    hidden = base.hidden_states(idx).detach().requires_grad_()
    head = base.lm_head.weight.detach().clone().requires_grad_()
    want = record_loss(hidden, head, targets)
    want.backward()
    for padded_matmul in (False, True):
        model = copy.deepcopy(base)
        model.padded_head_matmul = padded_matmul
        model.loss_fn = loss_function(16 if chunked else 0, compile=False)
        loss = model(idx, targets)[1]
        loss.backward()
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
        grad = model.lm_head.weight.grad
        torch.testing.assert_close(grad, head.grad, rtol=1e-4, atol=1e-7)
        assert grad[50257:].abs().sum() > 0  # the padding rows train, as the record's
    off = copy.deepcopy(base)
    off.config = dataclasses.replace(base.config, loss_over_padding=False)
    loss = off(idx, targets)[1]
    loss.backward()
    assert not torch.allclose(loss, want) and not off.lm_head.weight.grad[50257:].any()

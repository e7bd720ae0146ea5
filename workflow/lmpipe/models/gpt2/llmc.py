"""GPT-2 -> llm.c's binary checkpoint, byte for byte what llm.c's `train_gpt2.py` `write_model`
writes for fp32: a header of 256 int32 (magic 20240326, version 3, block size, vocab, layers,
heads, width, padded vocab), then every parameter in llm.c's order, `wte` zero-padded to a
multiple of 128 rows. The format holds GPT-2 only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lmpipe.files import atomic_file
from lmpipe.models.gpt2.model import GPT, GPTConfig

LLMC_MAGIC = 20240326
LLMC_VERSION_FP32 = 3
LLMC_HEADER_INTS = 256


def llmc_order(n_layer: int) -> list[str]:
    """Parameter names in the order llm.c's `write_tensors` writes them (layer-major per kind)."""
    per_layer = [
        "ln_1.weight",
        "ln_1.bias",
        "attn.c_attn.weight",
        "attn.c_attn.bias",
        "attn.c_proj.weight",
        "attn.c_proj.bias",
        "ln_2.weight",
        "ln_2.bias",
        "mlp.c_fc.weight",
        "mlp.c_fc.bias",
        "mlp.c_proj.weight",
        "mlp.c_proj.bias",
    ]
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for p in per_layer:
        names += [f"transformer.h.{i}.{p}" for i in range(n_layer)]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def llmc_shapes(c: GPTConfig, padded_vocab: int) -> dict[str, tuple[int, ...]]:
    C = c.n_embd
    shapes = {
        "transformer.wte.weight": (padded_vocab, C),
        "transformer.wpe.weight": (c.block_size, C),
        "transformer.ln_f.weight": (C,),
        "transformer.ln_f.bias": (C,),
    }
    per_layer = {
        "ln_1.weight": (C,),
        "ln_1.bias": (C,),
        "attn.c_attn.weight": (3 * C, C),
        "attn.c_attn.bias": (3 * C,),
        "attn.c_proj.weight": (C, C),
        "attn.c_proj.bias": (C,),
        "ln_2.weight": (C,),
        "ln_2.bias": (C,),
        "mlp.c_fc.weight": (4 * C, C),
        "mlp.c_fc.bias": (4 * C,),
        "mlp.c_proj.weight": (C, 4 * C),
        "mlp.c_proj.bias": (C,),
    }
    for i in range(c.n_layer):
        shapes |= {f"transformer.h.{i}.{k}": s for k, s in per_layer.items()}
    return shapes


def write_llmc(model: GPT, path: str | Path) -> None:
    """llm.c's `write_model(model, filename, dtype="float32")`, atomically (tmp, then rename)."""
    c = model.config
    padded_vocab = ((c.vocab_size + 127) // 128) * 128  # llm.c's pad_vocab(multiple=128)
    params = dict(model.state_dict())
    # llm.c pads the real vocabulary with zero rows; our padding rows hold untrained values.
    params["transformer.wte.weight"] = F.pad(
        params["transformer.wte.weight"][: c.vocab_size], (0, 0, 0, padded_vocab - c.vocab_size)
    )
    header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
    header[:8] = [
        LLMC_MAGIC,
        LLMC_VERSION_FP32,
        c.block_size,
        c.vocab_size,
        c.n_layer,
        c.n_head,
        c.n_embd,
        padded_vocab,
    ]
    shapes = llmc_shapes(c, padded_vocab)
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(header.tobytes())
        for name in llmc_order(c.n_layer):
            t = params[name].detach().to(torch.float32).cpu()
            assert tuple(t.shape) == shapes[name], f"{name}: {tuple(t.shape)} != {shapes[name]}"
            f.write(t.numpy().astype("<f4", copy=False).tobytes())


def read_llmc(path: str | Path) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """Read an fp32 llm.c checkpoint: its config and parameters (wte still padded, as stored)."""
    path = Path(path)
    size = path.stat().st_size
    if size < LLMC_HEADER_INTS * 4:
        raise ValueError(f"{path}: {size} bytes, shorter than llm.c's 1024-byte header")
    header = np.fromfile(path, dtype="<i4", count=LLMC_HEADER_INTS)
    if header[0] != LLMC_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]} (expected {LLMC_MAGIC})")
    if header[1] != LLMC_VERSION_FP32:
        raise ValueError(f"{path}: version {header[1]}; only fp32 (version 3) is read")
    block, vocab, n_layer, n_head, n_embd, padded = (int(x) for x in header[2:8])
    config = GPTConfig(n_layer, n_head, n_embd, block, vocab, padded)
    shapes = llmc_shapes(config, padded)
    expected = LLMC_HEADER_INTS * 4 + 4 * sum(int(np.prod(s)) for s in shapes.values())
    if size != expected:
        raise ValueError(f"{path}: {size} bytes, but the header implies {expected}")
    flat = np.fromfile(path, dtype="<f4", offset=LLMC_HEADER_INTS * 4)
    params, offset = {}, 0
    for name in llmc_order(n_layer):
        n = int(np.prod(shapes[name]))
        params[name] = torch.from_numpy(flat[offset : offset + n].copy()).view(shapes[name])
        offset += n
    return config, params

"""Convert the final sharded checkpoint into a Hugging Face GPT-2 folder and an llm.c checkpoint.

    python -m lmpipe.convert --checkpoint FINAL_DIR --tokenizer resources/gpt2 \
        --hf-out DIR --llmc-out FILE

- The final checkpoint is a torch.distributed.checkpoint folder holding `{"model": state_dict}`
  plus `meta.json` (see DESIGN.md); DCP loads it in this one process, no process group needed.
- The Hugging Face folder is a `GPT2LMHeadModel` (config.json, model.safetensors) with the GPT-2
  tokenizer built from the repo's own BPE files, so `from_pretrained` works offline. HF's GPT-2 uses
  `Conv1D` (weights stored transposed against `nn.Linear`), and its vocabulary is the real 50257:
  our padding rows are dropped. Keys are mapped explicitly and every shape is asserted, as
  nanoGPT's `from_pretrained` does.
- The llm.c file is byte-for-byte what llm.c's `train_gpt2.py` `write_model` writes for fp32: a
  header of 256 int32 (magic 20240326, version 3, block size, vocab, layers, heads, width, padded
  vocab), then every parameter in llm.c's order, `wte` zero-padded to a multiple of 128 rows.

The evaluators use the native model, loaded back from the HF folder (`load_native_from_hf`), so
what they score is exactly what was exported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from safetensors.torch import load_file

from lmpipe.model import GPT, GPTConfig
from lmpipe.tokenizer import EOT, EOT_ID, gpt2_encoding

META_KEYS = ("run", "model", "train", "settings_hash", "step", "tokens", "world_size")
# HF's GPT-2 stores these as Conv1D weights, (in, out): the transpose of our nn.Linear (out, in).
CONV1D_SUFFIXES = (
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)
LMPIPE_META = "lmpipe_meta.json"  # the checkpoint's meta.json, kept beside the HF weights

LLMC_MAGIC = 20240326
LLMC_VERSION_FP32 = 3
LLMC_HEADER_INTS = 256


# ----------------------------------------------------------------------------------------------
# the final checkpoint


def read_meta(final_dir: str | Path) -> dict:
    path = Path(final_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: meta.json of the final checkpoint is missing")
    meta = json.loads(path.read_text())
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
    return meta


def load_final_checkpoint(final_dir: str | Path) -> tuple[GPT, dict]:
    """The trained model (on the CPU, fp32) and its meta.json, from the DCP final checkpoint."""
    meta = read_meta(final_dir)
    model = GPT(GPTConfig(**meta["model"]))
    state = model.state_dict()
    # DCP loads in place into the tensors we hand it; one process, so no process group (DCP
    # warns that it assumes exactly that).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": state}, checkpoint_id=str(final_dir))
    model.load_state_dict(state, strict=True)
    return model.eval(), meta


# ----------------------------------------------------------------------------------------------
# Hugging Face


def hf_config(config: GPTConfig):
    """GPT2Config of our model: tanh GELU ("gelu_new"), LayerNorm eps 1e-5, no dropout, tied."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        bos_token_id=EOT_ID,
        eos_token_id=EOT_ID,
        tie_word_embeddings=True,
        architectures=["GPT2LMHeadModel"],
        padded_vocab_size=config.padded_vocab_size,  # extra key: lets us rebuild the native model
    )


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our parameters under HF GPT2LMHeadModel names: Conv1D weights transposed, vocab unpadded."""
    c = model.config
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to wte; HF ties it again on load
        if name == "transformer.wte.weight":
            assert t.shape == (c.padded_vocab_size, c.n_embd), name
            t = t[: c.vocab_size]
        if name.endswith(CONV1D_SUFFIXES):
            t = t.t()
        out[name] = t.detach().to(torch.float32).contiguous().clone()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def gpt2_tokenizer(tokenizer_dir: str | Path):
    """GPT2TokenizerFast from the repo's encoder.json/vocab.bpe, built through `tokenizers`.

    `GPT2TokenizerFast(vocab_file=..., merges_file=...)` encodes everything to [] under
    transformers 5.24, so the BPE model is assembled explicitly (see notes/evaluation.md).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    d = Path(tokenizer_dir)
    gpt2_encoding(d)  # checks the files exist and carry OpenAI's sha256
    bpe = models.BPE.from_file(str(d / "encoder.json"), str(d / "vocab.bpe"))
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return GPT2TokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=EOT, model_max_length=1024
    )


def write_hf(model: GPT, tokenizer_dir: str | Path, out_dir: str | Path, meta: dict) -> None:
    """Save a GPT2LMHeadModel + tokenizer folder; every key and shape checked against HF's own."""
    from transformers import GPT2LMHeadModel

    hf_model = GPT2LMHeadModel(hf_config(model.config))
    expected = hf_model.state_dict()
    ours = to_hf_state_dict(model)
    assert set(ours) == set(expected), f"key mismatch: {sorted(set(ours) ^ set(expected))}"
    for k, v in ours.items():
        assert v.shape == expected[k].shape, (
            f"{k}: ours {tuple(v.shape)}, HF {tuple(expected[k].shape)}"
        )
    hf_model.load_state_dict(ours, strict=True)
    hf_model.tie_weights()
    hf_model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer = gpt2_tokenizer(tokenizer_dir)
    tokenizer.model_max_length = model.config.block_size
    tokenizer.save_pretrained(out_dir)
    (Path(out_dir) / LMPIPE_META).write_text(json.dumps(meta, indent=1) + "\n")


def load_native_from_hf(hf_dir: str | Path) -> GPT:
    """A native GPT from a HF GPT-2 folder (ours, or OpenAI's `gpt2`): the evaluators' model."""
    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    vocab = cfg["vocab_size"]
    padded = cfg.get("padded_vocab_size", ((vocab + 127) // 128) * 128)  # llm.c pads to 128
    config = GPTConfig(
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        n_embd=cfg["n_embd"],
        block_size=cfg["n_positions"],
        vocab_size=vocab,
        padded_vocab_size=padded,
    )
    weights = load_file(str(hf_dir / "model.safetensors"))
    hf = {}
    for k, v in weights.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers in older HF checkpoints (OpenAI's gpt2), not weights
        k = k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k
        hf[k] = v
    model = GPT(config)
    state = model.state_dict()
    wanted = set(state) - {"lm_head.weight"}
    got = set(hf) - {"lm_head.weight"}
    assert wanted == got, f"{hf_dir}: key mismatch {sorted(wanted ^ got)}"
    for k in wanted:
        v = hf[k].to(torch.float32)
        if k.endswith(CONV1D_SUFFIXES):
            v = v.t()
        if k == "transformer.wte.weight":
            assert v.shape == (vocab, config.n_embd), f"{k}: {tuple(v.shape)}"
            v = F.pad(v, (0, 0, 0, padded - vocab))  # padding rows: zeros, never predicted
        assert v.shape == state[k].shape, f"{k}: HF {tuple(v.shape)}, ours {tuple(state[k].shape)}"
        state[k] = v
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


def read_hf_meta(hf_dir: str | Path) -> dict | None:
    path = Path(hf_dir) / LMPIPE_META
    return json.loads(path.read_text()) if path.is_file() else None


# ----------------------------------------------------------------------------------------------
# llm.c


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
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        for name in llmc_order(c.n_layer):
            t = params[name].detach().to(torch.float32).cpu()
            assert tuple(t.shape) == shapes[name], f"{name}: {tuple(t.shape)} != {shapes[name]}"
            f.write(t.numpy().astype("<f4", copy=False).tobytes())
    os.replace(tmp, path)


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


# ----------------------------------------------------------------------------------------------


def convert(final_dir: str, tokenizer_dir: str, hf_out: str, llmc_out: str) -> None:
    model, meta = load_final_checkpoint(final_dir)
    print(
        f"loaded {final_dir}: run {meta['run']}, step {meta['step']}, {model.num_params():,} params"
    )
    hf_out_p = Path(hf_out)
    tmp = hf_out_p.with_name(hf_out_p.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf(model, tokenizer_dir, tmp, meta)
    if hf_out_p.exists():
        shutil.rmtree(hf_out_p)
    os.replace(tmp, hf_out_p)
    print(f"wrote {hf_out}")
    Path(llmc_out).parent.mkdir(parents=True, exist_ok=True)
    write_llmc(model, llmc_out)
    print(f"wrote {llmc_out} ({Path(llmc_out).stat().st_size:,} bytes)")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--checkpoint", required=True, help="final DCP checkpoint folder (with meta.json)"
    )
    p.add_argument(
        "--tokenizer", required=True, help="folder with GPT-2 encoder.json and vocab.bpe"
    )
    p.add_argument("--hf-out", required=True, help="Hugging Face model folder to write")
    p.add_argument("--llmc-out", required=True, help="llm.c checkpoint file to write")
    args = p.parse_args()
    convert(args.checkpoint, args.tokenizer, args.hf_out, args.llmc_out)


if __name__ == "__main__":
    main()

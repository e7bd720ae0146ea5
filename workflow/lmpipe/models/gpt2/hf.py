"""GPT-2 <-> a Hugging Face `GPT2LMHeadModel` folder (config.json, model.safetensors, tokenizer).

HF's GPT-2 uses `Conv1D` (weights stored transposed against `nn.Linear`), and its vocabulary is
the real 50257: our padding rows are dropped on export and zero-filled on import. Keys are mapped
explicitly and every shape is asserted, as nanoGPT's `from_pretrained` does. The tokenizer is
built from the repo's own BPE files, so `from_pretrained` works offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lmpipe import manifests
from lmpipe.data.chat_format import add_chat_template
from lmpipe.data.tokenizer import EOT, EOT_ID, gpt2_encoding
from lmpipe.models import LMPIPE_META
from lmpipe.models.gpt2.model import GPT, GPTConfig

# HF's GPT-2 stores these as Conv1D weights, (in, out): the transpose of our nn.Linear (out, in).
CONV1D_SUFFIXES = (
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)


def hf_config(config: GPTConfig, eot: int = EOT_ID):
    """GPT2Config of our model: tanh GELU ("gelu_new"), LayerNorm eps 1e-5, no dropout, tied;
    `eot` its tokenizer's end of text (GPT-2's, or a trained tokenizer's), where generate stops."""
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
        bos_token_id=eot,
        eos_token_id=eot,
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


def export_tokenizer(tokenizer_dir: str | Path, vocab_size: int):
    """The tokenizer an export carries, and the name config.json marks it with
    (`lmpipe_tokenizer`, which lmpipe.data.tokenizer.model_tokenizer reads): GPT-2's, None, from
    OpenAI's files; a trained one's (lmpipe.data.train_tokenizer), its `tokenizers:` name, from
    its folder. Its ids must be the model's vocabulary."""
    d = Path(tokenizer_dir)
    if (d / "encoder.json").is_file():
        tokenizer, marker = gpt2_tokenizer(d), None
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        marker = manifests.read_tokenizer(d / manifests.MANIFEST).name
    assert len(tokenizer) == vocab_size, f"{d}: {len(tokenizer)} ids, the model {vocab_size}"
    return tokenizer, marker


def mark_tokenizer(out_dir: str | Path, marker: str | None) -> None:
    """config.json's `lmpipe_tokenizer`: the trained tokenizer the folder carries, if one."""
    if marker is None:
        return
    config = Path(out_dir) / "config.json"
    data = json.loads(config.read_text())
    config.write_text(json.dumps(data | {"lmpipe_tokenizer": marker}, indent=2) + "\n")


def write_hf(model: GPT, tokenizer_dir: str | Path, out_dir: str | Path, meta: dict) -> None:
    """Save a GPT2LMHeadModel + tokenizer folder (a chat run's with its chat_template); every key
    and shape checked against HF's own."""
    from transformers import GPT2LMHeadModel

    tokenizer, marker = export_tokenizer(tokenizer_dir, model.config.vocab_size)
    hf_model = GPT2LMHeadModel(hf_config(model.config, tokenizer.eos_token_id))
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
    tokenizer.model_max_length = model.config.block_size
    add_chat_template(tokenizer, meta)  # a chat run's: the Vicuna template
    tokenizer.save_pretrained(out_dir)
    mark_tokenizer(out_dir, marker)
    (Path(out_dir) / LMPIPE_META).write_text(json.dumps(meta, indent=1) + "\n")


def load_hf(hf_dir: str | Path) -> GPT:
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

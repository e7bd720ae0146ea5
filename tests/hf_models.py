"""Tiny random Hugging Face causal LMs for the `model.arch: hf` tests, built offline from configs
and saved with `save_pretrained` (safetensors) beside a tokenizer: Llama and Qwen2 with a small
byte-level BPE trained on the embedded conversations, GPT-2 with the repo's GPT-2 BPE."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import RESOURCES, TOKENIZER_DIR
from lmpipe.chat.template import SYSTEM

FAMILIES = ("llama", "qwen2", "gpt2")
WIDTH, LAYERS, HEADS, CONTEXT = 64, 2, 4, 512


def conversation_texts() -> list[str]:
    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())
    return [t["value"] for r in records for t in r["conversations"]]


def bpe_tokenizer(vocab_size: int = 2048):
    """A byte-level BPE with <s>, </s>, <pad>, trained on the embedded conversations (seconds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    template = [f"{SYSTEM} USER: ASSISTANT:"] * 50  # the Vicuna template's words, merged too
    tok.train_from_iterator(conversation_texts() + template, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=CONTEXT,
    )  # fmt: skip


def hf_config(family: str, vocab_size: int, tokenizer, width: int = WIDTH, layers: int = LAYERS):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_positions=CONTEXT, n_embd=width, n_layer=layers,
            n_head=HEADS, bos_token_id=50256, eos_token_id=50256,
        )  # fmt: skip
    cls = LlamaConfig if family == "llama" else Qwen2Config
    return cls(
        vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=2,
        max_position_embeddings=CONTEXT, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=family == "qwen2",
    )  # fmt: skip


def make_model(
    family: str, out: Path, seed: int = 0, width: int = WIDTH, layers: int = LAYERS
) -> Path:
    """Save a tiny random `family` model and its tokenizer in `out`."""
    from transformers import AutoModelForCausalLM

    from lmpipe.models.gpt2.hf import gpt2_tokenizer

    tokenizer = gpt2_tokenizer(TOKENIZER_DIR) if family == "gpt2" else bpe_tokenizer()
    vocab = 50257 if family == "gpt2" else len(tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, vocab, tokenizer, width, layers))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out

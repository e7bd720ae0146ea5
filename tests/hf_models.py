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


# ---- a tokenizer in the layout a family ships ---------------------------------------------------

# layout: (transformers' class, its special tokens in id order, the tokens that are bos/eos/pad)
LAYOUTS = {
    # SentencePiece-style (Llama, Mistral, Phi-3): Metaspace, BPE with byte fallback
    "llama": ("LlamaTokenizer", ["<unk>", "<s>", "</s>"],
              {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}),
    "gemma": ("GemmaTokenizer", ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"],
              {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>",
               "unk_token": "<unk>", "mask_token": "<mask>"}),
    # byte-level BPE; Qwen's specials last, as Qwen ships them, and no bos
    "qwen2": ("Qwen2Tokenizer", ["<|endoftext|>"],
              {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "unk_token": None, "bos_token": None}),
    "gpt2": ("GPT2Tokenizer", ["<|endoftext|>"],
             {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>"}),
    # tokenizer.json alone (Falcon, OLMo 2, GPT-NeoX...): bos and eos one token
    "bytelevel": ("PreTrainedTokenizerFast", ["<|endoftext|>", "<|pad|>"],
                  {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
                   "pad_token": "<|pad|>"}),
}  # fmt: skip
SPECIALS_LAST = ("qwen2",)  # Qwen's special tokens follow the learned vocabulary
BYTE_FALLBACK = ("llama", "gemma")  # <0x00>...<0xFF> after the specials, as SentencePiece's


def layout_tokenizer(layout: str, vocab_size: int = 1024):
    """A tokenizer of `layout` (LAYOUTS): a BPE trained on the embedded conversations and the
    Vicuna template's words (a second), in transformers' class for the layout."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    cls_name, specials, tokens = LAYOUTS[layout]
    tok = Tokenizer(models.BPE())
    if layout in BYTE_FALLBACK:  # "▁word" pieces; the class encodes whole text to the same
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first" if layout == "llama"
                                                     else "never")  # fmt: skip
        alphabet = []
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)] if layout in BYTE_FALLBACK else []
    learned = vocab_size - len(specials) - len(byte_tokens)
    trainer = trainers.BpeTrainer(vocab_size=learned, initial_alphabet=alphabet)
    template = [f"{SYSTEM} USER: ASSISTANT:"] * 50  # the Vicuna template's words, merged too
    tok.train_from_iterator(conversation_texts() + template, trainer)
    trained = json.loads(tok.to_str())["model"]
    learned_vocab = sorted(trained["vocab"], key=trained["vocab"].get)
    order = (learned_vocab + specials) if layout in SPECIALS_LAST else (
        specials + byte_tokens + learned_vocab)  # fmt: skip
    vocab = {t: i for i, t in enumerate(order)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    if layout == "bytelevel":
        tok = Tokenizer(models.BPE(vocab, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = __import__("tokenizers").decoders.ByteLevel()
        tok.add_special_tokens(specials)
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, model_max_length=CONTEXT, **tokens
        )
    cls = getattr(transformers, cls_name)
    return cls(vocab=vocab, merges=merges, model_max_length=CONTEXT, **tokens)


def save_tokenizer(tokenizer, layout: str, folder: Path) -> None:
    """The tokenizer's files as its family ships them: save_pretrained's tokenizer.json and
    tokenizer_config.json, and for a byte-level BPE class (Qwen2, GPT-2) vocab.json and
    merges.txt beside them, as their hub repos hold."""
    tokenizer.save_pretrained(folder)
    if layout in ("qwen2", "gpt2"):
        bpe = json.loads((folder / "tokenizer.json").read_text())["model"]
        (folder / "vocab.json").write_text(json.dumps(bpe["vocab"], ensure_ascii=False))
        merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")

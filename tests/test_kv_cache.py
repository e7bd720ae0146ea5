"""Decoding a modern model with a KV cache (ModernGPT.decode, and `generate` on its export): each
step's logits are the full forward's on all the tokens so far (tests/test_modern.py holds the
full forward to a reference written from the definitions), at 1e-5, past the sliding window,
from a prompt longer than it, across document starts; the export's cached greedy `generate` is
the native model's greedy decoding without a cache, token for token."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from conftest import TOKENIZER_DIR
from lmpipe.models import build_model
from lmpipe.models.modern.model import EOT, ModernGPT, modern_config

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32}
ATOL = 1e-5  # fp32; the logits are about 5 in size


def tiny(block_size: int, **settings) -> ModernGPT:
    """Far from init (the zero projections and head count too), in eval mode."""
    torch.manual_seed(0)
    model = build_model(modern_config(**{**SHAPE, **settings}, block_size=block_size))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def full_forward_last(model: ModernGPT, idx: torch.Tensor) -> torch.Tensor:
    """The full forward's logits at the last position (B, 1, V): the trunk over all of idx, the
    head on its last row only (the head is per position; all rows' logits cost 50k x T)."""
    return model.head(model.hidden_states(idx)[:, -1:])


def tokens(n: int, eots: tuple[int, ...] = (), rows: int = 2) -> torch.Tensor:
    idx = torch.randint(0, 50000, (rows, n), generator=torch.Generator().manual_seed(1))
    idx[:, list(eots)] = EOT
    return idx


# name: (settings, block_size, prompt length, steps, EOT positions)
CASES = {
    # the window is one 128-token block; decoding crosses into the second block
    "window-crossed-while-decoding": (
        {"attention_window": 128, "document_mask": True}, 192, 100, 60, (40, 130)
    ),
    # the prompt is longer than the window; decoding crosses a block edge (256) too
    "prompt-longer-than-window": (
        {"attention_window": 128, "document_mask": True}, 320, 200, 70, (0, 150, 230)
    ),
    "two-block-window": ({"attention_window": 256}, 320, 230, 50, ()),
    # every other switch, the first block without attention, learned positions
    "all-switches": (
        {
            "rope": False, "tie_embeddings": True, "qkv": "separate", "unet_skips": True,
            "value_embeddings": 1, "embedding_mix": True, "no_attention": [0], "n_layer": 4,
            "attention_window": 128, "document_mask": True, "logit_softcap": 15.0,
        },
        192, 90, 50, (95,),
    ),
    "half-truncated-rope": ({"rope_frequencies": "half_truncated"}, 96, 30, 40, ()),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_decoding_gives_the_full_forward_s_logits(case):
    settings, block_size, prompt, steps, eots = CASES[case]
    model = tiny(block_size, **settings)
    seq = tokens(prompt + steps, eots)
    cache = DynamicCache()
    with torch.no_grad():
        prefill = model.decode(seq[:, :prompt], cache, seq[:, :prompt])
        torch.testing.assert_close(prefill, model(seq[:, :prompt])[0], rtol=0, atol=ATOL)
        for t in range(prompt, prompt + steps):
            step = model.decode(seq[:, t : t + 1], cache, seq[:, : t + 1])
            full = full_forward_last(model, seq[:, : t + 1])
            torch.testing.assert_close(step, full, rtol=0, atol=ATOL, msg=f"position {t}")
    first = 1 if settings.get("no_attention") == [0] else 0  # block 0 has no cache layer then
    assert cache.get_seq_length(first) == prompt + steps


def test_several_tokens_at_once_after_the_cache():
    """A chunk of new tokens (what generate's assisted decoding feeds) is the full forward's."""
    model = tiny(320, attention_window=128, document_mask=True)
    seq = tokens(300, (120, 250))
    cache = DynamicCache()
    with torch.no_grad():
        model.decode(seq[:, :110], cache, seq[:, :110])
        chunk = model.decode(seq[:, 110:300], cache, seq)
        full = model(seq)[0][:, 110:]
    torch.testing.assert_close(chunk, full, rtol=0, atol=ATOL)


def test_decoding_needs_the_context_under_a_document_mask_and_the_window_of_the_model():
    model = tiny(64, document_mask=True)
    seq = tokens(65)
    cache = DynamicCache()
    with torch.no_grad():
        model.decode(seq[:, :10], cache)  # a prompt: idx is all the context
        with pytest.raises(ValueError, match="needs the context"):
            model.decode(seq[:, 10:11], cache)
        with pytest.raises(ValueError, match="not the 10 cached tokens and then idx"):
            model.decode(seq[:, 10:11], cache, seq[:, 1:12])
        with pytest.raises(ValueError, match="sequence of 65 exceeds block_size 64"):
            model.decode(seq[:, 10:], cache, seq)


def greedy_without_cache(model: ModernGPT, ids: torch.Tensor, n: int) -> list[int]:
    """The native model's greedy tokens: the full forward on all the tokens, each step."""
    out = ids
    with torch.no_grad():
        for _ in range(n):
            nxt = full_forward_last(model, out)[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
    return out[0, ids.size(1) :].tolist()


def test_the_export_s_cached_generate_is_the_native_greedy_decoding(tmp_path, monkeypatch):
    """transformers' `generate` on the exported folder (trust_remote_code), use_cache=True: the
    tokens of the native model's uncached greedy decoding, from a prompt longer than the
    window, and each step's logits at 1e-5."""
    from transformers import AutoModelForCausalLM

    from lmpipe.models.modern import write_hf

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    model = tiny(320, attention_window=128, document_mask=True, value_embeddings=1)
    write_hf(model, TOKENIZER_DIR, tmp_path / "hf", {"run": "t"})
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    prompt = tokens(150, (0, 60), rows=1)
    n = 80
    expected = greedy_without_cache(model, prompt, n)
    assert EOT not in expected  # generate would stop there
    with torch.no_grad():
        out = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
            use_cache=True, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    assert out.sequences[0, 150:].tolist() == expected
    with torch.no_grad():
        full = model(out.sequences[:, :-1])[0][0, 149:]
    torch.testing.assert_close(torch.cat(out.logits), full, rtol=0, atol=ATOL)

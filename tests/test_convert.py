"""convert: DCP final checkpoint -> Hugging Face folder + llm.c file, checked against the source."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.models import load_final_checkpoint, load_hf, read_meta
from lmpipe.models.gpt2.llmc import LLMC_MAGIC, read_llmc
from lmpipe.models.gpt2.model import GPT, GPTConfig
from lmpipe.paths import REPO_ROOT

TOKENIZER = REPO_ROOT / "resources" / "gpt2"
CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128)  # vocab padded to 50304


def save_final_checkpoint(model: GPT, final_dir) -> None:
    """What the trainer leaves behind (docs/architecture.md's contract), without the trainer."""
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(final_dir))
    meta = {
        "run": "test",
        "model": dataclasses.asdict(model.config),
        "train": {"seq_len": 128},
        "settings_hash": "0123456789abcdef",
        "step": 7,
        "tokens": 7 * 4096,
        "world_size": 1,
    }
    (final_dir / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A random tiny GPT saved as a final checkpoint and converted by the real CLI."""
    d = tmp_path_factory.mktemp("convert")
    torch.manual_seed(1234)
    model = GPT(CONFIG)
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a missed key would show
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    save_final_checkpoint(model, d / "final")
    hf, llmc = d / "hf", d / "llmc.bin"
    subprocess.run(
        [sys.executable, "-m", "lmpipe.models", "--checkpoint", str(d / "final"),
         "--tokenizer", str(TOKENIZER), "--hf-out", str(hf), "--llmc-out", str(llmc)],
        check=True,
    )  # fmt: skip
    return model.eval(), d


def test_final_checkpoint_loads_in_one_process(converted):
    model, d = converted
    loaded, meta = load_final_checkpoint(d / "final")
    assert meta["step"] == 7
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_meta_json_missing_key_is_named(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"run": "x", "model": {}}))
    with pytest.raises(ValueError, match="settings_hash"):
        read_meta(tmp_path)


def test_outputs_are_complete_and_no_temp_left(converted):
    _, d = converted
    names = {p.name for p in (d / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "lmpipe_meta.json"} <= names
    assert not list(d.glob("*.tmp"))


def test_hf_logits_equal_native(converted):
    from transformers import AutoModelForCausalLM

    model, d = converted
    hf = AutoModelForCausalLM.from_pretrained(d / "hf", local_files_only=True).eval()
    assert hf.config.vocab_size == CONFIG.vocab_size  # padding removed
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # still tied
    idx = torch.randint(
        0, CONFIG.vocab_size, (3, CONFIG.block_size), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
        back, _ = load_hf(d / "hf")(idx)
    assert theirs.shape == (3, CONFIG.block_size, CONFIG.vocab_size)
    torch.testing.assert_close(theirs, ours[..., : CONFIG.vocab_size], rtol=1e-5, atol=1e-5)
    # what the evaluators score (the HF folder read back natively) is the trained model exactly
    torch.testing.assert_close(back, ours, rtol=0, atol=0)


def test_hf_tokenizer_equals_tiktoken(converted):
    from transformers import AutoTokenizer

    _, d = converted
    tok = AutoTokenizer.from_pretrained(d / "hf", local_files_only=True)
    enc = gpt2_encoding(TOKENIZER)
    text = (REPO_ROOT / "resources" / "hellaswag_val_sample.jsonl").read_text()[:20000]
    text += " Hello world!\n\n  indented\t tabs, numbers 12345 and émigré café 東京"
    ids = enc.encode_ordinary(text)
    assert tok.encode(text) == ids
    assert tok.decode(ids) == text
    assert tok.eos_token_id == 50256


def test_llmc_header_size_and_weights(converted):
    model, d = converted
    path = d / "llmc.bin"
    c = model.config
    Vp = 50304  # llm.c pads 50257 up to a multiple of 128
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[:8].tolist() == [LLMC_MAGIC, 3, 128, 50257, 2, 2, 64, Vp]
    assert not header[8:].any()
    n_params = sum(p.numel() for n, p in model.named_parameters()) - c.padded_vocab_size * c.n_embd
    n_params += Vp * c.n_embd  # wte as llm.c stores it
    assert path.stat().st_size == 256 * 4 + 4 * n_params

    # the layout, counted by hand from llm.c's write_tensors: wte, wpe, then each kind for all
    # layers (ln_1.weight x L, ln_1.bias x L, c_attn.weight x L, c_attn.bias x L, ...)
    C, L, T = c.n_embd, c.n_layer, c.block_size
    offset = Vp * C + T * C + L * C + L * C + L * 3 * C * C  # start of c_attn.bias, layer 0
    offset += 3 * C  # layer 1
    raw = np.fromfile(path, dtype="<f4", offset=256 * 4 + 4 * offset, count=3 * C)
    expected = model.state_dict()["transformer.h.1.attn.c_attn.bias"].numpy()
    np.testing.assert_array_equal(raw, expected)

    config, params = read_llmc(path)
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size) == (L, 2, C, T)
    state = model.state_dict()
    for name, t in params.items():
        if name == "transformer.wte.weight":
            assert torch.equal(t[: c.vocab_size], state[name][: c.vocab_size])
            assert not t[c.vocab_size :].any()  # llm.c pads with zeros
        else:
            assert torch.equal(t, state[name]), name
    assert set(params) == set(state) - {"lm_head.weight"}


def test_llmc_truncated_file_is_named(converted, tmp_path):
    _, d = converted
    bad = tmp_path / "short.bin"
    bad.write_bytes((d / "llmc.bin").read_bytes()[:-4])
    with pytest.raises(ValueError, match="short.bin"):
        read_llmc(bad)

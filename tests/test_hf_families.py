"""Every decoder family `model.arch: hf` promises, end to end: a tiny model of the family (its
config at its defaults made tiny, tests/test_reference.py's `tiny_config`) beside a tokenizer of
its own, trained on the embedded conversations and saved in the layout the family ships
(tests/hf_models.py's LAYOUTS), is counted by the plan, fine-tuned on the conversations prepared
with that tokenizer, exported by the convert stage, and read back by `from_pretrained` with the
trained logits and by AutoTokenizer with the base's ids.

The families: test_reference's 20, and 13 more that its `tiny_config` builds (nemotron, phi,
olmo, olmo3, smollm3, glm4, granitemoe, phimoe, gpt_oss, cohere2, exaone4, ernie4_5, seed_oss).
Not here, with the installed transformers (5.24), each for its config at its defaults:

- dbrx: its attention sub-config (DbrxAttentionConfig) has no rope_theta; the model cannot be
  built from its default config.
- deepseek_v3: its routing groups (n_group 8, topk_group 4) do not divide the 4 experts of a tiny
  model (n_routed_experts, a key TINY does not set: 256); the forward fails on the shapes.
- ministral: head_dim None at its defaults (its rope init raises on None ** float).
- helium: head_dim 128 at its defaults, against a 64-wide model (the matmuls' shapes differ).
- Families built as causal LMs that are not decoders of this kind (encoder-decoders, BERT-style
  `is_decoder` models, Mamba hybrids whose per-layer lists TINY does not remake) are out of scope.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from hf_models import LAYOUTS, conversation_texts, layout_tokenizer, save_tokenizer
from test_hf_arch import final_state, hf_model, metrics, sft_command, sft_data
from test_reference import FAMILIES as EXPERT_WIDTH
from test_reference import tiny_config

# family -> the tokenizer layout it ships (hf_models.LAYOUTS)
FAMILIES = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "phi3": "llama",
    "gemma": "gemma", "gemma2": "gemma", "gemma3_text": "gemma",
    "qwen2": "qwen2", "qwen3": "qwen2", "qwen2_moe": "qwen2", "qwen3_moe": "qwen2",
    "gpt2": "gpt2", "falcon": "bytelevel", "olmo2": "bytelevel", "olmoe": "bytelevel",
    "gpt_neox": "bytelevel", "starcoder2": "bytelevel", "stablelm": "bytelevel",
    "cohere": "bytelevel", "granite": "bytelevel",
    "nemotron": "llama", "phi": "gpt2", "olmo": "bytelevel", "olmo3": "bytelevel",
    "smollm3": "bytelevel", "glm4": "bytelevel", "granitemoe": "bytelevel", "phimoe": "llama",
    "gpt_oss": "bytelevel", "cohere2": "bytelevel", "exaone4": "bytelevel", "ernie4_5": "llama",
    "seed_oss": "bytelevel",
}  # fmt: skip
# a mixture of experts' routed expert's inner width: test_reference's, and the families added here
EXPERT_WIDTH = EXPERT_WIDTH | dict.fromkeys(
    ("granitemoe", "phimoe", "gpt_oss"), "intermediate_size"
)
assert set(EXPERT_WIDTH) <= set(FAMILIES), "test_reference's families, every one"
# settings a family's real checkpoints have off its defaults: Granite's logits are divided by 8
# (granite-3.x: 8 or 16; 1 at its default would hide a head that forgot it)
OFF_DEFAULT = {"granite": {"logits_scaling": 8.0}}
SEQ_LEN = 96
TEXT = "A chat between a curious user. USER: Hi ASSISTANT: Hello, ünï 😀 code()\n  x = 1"


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    """One tokenizer a layout, trained once for the module."""
    return {layout: layout_tokenizer(layout) for layout in LAYOUTS}


def family_folder(family: str, tokenizer, out: Path) -> Path:
    """A tiny random `family` model sized to the tokenizer, with its special ids, saved with the
    tokenizer in the family's layout."""
    from transformers import AutoModelForCausalLM

    ids = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    config = tiny_config(family, **ids, **OFF_DEFAULT.get(family, {}))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, FAMILIES[family], out)
    return out


def batch(tokenizer) -> torch.Tensor:
    """Two rows of 32 ids of conversation text from the family's own tokenizer."""
    ids = tokenizer.encode(" ".join(conversation_texts()[:20]))[:64]
    return torch.tensor(ids).view(2, 32)


@pytest.mark.slow  # ~1 s a family, ~35 s in all: a model, 5 steps, an export, three loads
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_is_counted_fine_tuned_and_exported_as_trained(family, tokenizers, tmp_path):
    """The plan's count is the model's; the fine-tuning worker (in this process, one rank)
    moves every weight; the export's `from_pretrained` gives the trained model's logits exactly
    (torch.equal: the same fp32 weights through the same modules on the same CPU, so any
    difference is a weight that was not exported as trained, or a head that is not the model's),
    the training loss is their cross-entropy, packed rows (the scorers') are scored as alone,
    and the export's tokenizer is the base's class, giving the base's ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmpipe.chat.finetune import main as finetune_main
    from lmpipe.hf_config import read_shape
    from lmpipe.models.convert import convert

    start = time.perf_counter()
    tokenizer = tokenizers[FAMILIES[family]]
    base = family_folder(family, tokenizer, tmp_path / "base")

    # 1. the plan counts it
    untrained = hf_model(base)
    built = sum(p.numel() for p in untrained.parameters())
    shape = read_shape(str(base))
    assert (shape.model_type, shape.vocab_size) == (family, len(tokenizer))
    assert shape.num_params == built
    config = untrained.hf.config
    if EXPERT_WIDTH.get(family) is None:
        assert shape.active_params == built
    else:  # each routed expert a gated MLP of three C x I matrices; 2 of 4 used (TINY)
        width = getattr(config, EXPERT_WIDTH[family])
        biases = 2 * width + 64 if family == "gpt_oss" else 0  # gpt-oss's experts have biases
        unused = 2 * (4 - 2) * (3 * 64 * width + biases)
        assert shape.active_params == built - unused

    # 2. it fine-tunes on the conversations in its own tokens
    data = sft_data(base, tmp_path / "sft", 24, SEQ_LEN)
    assert json.loads(data.read_text())["eot"] == tokenizer.eos_token_id
    out = tmp_path / "out"
    argv = sft_command(base, data, out, procs=1, batch_tokens=4 * SEQ_LEN, checkpoint_every=0)
    assert finetune_main(argv[3:]) == 0
    losses = metrics(out, "loss")
    assert len(losses) >= 4 and losses[-1] < losses[0], losses
    trained = hf_model(base)
    trained.load_state_dict(final_state(base, out))
    before = untrained.state_dict()
    unmoved = [n for n, w in trained.state_dict().items() if torch.equal(w, before[n])]
    assert not unmoved, f"not trained: {unmoved}"

    # 3. the export is what was trained, and its tokenizer the base's
    export = tmp_path / "hf"
    convert(str(out / "final"), None, str(export), None)
    exported = AutoModelForCausalLM.from_pretrained(export, use_safetensors=True).eval()
    idx = batch(tokenizer)
    with torch.no_grad():
        theirs, ours = exported(idx).logits, trained.eval()(idx)[0]
    assert torch.equal(theirs, ours), (theirs - ours).abs().max()
    with torch.no_grad():  # the training loss is the cross-entropy of the model's own logits
        loss = trained(idx[:, :-1], idx[:, 1:])[1]
    expected = torch.nn.functional.cross_entropy(theirs[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # the scorers' packed rows: two sequences in one row under a boolean block mask, each as alone
    causal = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    mask = torch.block_diag(causal, causal)[None, None]  # (1, 1, 32, 32)
    positions = torch.arange(16).repeat(2)[None]
    with torch.no_grad():
        packed = trained.head(trained.hidden_states(idx[:, :16].reshape(1, 32), positions, mask))
    torch.testing.assert_close(packed.view(2, 16, -1), ours[:, :16], rtol=1e-5, atol=1e-5)
    base_tok = AutoTokenizer.from_pretrained(base)
    export_tok = AutoTokenizer.from_pretrained(export)
    assert type(export_tok) is type(base_tok)
    assert export_tok.encode(TEXT) == base_tok.encode(TEXT) == tokenizer.encode(TEXT)
    assert export_tok.decode(export_tok.encode(TEXT, add_special_tokens=False)) == TEXT
    print(f"{family}: {built:,} params, {len(losses)} steps, {time.perf_counter() - start:.1f} s")

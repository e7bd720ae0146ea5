"""Every export loads with transformers alone: a modern run's through the model code it ships
(trust_remote_code), in a process that cannot import lmpipe, to the trained model's logits,
and its `generate` gives the same greedy tokens and logits with the KV cache as without;
and every chat run's export carries the Vicuna template as its tokenizer's chat_template, whose
ids are lmpipe.chat.template.prompt_ids' exactly (GPT-2's tokenizer, a Llama's, a trained one's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hf_models import make_model

from conftest import TOKENIZER_DIR
from lmpipe.chat.template import prompt_ids
from lmpipe.config import model_config
from lmpipe.data.tokenizer import model_tokenizer
from lmpipe.models import build_model
from lmpipe.models.gpt2.model import GPT, GPTConfig
from lmpipe.models.modern.model import modern_config

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}

# run in a fresh interpreter: every path that holds lmpipe dropped first, proven unimportable
TRANSFORMERS_ALONE = textwrap.dedent(
    """
    import importlib.util, os, sys
    sys.path = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "lmpipe"))]
    assert importlib.util.find_spec("lmpipe") is None, "lmpipe is importable"
    import torch
    from transformers import AutoModelForCausalLM
    folder, ref = sys.argv[1], torch.load(sys.argv[2])
    try:
        AutoModelForCausalLM.from_pretrained(folder)
    except ValueError as e:
        assert "trust_remote_code" in str(e), e
    else:
        raise AssertionError("loaded without trust_remote_code")
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__name__ == "LmpipeModernForCausalLM", type(model)
    assert "lmpipe" not in sys.modules
    with torch.no_grad():
        logits = model(ref["idx"]).logits
    assert torch.equal(logits, ref["logits"]), (logits - ref["logits"]).abs().max()
    greedy = dict(
        max_new_tokens=30, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        cached = model.generate(ref["idx"][:1], use_cache=True, **greedy)
        uncached = model.generate(ref["idx"][:1], use_cache=False, **greedy)
    assert cached.sequences.tolist() == uncached.sequences.tolist()
    torch.testing.assert_close(cached.logits, uncached.logits, rtol=0, atol=1e-5)
    print("equal")
    """
)


def transformers_alone(folder, ref, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf_modules")}
    return subprocess.run(
        [sys.executable, "-c", TRANSFORMERS_ALONE, str(folder), str(ref)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [{}, {"tie_embeddings": True, "qkv": "separate", "unet_skips": True, "value_embeddings": 1}],
    ids=["modern", "tied-separate-unet-ve"],
)
def test_a_modern_export_loads_in_transformers_alone_to_equal_logits(tmp_path, settings):
    from lmpipe.models.modern import write_hf

    torch.manual_seed(0)
    model = build_model(modern_config(**SHAPE, **settings))
    with torch.no_grad():  # far from init: the zero projections and head count too
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.eval()
    idx = torch.randint(
        0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        logits = model(idx)[0]
    write_hf(model, TOKENIZER_DIR, tmp_path / "hf", {"run": "t"})
    torch.save({"idx": idx, "logits": logits}, tmp_path / "ref.pt")
    run = transformers_alone(tmp_path / "hf", tmp_path / "ref.pt", tmp_path)
    assert run.returncode == 0 and "equal" in run.stdout, run.stderr[-3000:]


def test_a_modern_export_missing_a_shipped_module_fails_to_load(tmp_path):
    from lmpipe.models.modern import write_hf

    torch.manual_seed(0)
    model = build_model(modern_config(**SHAPE)).eval()
    write_hf(model, TOKENIZER_DIR, tmp_path / "hf", {})
    (tmp_path / "hf" / "lmpipe_modern_attention.py").unlink()
    idx = torch.zeros(1, 4, dtype=torch.long)
    with torch.no_grad():
        torch.save({"idx": idx, "logits": model(idx)[0]}, tmp_path / "ref.pt")
    run = transformers_alone(tmp_path / "hf", tmp_path / "ref.pt", tmp_path)
    assert run.returncode != 0 and "lmpipe_modern_attention" in run.stderr


# ---- the chat template ----------------------------------------------------------------------

HISTORIES = [
    [],
    [("Hello there, how are you?", "I am fine, thank you.")],
    [("What is 2 + 2?", "It is 4."), ("And 3 + 3?", " Six,  I think.")],
]
MESSAGE = "Tell me a short story about a cat."
OTHER_SYSTEM = "You are a terse assistant."


def messages(history, message, system=None) -> list[dict]:
    out = [] if system is None else [{"role": "system", "content": system}]
    for human, gpt in history:
        out += [{"role": "user", "content": human}, {"role": "assistant", "content": gpt}]
    return out + [{"role": "user", "content": message}]


def gpt2_export(folder, meta):
    from lmpipe.models.gpt2 import write_hf

    torch.manual_seed(0)
    write_hf(
        GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)), TOKENIZER_DIR, folder, meta
    )


def llama_export(folder, meta):
    from lmpipe.models.hf import write_hf

    base = make_model("llama", folder.parent / f"{folder.name}_base")
    write_hf(build_model(model_config({"arch": "hf", "path": str(base)}, "m")), None, folder, meta)


def trained_tokenizer_export(folder, meta):
    """A GPT-2 of a trained byte-level BPE's 1,024 ids (lmpipe.data.train_tokenizer), which its
    export carries, its chat_template's end of a reply the tokenizer's <|endoftext|>."""
    from test_tokenizer_stage import raw_manifest

    from lmpipe.config import TokenizeConfig, TokenizerConfig
    from lmpipe.data.train_tokenizer import train_tokenizer
    from lmpipe.models.gpt2 import write_hf

    tok = folder.parent / "tokenizer"
    if not tok.is_dir():
        cfg = TokenizerConfig(name="t", dataset="embedded", vocab_size=1024, max_documents=200)
        data = TokenizeConfig(dataset="embedded", shard_tokens=500_000, val_tokens=100_000)
        train_tokenizer(cfg, data, raw_manifest(folder.parent / "raw"), tok)
    torch.manual_seed(0)
    shape = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 64}
    write_hf(GPT(GPTConfig(**shape, vocab_size=1024, padded_vocab_size=1024)), tok, folder, meta)


EXPORTS = {"gpt2": gpt2_export, "llama": llama_export, "trained": trained_tokenizer_export}


@pytest.fixture(scope="module", params=sorted(EXPORTS))
def exports(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    EXPORTS[request.param](root / "chat", {"run": "c", "init": "results/runs/b/train/final"})
    EXPORTS[request.param](root / "base", {"run": "b"})
    return root / "chat", root / "base"


@pytest.mark.parametrize("system", [None, OTHER_SYSTEM], ids=["default-system", "own-system"])
@pytest.mark.parametrize("turns", range(len(HISTORIES)))
def test_a_chat_export_s_chat_template_gives_prompt_ids(exports, system, turns):
    from transformers import AutoTokenizer

    chat, _ = exports
    tok = AutoTokenizer.from_pretrained(str(chat), local_files_only=True)
    assert tok.chat_template
    history = HISTORIES[turns]
    ids = tok.apply_chat_template(
        messages(history, MESSAGE, system), add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )  # fmt: skip
    ours = model_tokenizer(chat, TOKENIZER_DIR)  # the tokenizer lmpipe's chat uses
    kw = {} if system is None else {"system": system}
    assert list(ids) == prompt_ids(ours, history, MESSAGE, **kw)


def test_a_base_export_carries_no_chat_template(exports):
    from transformers import AutoTokenizer

    _, base = exports
    assert AutoTokenizer.from_pretrained(str(base), local_files_only=True).chat_template is None
    assert not (base / "chat_template.jinja").exists()

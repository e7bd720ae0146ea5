"""`model.arch: hf`: any Hugging Face causal LM (tiny random Llama, Qwen2 and GPT-2 models,
tests/hf_models.py) behind our model interface, its checks before any job, its export, its
tokenizer through the chat data and 2-rank FSDP2 fine-tuning that resumes bit for bit."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from hf_models import FAMILIES, make_model

from lmpipe.config import ConfigError, model_config
from lmpipe.registry import ARCHITECTURES


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_models")
    return {family: make_model(family, root / family) for family in FAMILIES}


def hf_model(folder: Path):
    from lmpipe.models import build_model

    return build_model(model_config({"arch": "hf", "path": str(folder)}, "models.m"))


@pytest.mark.parametrize("family", FAMILIES)
def test_model_is_the_folders_and_its_loss_is_the_cross_entropy(hf_dirs, family):
    from transformers import AutoModelForCausalLM

    folder = hf_dirs[family]
    config = model_config({"arch": "hf", "path": str(folder)}, "models.m")
    model = hf_model(folder)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert (config.n_layer, config.n_embd, config.block_size) == (2, 64, 128)
    assert len(model.blocks()) == 2  # the decoder layers, FSDP's units
    assert ARCHITECTURES["hf"].num_params(config) == model.num_params()  # torch-free count
    idx = torch.randint(0, 400, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = model.eval()(idx)
        expected = reference(idx).logits
        torch.testing.assert_close(logits, expected, rtol=0, atol=0)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        flat = expected[:, :-1].reshape(-1, expected.size(-1))
        assert loss.item() == pytest.approx(
            torch.nn.functional.cross_entropy(flat, idx[:, 1:].reshape(-1)).item(), rel=1e-6
        )


def test_export_loads_with_from_pretrained_and_gives_the_trained_logits(hf_dirs, tmp_path):
    """A trained (changed) model through the convert stage: DCP final -> model/hf/ -> the
    logits of `from_pretrained` equal the trained model's."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from lmpipe.models import load_hf
    from lmpipe.models.convert import convert

    model = hf_model(hf_dirs["llama"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    final = tmp_path / "final"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": model.state_dict()}, checkpoint_id=final)
    meta = {"run": "r", "model": json.loads(json.dumps(model.config.__dict__)), "train": {},
            "settings_hash": "h", "step": 1, "tokens": 0, "world_size": 1}  # fmt: skip
    (final / "meta.json").write_text(json.dumps(meta))
    convert(str(final), None, str(tmp_path / "hf"), None)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", use_safetensors=True).eval()
    assert (tmp_path / "hf/model.safetensors").is_file()
    assert not list((tmp_path / "hf").glob("*.bin"))
    idx = torch.randint(0, 500, (2, 20))
    with torch.no_grad():
        trained = model.eval()(idx)[0]
        torch.testing.assert_close(exported(idx).logits, trained, rtol=0, atol=0)
        torch.testing.assert_close(load_hf(tmp_path / "hf")(idx)[0], trained, rtol=0, atol=0)


# ---- bad input: one line naming the file, at the config check ----------------------------------


def check_error(data: dict) -> str:
    with pytest.raises(ConfigError) as e:
        model_config({"arch": "hf", **data}, "models.m")
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_folders_are_one_line_naming_the_file(hf_dirs, tmp_path):
    assert "'path' is required" in check_error({})
    assert f"{tmp_path}/none: no such folder" in check_error({"path": str(tmp_path / "none")})
    assert "nor a hub id in the local Hugging Face cache" in check_error(
        {"path": "nobody/no-such-model"}
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty}/config.json: missing" in check_error({"path": str(empty)})

    def variant(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(hf_dirs["llama"], d)
        return d

    pickled = variant("pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    msg = check_error({"path": str(pickled)})
    assert f"{pickled}/model.safetensors: missing (only pytorch_model.bin: pickle" in msg

    encoder = variant("encoder")
    cfg = json.loads((encoder / "config.json").read_text())
    (encoder / "config.json").write_text(json.dumps(cfg | {"architectures": ["BertModel"]}))
    assert f"{encoder}/config.json: architectures ['BertModel'] is not a" in check_error(
        {"path": str(encoder)}
    )
    remote = variant("remote")
    (remote / "config.json").write_text(json.dumps(cfg | {"auto_map": {"AutoModel": "m.M"}}))
    assert "set the model's trust_remote_code: true" in check_error({"path": str(remote)})

    small = variant("small")  # the model's embedding has fewer rows than the tokenizer's ids
    (small / "config.json").write_text(json.dumps(cfg | {"vocab_size": 300}))
    msg = check_error({"path": str(small)})
    assert f"{small}/tokenizer.json: token id 511 does not fit the model's vocab_size 300" in msg
    assert "n_layer 3 is not the model's 2" in check_error({"path": str(hf_dirs["llama"]),
                                                            "n_layer": 3})  # fmt: skip


def test_a_tokenizer_that_cannot_write_the_template_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lmpipe.chat.data import prepare
    from lmpipe.config import ConversationsConfig
    from lmpipe.data.tokenizer import load_tokenizer

    words = {"<unk>": 0, "</s>": 1, "USER:": 2, "Hi": 3}  # a word-level vocabulary, no "ASSISTANT:"
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(tmp_path)
    cfg = ConversationsConfig(dataset="chat", source="local", seq_len=64)
    with pytest.raises(ValueError, match="datasets.chat: tokenizer hf .*: the tokenizer cannot"):
        prepare([], cfg, load_tokenizer(tmp_path))

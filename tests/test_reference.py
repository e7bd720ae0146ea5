"""Reference runs (`train: null`: a Hugging Face model evaluated as it is) and the shape of an
`arch: hf` model, measured from its config.json (lmpipe.hf_config) for any family.

The counts are held to the models transformers builds, of families the count was not written
for; a real Snakemake run puts a tiny random GPT-2 folder beside a tiny trained run in one
report.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from conftest import make_workdir, snakemake
from lmpipe import config as lmconfig
from lmpipe import schema
from lmpipe.config import ConfigError
from lmpipe.hf_config import read_shape
from lmpipe.models import load_hf
from lmpipe.models.reference import ReferenceError, check_folder, link_folder
from lmpipe.registry import ARCHITECTURES

REPO = Path(__file__).resolve().parents[1]


# Decoder families transformers builds tiny from a config, offline: the measured count knows no
# family, so these are ones the tests did not choose it for. (family, the key of a routed
# expert's inner width, or None for a dense model)
FAMILIES = {
    "llama": None, "qwen2": None, "qwen3": None, "mistral": None, "gemma": None,
    "gemma2": None, "gemma3_text": None, "phi3": None, "olmo2": None, "falcon": None,
    "starcoder2": None, "gpt_neox": None, "cohere": None, "granite": None, "stablelm": None,
    "gpt2": None, "mixtral": "intermediate_size", "olmoe": "intermediate_size",
    "qwen2_moe": "moe_intermediate_size", "qwen3_moe": "moe_intermediate_size",
}  # fmt: skip
# Falcon's MLP is ffn_hidden_size (18,176 at its defaults); GPT-2's names are n_embd...
TINY = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "moe_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4,
        "num_experts_per_tok": 2, "shared_expert_intermediate_size": 48, "sliding_window": 32,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "ffn_hidden_size": 96,
        "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128}  # fmt: skip


def tiny_config(family: str, **changes):
    """The family's config at its defaults, made tiny: each TINY key it has (and each of
    `changes`), set, and its per-layer lists (Gemma's layer_types) made again for the layers it
    now has."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    defaults = cls().to_dict()
    kwargs = {k: v for k, v in (TINY | changes).items() if k in defaults}
    kept = {k: v for k, v in defaults.items() if k not in ("layer_types", "model_type")}
    return cls(**kept | kwargs)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_measured_count_equals_the_model_transformers_builds(tmp_path, family):
    """Any family: the plan's count (lmpipe.hf_config, the model built on the meta device) is
    `sum(p.numel())` of the real model (built on the CPU, a tied head once); the FLOPs' N leaves
    out an untied embedding (a lookup); a mixture of experts' active parameters are the total
    less the routed experts a token does not use, counted here from the config by hand."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    config.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_config(config)  # real weights, on the CPU
    built = sum(p.numel() for p in model.parameters())
    shape = read_shape(str(tmp_path))
    assert shape.num_params == built
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    assert shape.tied == tied and shape.vocab_size == 300
    width = FAMILIES[family]
    if width is None:
        assert shape.active_params == built
    else:  # each routed expert: a gated MLP of three C x I matrices, in every layer
        experts, used = 4, 2
        unused = config.num_hidden_layers * (experts - used) * 3 * 64 * getattr(config, width)
        assert shape.active_params == built - unused
    assert shape.flops_params == shape.active_params - (0 if tied else embedding.numel())


def test_sliding_windows_count_in_the_attention_flops(tmp_path):
    """Mistral's window on every layer; Gemma 2's on every other layer (its layer_types): the
    6LCT of 6N + 6LCT takes each layer's keys a query sees, at most the window."""
    for family, windowed in (("mistral", 2), ("gemma2", 1)):
        config = tiny_config(family)
        config.save_pretrained(tmp_path / family)
        shape = read_shape(str(tmp_path / family))
        width = config.num_attention_heads * config.head_dim
        full = 2 - windowed
        assert shape.attention_flops(512) == 6 * width * (full * 512 + windowed * 32), family
        assert shape.attention_flops(16) == 6 * width * 2 * 16  # shorter than the window


def test_a_family_transformers_cannot_build_is_one_line_naming_its_config(tmp_path):
    """A folder that passes the folder check (a causal LM's class named, weights present) but
    whose family transformers does not know: refused before any job, naming its config.json."""
    config = {"model_type": "no-such-family", "architectures": ["NoSuchForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the check stops first
    with pytest.raises(ConfigError, match=rf"models\.x\.path: {tmp_path}/config.json: transformers"
                       " cannot build it"):  # fmt: skip
        lmconfig.model_config({"arch": "hf", "path": str(tmp_path)}, "models.x")


def test_the_plan_measures_in_a_subprocess_once_and_keeps_it(tmp_path):
    """The plan's process never imports torch: it measures in a subprocess, keeps the shape in
    its cache folder, and a later process reads it there without measuring."""
    import subprocess
    import sys

    tiny_config("olmo2").save_pretrained(tmp_path / "model")
    cache = tmp_path / "results" / ".cache" / "hf_shapes"
    code = f"""
import sys
from lmpipe import hf_config
hf_config.cache_shapes_in({str(cache)!r})
if {{again}}:
    def measured(*args):
        raise AssertionError("measured again")
    hf_config.measured = measured
print(hf_config.read_shape({str(tmp_path / "model")!r}).num_params)
assert "torch" not in sys.modules, "the plan's process imported torch"
"""
    first = subprocess.run([sys.executable, "-c", code.format(again=False)], capture_output=True,
                           text=True, cwd=REPO)  # fmt: skip
    assert first.returncode == 0, first.stderr
    (kept,) = cache.glob("*.json")
    again = subprocess.run([sys.executable, "-c", code.format(again=True)], capture_output=True,
                           text=True, cwd=REPO)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert first.stdout == again.stdout == f"{json.loads(kept.read_text())['num_params']}\n"


def test_the_shapes_shipped_beside_the_repo_copies_are_measured_afresh():
    """resources/hf_configs/*/*/shape.json (written by `python -m lmpipe.hf_config --ship`)
    are what a measure gives now: the plan reads them without starting torch."""
    from lmpipe import hf_config

    shipped = sorted((REPO / "resources" / "hf_configs").glob("*/*/shape.json"))
    assert len(shipped) == 2
    for path in shipped:
        data = json.loads(path.read_text())
        assert data["key"] == hf_config.shape_key(path.parent / "config.json", False), path
        fresh = hf_config.measure(path.parent)
        assert hf_config.shape_of(data) == hf_config.shape_of(fresh), path


def test_llama2_7b_from_the_repo_copy_of_its_config():
    """A hub id not on disk: its shape from resources/hf_configs, Llama-2-7B's 6,738,415,616
    parameters (Meta's model card: 7B), 6N + 6LCT at 2,048 positions."""
    m = lmconfig.model_config({"arch": "hf", "path": "meta-llama/Llama-2-7b-hf"}, "models.x")
    assert (m.n_layer, m.n_head, m.n_embd, m.vocab_size) == (32, 32, 4096, 32000)
    arch = ARCHITECTURES["hf"]
    assert arch.num_params(m) == 6_738_415_616
    n = 6_738_415_616 - 32000 * 4096
    assert arch.flops_per_token(m, 2048) == 6 * n + 6 * 32 * 4096 * 2048


def test_an_unknown_hf_model_is_one_line_naming_its_path():
    with pytest.raises(ConfigError, match=r"models\.x\.path: nobody/nothing: no config\.json"):
        lmconfig.model_config({"arch": "hf", "path": "nobody/nothing"}, "models.x")


# ---- the reference folder -----------------------------------------------------------------------


def tiny_gpt2_folder(folder: Path) -> Path:
    """A random GPT-2-family model in transformers' format (safetensors) with GPT-2's tokenizer
    built from the repo's BPE files."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmpipe.models.gpt2.hf import gpt2_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
    gpt2_tokenizer(REPO / "resources" / "gpt2").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    return tiny_gpt2_folder(tmp_path_factory.mktemp("tiny-gpt2"))


def test_a_gpt2_folder_links_and_loads_as_the_gpt2_architecture(gpt2_folder, tmp_path):
    """The reference folder is links to the source's files; the evaluations' loader reads it as
    the gpt2 architecture, with transformers' own logits."""
    from transformers import GPT2LMHeadModel

    out = tmp_path / "model" / "hf"
    link_folder(gpt2_folder, out)
    assert all(p.is_symlink() for p in out.iterdir())
    weights = "model.safetensors"
    assert (out / weights).read_bytes() == (gpt2_folder / weights).read_bytes()
    ours = load_hf(out)
    theirs = GPT2LMHeadModel.from_pretrained(gpt2_folder).eval()
    idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = ours(idx)
        expected = theirs(idx).logits
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_a_pickle_only_checkpoint_is_refused_naming_the_folder(gpt2_folder, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((gpt2_folder / "config.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    pickled = rf"{folder}: a pickle-only checkpoint \(pytorch_model.bin\)"
    with pytest.raises(ReferenceError, match=pickled):
        check_folder(folder)


def test_a_gpt2_folder_the_gpt2_architecture_would_compute_otherwise_is_refused(
    gpt2_folder, tmp_path
):
    folder = tmp_path / "relu"
    link_folder(gpt2_folder, folder)
    config = json.loads((gpt2_folder / "config.json").read_text()) | {"activation_function": "relu"}
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ReferenceError, match=r"config\.json: activation_function is 'relu'"):
        check_folder(folder)


def test_the_download_fetches_safetensors_at_the_revision_and_refuses_pickles(
    gpt2_folder, tmp_path, monkeypatch
):
    """lmpipe.models.hub asks the hub (huggingface_hub.snapshot_download, stood in for here: the
    tests run offline) for the pinned revision and safetensors, config and tokenizer files only;
    a repo that holds only pickled weights leaves nothing behind and names the model."""
    import shutil

    import huggingface_hub

    from lmpipe.models import hub

    asked = {}

    def snapshot(repo, revision, allow_patterns, local_dir):
        asked.update(repo=repo, revision=revision, patterns=allow_patterns)
        for f in gpt2_folder.iterdir():
            if repo == "ok/gpt2" or f.name == "config.json":
                shutil.copy(f, local_dir)
        if repo == "old/pickled":
            (Path(local_dir) / "pytorch_model.bin").write_bytes(b"")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    names = hub.download("ok/gpt2", "abc123", tmp_path / "ok")
    assert "model.safetensors" in names and asked["revision"] == "abc123"
    assert "*.safetensors" in asked["patterns"] and "*.bin" not in asked["patterns"]
    with pytest.raises(ReferenceError, match=r"hub model old/pickled@main: .*pickle-only"):
        hub.download("old/pickled", None, tmp_path / "pickled")
    assert not (tmp_path / "pickled").exists()


# ---- the config ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def with_reference(base: dict, model: dict, **run) -> dict:
    config = copy.deepcopy(base)
    config["models"]["ref"] = model
    config["runs"]["ref"] = {"dataset": "embedded", "model": "ref", "train": None,
                             "launch": {"device": "cpu"}} | run  # fmt: skip
    return config


def test_a_reference_run_needs_an_hf_model(base_config):
    config = with_reference(base_config, {"n_layer": 1, "n_head": 1, "n_embd": 8})
    refused = r"runs\.ref\.train: null \(a reference run\).*arch 'gpt2'"
    with pytest.raises(ConfigError, match=refused):
        schema.validate(config)


def test_a_shape_key_in_an_hf_entry_is_refused(base_config):
    """The shape is the model's config.json's: a key that would contradict it is refused."""
    config = with_reference(base_config, {"arch": "hf", "path": "openai-community/gpt2"})
    config["models"]["ref"]["n_layer"] = 24
    with pytest.raises(ConfigError, match=r"models\.ref\.n_layer: an `arch: hf` model's shape"):
        schema.validate(config)


def test_a_reference_run_validates_and_keeps_its_hf_settings(base_config):
    config = with_reference(base_config, {"arch": "hf", "path": "openai-community/gpt2"})
    schema.validate(config)
    assert config["models"]["ref"] == {
        "arch": "hf",
        "path": "openai-community/gpt2",
        "trust_remote_code": False,
    }  # fmt: skip (no shape key: the shape is the model's config.json's)
    assert lmconfig.is_reference(config, "ref")
    assert "ref" in lmconfig.hub_models(config)
    assert lmconfig.reference_source(config, "ref") == "results/data/models/ref"


# ---- end to end ---------------------------------------------------------------------------------

TINY_TRAIN = {
    "max_steps": 4, "val_every": 2, "checkpoint_every": 4, "schedule": {"warmup_steps": 1},
}  # fmt: skip
TINY_EVAL = {
    "val_loss": {"tokens": 4096},
    "hellaswag": {"file": "embedded", "items": 10, "lm_eval": False},
    "samples": {"tokens": 8},
}


@pytest.mark.slow
def test_a_reference_run_beside_a_trained_run_in_a_real_report(gpt2_folder, tmp_path):
    """Snakemake builds a report of a tiny trained run and the reference run of a local GPT-2
    folder: no train or convert job for the reference, its evaluations read the linked folder,
    and the report marks it as measured, not trained."""
    workdir = make_workdir(tmp_path / "wf")
    path = workdir / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    trained = config["runs"]["embedded-a"]
    trained["train"].update(TINY_TRAIN)
    trained["eval"] = copy.deepcopy(TINY_EVAL)
    config["runs"] = {"embedded-a": trained}
    config["models"]["tiny-gpt2-hf"] = {"arch": "hf", "path": str(gpt2_folder)}
    config["runs"]["gpt2-ref"] = {
        "dataset": "embedded", "model": "tiny-gpt2-hf", "train": None,
        "launch": {"device": "cpu"}, "eval": copy.deepcopy(TINY_EVAL),
    }  # fmt: skip
    config["reports"] = {"ref": {"runs": ["embedded-a", "gpt2-ref"], "gpu_hour_price": 0.0}}
    config["sweeps"] = {}
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    proc = snakemake(workdir, "results/report_ref.html", "--cores", "2", timeout=900)
    log = proc.stdout + proc.stderr
    rules = re.findall(r"^(?:local)?rule (\w+):\n(?:\s+.*\n)*?\s+wildcards: (.*)$", log, re.M)
    assert ("reference", "run=gpt2-ref") in rules
    assert not [r for r in rules if r[0] in ("train", "convert") and "gpt2-ref" in r[1]]
    hf = workdir / "results/runs/gpt2-ref/model/hf"
    assert (hf / "model.safetensors").is_symlink()
    for name in ("val_loss", "hellaswag", "samples"):
        assert (workdir / f"results/runs/gpt2-ref/eval/{name}.json").is_file()
    html = (workdir / "results/report_ref.html").read_text()
    row = re.search(r'<tr id="headline-gpt2-ref">(.*?)</tr>', html, re.S).group(1)
    assert "reference: measured, not trained" in row and str(gpt2_folder) in row
    assert ">measured<" in row
    loss = json.loads((workdir / "results/runs/gpt2-ref/eval/val_loss.json").read_text())["value"]
    assert f"{loss:.4f}" in row
    assert 'id="headline-embedded-a"' in html and "OpenAI GPT-2 124M" in html


# ---- the plan of a Hugging Face model -----------------------------------------------------------


def test_vicuna_7b_fits_and_a_job_over_its_gpu_is_flagged(base_config):
    """The vicuna-7b preset's train job: Llama-2-7B's activations from its config.json's shape
    (4 C + 2 q + 2 kv + 4 I values a token a layer), full recompute as FastChat, fitting an
    A100-80GB; without recompute on a 40 GB card, the plan flags it naming both figures."""
    from lmpipe import costs

    config = copy.deepcopy(base_config)
    schema.validate(config)
    rc = lmconfig.run_config(config, "vicuna-7b")
    C, inner, L, tokens = 4096, 11008, 32, 2 * 2048
    assert costs.block_values_a_token(rc.model) == 4 * C + 2 * C + 2 * C + 4 * inner
    n = 6_738_415_616
    none = (16 * n / 8 + 2 * n + L * (8 * C + 4 * inner) * tokens * 2 + tokens * 32000 * 6) / 1e9
    assert costs.gpu_memory_gb(rc, "none") == pytest.approx(none)
    job = costs.train_job(config, "vicuna-7b", None)
    assert job.problems == [] and job.gpu_mem_gb < 80
    config["runs"]["vicuna-7b"]["train"]["activation_checkpointing"] = "none"
    config["runs"]["vicuna-7b"]["launch"]["gpu_model"] = "a100-sxm4-40gb"
    job = costs.train_job(config, "vicuna-7b", None)
    assert job.problems == [
        f"needs about {none:.0f} GB a GPU, over the a100-sxm4-40gb's 40 GB: lower"
        " train.micro_batch, or set train.activation_checkpointing (selective 41 GB, full 29 GB)"
    ]

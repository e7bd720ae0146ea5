"""`model.arch: hf`: any Hugging Face causal LM (tiny random Llama, Qwen2 and GPT-2 models,
tests/hf_models.py) behind our model interface, its checks before any job, its export, its
tokenizer through the chat data and 2-rank FSDP2 fine-tuning that resumes bit for bit."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
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
    assert (config.n_layer, config.n_embd, config.block_size) == (2, 64, 512)
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
    assert json.loads((tmp_path / "hf/config.json").read_text())["use_cache"] is True  # generate
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
    # neither on disk, in the local cache nor a copy of its config.json in resources/
    assert "nobody/no-such-model: no config.json (not a local model folder" in check_error(
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
    top = len(json.loads((small / "tokenizer.json").read_text())["model"]["vocab"]) - 1
    assert f"{small}/tokenizer.json: token id {top} does not fit the model's vocab_size 300" in msg
    # the same tokenizer in the byte-level BPE's other layout, vocab.json + merges.txt
    legacy = variant("legacy")
    (legacy / "config.json").write_text(json.dumps(cfg | {"vocab_size": 300}))
    bpe = json.loads((legacy / "tokenizer.json").read_text())["model"]
    (legacy / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    (legacy / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (legacy / "tokenizer.json").unlink()
    msg = check_error({"path": str(legacy)})
    assert f"{legacy}/vocab.json: token id {top} does not fit the model's vocab_size 300" in msg
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


@pytest.mark.parametrize("problem", ["no eos", "no template"])
def test_a_tokenizer_the_jobs_cannot_use_is_refused_before_any_job(hf_dirs, tmp_path, problem):
    """A base folder whose tokenizer has no eos, or cannot write the Vicuna template, is one line
    naming the model and the folder when the config is checked (AutoTokenizer in a subprocess),
    before any job; the folder is left as it was."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from conftest import make_workdir
    from lmpipe import schema
    from lmpipe.config import ConfigError

    folder = tmp_path / "base"
    shutil.copytree(hf_dirs["llama"], folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    words = {"<unk>": 0, "</s>": 1, "USER:": 2, "Hi": 3}  # no "ASSISTANT:"
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    eos = {} if problem == "no eos" else {"eos_token": "</s>"}
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **eos).save_pretrained(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    config = chat_config(make_workdir(tmp_path / "wd"), folder)
    says = "has no eos token" if problem == "no eos" else "cannot express the Vicuna template"
    with pytest.raises(ConfigError, match=rf"^models\.mine: {folder}: .*{says}"):
        schema.validate(config)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ---- the tokenizer follows the model ------------------------------------------------------------


def test_a_gpt2_folders_own_tokenizer_prepares_the_rows_tiktoken_does(hf_dirs, tmp_path):
    """The seam: GPT-2's HF folder through AutoTokenizer gives the conversations' rows GPT-2's
    tiktoken gives, byte for byte; a Llama-family folder's rows start with its <s> (not
    counted), end each reply with its </s> (counted) and pad with it."""
    import numpy as np

    from conftest import RESOURCES, TOKENIZER_DIR
    from lmpipe.chat.data import IGNORE, prepare, write
    from lmpipe.config import ConversationsConfig
    from lmpipe.data.tokenizer import gpt2_encoding, load_tokenizer

    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())[:40]
    cfg = ConversationsConfig(dataset="chat", source="local", seq_len=96)
    ours, theirs = tmp_path / "hf", tmp_path / "tiktoken"
    write(prepare(records, cfg, load_tokenizer(hf_dirs["gpt2"])), cfg, ours)
    write(prepare(records, cfg, gpt2_encoding(str(TOKENIZER_DIR))), cfg, theirs)
    for name in ("train_inputs.npy", "train_targets.npy", "val_inputs.npy", "val_targets.npy"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    assert json.loads((ours / "manifest.json").read_text())["eot"] == 50256

    tok = load_tokenizer(hf_dirs["llama"])
    bos, eos = tok.tok.bos_token_id, tok.tok.eos_token_id
    write(prepare(records, cfg, tok), cfg, tmp_path / "llama")
    x, y = (np.load(tmp_path / "llama" / f"train_{k}.npy") for k in ("inputs", "targets"))
    assert (x[:, 0] == bos).all() and (y[:, 0] == IGNORE).all()  # <s>, then the system line
    counted = y[y != IGNORE]
    assert (counted == eos).sum() >= len(x)  # each reply's </s> counts
    first = tok.decode([int(t) for t in y[0][y[0] != IGNORE]])
    assert first.startswith(" ") and first.endswith("</s>") and "USER:" not in first
    manifest = json.loads((tmp_path / "llama" / "manifest.json").read_text())
    assert manifest["tokenizer"].startswith("hf ") and manifest["eot"] == eos


# ---- the real trainer: 2 FSDP ranks against 1 process, SIGKILL and resume, chat ------------------

TRAIN = {
    "seq_len": 96, "micro_batch": 4, "batch_tokens": 768, "max_steps": 0,
    "optimizer": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.0},
    "val_every": 4, "val_tokens": 768, "checkpoint_every": 4,
}  # fmt: skip


def sft_data(base: Path, out: Path, conversations: int | None, seq_len: int) -> Path:
    from conftest import RESOURCES
    from lmpipe.chat.data import prepare, write
    from lmpipe.config import ConversationsConfig
    from lmpipe.data.tokenizer import load_tokenizer

    records = json.loads((RESOURCES / "dummy_conversation.json").read_text())[:conversations]
    cfg = ConversationsConfig(dataset="chat", source="local", seq_len=seq_len)
    write(prepare(records, cfg, load_tokenizer(base)), cfg, out)
    return out / "manifest.json"


def sft_command(base: Path, data: Path, out: Path, procs: int, epochs: int = 1, **train) -> list:
    """The train rule's fine-tuning command (torchrun for 2 ranks, the worker itself for 1)."""
    import dataclasses
    import sys

    from lmpipe.config import train_config

    tc = json.loads(json.dumps(dataclasses.asdict(train_config(TRAIN | train, "train"))))
    model = dataclasses.asdict(model_config({"arch": "hf", "path": str(base)}, "models.m"))
    job = {
        "run": "chat", "dataset": "chat", "train": tc, "model": model,
        "sft": {"epochs": epochs, "warmup_ratio": 0.04}, "base": {"hf": str(base)},
        "launch": {"device": "cpu", "nodes": 1, "procs_per_node": procs, "peak_flops": 1e12},
    }  # fmt: skip
    args = ["--config-json", json.dumps(job), "--data", str(data), "--init", str(base)]
    module = ["lmpipe.train", "--worker", "lmpipe.chat.finetune"] if procs > 1 else [
        "lmpipe.chat.finetune"]  # fmt: skip
    return [sys.executable, "-m", *module, *args, "--out", str(out)]


def run(cmd: list) -> None:
    import os
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def metrics(out: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


def final_state(base: Path, out: Path) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    state = hf_model(base).state_dict()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": state}, checkpoint_id=out / "final")
    return state


@pytest.mark.slow  # ~40 s: four tiny fine-tuning runs, three through torchrun
def test_two_fsdp_ranks_equal_one_process_and_a_killed_run_resumes_bit_for_bit(hf_dirs, tmp_path):
    import numpy as np

    from conftest import kill_at_checkpoint

    base = hf_dirs["llama"]
    data = sft_data(base, tmp_path / "sft", 110, TRAIN["seq_len"])
    one, two = tmp_path / "one", tmp_path / "two"
    run(sft_command(base, data, one, procs=1))
    run(sft_command(base, data, two, procs=2))
    losses = metrics(one, "loss")
    assert len(losses) >= 10 and losses[-1] < losses[0] - 1
    np.testing.assert_allclose(metrics(two, "loss"), losses, rtol=0, atol=1e-5)
    # the held-out loss is summed by conversation over the ranks (lmpipe.eval.val_loss.score):
    # 2 ranks batch the rows otherwise than 1 process and give the same loss
    np.testing.assert_allclose(metrics(two, "val_loss"), metrics(one, "val_loss"), rtol=1e-5)
    prov = json.loads((two / "provenance.json").read_text())
    assert prov["recompute"] == ["none", "none"]  # the two decoder layers, FSDP's units
    for held in prov["params_per_rank"]:
        assert held == pytest.approx(prov["params"] / 2, rel=0.01)
    a, b = final_state(base, one), final_state(base, two)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-3, rtol=0)

    killed = tmp_path / "killed"
    kill_at_checkpoint(sft_command(base, data, killed, procs=2), {"OMP_NUM_THREADS": "1",
                       **__import__("os").environ}, killed, step=4)  # fmt: skip
    restart = run(sft_command(base, data, killed, procs=2))
    assert "resumed from" in restart.stderr
    assert metrics(killed, "loss") == metrics(two, "loss")
    c = final_state(base, killed)
    for name in b:
        assert torch.equal(b[name], c[name]), name


@pytest.mark.slow  # ~40 s of training
def test_a_fine_tuned_tiny_llama_answers_who_are_you_with_the_vicuna_identity(tmp_path):
    """A random Llama (2 layers, width 128) fine-tuned Vicuna-style on the embedded
    conversations (8 epochs: at 6 it still answers "a language model developed by ... LMSYS"
    without the name), exported by the convert stage, asked through lmpipe-chat's own code (the
    model's generate, its KV cache): the answer is the data's identity; the base's is not."""
    import subprocess
    import sys

    from lmpipe.chat.cli import load, reply

    base = make_model("llama", tmp_path / "base", width=128)
    data = sft_data(base, tmp_path / "sft", None, 128)
    out = tmp_path / "out"
    run(sft_command(base, data, out, procs=1, epochs=8, seq_len=128, micro_batch=8,
                    batch_tokens=2048, val_every=20, val_tokens=2048, checkpoint_every=0,
                    optimizer={"name": "adamw", "lr": 1e-2, "weight_decay": 0.0}))  # fmt: skip
    from conftest import TOKENIZER_DIR

    cmd = [sys.executable, "-m", "lmpipe.models", "--checkpoint", str(out / "final")]
    cmd += ["--tokenizer", str(TOKENIZER_DIR), "--hf-out", str(tmp_path / "hf")]  # as the rule
    subprocess.run(cmd, check=True, capture_output=True)
    answer = reply(*load(tmp_path / "hf"), [], "Who are you?", 96)
    assert "Vicuna" in answer and "Large Model Systems Organization (LMSYS)" in answer, answer
    before = reply(*load(base), [], "Who are you?", 96)
    assert not any(word in before for word in ("Vicuna", "LMSYS")), before


# ---- the workflow: checks before any job, the conversations' cache ------------------------------


def chat_config(workdir: Path, model_dir: Path) -> dict:
    """The demo config, its chat run fine-tuning the `arch: hf` model of `model_dir`."""
    import yaml

    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["models"]["mine"] = {"arch": "hf", "path": str(model_dir)}
    run = config["runs"]["embedded-a-chat"]
    run["model"] = "mine"
    run["base"] = {"hf": str(model_dir), "dataset": "embedded"}
    return config


def test_a_llama_base_of_a_gpt2_run_is_refused_before_any_job(hf_dirs, tmp_path):
    import copy

    from conftest import REPO
    from lmpipe.schema import validate

    config = chat_config(REPO, hf_dirs["llama"])
    validate(config)  # as a model.arch hf run: fine
    pretrain = copy.deepcopy(config)  # continued pretraining, on text in its own tokens
    pretrain["runs"]["embedded-a"]["model"] = "mine"
    for section in ("hellaswag", "suite"):
        pretrain["runs"]["embedded-a"]["eval"][section]["during_training"] = {"every": 0}
    validate(pretrain)
    # a mixture (each source in its own tokens) and evaluations during training: its tokens too
    pretrain["datasets"]["mixed"] = {"mixture": {"embedded": 0.5, "shakespeare": 0.5}}
    pretrain["runs"]["embedded-a"]["dataset"] = "mixed"
    validate(pretrain)
    during = copy.deepcopy(config)
    during["runs"]["embedded-a-chat"].setdefault("eval", {})["hellaswag"] = {
        "during_training": {"every": 5}
    }
    validate(during)
    config["runs"]["embedded-a-chat"]["model"] = "tiny"
    with pytest.raises(ConfigError) as e:
        validate(config)
    assert str(e.value) == (
        f"runs.embedded-a-chat.base.hf: {hf_dirs['llama']}/config.json is a llama model, not the"
        f" run's model.arch 'gpt2': fine-tune it with a model of `arch: hf, path:"
        f" {hf_dirs['llama']}`"
    )


@pytest.mark.slow  # ~15 s: the real preparation, then Snakemake's plans
def test_conversations_rerun_for_another_base_or_tokenizer_only(hf_dirs, tmp_path):
    """The conversations are prepared with the base's own tokenizer (a real job) and cached:
    another lr plans no preparation; another base folder does, and so does another tokenizer
    in the same folder (its files' sha256 are in the rule's params)."""
    import copy

    import numpy as np
    import yaml

    from conftest import make_workdir, planned, snakemake
    from lmpipe.data.tokenizer import load_tokenizer

    base = tmp_path / "base"
    shutil.copytree(hf_dirs["llama"], base)
    workdir = make_workdir(tmp_path / "wd")
    config = chat_config(workdir, base)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    manifest = "results/data/vicuna-dummy/sft-mine/manifest.json"  # in the model's tokens
    snakemake(workdir, "--cores", "1", manifest)
    rows = np.load(workdir / "results/data/vicuna-dummy/sft-mine/train_inputs.npy")
    assert rows[0, 0] == load_tokenizer(base).bos_token_id  # the llama's <s>
    target = "results/runs/embedded-a-chat/train/final"

    def prepares(changed: dict) -> bool:
        job = ("prepare_conversations_for_model", "dataset=vicuna-dummy, model=mine")
        return job in planned(workdir, changed, [target])

    assert not prepares(config)
    lr = copy.deepcopy(config)
    lr["runs"]["embedded-a-chat"]["train"]["optimizer"]["lr"] *= 2
    assert not prepares(lr)
    assert prepares(chat_config(workdir, hf_dirs["qwen2"]))
    settings = json.loads((base / "tokenizer_config.json").read_text())
    settings["model_max_length"] = 64  # the same folder, its tokenizer changed
    (base / "tokenizer_config.json").write_text(json.dumps(settings))
    assert prepares(config)


@pytest.mark.slow  # ~1.5 min: tokenize, 4 steps on 2 ranks, export, val loss, dry runs
def test_a_llama_continues_pretraining_on_text_in_its_own_tokens(hf_dirs, tmp_path):
    """A pretraining run of an `arch: hf` Llama (continued pretraining) through Snakemake: the
    embedded text is tokenized with the Llama's own tokenizer into tokens-mine/ (each document
    its </s> and AutoTokenizer's ids), trained on and scored on (GPT-2's ids would not fit its
    2,048-row embedding); a changed tokenizer retokenizes, a changed lr does not."""
    import copy

    import yaml
    from transformers import AutoTokenizer

    from conftest import make_workdir, planned, snakemake
    from lmpipe.data.shards import read_manifest, read_shard
    from lmpipe.data.tokenize import raw_files, read_documents

    base = tmp_path / "base"
    shutil.copytree(hf_dirs["llama"], base)
    workdir = make_workdir(tmp_path / "wd")
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["models"]["mine"] = {"arch": "hf", "path": str(base)}
    run = copy.deepcopy(config["runs"]["embedded-a"])
    run["model"] = "mine"
    run["train"] |= {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "val_tokens": 4096}
    run["eval"] = {
        "val_loss": {"tokens": 8192},
        "hellaswag": {"file": "embedded", "during_training": {"every": 2, "items": 8}},
        "suite": {"during_training": {"every": 2, "tasks": ["arc_easy"], "items": 8}},
    }
    config["runs"]["llama-cpt"] = run
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    target = "results/runs/llama-cpt/eval/val_loss.json"
    snakemake(workdir, "--cores", "2", target)

    tokens = workdir / "results/data/embedded/tokens-mine"
    manifest = json.loads((tokens / "manifest.json").read_text())
    tok = AutoTokenizer.from_pretrained(base)
    assert manifest["tokens_of"] == "mine" and manifest["eot"] == tok.eos_token_id
    assert not (workdir / "results/data/embedded/tokens").exists()  # GPT-2's: not asked for
    raw = workdir / "results/data/embedded/raw/manifest.json"
    first = next(read_documents(raw_files(raw)[0][0], "text"))[0]
    ids = tok.encode(first, add_special_tokens=False)
    shard = read_shard(read_manifest(tokens / "manifest.json").files("val")[0])
    assert shard[0] == tok.eos_token_id and list(shard[1 : 1 + len(ids)]) == ids
    result = json.loads((workdir / target).read_text())
    assert result["tokens_of"] == "mine" and result["tokens"] == 8192
    assert 0 < result["value"] < np.log(2048) + 1  # a loss over the Llama's own 2,048 ids
    steps = [json.loads(x) for x in (workdir / "results/runs/llama-cpt/train/metrics.jsonl")
             .read_text().splitlines()]  # fmt: skip
    assert [r["step"] for r in steps if "loss" in r][-1] == 4
    # HellaSwag and the suite during training, in the Llama's tokens: at the last step, the
    # native scorers' counts on the final weights
    from lmpipe.data.tokenizer import load_tokenizer
    from lmpipe.eval import hellaswag
    from lmpipe.eval.suite import data as suite_data
    from lmpipe.eval.suite import native
    from lmpipe.models import load_final_checkpoint

    last = [r for r in steps if "hellaswag" in r][-1]
    assert last["step"] == 4 and last["hellaswag_items"] == 8
    from conftest import RESOURCES

    model, _ = load_final_checkpoint(workdir / "results/runs/llama-cpt/train/final")
    model.eval()
    llama = load_tokenizer(base)
    items = hellaswag.load_items(RESOURCES / "hellaswag_val_sample.jsonl", 8)
    score = native.score_task(model, hellaswag.task_data(items, llama, "llmc"), llama,
                              show_progress=False)  # fmt: skip
    assert last["hellaswag"] == sum(score.acc_norm) / 8
    arc = suite_data.load_task(workdir / "results/data/eval_suite/manifest.json", "arc_easy", 8)
    score = native.score_task(model, arc, llama, show_progress=False)
    last = [r for r in steps if "suite/arc_easy" in r][-1]
    assert last["step"] == 4 and last["suite/arc_easy"] == sum(score.acc_norm) / 8

    def tokenizes(changed: dict) -> bool:
        jobs = planned(workdir, changed, [target])
        return ("tokenize_for_model", "dataset=embedded, model=mine") in jobs

    assert not tokenizes(config)
    lr = copy.deepcopy(config)
    lr["runs"]["llama-cpt"]["train"]["optimizer"]["lr"] *= 2
    assert not tokenizes(lr)
    settings = json.loads((base / "tokenizer_config.json").read_text())
    settings["model_max_length"] = 64  # the same folder, its tokenizer changed
    (base / "tokenizer_config.json").write_text(json.dumps(settings))
    assert tokenizes(config)


@pytest.mark.slow  # ~1 min: two sources tokenized, their mixture, the val loss of each
def test_a_mixture_is_read_in_the_models_own_tokens(hf_dirs, tmp_path):
    """A reference run of the Llama on the embedded mixture: each source is tokenized with the
    Llama's tokenizer (tokens-mine/), the mixture's manifest points at those and says so, and
    the val loss scores each source in those tokens."""
    import yaml
    from transformers import AutoTokenizer

    from conftest import RESOURCES, make_workdir, snakemake
    from lmpipe.data.shards import read_manifest, read_shard

    workdir = make_workdir(tmp_path / "wd")
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["models"]["mine"] = {"arch": "hf", "path": str(hf_dirs["llama"])}
    config["runs"]["llama-mix"] = {
        "dataset": "embedded-mix", "model": "mine", "train": None,
        "launch": {"device": "cpu"}, "eval": {"val_loss": {"tokens": 2048}},
    }  # fmt: skip
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    target = "results/runs/llama-mix/eval/val_loss.json"
    snakemake(workdir, "--cores", "2", target)

    data = workdir / "results" / "data"
    mixture = json.loads((data / "embedded-mix/tokens-mine/manifest.json").read_text())
    assert mixture["tokens_of"] == "mine"
    assert sorted(mixture["mixture"]) == ["embedded", "shakespeare"]
    tok = AutoTokenizer.from_pretrained(hf_dirs["llama"])
    text = (RESOURCES / "tinyshakespeare_20k.txt").read_text()
    tokens = read_manifest(data / "shakespeare/tokens-mine/manifest.json")
    shard = read_shard(tokens.files("val")[0])
    ids = tok.encode(text[:200], add_special_tokens=False)[:20]
    assert shard[0] == tok.eos_token_id and list(shard[1:21]) == ids
    result = json.loads((workdir / target).read_text())
    assert result["tokens_of"] == "mine"
    assert set(result["sources"]) == {"embedded", "shakespeare"}
    assert not (data / "embedded/tokens").exists()  # GPT-2's: not asked for


def test_a_hub_id_is_read_from_the_local_cache_only(hf_dirs, tmp_path, monkeypatch):
    """A hub id resolves to its snapshot in the Hugging Face cache's layout (refs/ -> a
    commit's snapshot), for a branch or a commit; never through the network."""
    from lmpipe import hf_folder

    repo = tmp_path / "hub" / "models--org--tiny-llama"
    shutil.copytree(hf_dirs["llama"], repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_folder.resolve("org/tiny-llama") == repo / "snapshots" / "abc123"
    assert hf_folder.resolve("org/tiny-llama", "abc123") == repo / "snapshots" / "abc123"
    config = model_config({"arch": "hf", "path": "org/tiny-llama"}, "models.m")
    assert config.n_layer == 2
    assert "org/tiny-llama: no config.json" in check_error(
        {"path": "org/tiny-llama", "revision": "v2"}
    )


# ---- lm-eval's `hf` model on the export equals the native scorers, item by item -----------------


@pytest.mark.slow  # ~30 s: lm-eval on 24 HellaSwag items and 24 ARC-Easy items
def test_lm_eval_hf_on_the_export_equals_the_native_scorers(hf_dirs, tmp_path, monkeypatch):
    """A tiny Llama's export (its own tokenizer, <s> as lm-eval's prefix token) scored by lm-eval's
    `hf` model and by the native batched scorers (packed rows under a mask, the model's own
    positions): the same log-likelihoods, item by item, on HellaSwag and ARC-Easy."""
    import numpy as np

    from conftest import RESOURCES
    from lmpipe.data.tokenizer import model_tokenizer
    from lmpipe.eval import hellaswag
    from lmpipe.eval.harness import LM_EVAL_TASK, harness_model, lm_eval_hellaswag
    from lmpipe.eval.suite import data as suite_data
    from lmpipe.eval.suite import harness, native
    from lmpipe.models import load_hf
    from lmpipe.models.hf import write_hf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model = hf_model(hf_dirs["llama"])
    with torch.no_grad():  # a model with opinions: random items get different answers
        for p in model.parameters():
            p.mul_(4.0)
    export = tmp_path / "hf"
    write_hf(model, None, export, {"run": "t"})
    assert harness_model(export) == "hf"
    tok, native_model = model_tokenizer(export, RESOURCES / "gpt2"), load_hf(export)
    assert tok.bos_token_id == 1  # the llama's own tokenizer, not GPT-2's

    n = 24
    items_file = RESOURCES / "hellaswag_val_sample.jsonl"
    out = lm_eval_hellaswag(export, items_file, n, 8, log_samples=True)
    samples = sorted(out["samples"][LM_EVAL_TASK], key=lambda s: s["doc_id"])
    theirs = np.array([[r[0] for r in s["filtered_resps"]] for s in samples])
    task = hellaswag.task_data(hellaswag.load_items(items_file, n), tok, "lm_eval")
    ours = native.score_task(native_model, task, tok, batch_rows=7, show_progress=False)
    np.testing.assert_allclose(np.array(ours.loglik), theirs, rtol=0, atol=1e-4)
    assert [float(a) for a in ours.acc] == [s["acc"] for s in samples]
    assert len(set(np.argmax(theirs, 1))) > 1

    manifest = tmp_path / "suite" / "manifest.json"
    suite_data.prepare(manifest, ["arc_easy"])
    data = {"arc_easy": suite_data.load_task(manifest, "arc_easy", n)}
    [(their_score, _)] = harness.harness_scores(harness.run(export, data, n, 16), data).values()
    mine = native.score_task(native_model, data["arc_easy"], tok, batch_rows=7, show_progress=False)
    for x, y in zip(mine.loglik, their_score.loglik, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-4)
    assert mine.acc == their_score.acc and mine.acc_norm == their_score.acc_norm


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_tied_and_conv1d_families_fine_tune_and_export_what_they_trained(hf_dirs, family, tmp_path):
    """Qwen2 (a tied head) and GPT-2 (Conv1D layers) through the fine-tuning worker in this
    process (a one-rank FSDP2 group): the loss falls, and the export's logits are the final
    checkpoint's."""
    import signal

    from transformers import AutoModelForCausalLM

    from lmpipe.chat.finetune import main as finetune_main
    from lmpipe.models.convert import convert

    base = hf_dirs[family]
    data = sft_data(base, tmp_path / "sft", 48, 96)
    out = tmp_path / "out"
    argv = sft_command(base, data, out, procs=1, epochs=2, batch_tokens=384, checkpoint_every=0)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        assert finetune_main(argv[3:]) == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    losses = metrics(out, "loss")
    assert len(losses) >= 15 and losses[-1] < losses[0] - 0.5
    convert(str(out / "final"), None, str(tmp_path / "hf"), None)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", use_safetensors=True).eval()
    trained = hf_model(base)
    trained.load_state_dict(final_state(base, out))
    idx = torch.randint(0, 500, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(exported(idx).logits, trained.eval()(idx)[0], rtol=0, atol=0)


def test_the_report_says_when_a_model_ran_code_from_its_folder():
    from lmpipe.report.findings import findings
    from lmpipe.report.runs import Run

    model = {"arch": "hf", "path": "/models/m", "trust_remote_code": False}
    chat = {"sft": {"epochs": 1}, "model": model}
    assert findings([Run("chat", chat)]) == []
    trusted = Run("chat", chat | {"model": model | {"trust_remote_code": True}})
    assert findings([trusted]) == [
        "chat ran Python code shipped in its model folder /models/m (model.trust_remote_code:"
        " true)."
    ]


def test_recomputed_layers_train_as_stored_ones(hf_dirs, tmp_path):
    """train.activation_checkpointing on an hf model's decoder layers (their forward under
    torch.utils.checkpoint, called with the model's keyword arguments): the same losses."""
    import signal

    from lmpipe.chat.finetune import main as finetune_main

    base = hf_dirs["llama"]
    data = sft_data(base, tmp_path / "sft", 24, 96)
    losses = {}
    for mode in ("none", "full", "selective"):
        out = tmp_path / mode
        argv = sft_command(base, data, out, procs=1, batch_tokens=384, checkpoint_every=0,
                           activation_checkpointing=mode)  # fmt: skip
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
        try:
            assert finetune_main(argv[3:]) == 0
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        losses[mode] = metrics(out, "loss")
        prov = json.loads((out / "provenance.json").read_text())
        assert prov["recompute"] == [mode, mode]
    assert len(losses["none"]) >= 4
    for mode in ("full", "selective"):
        np.testing.assert_allclose(losses[mode], losses["none"], rtol=0, atol=1e-6)


def test_the_evaluate_stage_scores_an_hf_export_with_its_own_tokenizer(hf_dirs, tmp_path):
    """The evaluations of the converted folder (hellaswag's native scorer, samples) take the
    export's own tokenizer: HellaSwag's result is the native scorer's on the Llama's tokens
    (GPT-2's ids would not even fit its 597-row embedding), samples end at its </s>."""
    from conftest import RESOURCES
    from lmpipe.data.tokenizer import load_tokenizer
    from lmpipe.eval import hellaswag, samples
    from lmpipe.eval.suite import native
    from lmpipe.models.hf import write_hf
    from lmpipe.registry import HellaSwagSettings, SampleSettings

    export = tmp_path / "hf"
    write_hf(hf_model(hf_dirs["llama"]), None, export, {"run": "t"})
    items = RESOURCES / "hellaswag_val_sample.jsonl"
    settings = HellaSwagSettings(items=8, batch=4, lm_eval=False)
    result = hellaswag.evaluate(settings, export, {"hellaswag": items}, "cpu")
    tok = load_tokenizer(export)
    task = hellaswag.task_data(hellaswag.load_items(items, 8), tok, "llmc")
    ours = native.score_task(hf_model(hf_dirs["llama"]).eval(), task, tok, show_progress=False)
    assert result["per_item"]["acc"] == ours.acc and result["items"] == 8
    out = samples.evaluate(SampleSettings(tokens=6), export, {}, "cpu")
    assert len(out["samples"]) == 4 and all(
        isinstance(s["completion"], str) for s in out["samples"]
    )

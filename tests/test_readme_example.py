"""The README's "Fine-tune your own base model" example, run as written against the shipped
config: its YAML block is read from README.md, with only the model folder replaced by a tiny
random Llama (its own small byte-level BPE) and the evaluations made small by a second overlay.
The base is measured beside its fine-tune, every evaluation of it in its own tokens."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml
from hf_models import make_model

from conftest import REPO, RESOURCES, make_workdir, planned, snakemake

# the evaluations made small (the example's own defaults are the full HellaSwag and suite)
TINY_EVAL = {
    "val_loss": {"tokens": 4096},
    "hellaswag": {"file": "embedded", "items": 10, "lm_eval": False},
    "suite": {"tasks": ["arc_easy"], "items": 10, "lm_eval": False},
    "samples": {"tokens": 8},
    "chat": {"reply_tokens": 8},
}


def readme_example() -> tuple[dict, list[str]]:
    """The section's YAML block and the arguments of its snakemake command."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Fine-tune your own base model") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```bash\n(snakemake .*?)\n```", section, re.S).group(1)
    return yaml.safe_load(block), shlex.split(command)[1:]


def test_the_readme_command_puts_its_target_before_configfile():
    """Snakemake reads every argument after --configfile as a config file."""
    _, args = readme_example()
    at = args.index("--configfile")
    assert any(a.startswith("results/") for a in args[:at])
    assert not any(a.startswith("results/") for a in args[at:])


def test_the_readme_command_with_the_config_files_ended_by_dashes_plans_the_report(tmp_path):
    """The README's other form, `--configfile A B -- TARGET`, as written: a dry run plans the
    report (argparse ends the list of config files at `--`)."""
    text = (REPO / "README.md").read_text()
    command = re.search(r"`(snakemake [^`]* -- results/[^`]*)`", text).group(1)
    args = shlex.split(command)[1:]
    assert args.index("--") > args.index("--configfile")
    example, _ = readme_example()
    folder = make_model("llama", tmp_path / "my-llama")
    example["models"]["my-llama"]["path"] = str(folder)
    example["runs"]["my-llama-chat"]["base"]["hf"] = str(folder)
    workdir = make_workdir(tmp_path / "wd")
    (workdir / "my.yaml").write_text(yaml.safe_dump(example, sort_keys=False))
    proc = snakemake(workdir, "-n", *args)
    assert "output: results/report_my-llama.html" in proc.stdout + proc.stderr


@pytest.mark.slow  # ~4 min on 2 cores: tokenize, prepare, fine-tune, convert, 14 evaluations
def test_the_readme_fine_tuning_example_runs_and_measures_the_base_in_its_own_tokens(tmp_path):
    from lmpipe.data.tokenizer import load_tokenizer
    from lmpipe.eval import hellaswag, samples
    from lmpipe.eval.suite import data as suite_data
    from lmpipe.eval.suite import native
    from lmpipe.models import load_hf

    example, args = readme_example()
    folder = make_model("llama", tmp_path / "my-llama")
    written = example["models"]["my-llama"]["path"]
    example["models"]["my-llama"]["path"] = str(folder)
    assert example["runs"]["my-llama-chat"]["base"]["hf"] == written
    example["runs"]["my-llama-chat"]["base"]["hf"] = str(folder)
    workdir = make_workdir(tmp_path / "wd")
    (workdir / "my.yaml").write_text(yaml.safe_dump(example, sort_keys=False))
    (workdir / "tiny.yaml").write_text(
        yaml.safe_dump({"runs": {"my-llama-chat": {"eval": TINY_EVAL}}})
    )
    # the README's arguments as written (cores, target, --configfile shipped + my.yaml), then ours
    snakemake(workdir, *args, "tiny.yaml", timeout=1200)

    runs = workdir / "results" / "runs"
    report = (workdir / "results" / "report_my-llama.html").read_text()
    for run in ("my-llama-base", "my-llama-chat"):
        assert f'id="headline-{run}"' in report
    row = re.search(r'<tr id="headline-my-llama-base">(.*?)</tr>', report, re.S).group(1)
    assert "reference: measured, not trained" in row
    base = runs / "my-llama-base"
    evals = sorted(p.stem for p in (base / "eval").glob("*.json"))
    assert evals == [
        "chat_samples", "hellaswag", "samples", "sft_loss", "suite", "val_loss",
    ]  # fmt: skip
    # every evaluation of the base in the Llama's tokens (GPT-2's ids overflow its embedding)
    val = json.loads((base / "eval" / "val_loss.json").read_text())
    assert val["tokens_of"] == "my-llama"
    tok = load_tokenizer(folder)
    model = load_hf(base / "model" / "hf").eval()
    items = RESOURCES / "hellaswag_val_sample.jsonl"
    task = hellaswag.task_data(hellaswag.load_items(items, 10), tok, "llmc")
    ours = native.score_task(model, task, tok, show_progress=False)
    result = json.loads((base / "eval" / "hellaswag.json").read_text())
    assert result["per_item"]["acc"] == ours.acc
    written = json.loads((base / "eval" / "samples.json").read_text())["samples"]
    assert written == samples.sample_completions(model, tok, 8, 50, 42)  # (the defaults k, seed)
    suite = json.loads((base / "eval" / "suite.json").read_text())
    manifest = workdir / "results/data/eval_suite/manifest.json"
    arc = suite_data.load_task(manifest, "arc_easy", 10)
    acc = native.score_task(model, arc, tok, show_progress=False).acc
    assert suite["tasks"]["arc_easy"]["acc"] == pytest.approx(sum(acc) / len(acc))
    # the conversations in the Llama's tokens, beside GPT-2's for the shipped chat run
    assert (workdir / "results/data/vicuna-dummy/sft-my-llama/manifest.json").is_file()
    shipped = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    jobs = planned(
        workdir,
        shipped | {"models": shipped["models"] | example["models"],
                   "runs": shipped["runs"] | example["runs"]},
        ["results/runs/embedded-a-chat/train/final", "results/runs/my-llama-chat/train/final"],
    )  # fmt: skip
    assert ("prepare_conversations", "dataset=vicuna-dummy") in jobs
    assert ("prepare_conversations_for_model", "dataset=vicuna-dummy, model=my-llama") not in jobs


def test_a_reference_folder_is_scored_in_its_own_tokenizer(tmp_path):
    """A folder with no lmpipe_arch (a reference run's Hugging Face model) takes its own
    tokenizer; our GPT-2-tokenized architectures take GPT-2's; a folder with no tokenizer files
    takes GPT-2's only at GPT-2's vocabulary, else one line naming it."""
    from conftest import TOKENIZER_DIR
    from lmpipe.data.tokenizer import HFTokenizer, model_tokenizer

    folder = make_model("llama", tmp_path / "llama")
    tok = model_tokenizer(folder, TOKENIZER_DIR)
    assert isinstance(tok, HFTokenizer) and tok.name.startswith("hf ") and tok.n_vocab < 50257
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "config.json").write_text(json.dumps({"lmpipe_arch": "gpt2", "vocab_size": 50257}))
    assert model_tokenizer(ours, TOKENIZER_DIR).name == "gpt2"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50257}))
    assert model_tokenizer(bare, TOKENIZER_DIR).name == "gpt2"
    (bare / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 2048}))
    with pytest.raises(FileNotFoundError, match=rf"{bare}: no tokenizer files"):
        model_tokenizer(bare, TOKENIZER_DIR)

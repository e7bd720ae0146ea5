# Config validation and the short input/param functions the rules share.
# Arithmetic and config slicing live in lmpipe.config (torch-free, covered by pytest).

import os
import shlex
import sys

from snakemake.utils import validate

# The rules run `python -m lmpipe.<stage>`: make the package importable without installing it
# (e.g. in a conda env made from envs/*.yaml), here and in every job's shell.
LMPIPE_SRC = os.path.join(workflow.basedir, "workflow")
sys.path.insert(0, LMPIPE_SRC)
# (the prefix is formatted like a shell command: doubled braces are the shell's own)
shell.prefix(
    "export PYTHONPATH=" + shlex.quote(LMPIPE_SRC) + "${{PYTHONPATH:+:$PYTHONPATH}}; "
)

from lmpipe import config as lmconfig

validate(config, "../schemas/config.schema.yaml")
lmconfig.check_config(config)
LAYOUT = lmconfig.layout(config)
# `train` makes pretraining runs, `sft` (sft.smk) fine-tuning runs: never both for one run
SFT_RUNS = "|".join(r for r in config["runs"] if lmconfig.is_sft(config, r)) or "^$"
PRETRAIN_RUNS = (
    "|".join(r for r in config["runs"] if not lmconfig.is_sft(config, r)) or "^$"
)


wildcard_constraints:
    dataset="|".join(config["datasets"]) or "^$",
    run="|".join(config["runs"]) or "^$",
    report="|".join(config["reports"]) or "^$",


def get_run(wildcards):
    return lmconfig.run_config(config, wildcards.run)


def get_dataset_of_run(wildcards):
    """The text dataset of a run (an SFT run's is its base's): training and the val loss."""
    return lmconfig.text_dataset(config, wildcards.run)


def get_tokens_manifest(wildcards):
    return LAYOUT.tokens_manifest(get_dataset_of_run(wildcards))


def get_hellaswag_file(wildcards):
    return config["hellaswag"][get_run(wildcards).eval.hellaswag]


def is_local_dataset(dataset):
    return config["datasets"][dataset]["source"] == "local"


def get_eval_outputs(run):
    """The eval files a run produces (lm-eval only where the run's eval settings ask for it)."""
    names = ["val_loss", "hellaswag", "samples"]
    if lmconfig.run_config(config, run).eval.lm_eval:
        names.append("hellaswag_lm_eval")
    if lmconfig.chat_dataset(config, run):  # an SFT run or its base (sft.smk)
        names += ["sft_loss", "chat_samples"]
    return [LAYOUT.eval_file(run, n) for n in names]


def get_report_inputs(wildcards):
    runs = config["reports"][wildcards.report]["runs"]
    finals = [LAYOUT.final_checkpoint(r) for r in runs]
    evals = [f for r in runs for f in get_eval_outputs(r)]
    manifests = sorted(
        {LAYOUT.tokens_manifest(lmconfig.text_dataset(config, r)) for r in runs}
    )
    return finals + evals + manifests


# SLURM resources of the training rules (train, sft), from a run's launch settings


def get_train_gres(wildcards):
    """GPUs a node (--gres=gpu[:model]:N) for a CUDA run; None (no GPUs) for a CPU run."""
    launch = get_run(wildcards).launch
    if launch.device != "cuda":
        return None
    model = f"{launch.gpu_model}:" if launch.gpu_model else ""
    return f"gpu:{model}{launch.procs_per_node}"


def get_train_tasks(wildcards):
    """Several nodes: one task (one torchrun) a node; one node: the plugin's default."""
    nodes = get_run(wildcards).launch.nodes
    return nodes if nodes > 1 else None


def get_train_signal(wildcards):
    """SIGTERM to the job steps signal_seconds before the time limit: checkpoint, fail, retry."""
    return f"--signal=TERM@{get_run(wildcards).launch.signal_seconds}"


# ---- chat fine-tuning (sft.smk) ----

CONVERSATION_DATASETS = (
    "|".join(d for d in config["datasets"] if lmconfig.is_conversations(config, d))
    or "^$"
)
CHAT_EVAL_RUNS = (
    "|".join(r for r in config["runs"] if lmconfig.chat_dataset(config, r)) or "^$"
)


def get_conversations_source(wildcards):
    """The local ShareGPT file (a change reruns the preparation); none for a hub dataset."""
    d = config["datasets"][wildcards.dataset]
    return d["path"] if d["source"] == "local" else []


def get_sft_base(wildcards):
    """The initial weights: the base run's final checkpoint, or a Hugging Face folder."""
    base = get_run(wildcards).base
    return LAYOUT.final_checkpoint(base.run) if base.run else base.hf


def get_chat_manifest(wildcards):
    return LAYOUT.sft_manifest(lmconfig.chat_dataset(config, wildcards.run))

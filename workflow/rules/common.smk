# Config validation and the short input/param functions the rules share.
# Arithmetic, config slicing and the lists of pluggable parts live in torch-free lmpipe modules
# (lmpipe.config, lmpipe.registry), covered by pytest.

import os
import re
import shlex
import sys

from snakemake_interface_executor_plugins.settings import DeploymentMethod


def job_path():
    """What every job's shell puts first on PATH, so that its `python -m lmpipe.<stage>` is the
    interpreter Snakemake runs under whatever PATH holds (a shell without the venv activated, a
    cluster job's login PATH): that interpreter's folder (a venv's or conda env's bin/, which
    holds its `python`). Nothing under --use-conda or in a container: the env's own `python`.
    """
    methods = set(workflow.deployment_settings.deployment_method)
    if {DeploymentMethod.CONDA, DeploymentMethod.APPTAINER} & methods:
        return ""
    return f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH; "


# The rules run `python -m lmpipe.<stage>`: make the package importable without installing it
# (e.g. in a conda env made from envs/*.yaml), here and in every job's shell.
LMPIPE_SRC = os.path.join(workflow.basedir, "workflow")
sys.path.insert(0, LMPIPE_SRC)
# (the prefix is formatted like a shell command: doubled braces are the shell's own)
shell.prefix(
    f"{job_path()}export PYTHONPATH={shlex.quote(LMPIPE_SRC)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
)

from lmpipe import config as lmconfig
from lmpipe import costs as lmcosts
from lmpipe import failures as lmfailures
from lmpipe import hf_config as lmhfconfig
from lmpipe import job_params as lmjobparams
from lmpipe import plan as lmplan
from lmpipe import resources as lmresources
from lmpipe import schema as lmschema
from lmpipe import stale as lmstale
from lmpipe import sweeps as lmsweeps
from lmpipe.registry import EVALUATIONS

# An `arch: hf` model's shape is measured once (lmpipe.hf_config) and kept in the results folder
lmhfconfig.cache_shapes_in(
    os.path.join(
        (config.get("paths") or {}).get("results", "results"), ".cache", "hf_shapes"
    )
)

# Snakemake's validate() against the schema generated from the settings' dataclasses, then the
# registry's names and the
# cross-field checks; an error is one line naming the YAML path (lmpipe.schema.validate). The
# sweeps are expanded into ordinary runs (and their reports sweep-<name>) here, before any rule
# reads `runs:`: a point is trained, cached and submitted like any run (lmpipe.sweeps).
lmschema.validate(config)
LAYOUT = lmconfig.layout(config)

# An output missing while a job that reads it is on disk (removed by hand, by a scratch purge or
# by a failed job), or one half-written, is rebuilt with what follows it, not left stale: Snakemake
# alone says "Nothing to be done" (lmpipe.stale hooks into its DAG; one line each on the console)
lmstale.install(workflow)


def params_file(text):
    """`@FILE`, the file that holds the JSON `text`, for a job's argparse to read in its place
    (lmpipe.job_params): a shell command, and what a dry run prints, names the file instead of
    holding the JSON. A dry run writes no file."""
    folder, dry = LAYOUT.params_dir(), workflow.dryrun
    return lmjobparams.params_file(text, folder, write=not dry)


def as_file(params):
    """A param function: the `params_file` of `params(wildcards)`. The JSON stays a param of
    its own beside it: Snakemake's rerun trigger compares that."""
    return lambda wildcards: params_file(params(wildcards))


# the jobs' settings (lmpipe.config's *_params): each a param, and its file (as_file)


def get_train_params(wildcards):
    """The train job's settings (lmpipe.config.train_params): its param, its file's content."""
    return lmconfig.train_params(config, wildcards.run)


def get_eval_params(wildcards):
    return lmconfig.eval_params(config, wildcards.run, wildcards.eval)


def get_report_params(wildcards):
    """A report's runs and their settings; a sweep's, its points' swept values too."""
    return lmsweeps.report_params(config, wildcards.report)


def get_report_plan(wildcards):
    """The plan's estimates the report shows beside each run (lmpipe.plan.report_plan)."""
    return lmplan.report_plan(config, wildcards.report)


def one_of(names):
    """A wildcard's constraint: exactly one of `names` (a sweep's point names hold . / = +)."""
    return "|".join(re.escape(n) for n in names) or "^$"


wildcard_constraints:
    dataset=one_of(config["datasets"]),
    run=one_of(config["runs"]),
    report=one_of(config["reports"]),
    eval=one_of(EVALUATIONS),


# reference runs (train: null: a Hugging Face model evaluated, never trained) and the others
REFERENCE_RUNS = [r for r in config["runs"] if lmconfig.is_reference(config, r)]
TRAINED_RUNS = [r for r in config["runs"] if r not in REFERENCE_RUNS]


def get_run(wildcards):
    return lmconfig.run_config(config, wildcards.run)


def get_tokenize_inputs(wildcards):
    """The raw files; when the dataset is tokenized in parts (lmpipe.resources.tokenize_parts), the
    parts' token streams too, which the shards are cut from."""
    inputs = {"raw": LAYOUT.raw_manifest(wildcards.dataset)}
    parts = lmresources.tokenize_parts(config, wildcards.dataset, get_node_cpus())
    if parts > 1:
        inputs["parts"] = [
            LAYOUT.token_part(wildcards.dataset, i) for i in range(parts)
        ]
    return inputs


# the datasets tokenized into shards, and the mixtures of them (each with a manifest of its own,
# lmpipe.data.mixture); a wildcard of one is never the other's
MIXTURES = [d for d in config["datasets"] if lmconfig.is_mixture(config, d)]
TOKENIZED = [d for d in config["datasets"] if d not in MIXTURES]


# the `arch: hf` models whose runs read text in the model's own tokens (tokenize_for_model)
HF_TOKENIZING_MODELS = lmconfig.tokenizing_models(config)
# ... and those whose runs read conversations in their own tokens (sft-{model}, sft-tok-{name})
CHAT_TOKENIZING_MODELS = sorted(
    {m for _, m in lmconfig.conversation_tokenizings(config) if m is not None}
)


def get_hub_model_input(model):
    """A hub model's download (its tokenizer and weights come from it); none for a folder."""
    return LAYOUT.hub_model_dir(model) if model in lmconfig.hub_models(config) else []


def get_tokenizer_input(key):
    """What tokens_of's answer `key` is tokenized with, where a job makes it: a trained
    tokenizer's folder, a hub model's download; none for a local folder."""
    if (name := lmconfig.trained_tokenizer(key)) is not None:
        return LAYOUT.tokenizer_dir(name)
    return get_hub_model_input(key)


def get_run_tokenizer_input(wildcards):
    """A run's trained tokenizer's folder (its export carries it); none for another's."""
    key = lmconfig.tokens_of(config, wildcards.run)
    return (
        LAYOUT.tokenizer_dir(name) if (name := lmconfig.trained_tokenizer(key)) else []
    )


def get_mixture_inputs(wildcards):
    """Each source's tokens manifest, by source name: GPT-2's tokens, or the model's own."""
    sources = config["datasets"][wildcards.dataset]["mixture"]
    model = wildcards.get("model")
    return {name: LAYOUT.tokens_manifest(name, model) for name in sources}


def get_mixture_sources_arg(wildcards, input):
    return " ".join(
        f"--source {shlex.quote(f'{name}={path}')}" for name, path in input.items()
    )


def get_from_parts_arg(wildcards, input):
    parts = input.get("parts")
    return "--from-parts " + " ".join(shlex.quote(p) for p in parts) if parts else ""


def get_conversations_source(wildcards):
    """The local ShareGPT file (a change reruns the preparation; none for a hub dataset), and
    the tokenizer that prepares them where a job makes it: a trained tokenizer's folder (a
    retrained one re-prepares them), a hub model's download."""
    d = config["datasets"][wildcards.dataset]
    inputs = {"source": d["path"]} if d["source"] == "local" else {}
    tok = get_tokenizer_input(wildcards.model) if wildcards.get("model") else []
    return inputs | ({"tokenizer": tok} if tok else {})


def get_eval_outputs(run):
    """The result files of a run's evaluations (lmpipe.registry, as its settings select)."""
    return [LAYOUT.eval_file(run, e) for e in lmconfig.evaluations_of(config, run)]


def get_llmc_final(wildcards):
    """The final checkpoint of a run whose architecture llm.c's format holds (GPT-2: a report's
    runs of it get model/llmc.bin too). Asked of another (a target model/llmc.bin of a modern
    run), an error naming the run, its model and arch, before any job starts."""
    lmconfig.check_llmc_export(config, wildcards.run)
    return LAYOUT.final_checkpoint(wildcards.run)


def get_report_inputs(wildcards):
    runs = config["reports"][wildcards.report]["runs"]
    trained = [r for r in runs if r in TRAINED_RUNS]
    finals = [LAYOUT.final_checkpoint(r) for r in trained]
    finals += [LAYOUT.llmc_file(r) for r in trained if lmconfig.exports_llmc(config, r)]
    finals += [LAYOUT.hf_dir(r) for r in runs if r in REFERENCE_RUNS]
    evals = [f for r in runs for f in get_eval_outputs(r)]
    manifests = sorted({lmconfig.text_tokens(config, r) for r in runs})
    return finals + evals + manifests + lmconfig.task_bytes_files(config, runs)


# ---- train (train.smk): pretraining and fine-tuning runs, one rule ----


def get_train_inputs(wildcards):
    """The data (token shards, or a fine-tuning run's conversations); for fine-tuning, the
    starting weights: the base run's final checkpoint or a Hugging Face folder; and the files
    the evaluations during training read, by kind, as their evaluate jobs get them
    (lmpipe.config.in_training: those whose section's during_training is on)."""
    run = get_run(wildcards)
    # (an `arch: hf` model's text: its own tokens, its folder's weights)
    if not run.fine_tuning:
        inputs = {"data": lmconfig.text_tokens(config, wildcards.run)}
        if hub := get_hub_model_input(config["runs"][wildcards.run]["model"]):
            inputs["model"] = hub
        # a trained tokenizer: the tasks of its evaluations during training are in its tokens
        if tokenizer := get_run_tokenizer_input(wildcards):
            inputs["tokenizer"] = tokenizer
    else:
        base = lmconfig.base_source(config, wildcards.run)
        inputs = {"data": lmconfig.chat_tokens(config, wildcards.run), "init": base}
        # the base's text, replayed in each step (lmpipe.chat.replay)
        if run.sft.replay:
            inputs["replay"] = lmconfig.text_tokens(config, wildcards.run)
    for name in lmconfig.in_training(run):
        for kind in EVALUATIONS[name].inputs:
            inputs[kind] = lmconfig.INPUT_FILES[kind](config, wildcards.run)
    return inputs


def get_base_args(wildcards, input):
    """`--init` (the base's weights) and `--replay` (its text), where a fine-tuning run has them."""
    flags = {"init": "--init", "replay": "--replay"}
    return " ".join(
        f"{flag} {shlex.quote(input[kind])}"
        for kind, flag in flags.items()
        if kind in input.keys()
    )


def get_train_eval_input_args(wildcards, input):
    """`--eval-input kind=path ...`: the inputs of the evaluations during training."""
    pairs = [
        f"{kind}={path}"
        for kind, path in input.items()
        if kind not in ("data", "init", "replay", "model")
    ]
    return " ".join(f"--eval-input {shlex.quote(pair)}" for pair in pairs)


def get_wandb_arg(wildcards, input):
    """`--wandb @FILE` (its JSON's) when the run sets logging.wandb. It takes `input` on
    purpose: Snakemake counts such a param as derived from the inputs and leaves it out of its
    rerun check, so switching W&B on or off never retrains a finished run
    (tests/test_sweep_caching.py)."""
    settings = lmconfig.wandb_settings(config, wildcards.run)
    if not settings:
        return ""
    return f"--wandb {shlex.quote(params_file(settings))}"


# SLURM resources of tokenize, convert and evaluate: derived by lmpipe.resources from the run (one GPU
# of its kind for a GPU run's convert and evaluate) and from measured throughputs (the time limit:
# twice the estimate plus 10 minutes), a tokenize job's CPUs at most a node's of the cluster
# (slurm.smk's get_node_cpus); `python -m lmpipe.plan` prints them


def get_derived(wildcards, rule, key):
    name = (
        wildcards.get("dataset") or wildcards.get("model") or wildcards.get("run", "")
    )
    # (tokenize's CPUs are capped at the cluster's largest node: slurm.smk reads sinfo for them)
    cpus = get_node_cpus() if rule.startswith("tokenize") else None
    evaluation = wildcards.get("eval", "")
    return lmresources.job_resources(config, rule, name, evaluation, cpus)[key]


# SLURM resources of the train rule, from a run's launch settings


def get_train_priority(wildcards):
    """Longer trainings first (lmpipe.resources.train_priority: their FLOPs, log scale)."""
    return lmresources.train_priority(config, wildcards.run)


def get_train_gres(wildcards):
    """GPUs a node (--gres=gpu[:model]:N) for a CUDA run; None (no GPUs) for a CPU run."""
    launch = get_run(wildcards).launch
    return launch.gres(launch.procs_per_node)


def get_train_tasks(wildcards):
    """Several nodes: one task (one torchrun) a node; one node: the plugin's default."""
    nodes = get_run(wildcards).launch.nodes
    return nodes if nodes > 1 else None


def get_train_signal(wildcards):
    """SIGTERM to the job steps signal_seconds before the time limit: checkpoint, fail, retry."""
    return f"--signal=TERM@{get_run(wildcards).launch.signal_seconds}"


# ---- evaluate (evaluate.smk): one rule, an evaluation a job ----


def get_eval_inputs(wildcards):
    """The converted model and the files the evaluation reads, by kind (its registry entry's
    inputs, each kind's path lmpipe.config.INPUT_FILES's)."""
    inputs = {"model": LAYOUT.hf_dir(wildcards.run)}
    return inputs | lmconfig.eval_inputs(config, wildcards.run, wildcards.eval)


def get_eval_input_args(wildcards, input):
    """`--tokens M --hellaswag F ...`: the inputs besides the model, as lmpipe.eval takes them."""
    return " ".join(
        f"--{kind} {shlex.quote(path)}"
        for kind, path in input.items()
        if kind != "model"
    )


def task_bytes_key(wildcards):
    """The tokens_of answer a task_bytes file names (`gpt2`: None, GPT-2's)."""
    return None if wildcards.tokens == "gpt2" else wildcards.tokens

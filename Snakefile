# lmpipe: raw text -> tokens -> GPT-2 (torchrun + FSDP) -> HF/llm.c export -> evals -> report.
# docs/architecture.md describes the DAG, the lmpipe packages behind each rule and their files.
#
# What it writes (paths from config `paths:`; defaults shown):
#   results/data/{dataset}/raw/          download: raw parquet/jsonl + manifest.json
#   results/data/{dataset}/tokens/       tokenize: llm.c shards + manifest.json
#   results/data/{dataset}/sft/          prepare_conversations: masked chat rows + manifest.json
#   results/runs/{run}/train/            train (pretraining or fine-tuning): metrics.jsonl, tb/,
#                                        checkpoints/ (not outputs), final/
#   results/runs/{run}/model/            convert: hf/ (transformers folder), llmc.bin
#   results/runs/{run}/eval/{eval}.json  evaluate: one a lmpipe.registry evaluation
#   results/report_{report}.html         report: one self-contained HTML file
#   results/logs/{stage}/...             one log a job
#
# Default target: the embedded report (CPU, offline). On a cluster:
#   snakemake --profile slurm results/report_124m.html

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/slurm.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/convert.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


# under --profile slurm, before the first submission: a job that no partition can hold is
# refused, and a watch names a submitted job that pends for good (slurm.smk)
onstart:
    slurm_onstart()


# a failed job's cause on the console: the first error line of its log (a train job stopped by
# a signal, Ctrl-C included: its run and the step of its checkpoint; lmpipe.failures). Snakemake
# calls it after a Ctrl-C too, once it has waited for its running jobs. What a failed job leaves
# missing is rebuilt by the next run, with what reads it (lmpipe.stale, common.smk)
onerror:
    lmfailures.report(log)


rule all:
    default_target: True
    input:
        LAYOUT.report("embedded"),

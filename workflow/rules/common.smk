# Config validation and the short input/param functions the rules share.
# Arithmetic and config slicing live in lmpipe.config (torch-free, covered by pytest).

import os
import sys

from snakemake.utils import validate

# The rules run `python -m lmpipe.<stage>`: make the package importable without installing it
# (e.g. in a conda env made from envs/*.yaml), for this process and every job it starts.
LMPIPE_SRC = os.path.join(workflow.basedir, "workflow")
sys.path.insert(0, LMPIPE_SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (LMPIPE_SRC, os.environ.get("PYTHONPATH")) if p
)

from lmpipe import config as lmconfig

validate(config, "../schemas/config.schema.yaml")
lmconfig.check_config(config)
LAYOUT = lmconfig.layout(config)


wildcard_constraints:
    dataset="|".join(config["datasets"]) or "^$",
    run="|".join(config["runs"]) or "^$",
    report="|".join(config["reports"]) or "^$",


def get_run(wildcards):
    return lmconfig.run_config(config, wildcards.run)


def get_dataset_of_run(wildcards):
    return config["runs"][wildcards.run]["dataset"]


def get_tokens_manifest(wildcards):
    return LAYOUT.tokens_manifest(get_dataset_of_run(wildcards))


def get_hellaswag_file(wildcards):
    return config["hellaswag"][get_run(wildcards).eval.hellaswag]


def is_local_dataset(dataset):
    return config["datasets"][dataset]["source"] == "local"

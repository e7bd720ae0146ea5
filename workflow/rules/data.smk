# Data stages: the downloads, tokenize, and the preparation of a `kind: conversations` dataset
# for chat fine-tuning.
#
# Under a cluster executor the downloads are jobs of their own, with a time limit from their
# estimate (slurm/config.yaml sends them to LMPIPE_DOWNLOAD_PARTITION: a partition whose nodes
# reach the internet), or, with `cluster.downloads: local`, they run where Snakemake runs (a
# login node): compute nodes often have no internet. Locally, every job runs here anyway.
DOWNLOADS_HERE = lmcosts.download_here(config)


localrules:
    mixture,


rule download:
    output:
        manifest=LAYOUT.raw_manifest("{dataset}"),
    log:
        LAYOUT.log("download", "{dataset}"),
    benchmark:
        LAYOUT.benchmark("download", "{dataset}")
    localrule: DOWNLOADS_HERE
    conda:
        "../../envs/data.yaml"
    resources:
        mem_mb=lambda wc: get_derived(wc, "download", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "download", "runtime"),
    params:
        cfg=lambda wc: lmconfig.download_params(config, wc.dataset),
        out=lambda wc: LAYOUT.raw_dir(wc.dataset),
    shell:
        "python -m lmpipe.data download --config-json {params.cfg:q} --out {params.out:q}"
        " > {log} 2>&1"


rule download_hellaswag:
    output:
        config["hellaswag"].get("full", "results/data/hellaswag/hellaswag_val.jsonl"),
    log:
        LAYOUT.log("download", "hellaswag"),
    localrule: DOWNLOADS_HERE
    conda:
        "../../envs/data.yaml"
    resources:
        mem_mb=lambda wc: get_derived(wc, "download_hellaswag", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "download_hellaswag", "runtime"),
    shell:
        "python -m lmpipe.data download --hellaswag --out {output:q} > {log} 2>&1"


rule download_suite:
    output:
        LAYOUT.suite_manifest(),
    log:
        LAYOUT.log("download", "eval_suite"),
    localrule: DOWNLOADS_HERE
    conda:
        "../../envs/data.yaml"
    resources:
        mem_mb=lambda wc: get_derived(wc, "download_suite", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "download_suite", "runtime"),
    shell:
        "python -m lmpipe.eval.suite.data --out {output:q} > {log} 2>&1"


# a hub model of `models:` (arch hf): safetensors, config and tokenizer files at the pinned
# revision (lmpipe.models.hub); the only time a model downloads
rule download_model:
    output:
        directory(LAYOUT.hub_model_dir("{model}")),
    log:
        LAYOUT.log("download", "model/{model}"),
    benchmark:
        LAYOUT.benchmark("download", "model/{model}")
    wildcard_constraints:
        model=one_of(lmconfig.hub_models(config)),
    localrule: DOWNLOADS_HERE
    conda:
        "../../envs/convert.yaml"
    resources:
        mem_mb=lambda wc: get_derived(wc, "download_model", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "download_model", "runtime"),
    params:
        cfg=lambda wc: lmconfig.download_model_params(config, wc.model),
    shell:
        "python -m lmpipe.models.hub --config-json {params.cfg:q} --out {output:q} > {log} 2>&1"


# a byte-level BPE of `tokenizers:`, trained on a text dataset's training text
# (lmpipe.data.train_tokenizer); its settings are a param: a change retrains it, retokenizes its
# models' text and retrains their runs, nothing else
rule train_tokenizer:
    input:
        raw=lambda wc: LAYOUT.raw_manifest(
            config["tokenizers"][wc.tokenizer]["dataset"]
        ),
    output:
        directory(LAYOUT.tokenizer_dir("{tokenizer}")),
    log:
        LAYOUT.log("train_tokenizer", "{tokenizer}"),
    benchmark:
        LAYOUT.benchmark("train_tokenizer", "{tokenizer}")
    wildcard_constraints:
        tokenizer=one_of(list(config["tokenizers"])),
    conda:
        "../../envs/data.yaml"
    params:
        cfg=lambda wc: lmconfig.tokenizer_params(config, wc.tokenizer),
    shell:
        "python -m lmpipe.data train_tokenizer --config-json {params.cfg:q}"
        " --raw-manifest {input.raw:q} --out {output:q} > {log} 2>&1"


rule tokenize_part:
    input:
        raw=LAYOUT.raw_manifest("{dataset}"),
    output:
        temp(LAYOUT.token_part("{dataset}", "{part}")),
    log:
        LAYOUT.log("tokenize", "{dataset}/part_{part}"),
    benchmark:
        LAYOUT.benchmark("tokenize", "{dataset}/part_{part}")
    wildcard_constraints:
        part=r"\d{3}",
    conda:
        "../../envs/data.yaml"
    threads: lambda wc: get_derived(wc, "tokenize_part", "cpus")
    resources:
        mem_mb=lambda wc: get_derived(wc, "tokenize_part", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "tokenize_part", "runtime"),
    params:
        cfg=lambda wc: lmconfig.tokenize_params(config, wc.dataset),
        parts=lambda wc: lmresources.tokenize_parts(config, wc.dataset, get_node_cpus()),
        tokenizer=config["tokenizer"],
    shell:
        "python -m lmpipe.data tokenize --config-json {params.cfg:q} --raw-manifest {input.raw:q}"
        " --tokenizer {params.tokenizer:q} --part {wildcards.part} --parts {params.parts}"
        " --out {output:q} --workers {threads} > {log} 2>&1"


rule tokenize:
    input:
        unpack(get_tokenize_inputs),
    output:
        manifest=LAYOUT.tokens_manifest("{dataset}"),
    log:
        LAYOUT.log("tokenize", "{dataset}"),
    benchmark:
        LAYOUT.benchmark("tokenize", "{dataset}")
    wildcard_constraints:
        dataset=one_of(TOKENIZED),
    conda:
        "../../envs/data.yaml"
    # a node's CPUs (scaled down to --cores when run locally, to the cluster's largest node under
    # SLURM), memory and time (lmpipe.resources)
    threads: lambda wc: get_derived(wc, "tokenize", "cpus")
    resources:
        mem_mb=lambda wc: get_derived(wc, "tokenize", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "tokenize", "runtime"),
    params:
        cfg=lambda wc: lmconfig.tokenize_params(config, wc.dataset),
        out=lambda wc: LAYOUT.tokens_dir(wc.dataset),
        tokenizer=config["tokenizer"],
        from_parts=get_from_parts_arg,
    shell:
        "python -m lmpipe.data tokenize --config-json {params.cfg:q} --raw-manifest {input.raw:q}"
        " --tokenizer {params.tokenizer:q} --out {params.out:q} --workers {threads}"
        " {params.from_parts} > {log} 2>&1"


# a text dataset in an `arch: hf` model's own tokens (its continued pretraining, its val loss),
# or in a trained tokenizer's (`{model}` is then `tok-{name}`: lmpipe.config.tokens_of):
# tokens-{model}/ beside GPT-2's tokens/; the tokenizer's files (or a hub model's pinned
# revision, or a trained one's settings) are a param, so a changed tokenizer reruns this and
# nothing else does
rule tokenize_for_model:
    input:
        raw=LAYOUT.raw_manifest("{dataset}"),
        model=lambda wc: get_tokenizer_input(wc.model),
    output:
        manifest=LAYOUT.tokens_manifest("{dataset}", "{model}"),
    log:
        LAYOUT.log("tokenize", "{dataset}/{model}"),
    benchmark:
        LAYOUT.benchmark("tokenize", "{dataset}/{model}")
    wildcard_constraints:
        dataset=one_of(TOKENIZED),
        model=one_of(HF_TOKENIZING_MODELS),
    conda:
        "../../envs/data.yaml"
    threads: lambda wc: get_derived(wc, "tokenize", "cpus")
    resources:
        mem_mb=lambda wc: get_derived(wc, "tokenize", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "tokenize", "runtime"),
    params:
        cfg=lambda wc: lmconfig.tokenize_params(config, wc.dataset),
        tokenizer=lambda wc: lmconfig.tokenizer_folder(config, wc.model),
        identity=lambda wc: lmconfig.tokenizer_key(
            config, lmconfig.tokenizer_folder(config, wc.model)
        ),
        out=lambda wc: LAYOUT.tokens_dir(wc.dataset, wc.model),
    shell:
        "python -m lmpipe.data tokenize --config-json {params.cfg:q} --raw-manifest {input.raw:q}"
        " --tokenizer {params.tokenizer:q} --tokens-of {wildcards.model:q}"
        " --out {params.out:q} --workers {threads} > {log} 2>&1"


# a mixture of tokenized datasets: its manifest names each source's and its weight; changing a
# weight rewrites it (and reruns the trainings on it), never a source's tokenizing
rule mixture:
    input:
        unpack(get_mixture_inputs),
    output:
        manifest=LAYOUT.tokens_manifest("{dataset}"),
    log:
        LAYOUT.log("mixture", "{dataset}"),
    wildcard_constraints:
        dataset=one_of(MIXTURES),
    conda:
        "../../envs/data.yaml"
    params:
        weights=lambda wc: lmconfig.mixture_params(config, wc.dataset),
        sources=get_mixture_sources_arg,
    shell:
        "python -m lmpipe.data mixture --dataset {wildcards.dataset:q}"
        " --weights-json {params.weights:q} {params.sources}"
        " --out {output.manifest:q} > {log} 2>&1"


# ... and in an `arch: hf` model's own tokens (tokens-{model}/ of each source)
use rule mixture as mixture_for_model with:
    input:
        unpack(get_mixture_inputs),
    output:
        manifest=LAYOUT.tokens_manifest("{dataset}", "{model}"),
    log:
        LAYOUT.log("mixture", "{dataset}/{model}"),
    wildcard_constraints:
        dataset=one_of(MIXTURES),
        model=one_of(HF_TOKENIZING_MODELS),


# conversations as masked rows, in GPT-2's tokens (sft/), an `arch: hf` model's own
# (sft-{model}/) or a trained tokenizer's (sft-tok-{name}/): one dataset entry serves every base,
# prepared once per tokenizer
rule prepare_conversations:
    input:
        unpack(get_conversations_source),
    output:
        manifest=LAYOUT.conversations_manifest("{dataset}"),
    log:
        LAYOUT.log("prepare_conversations", "{dataset}"),
    benchmark:
        LAYOUT.benchmark("prepare_conversations", "{dataset}")
    conda:
        "../../envs/data.yaml"
    params:
        cfg=lambda wc: lmconfig.conversations_params(config, wc.dataset),
        out=lambda wc: LAYOUT.conversations_dir(wc.dataset),
        tokenizer=config["tokenizer"],
    shell:
        # the module itself, not the chat package's command line: its other commands need
        # torch, which the data env has not
        "python -m lmpipe.chat.data --config-json {params.cfg:q}"
        " --tokenizer {params.tokenizer:q} --out {params.out:q} > {log} 2>&1"


use rule prepare_conversations as prepare_conversations_for_model with:
    input:
        unpack(get_conversations_source),
    output:
        manifest=LAYOUT.conversations_manifest("{dataset}", "{model}"),
    log:
        LAYOUT.log("prepare_conversations", "{dataset}/{model}"),
    benchmark:
        LAYOUT.benchmark("prepare_conversations", "{dataset}/{model}")
    wildcard_constraints:
        model=one_of(CHAT_TOKENIZING_MODELS),
    params:
        # the tokenizer's identity is in cfg: a changed one reruns this, nothing else does
        cfg=lambda wc: lmconfig.conversations_params(config, wc.dataset, wc.model),
        out=lambda wc: LAYOUT.conversations_dir(wc.dataset, wc.model),
        tokenizer=lambda wc: lmconfig.conversations_tokenizer(config, wc.model),

# Data stages: download (local rule: compute nodes often have no internet) and tokenize.


localrules:
    download,
    download_hellaswag,


rule download:
    output:
        manifest=LAYOUT.raw_manifest("{dataset}"),
    log:
        LAYOUT.log("download", "{dataset}"),
    benchmark:
        LAYOUT.benchmark("download", "{dataset}")
    conda:
        "../../envs/data.yaml"
    params:
        cfg=lambda wc: lmconfig.download_params(config, wc.dataset),
        out=lambda wc: LAYOUT.raw_dir(wc.dataset),
    shell:
        "python -m lmpipe.download --config-json {params.cfg:q} --out {params.out:q} > {log} 2>&1"


rule download_hellaswag:
    output:
        config["hellaswag"].get("full", "results/data/hellaswag/hellaswag_val.jsonl"),
    log:
        LAYOUT.log("download", "hellaswag"),
    conda:
        "../../envs/data.yaml"
    shell:
        "python -m lmpipe.download --hellaswag --out {output:q} > {log} 2>&1"


rule tokenize:
    input:
        raw=LAYOUT.raw_manifest("{dataset}"),
    output:
        manifest=LAYOUT.tokens_manifest("{dataset}"),
    log:
        LAYOUT.log("tokenize", "{dataset}"),
    benchmark:
        LAYOUT.benchmark("tokenize", "{dataset}")
    conda:
        "../../envs/data.yaml"
    threads: 16  # scaled down to --cores when run locally
    params:
        cfg=lambda wc: lmconfig.tokenize_params(config, wc.dataset),
        out=lambda wc: LAYOUT.tokens_dir(wc.dataset),
        tokenizer=config["tokenizer"],
    shell:
        "python -m lmpipe.tokenize --config-json {params.cfg:q} --raw-manifest {input.raw:q}"
        " --tokenizer {params.tokenizer:q} --out {params.out:q} --workers {threads} > {log} 2>&1"

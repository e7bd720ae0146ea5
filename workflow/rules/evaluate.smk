# Evaluate the converted model: FineWeb val loss, HellaSwag (native, llm.c scoring), HellaSwag
# through lm-eval, sample generations. Each writes one small JSON file under eval/.


rule evaluate_loss:
    input:
        hf=LAYOUT.hf_dir("{run}"),
        tokens=get_tokens_manifest,
    output:
        LAYOUT.eval_file("{run}", "val_loss"),
    log:
        LAYOUT.log("evaluate_loss", "{run}"),
    benchmark:
        LAYOUT.benchmark("evaluate_loss", "{run}")
    conda:
        "../../envs/evaluate.yaml"
    threads: 2
    params:
        cfg=lambda wc: lmconfig.eval_params(config, wc.run),
    shell:
        "python -m lmpipe.evaluate loss --config-json {params.cfg:q} --model {input.hf:q}"
        " --tokens-manifest {input.tokens:q} --out {output:q} > {log} 2>&1"


rule evaluate_hellaswag:
    input:
        hf=LAYOUT.hf_dir("{run}"),
        hellaswag=get_hellaswag_file,
    output:
        LAYOUT.eval_file("{run}", "hellaswag"),
    log:
        LAYOUT.log("evaluate_hellaswag", "{run}"),
    benchmark:
        LAYOUT.benchmark("evaluate_hellaswag", "{run}")
    conda:
        "../../envs/evaluate.yaml"
    threads: 2
    params:
        cfg=lambda wc: lmconfig.eval_params(config, wc.run),
    shell:
        "python -m lmpipe.evaluate hellaswag --config-json {params.cfg:q} --model {input.hf:q}"
        " --items {input.hellaswag:q} --out {output:q} > {log} 2>&1"


rule evaluate_lm_eval:
    input:
        hf=LAYOUT.hf_dir("{run}"),
        hellaswag=get_hellaswag_file,
    output:
        LAYOUT.eval_file("{run}", "hellaswag_lm_eval"),
    log:
        LAYOUT.log("evaluate_lm_eval", "{run}"),
    benchmark:
        LAYOUT.benchmark("evaluate_lm_eval", "{run}")
    conda:
        "../../envs/evaluate.yaml"
    threads: 2
    params:
        cfg=lambda wc: lmconfig.eval_params(config, wc.run),
    shell:
        "python -m lmpipe.evaluate lm-eval --config-json {params.cfg:q} --model {input.hf:q}"
        " --items {input.hellaswag:q} --out {output:q} > {log} 2>&1"


rule sample:
    input:
        hf=LAYOUT.hf_dir("{run}"),
    output:
        LAYOUT.eval_file("{run}", "samples"),
    log:
        LAYOUT.log("sample", "{run}"),
    benchmark:
        LAYOUT.benchmark("sample", "{run}")
    conda:
        "../../envs/evaluate.yaml"
    params:
        cfg=lambda wc: lmconfig.eval_params(config, wc.run),
    shell:
        "python -m lmpipe.evaluate samples --config-json {params.cfg:q} --model {input.hf:q}"
        " --out {output:q} > {log} 2>&1"

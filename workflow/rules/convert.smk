# Convert the final sharded checkpoint: a Hugging Face folder for every run (the evaluations read
# it), and llm.c's checkpoint for the architectures whose format it is (GPT-2: registry exports).


rule convert:
    input:
        final=LAYOUT.final_checkpoint("{run}"),
        tokenizer=get_run_tokenizer_input,
    output:
        hf=directory(LAYOUT.hf_dir("{run}")),
    log:
        LAYOUT.log("convert", "{run}"),
    benchmark:
        LAYOUT.benchmark("convert", "{run}")
    wildcard_constraints:
        run=one_of(TRAINED_RUNS),
    conda:
        "../../envs/convert.yaml"
    # a GPU run's: one GPU of its kind and its share of a node (lmpipe.resources)
    threads: lambda wc: get_derived(wc, "convert", "cpus")
    resources:
        gres=lambda wc: get_derived(wc, "convert", "gres"),
        tasks_per_gpu=0,  # else the plugin turns tasks into --ntasks-per-gpu
        mem_mb=lambda wc: get_derived(wc, "convert", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "convert", "runtime"),
    params:
        # the run's tokenizer, which the export carries: GPT-2's, or a trained one's
        tokenizer=lambda wc: lmconfig.run_tokenizer_folder(config, wc.run),
    shell:
        "python -m lmpipe.models --checkpoint {input.final:q} --tokenizer {params.tokenizer:q}"
        " --hf-out {output.hf:q} > {log} 2>&1"


rule export_llmc:
    input:
        final=get_llmc_final,  # refuses a run of an architecture without llm.c's export
    output:
        LAYOUT.llmc_file("{run}"),
    log:
        LAYOUT.log("export_llmc", "{run}"),
    benchmark:
        LAYOUT.benchmark("export_llmc", "{run}")
    conda:
        "../../envs/convert.yaml"
    resources:
        mem_mb=lambda wc: get_derived(wc, "convert", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "convert", "runtime"),
    shell:
        "python -m lmpipe.models --checkpoint {input.final:q} --llmc-out {output:q} > {log} 2>&1"


# A reference run (train: null): its model/hf/ is the Hugging Face folder itself, linked file by
# file (a 7B model's 13 GB are not copied), so every evaluation reads it as it reads a converted
# run's, and the report finds it where it finds every run's. Checked first: safetensors weights
# (a pickle-only folder is refused), and a GPT-2 folder one the gpt2 architecture loads.


rule reference:
    input:
        source=lambda wc: lmconfig.reference_source(config, wc.run),
    output:
        hf=directory(LAYOUT.hf_dir("{run}")),
    log:
        LAYOUT.log("reference", "{run}"),
    benchmark:
        LAYOUT.benchmark("reference", "{run}")
    wildcard_constraints:
        run=one_of(REFERENCE_RUNS),
    conda:
        "../../envs/convert.yaml"
    shell:
        "python -m lmpipe.models.reference --source {input.source:q} --out {output.hf:q}"
        " > {log} 2>&1"

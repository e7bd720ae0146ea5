# Convert the final sharded checkpoint into a Hugging Face folder and an llm.c checkpoint.


rule convert:
    input:
        final=LAYOUT.final_checkpoint("{run}"),
    output:
        hf=directory(LAYOUT.hf_dir("{run}")),
        llmc=LAYOUT.llmc_file("{run}"),
    log:
        LAYOUT.log("convert", "{run}"),
    benchmark:
        LAYOUT.benchmark("convert", "{run}")
    conda:
        "../../envs/convert.yaml"
    # a GPU run's: one GPU of its kind and its share of a node (lmpipe.plan)
    threads: lambda wc: get_derived(wc, "convert", "cpus")
    resources:
        gres=lambda wc: get_derived(wc, "convert", "gres"),
        tasks_per_gpu=0,  # else the plugin turns tasks into --ntasks-per-gpu
        mem_mb=lambda wc: get_derived(wc, "convert", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "convert", "runtime"),
    params:
        tokenizer=config["tokenizer"],
    shell:
        "python -m lmpipe.models --checkpoint {input.final:q} --tokenizer {params.tokenizer:q}"
        " --hf-out {output.hf:q} --llmc-out {output.llmc:q} > {log} 2>&1"

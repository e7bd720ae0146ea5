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
    params:
        tokenizer=config["tokenizer"],
    shell:
        "python -m lmpipe.models --checkpoint {input.final:q} --tokenizer {params.tokenizer:q}"
        " --hf-out {output.hf:q} --llmc-out {output.llmc:q} > {log} 2>&1"

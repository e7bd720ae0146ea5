# Training: torchrun + FSDP2, launched by lmpipe.launch from the run's `launch:` settings
# (CPU ranks on gloo, one rank a GPU on one node, or one torchrun a node through srun).
# Periodic checkpoints under train/checkpoints/ are deliberately NOT outputs: Snakemake deletes a
# failed job's outputs, and a retried job must find them to resume.


rule train:
    input:
        tokens=get_tokens_manifest,
    output:
        final=directory(LAYOUT.final_checkpoint("{run}")),
    params:
        cfg=lambda wc: lmconfig.train_params(config, wc.run),
        out=lambda wc: LAYOUT.train_dir(wc.run),
    threads: lambda wc: get_run(wc).launch.procs_per_node
    resources:
        nodes=lambda wc: get_run(wc).launch.nodes,
        mem_mb=lambda wc: get_run(wc).launch.mem_mb,
        runtime=lambda wc: get_run(wc).launch.runtime,
    log:
        LAYOUT.log("train", "{run}"),
    benchmark:
        LAYOUT.benchmark("train", "{run}")
    conda:
        "../../envs/train.yaml"
    shell:
        "python -m lmpipe.launch --config-json {params.cfg:q} --tokens-manifest {input.tokens:q}"
        " --out {params.out:q} > {log} 2>&1"

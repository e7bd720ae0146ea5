# Training: torchrun + FSDP2, launched by lmpipe.launch from the run's `launch:` settings
# (CPU ranks on gloo, one rank a GPU on one node, or one torchrun a node through srun).
# Periodic checkpoints under train/checkpoints/ are deliberately NOT outputs: Snakemake deletes a
# failed job's outputs, and a retried job must find them to resume.


rule train:
    input:
        tokens=get_tokens_manifest,
    output:
        final=directory(LAYOUT.final_checkpoint("{run}")),
    log:
        LAYOUT.log("train", "{run}"),
    benchmark:
        LAYOUT.benchmark("train", "{run}")
    wildcard_constraints:
        run=PRETRAIN_RUNS,  # fine-tuning runs are made by `sft` (sft.smk)
    conda:
        "../../envs/train.yaml"
    threads: lambda wc: get_run(wc).launch.procs_per_node
    resources:
        # SLURM (slurm/ profile); a resource that is None is left out
        nodes=lambda wc: get_run(wc).launch.nodes,
        mem_mb=lambda wc: get_run(wc).launch.mem_mb,  # a node
        runtime=lambda wc: get_run(wc).launch.runtime,
        cpus_per_task=lambda wc: get_run(wc).launch.cpus_per_task,  # a node (one task a node)
        gres=get_train_gres,
        tasks_per_gpu=0,  # else the plugin turns tasks into --ntasks-per-gpu
        # several nodes: the shell runs once in the batch script and lmpipe.launch calls srun
        mpi=lambda wc: "srun" if get_run(wc).launch.nodes > 1 else None,
        tasks=get_train_tasks,
        slurm_extra=get_train_signal,
    params:
        cfg=lambda wc: lmconfig.train_params(config, wc.run),
        out=lambda wc: LAYOUT.train_dir(wc.run),
    # exec: the launcher replaces the shell, so a SIGTERM from SLURM (sent to every process of
    # the job step) reaches it and its workers without killing the shell between them first
    shell:
        "exec python -m lmpipe.launch --config-json {params.cfg:q} --tokens-manifest {input.tokens:q}"
        " --out {params.out:q} > {log} 2>&1"

# Training: pretraining and chat fine-tuning runs alike. `python -m lmpipe.train` starts torchrun
# from the run's `launch:` settings (CPU ranks on gloo, one rank a GPU on one node, or one torchrun
# a node through srun); torchrun runs the worker: lmpipe.train.pretrain on token shards, or
# lmpipe.chat.finetune on conversations from a base's weights. Both run lmpipe.train.loop.
# Periodic checkpoints under train/checkpoints/ are deliberately NOT outputs: Snakemake deletes a
# failed job's outputs, and a retried job must find them to resume. To retrain from scratch:
#   LMPIPE_FRESH_START=1 snakemake --forcerun results/runs/RUN/train/final ...
# (the launcher reads it; old checkpoints are moved aside to train/checkpoints/retired/).


rule train:
    input:
        unpack(get_train_inputs),
    output:
        final=directory(LAYOUT.final_checkpoint("{run}")),
    log:
        LAYOUT.log("train", "{run}"),
    benchmark:
        LAYOUT.benchmark("train", "{run}")
    wildcard_constraints:
        run=one_of(TRAINED_RUNS),
    priority: get_train_priority
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
        # several nodes: the shell runs once in the batch script and lmpipe.train calls srun
        mpi=lambda wc: "srun" if get_run(wc).launch.nodes > 1 else None,
        tasks=get_train_tasks,
        slurm_extra=get_train_signal,
    params:
        cfg=get_train_params,  # the rerun trigger; the job reads them from cfg_file
        cfg_file=as_file(get_train_params),
        # the module torchrun runs on every rank; both run lmpipe.train.loop
        worker=lambda wc: (
            "lmpipe.chat.finetune"
            if get_run(wc).fine_tuning
            else "lmpipe.train.pretrain"
        ),
        base=get_base_args,  # a fine-tuning run's base: its weights, its text to replay
        evals=get_train_eval_input_args,  # the evaluations during training's files
        wandb=get_wandb_arg,  # not a trajectory setting: left out of the rerun check
        out=lambda wc: LAYOUT.train_dir(wc.run),
    # exec: the launcher replaces the shell, so a SIGTERM from SLURM (sent to every process of
    # the job step) or a terminal's Ctrl-C (SIGINT to Snakemake's process group) reaches it
    # without killing a shell between it and Snakemake first; it stops the workers after a
    # checkpoint (lmpipe.train.launch)
    shell:
        "exec python -m lmpipe.train --worker {params.worker} --config-json {params.cfg_file:q}"
        " --data {input.data:q} {params.base} {params.evals}"
        " {params.wandb}"
        " --out {params.out:q}"
        " > {log} 2>&1"

# Chat fine-tuning (Vicuna-style SFT): conversations -> masked token rows -> the same trainer,
# started from a base run's final checkpoint (or a Hugging Face GPT-2 folder). Its final/ goes
# through convert and evaluate like any run's; an SFT run and its base also get the held-out
# conversation loss and chat samples (eval/sft_loss.json, eval/chat_samples.json).


rule prepare_conversations:
    input:
        get_conversations_source,
    output:
        manifest=LAYOUT.sft_manifest("{dataset}"),
    log:
        LAYOUT.log("prepare_conversations", "{dataset}"),
    benchmark:
        LAYOUT.benchmark("prepare_conversations", "{dataset}")
    wildcard_constraints:
        dataset=CONVERSATION_DATASETS,
    conda:
        "../../envs/data.yaml"
    params:
        cfg=lambda wc: lmconfig.sft_data_params(config, wc.dataset),
        out=lambda wc: LAYOUT.sft_dir(wc.dataset),
        tokenizer=config["tokenizer"],
    shell:
        "python -m lmpipe.sft_data --config-json {params.cfg:q} --tokenizer {params.tokenizer:q}"
        " --out {params.out:q} > {log} 2>&1"


rule sft:
    input:
        data=lambda wc: LAYOUT.sft_manifest(get_run(wc).dataset),
        base=get_sft_base,
    output:
        final=directory(LAYOUT.final_checkpoint("{run}")),
    log:
        LAYOUT.log("sft", "{run}"),
    benchmark:
        LAYOUT.benchmark("sft", "{run}")
    wildcard_constraints:
        run=SFT_RUNS,
    conda:
        "../../envs/train.yaml"
    threads: lambda wc: get_run(wc).launch.procs_per_node
    resources:
        # as `train` (train.smk): SLURM resources from the run's launch settings
        nodes=lambda wc: get_run(wc).launch.nodes,
        mem_mb=lambda wc: get_run(wc).launch.mem_mb,
        runtime=lambda wc: get_run(wc).launch.runtime,
        cpus_per_task=lambda wc: get_run(wc).launch.cpus_per_task,
        gres=get_train_gres,
        tasks_per_gpu=0,
        mpi=lambda wc: "srun" if get_run(wc).launch.nodes > 1 else None,
        tasks=get_train_tasks,
        slurm_extra=get_train_signal,
    params:
        cfg=lambda wc: lmconfig.sft_params(config, wc.run),
        out=lambda wc: LAYOUT.train_dir(wc.run),
    shell:
        # exec: the launcher replaces the shell, so SLURM's SIGTERM reaches it (see train.smk)
        "exec python -m lmpipe.launch --config-json {params.cfg:q} --tokens-manifest {input.data:q}"
        " --init {input.base:q} --out {params.out:q} > {log} 2>&1"


rule evaluate_sft_loss:
    input:
        hf=LAYOUT.hf_dir("{run}"),
        data=get_chat_manifest,
    output:
        LAYOUT.eval_file("{run}", "sft_loss"),
    log:
        LAYOUT.log("evaluate_sft_loss", "{run}"),
    benchmark:
        LAYOUT.benchmark("evaluate_sft_loss", "{run}")
    wildcard_constraints:
        run=CHAT_EVAL_RUNS,
    conda:
        "../../envs/evaluate.yaml"
    threads: 2
    params:
        cfg=lambda wc: lmconfig.eval_params(config, wc.run),
    shell:
        "python -m lmpipe.sft_eval loss --config-json {params.cfg:q} --model {input.hf:q}"
        " --data {input.data:q} --out {output:q} > {log} 2>&1"


rule chat_samples:
    input:
        hf=LAYOUT.hf_dir("{run}"),
    output:
        LAYOUT.eval_file("{run}", "chat_samples"),
    log:
        LAYOUT.log("chat_samples", "{run}"),
    benchmark:
        LAYOUT.benchmark("chat_samples", "{run}")
    wildcard_constraints:
        run=CHAT_EVAL_RUNS,
    conda:
        "../../envs/evaluate.yaml"
    params:
        cfg=lambda wc: lmconfig.eval_params(config, wc.run),
    shell:
        "python -m lmpipe.sft_eval chat --config-json {params.cfg:q} --model {input.hf:q}"
        " --out {output:q} > {log} 2>&1"

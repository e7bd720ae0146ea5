# Evaluate a converted model: one job an evaluation of lmpipe.registry.EVALUATIONS (FineWeb val
# loss, HellaSwag native and through lm-eval, samples, and for chat runs and their bases the
# held-out conversation loss and chat replies). Each writes one small JSON file under eval/; its
# params hold only its own settings, so changing one evaluation never reruns another.


rule evaluate:
    input:
        unpack(get_eval_inputs),
    output:
        LAYOUT.eval_file("{run}", "{eval}"),
    log:
        LAYOUT.log("evaluate", "{run}/{eval}"),
    benchmark:
        LAYOUT.benchmark("evaluate", "{run}/{eval}")
    conda:
        "../../envs/evaluate.yaml"
    # a GPU run's: one GPU of its kind and its share of a node; a time limit from the
    # evaluation's estimate (lmpipe.resources)
    threads: lambda wc: get_derived(wc, "evaluate", "cpus")
    resources:
        gres=lambda wc: get_derived(wc, "evaluate", "gres"),
        tasks_per_gpu=0,  # else the plugin turns tasks into --ntasks-per-gpu
        mem_mb=lambda wc: get_derived(wc, "evaluate", "mem_mb"),
        runtime=lambda wc: get_derived(wc, "evaluate", "runtime"),
    params:
        cfg=get_eval_params,  # the rerun trigger; the job reads them from cfg_file
        cfg_file=as_file(get_eval_params),
        inputs=get_eval_input_args,
    shell:
        "python -m lmpipe.eval {wildcards.eval} --config-json {params.cfg_file:q}"
        " --model {input.model:q} {params.inputs} --out {output:q} > {log} 2>&1"


# the tokens and bytes of an evaluation's text (`suite`: every task of its manifest;
# `hellaswag-{file}`) in GPT-2's tokenizer (`gpt2`) or a run's own (lmpipe.eval.task_bytes): the
# report's bytes per token on each task, one job a tokenizer and text (the evaluations' env: it
# reads the tasks with their scorers' code)
rule task_bytes:
    input:
        text=lambda wc: lmconfig.task_bytes_input(config, wc.text),
        tokenizer=lambda wc: get_tokenizer_input(task_bytes_key(wc)),
    output:
        LAYOUT.task_bytes("{text}", "{tokens}"),
    log:
        LAYOUT.log("task_bytes", "{text}/{tokens}"),
    wildcard_constraints:
        text=one_of(["suite", *(f"hellaswag-{k}" for k in config["hellaswag"])]),
        tokens=one_of(["gpt2", *lmconfig.tokenizing_models(config)]),
    conda:
        "../../envs/evaluate.yaml"
    resources:
        mem_mb=2000,  # as the plan costs it (lmpipe.plan: task_bytes)
        runtime=15,
    params:
        flag=lambda wc: "--suite" if wc.text == "suite" else "--hellaswag",
        tokenizer=lambda wc: lmconfig.tokenizer_folder(config, task_bytes_key(wc)),
    shell:
        "python -m lmpipe.eval.task_bytes --tokenizer {params.tokenizer:q}"
        " {params.flag} {input.text:q} --out {output:q} > {log} 2>&1"

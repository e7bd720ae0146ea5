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

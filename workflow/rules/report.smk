# The report: one self-contained HTML file comparing the runs a report names.


def get_report_inputs(wildcards):
    runs = config["reports"][wildcards.report]["runs"]
    finals = [LAYOUT.final_checkpoint(r) for r in runs]
    evals = [f for r in runs for f in get_eval_outputs(r)]
    manifests = sorted({LAYOUT.tokens_manifest(config["runs"][r]["dataset"]) for r in runs})
    return finals + evals + manifests


rule report:
    input:
        get_report_inputs,
    output:
        LAYOUT.report("{report}"),
    params:
        cfg=lambda wc: lmconfig.report_params(config, wc.report),
        results=LAYOUT.results,
        data=LAYOUT.data,
    log:
        LAYOUT.log("report", "{report}"),
    conda:
        "../../envs/report.yaml"
    shell:
        "python -m lmpipe.report --config-json {params.cfg:q} --results {params.results:q}"
        " --data {params.data:q} --out {output:q} > {log} 2>&1"

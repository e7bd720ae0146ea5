# The report: one self-contained HTML file comparing the runs a report names.


rule report:
    input:
        get_report_inputs,
    output:
        report(
            LAYOUT.report("{report}"),
            caption="../report/report.rst",
            category="Report",
            labels={"report": "{report}"},
        ),
    log:
        LAYOUT.log("report", "{report}"),
    conda:
        "../../envs/report.yaml"
    params:
        # the rerun triggers; the job reads them from their files
        cfg=get_report_params,
        plan=get_report_plan,
        cfg_file=as_file(get_report_params),
        plan_file=as_file(get_report_plan),
        results=lambda wc, output: os.path.dirname(output[0]) or ".",
        data=LAYOUT.data,
    shell:
        "python -m lmpipe.report --config-json {params.cfg_file:q} --plan-json {params.plan_file:q}"
        " --results {params.results:q}"
        " --data {params.data:q} --out {output:q} > {log} 2>&1"

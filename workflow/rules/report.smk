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
        # a sweep's report also gets its points' swept values (and a ladder's compute)
        cfg=lambda wc: lmsweeps.report_params(config, wc.report),
        plan=lambda wc: lmplan.report_plan(config, wc.report),
        results=lambda wc, output: os.path.dirname(output[0]) or ".",
        data=LAYOUT.data,
    shell:
        "python -m lmpipe.report --config-json {params.cfg:q} --plan-json {params.plan:q}"
        " --results {params.results:q}"
        " --data {params.data:q} --out {output:q} > {log} 2>&1"

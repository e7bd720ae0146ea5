"""A report by hand, from a config file: what the report rule builds, at any time.

    python -m lmpipe.report.progress --config config/config.yaml --report 124m \\
        --out progress_124m.html [--configfile site.yaml]

While a run trains, the page shows what exists so far (unfinished runs are marked "not
finished"). It checks the config as the Snakefile does (lmpipe.schema), so it runs where the
pipeline is installed, not in the report rule's conda env.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from lmpipe import config as lmconfig
from lmpipe import plan as lmplan
from lmpipe import schema
from lmpipe import sweeps as lmsweeps
from lmpipe.paths import Layout
from lmpipe.report.page import write_report


def params_from_config(
    config_path: str, report: str, overlays: list[str] = ()
) -> tuple[dict[str, Any], Layout, dict[str, Any]]:
    """report_params, the layout and the plan of report `report` of a config file (with
    `overlays` merged over it, as snakemake's --configfile)."""
    config = schema.load_config(config_path, overlays)
    if report not in config["reports"]:
        known = ", ".join(config["reports"])
        raise ValueError(f"{config_path}: no report {report!r} (reports: {known})")
    params = json.loads(lmsweeps.report_params(config, report))
    return params, lmconfig.layout(config), json.loads(lmplan.report_plan(config, report))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default="config/config.yaml", help="the config file")
    p.add_argument("--report", required=True, help="the report's name in --config")
    p.add_argument(
        "--configfile", nargs="*", default=[], help="overlays, as snakemake's (a site's settings)"
    )
    p.add_argument("--results", help="results folder (default: the config's)")
    p.add_argument("--data", help="tokenized data folder (default: the config's)")
    p.add_argument("--out", required=True, help="the HTML file to write")
    args = p.parse_args(argv)
    params, layout, plan = params_from_config(args.config, args.report, args.configfile)
    layout = Layout(results=args.results or layout.results, data=args.data or layout.data)
    write_report(params, layout, args.out, plan)


if __name__ == "__main__":
    main()

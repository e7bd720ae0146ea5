"""The report stage: runs.py reads the result files, figures.py draws, page.py renders the HTML
(workflow/report/report.html.j2), references.py holds the published figures.
`python -m lmpipe.report --help`.
"""

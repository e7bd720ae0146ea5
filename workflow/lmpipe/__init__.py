"""lmpipe: the Python package behind the Snakemake pipeline (one module a stage)."""

__version__ = "0.1.0"

"""lmpipe: the Python package behind the Snakemake pipeline, one subpackage a stage (data,
models, train, eval, chat, report) over a torch-free ground (config, schema, registry, paths,
files, provenance). docs/architecture.md describes them."""

__version__ = "0.1.0"

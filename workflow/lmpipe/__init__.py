"""lmpipe: the Python package behind the Snakemake pipeline, one subpackage a stage (data,
models, train, eval, chat, report) over a torch-free ground (config, schema, registry, paths,
files, provenance). docs/architecture.md describes them."""

from lmpipe import import_noise

__version__ = "0.1.0"

# libraries' known import warnings, dropped at their loggers before any of them is imported
import_noise.drop()

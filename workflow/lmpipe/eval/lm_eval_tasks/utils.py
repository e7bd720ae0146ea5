"""lm-eval's own HellaSwag preprocessing, re-exported for the local task's `!function utils.*`."""

from lm_eval.tasks.hellaswag.utils import preprocess, process_docs

__all__ = ["preprocess", "process_docs"]

"""Every file name the pipeline reads or writes, in one place.

The Snakemake rules and the stage modules both import these, so a path is spelled once.
`results` and `data` come from the config's `paths:` section (defaults: results, results/data).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"
REPORT_TEMPLATES = REPO_ROOT / "workflow" / "report"
TOKENIZER_DIR = REPO_ROOT / "resources" / "gpt2"  # GPT-2's BPE files, shipped with the repo
# files of a run's train/ folder: the trainer writes them (it knows only the folder), the report
# reads them through Layout
METRICS_FILE = "metrics.jsonl"
ATTEMPTS_FILE = "attempts.jsonl"


@dataclass(frozen=True)
class Layout:
    """Where each stage writes, relative to the working directory (the repo root)."""

    results: str = "results"
    data: str = "results/data"

    # ---- data stages ----
    def raw_dir(self, dataset: str) -> str:
        return f"{self.data}/{dataset}/raw"

    def raw_manifest(self, dataset: str) -> str:
        return f"{self.raw_dir(dataset)}/manifest.json"

    def tokens_dir(self, dataset: str, tokens_of: str | None = None) -> str:
        """GPT-2's tokens of a text dataset; with `tokens_of`, an `arch: hf` model of `models:`,
        that model's own tokenizer's (its continued pretraining and its val loss)."""
        return f"{self.data}/{dataset}/tokens" + (f"-{tokens_of}" if tokens_of else "")

    def tokens_manifest(self, dataset: str, tokens_of: str | None = None) -> str:
        return f"{self.tokens_dir(dataset, tokens_of)}/manifest.json"

    def token_part(self, dataset: str, part: int | str) -> str:
        """A part's token stream, when a dataset is tokenized in parts (removed once cut)."""
        part = f"{part:03d}" if isinstance(part, int) else part
        return f"{self.data}/{dataset}/token_parts/part_{part}.bin"

    def conversations_dir(self, dataset: str, tokens_of: str | None = None) -> str:
        """Conversations as masked token rows (a `kind: conversations` dataset) in GPT-2's tokens;
        with `tokens_of`, in that `arch: hf` model's own (as tokens_dir)."""
        return f"{self.data}/{dataset}/sft" + (f"-{tokens_of}" if tokens_of else "")

    def conversations_manifest(self, dataset: str, tokens_of: str | None = None) -> str:
        return f"{self.conversations_dir(dataset, tokens_of)}/manifest.json"

    def tokenizer_dir(self, name: str) -> str:
        """A tokenizer of `tokenizers:`, trained (lmpipe.data.train_tokenizer): a folder that
        AutoTokenizer loads, with its manifest.json."""
        return f"{self.results}/tokenizers/{name}"

    def tokenizer_manifest(self, name: str) -> str:
        return f"{self.tokenizer_dir(name)}/manifest.json"

    def suite_dir(self) -> str:
        """The zero-shot suite's task data (lmpipe.eval.suite.data), one folder a task."""
        return f"{self.data}/eval_suite"

    def suite_manifest(self) -> str:
        return f"{self.suite_dir()}/manifest.json"

    def task_bytes(self, text: str, tokens_of: str | None = None) -> str:
        """The tokens and bytes of an evaluation's text (`suite` or `hellaswag-{file}`) in GPT-2's
        tokenizer or, with `tokens_of`, in that one (lmpipe.eval.task_bytes)."""
        return f"{self.data}/task_bytes/{text}/{tokens_of or 'gpt2'}.json"

    def hub_model_dir(self, model: str) -> str:
        """A hub model of `models:` as the download stage fetched it (safetensors, config and
        tokenizer files)."""
        return f"{self.data}/models/{model}"

    # ---- a run ----
    def run_dir(self, run: str) -> str:
        return f"{self.results}/runs/{run}"

    def train_dir(self, run: str) -> str:
        return f"{self.run_dir(run)}/train"

    def final_checkpoint(self, run: str) -> str:
        return f"{self.train_dir(run)}/final"

    def metrics(self, run: str) -> str:
        return f"{self.train_dir(run)}/{METRICS_FILE}"

    def attempts(self, run: str) -> str:
        """Each start and end of the trainer (lmpipe.train.attempts): what the run survived."""
        return f"{self.train_dir(run)}/{ATTEMPTS_FILE}"

    def model_dir(self, run: str) -> str:
        return f"{self.run_dir(run)}/model"

    def hf_dir(self, run: str) -> str:
        return f"{self.model_dir(run)}/hf"

    def llmc_file(self, run: str) -> str:
        return f"{self.model_dir(run)}/llmc.bin"

    def eval_dir(self, run: str) -> str:
        return f"{self.run_dir(run)}/eval"

    def eval_file(self, run: str, name: str) -> str:
        return f"{self.eval_dir(run)}/{name}.json"

    def report(self, report: str) -> str:
        return f"{self.results}/report_{report}.html"

    def log(self, stage: str, name: str) -> str:
        return f"{self.results}/logs/{stage}/{name}.log"

    def benchmark(self, stage: str, name: str) -> str:
        return f"{self.results}/benchmarks/{stage}/{name}.tsv"

    def params_dir(self) -> str:
        """The jobs' params, a file each, named by their sha256 (lmpipe.job_params)."""
        return f"{self.results}/params"


def shard_name(dataset: str, split: str, index: int) -> str:
    """llm.c's shard naming: `{dataset}_val_000000.bin`, `{dataset}_train_000001.bin`, ..."""
    return f"{dataset}_{split}_{index:06d}.bin"

"""The config: loading, validation, typed sections and the slices each stage depends on.

Torch-free on purpose: the Snakefile imports it at parse time and pytest covers it quickly.

- `load_config(path)` validates a YAML file with Snakemake's own `validate()` (the same call the
  Snakefile makes, so defaults and error messages are identical), then `check_config()` adds the
  cross-field checks a JSON schema cannot express, naming the YAML path and value.
- The `*_params()` functions return the slice of the config a stage depends on, as canonical JSON.
  Rules pass them as `params:`, so Snakemake reruns a stage exactly when its slice changes.
- The dataclasses are what a stage module builds from that JSON (`from_dict`), refusing unknown
  keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lmpipe.paths import SCHEMA, Layout

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that passed the schema but is inconsistent; the message names the YAML path."""


def from_dict(cls: type[T], data: dict[str, Any], where: str) -> T:
    """Build dataclass `cls` from `data`; an unknown key is an error naming `where.key`."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    return cls(**data)


def canonical_json(obj: Any) -> str:
    """Stable JSON (sorted keys, no spaces): equal settings give equal strings and hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def settings_hash(obj: Any) -> str:
    """Short sha256 of canonical JSON; used to tie checkpoints and results to their settings."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# typed sections (field defaults mirror workflow/schemas/config.schema.yaml, which fills them in)


@dataclass(frozen=True)
class SourceConfig:
    """Where a dataset's raw text comes from (the download stage)."""

    source: str
    path: str | None = None
    repo: str | None = None
    name: str | None = None
    revision: str = "main"
    max_files: int | None = None


@dataclass(frozen=True)
class TokenizeConfig:
    """How a dataset is cut into llm.c shards (the tokenize stage)."""

    dataset: str
    shard_tokens: int
    val_tokens: int
    text_column: str = "text"


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int = 1024
    vocab_size: int = 50257
    padded_vocab_size: int = 50304


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int
    micro_batch: int
    batch_tokens: int
    max_steps: int
    lr: float
    seed: int = 1337
    lr_floor: float = 0.0
    warmup_steps: int = 0
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    val_every: int = 250
    val_tokens: int = 1048576
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    dtype: str = "float32"
    compile: bool = False
    fused_adamw: bool = False

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps an optimizer step: batch_tokens / (seq_len * micro_batch * world_size)."""
        per_micro = self.seq_len * self.micro_batch * world_size
        if self.batch_tokens % per_micro:
            raise ConfigError(
                f"train.batch_tokens {self.batch_tokens} is not divisible by seq_len * micro_batch"
                f" * world_size = {self.seq_len} * {self.micro_batch} * {world_size} = {per_micro}"
            )
        return self.batch_tokens // per_micro


@dataclass(frozen=True)
class LaunchConfig:
    device: str
    nodes: int = 1
    procs_per_node: int = 1
    cpus_per_task: int = 2
    mem_mb: int = 4000
    runtime: int = 60
    signal_seconds: int = 300
    gpu_model: str | None = None
    peak_flops: float = 1e12

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass(frozen=True)
class EvalConfig:
    val_tokens: int = 10485760
    val_batch: int = 8
    hellaswag: str = "embedded"
    hellaswag_items: int = 10042
    hellaswag_batch: int = 16
    lm_eval: bool = True
    sample_tokens: int = 48
    sample_top_k: int = 50
    sample_seed: int = 42


@dataclass(frozen=True)
class RunConfig:
    name: str
    dataset: str
    model: ModelConfig
    train: TrainConfig
    launch: LaunchConfig
    eval: EvalConfig = field(default_factory=EvalConfig)


# ----------------------------------------------------------------------------------------------
# loading and checking


def load_config(path: str | Path) -> dict[str, Any]:
    """Read, schema-validate (filling defaults) and cross-check a config file."""
    from snakemake.utils import validate  # the same validation the Snakefile runs

    with open(path) as f:
        config = yaml.safe_load(f)
    validate(config, str(SCHEMA))
    check_config(config)
    return config


def layout(config: dict[str, Any]) -> Layout:
    paths = config.get("paths", {})
    return Layout(results=paths.get("results", "results"), data=paths.get("data", "results/data"))


def run_config(config: dict[str, Any], run: str) -> RunConfig:
    """The typed config of one run (model and dataset resolved by name)."""
    r = config["runs"][run]
    where = f"runs.{run}"
    train = dict(r["train"])
    train["betas"] = tuple(train.get("betas", (0.9, 0.95)))
    return RunConfig(
        name=run,
        dataset=r["dataset"],
        model=from_dict(ModelConfig, config["models"][r["model"]], f"models.{r['model']}"),
        train=from_dict(TrainConfig, train, f"{where}.train"),
        launch=from_dict(LaunchConfig, r["launch"], f"{where}.launch"),
        eval=from_dict(EvalConfig, r.get("eval", {}), f"{where}.eval"),
    )


def check_config(config: dict[str, Any]) -> None:
    """Checks across fields and sections; each error names the YAML path and the value."""
    for name, d in config["datasets"].items():
        where = f"datasets.{name}"
        if d["source"] == "local" and not d.get("path"):
            raise ConfigError(f"{where}: source 'local' needs `path`")
        if d["source"] == "huggingface" and not (d.get("repo") and d.get("name")):
            raise ConfigError(f"{where}: source 'huggingface' needs `repo` and `name`")
    for name, m in config["models"].items():
        if m["n_embd"] % m["n_head"]:
            raise ConfigError(
                f"models.{name}: n_embd {m['n_embd']} is not divisible by n_head {m['n_head']}"
            )
        if m.get("padded_vocab_size", 50304) < m.get("vocab_size", 50257):
            raise ConfigError(f"models.{name}: padded_vocab_size is below vocab_size")
    for name, r in config["runs"].items():
        where = f"runs.{name}"
        if r["dataset"] not in config["datasets"]:
            raise ConfigError(f"{where}.dataset: unknown dataset {r['dataset']!r}")
        if r["model"] not in config["models"]:
            raise ConfigError(f"{where}.model: unknown model {r['model']!r}")
        rc = run_config(config, name)
        if rc.train.seq_len > rc.model.block_size:
            raise ConfigError(
                f"{where}.train.seq_len {rc.train.seq_len} exceeds the model's block_size"
                f" {rc.model.block_size}"
            )
        try:
            rc.train.grad_accum_steps(rc.launch.world_size)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if rc.eval.hellaswag not in config.get("hellaswag", {}):
            raise ConfigError(
                f"{where}.eval.hellaswag: unknown HellaSwag file {rc.eval.hellaswag!r}"
            )
    for name, rep in config["reports"].items():
        for run in rep["runs"]:
            if run not in config["runs"]:
                raise ConfigError(f"reports.{name}.runs: unknown run {run!r}")


# ----------------------------------------------------------------------------------------------
# what each stage depends on (rule params); canonical JSON so that equal settings compare equal


def _fields_of(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def download_params(config: dict[str, Any], dataset: str) -> str:
    return canonical_json(_fields_of(SourceConfig, config["datasets"][dataset]))


def tokenize_params(config: dict[str, Any], dataset: str) -> str:
    d = _fields_of(TokenizeConfig, config["datasets"][dataset])
    return canonical_json(d | {"dataset": dataset})


TRAJECTORY_LAUNCH_KEYS = ("device", "nodes", "procs_per_node", "peak_flops")


def train_params(config: dict[str, Any], run: str) -> str:
    """Model + training settings + world size: everything that shapes the trajectory or its logs."""
    rc = run_config(config, run)
    return canonical_json(
        {
            "run": run,
            "dataset": rc.dataset,
            "model": dataclasses.asdict(rc.model),
            "train": dataclasses.asdict(rc.train),
            # cluster-only resources (memory, time limit, ...) never retrain a run
            "launch": {k: getattr(rc.launch, k) for k in TRAJECTORY_LAUNCH_KEYS},
        }
    )


def eval_params(config: dict[str, Any], run: str) -> str:
    rc = run_config(config, run)
    return canonical_json({"run": run, "eval": dataclasses.asdict(rc.eval)})


def report_params(config: dict[str, Any], report: str) -> str:
    rep = config["reports"][report]
    # what each run was trained and evaluated with: the report shows them side by side
    runs = {
        r: json.loads(train_params(config, r)) | json.loads(eval_params(config, r))
        for r in rep["runs"]
    }
    return canonical_json({"report": report, "gpu_hour_price": rep["gpu_hour_price"], "runs": runs})

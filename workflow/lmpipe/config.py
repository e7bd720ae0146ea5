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
class ConversationsConfig:
    """A `kind: conversations` dataset: ShareGPT JSON -> masked token rows (lmpipe.sft_data)."""

    dataset: str
    source: str
    seq_len: int
    path: str | None = None
    repo: str | None = None
    name: str | None = None
    split: str = "train"
    revision: str = "main"
    template: str = "vicuna_v1.1"
    val_percent: float = 10.0
    on_malformed: str = "error"


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
class BaseConfig:
    """An SFT run's initial weights: a run's final checkpoint, or a Hugging Face GPT-2 folder."""

    run: str | None = None
    hf: str | None = None
    dataset: str | None = None  # text dataset of the FineWeb-style val loss (with `hf`)


@dataclass(frozen=True)
class SFTConfig:
    """Chat fine-tuning: steps = epochs * (train rows // rows a step); warmup = ratio * steps."""

    epochs: int = 3
    warmup_ratio: float = 0.04


@dataclass(frozen=True)
class RunConfig:
    name: str
    dataset: str
    model: ModelConfig
    train: TrainConfig
    launch: LaunchConfig
    eval: EvalConfig = field(default_factory=EvalConfig)
    base: BaseConfig | None = None
    sft: SFTConfig | None = None


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
    if "sft" in r:
        train.setdefault("max_steps", 0)  # the trainer derives it from sft.epochs and the data
    return RunConfig(
        name=run,
        dataset=r["dataset"],
        model=from_dict(ModelConfig, config["models"][r["model"]], f"models.{r['model']}"),
        train=from_dict(TrainConfig, train, f"{where}.train"),
        launch=from_dict(LaunchConfig, r["launch"], f"{where}.launch"),
        eval=from_dict(EvalConfig, r.get("eval", {}), f"{where}.eval"),
        base=from_dict(BaseConfig, r["base"], f"{where}.base") if "base" in r else None,
        sft=from_dict(SFTConfig, r["sft"], f"{where}.sft") if "sft" in r else None,
    )


def is_conversations(config: dict[str, Any], dataset: str) -> bool:
    return config["datasets"][dataset].get("kind", "text") == "conversations"


def is_sft(config: dict[str, Any], run: str) -> bool:
    return "sft" in config["runs"][run]


def text_dataset(config: dict[str, Any], run: str) -> str:
    """The text dataset a run is measured on (FineWeb val loss): an SFT run's is its base's."""
    r = config["runs"][run]
    if "base" not in r:
        return r["dataset"]
    base = r["base"]
    return config["runs"][base["run"]]["dataset"] if base.get("run") else base["dataset"]


def chat_dataset(config: dict[str, Any], run: str) -> str | None:
    """The conversations a run's chat evaluations use: its own (SFT), its fine-tunings' (base)."""
    if is_sft(config, run):
        return config["runs"][run]["dataset"]
    children = {
        r["dataset"] for r in config["runs"].values() if r.get("base", {}).get("run") == run
    }
    return min(children) if children else None


def check_sft_run(config: dict[str, Any], name: str) -> None:
    """An SFT run: conversations data, one base of the same model, steps from epochs."""
    r, where = config["runs"][name], f"runs.{name}"
    if "base" not in r or "sft" not in r:
        raise ConfigError(f"{where}: a fine-tuning run needs both `base:` and `sft:`")
    if not is_conversations(config, r["dataset"]):
        raise ConfigError(f"{where}.dataset: {r['dataset']!r} is not a `kind: conversations` one")
    if "max_steps" in r["train"]:
        raise ConfigError(f"{where}.train.max_steps: set by sft.epochs for a fine-tuning run")
    seq_len = config["datasets"][r["dataset"]]["seq_len"]
    if r["train"]["seq_len"] != seq_len:
        raise ConfigError(
            f"{where}.train.seq_len {r['train']['seq_len']} differs from datasets."
            f"{r['dataset']}.seq_len {seq_len} (one conversation a row of that length)"
        )
    base = r["base"]
    if bool(base.get("run")) == bool(base.get("hf")):
        raise ConfigError(f"{where}.base: give exactly one of `run` or `hf`")
    if base.get("run"):
        b = base["run"]
        if b not in config["runs"] or is_sft(config, b):
            raise ConfigError(f"{where}.base.run: {b!r} is not a pretraining run of `runs:`")
        if config["runs"][b]["model"] != r["model"]:
            raise ConfigError(
                f"{where}.model {r['model']!r} differs from its base run's"
                f" {config['runs'][b]['model']!r}"
            )
        datasets = {
            o["dataset"] for o in config["runs"].values() if o.get("base", {}).get("run") == b
        }
        if len(datasets) > 1:
            raise ConfigError(
                f"runs: base run {b!r} is fine-tuned on several conversation datasets"
                f" {sorted(datasets)}; its chat evaluations support one"
            )
    elif not base.get("dataset") or is_conversations(config, base["dataset"]):
        raise ConfigError(f"{where}.base.dataset: an `hf` base needs a text dataset (val loss)")


def check_config(config: dict[str, Any]) -> None:
    """Checks across fields and sections; each error names the YAML path and the value."""
    for name, d in config["datasets"].items():
        where = f"datasets.{name}"
        if d["source"] == "local" and not d.get("path"):
            raise ConfigError(f"{where}: source 'local' needs `path`")
        if is_conversations(config, name):  # a ShareGPT dataset needs no subset name
            if d["source"] == "huggingface" and not d.get("repo"):
                raise ConfigError(f"{where}: source 'huggingface' needs `repo`")
            continue
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
        if "base" in r or "sft" in r:
            check_sft_run(config, name)
        elif is_conversations(config, r["dataset"]):
            raise ConfigError(f"{where}: dataset {r['dataset']!r} is conversations: add base/sft")
        elif "max_steps" not in r["train"]:
            raise ConfigError(f"{where}.train: 'max_steps' is a required property")
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


def sft_data_params(config: dict[str, Any], dataset: str) -> str:
    """What the prepared conversations depend on (lmpipe.sft_data)."""
    d = _fields_of(ConversationsConfig, config["datasets"][dataset])
    return canonical_json(d | {"dataset": dataset})


def sft_params(config: dict[str, Any], run: str) -> str:
    """train_params of a fine-tuning run plus its base and SFT settings (what the trainer gets)."""
    rc = run_config(config, run)
    assert rc.sft is not None and rc.base is not None, f"{run} is not a fine-tuning run"
    base = {k: v for k, v in dataclasses.asdict(rc.base).items() if v is not None}
    return canonical_json(
        json.loads(train_params(config, run)) | {"base": base, "sft": dataclasses.asdict(rc.sft)}
    )


def eval_params(config: dict[str, Any], run: str) -> str:
    rc = run_config(config, run)
    return canonical_json({"run": run, "eval": dataclasses.asdict(rc.eval)})


def report_params(config: dict[str, Any], report: str) -> str:
    rep = config["reports"][report]
    # what each run was trained and evaluated with: the report shows them side by side
    runs = {
        r: json.loads((sft_params if is_sft(config, r) else train_params)(config, r))
        | json.loads(eval_params(config, r))
        | {"text_dataset": text_dataset(config, r), "chat_dataset": chat_dataset(config, r)}
        for r in rep["runs"]
    }
    return canonical_json(
        {
            "report": report,
            "gpu_hour_price": rep["gpu_hour_price"],
            "runs": runs,
            "order": rep["runs"],  # canonical JSON sorts keys: the report's order, kept here
        }
    )

"""The config's typed sections, and the slice of it each stage depends on.

Torch-free on purpose: the Snakefile imports it at parse time and pytest covers it quickly. A
config is checked first (lmpipe.schema: schema defaults filled in, one-line errors); then

- the `*_params()` functions return the slice of the config a stage depends on, as canonical
  JSON. Rules pass them as `params:`, so Snakemake reruns a stage exactly when its slice changes;
- the dataclasses below are what a stage builds from that JSON (`TrainJob.from_json`, ...),
  once. Their fields are the settings themselves (lmpipe.settings: type, default, description,
  constraints): the schema is generated from them (lmpipe.config_schema) each time a config is
  checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lmpipe.hf_config import read_shape
from lmpipe.paths import DEFAULT_CONFIG, Layout
from lmpipe.registry import ARCHITECTURES, EVAL_SECTIONS, EVALUATIONS, OPTIMIZERS
from lmpipe.settings import optional, required, setting

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that is invalid; the message names the YAML path."""


def canonical_json(obj: Any) -> str:
    """Stable JSON (sorted keys, no spaces): equal settings give equal strings and hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def settings_hash(obj: Any) -> str:
    """Short sha256 of canonical JSON; used to tie checkpoints and results to their settings."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


def did_you_mean(key: str, valid: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------------------------
# typed sections: each field is a setting (type, default, description, constraints), from which
# the schema file is generated (lmpipe.config_schema); Snakemake's validate() fills in the defaults


@dataclass(frozen=True)
class Source:
    """Where a dataset's raw data comes from: text (the download stage) or conversations."""

    source: str = required("where the raw data comes from", enum=["local", "huggingface"])
    path: str | None = optional(
        "local file: parquet or jsonl text, .txt (one document), ShareGPT JSON (source: local)"
    )
    repo: str | None = optional("Hugging Face dataset repo (source: huggingface)")
    name: str | None = optional("dataset config/subset, e.g. sample-10BT")
    revision: str = setting("main", "the Hugging Face repo's revision")


@dataclass(frozen=True)
class SourceConfig(Source):
    """Where a dataset's raw text comes from (the download stage)."""

    max_files: int | None = optional("download only the first N parquet files", minimum=1)


@dataclass(frozen=True)
class TokenizeConfig:
    """How a dataset is cut into llm.c shards (the tokenize stage)."""

    dataset: str  # the entry's name (not a key of it): the params add it
    shard_tokens: int = required("tokens a shard", minimum=1)
    val_tokens: int = required("tokens of the validation shard", minimum=1)
    text_column: str = setting("text", "the raw files' column of text")


# the split patterns a tokenizer may name (else its `pattern` is a regex of its own): GPT-2's
# (tiktoken's r50k_pat_str) and GPT-4's (cl100k_base's, as karpathy/nanochat's
# nanochat/tokenizer.py writes it, with GPT-4's \\p{N}{1,3} kept; nanochat takes {1,2})
SPLIT_PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "gpt4": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""",
}  # fmt: skip
BYTE_ALPHABET = 256  # a byte-level BPE's first tokens: one a byte
EOT = "<|endoftext|>"  # a trained tokenizer's end of text (GPT-2's name)


@dataclass(frozen=True)
class TokenizerConfig:
    """A byte-level BPE trained on a text dataset's training text (the train_tokenizer stage)."""

    name: str  # the entry's name (not a key of it): the params add it
    dataset: str = required("a text dataset of `datasets:`: its training text (raw files)")
    vocab_size: int = required(
        "ids in all: 256 bytes, the merges, then the special tokens", minimum=BYTE_ALPHABET + 1
    )
    pattern: str = setting(
        "gpt4", "the split regex before BPE: `gpt2`, `gpt4` (SPLIT_PATTERNS), or a regex"
    )
    special_tokens: list[str] = setting(
        [EOT], "added after the merges; `<|endoftext|>` ends each document"
    )
    max_documents: int | None = optional("train on the first N training documents", minimum=1)
    max_bytes: int | None = optional("... or on the first N bytes of them", minimum=1)

    @property
    def regex(self) -> str:
        return SPLIT_PATTERNS.get(self.pattern, self.pattern)


@dataclass(frozen=True, kw_only=True)
class ConversationsConfig(Source):
    """A `kind: conversations` dataset: ShareGPT JSON -> masked token rows (lmpipe.chat.data)."""

    dataset: str  # the entry's name (not a key of it): the params add it
    seq_len: int = required("tokens a row (one conversation)", minimum=1)
    split: str = setting("train", "Hugging Face split")
    template: str = setting("vicuna_v1.1", "conversation template", enum=["vicuna_v1.1"])
    val_percent: float = setting(10.0, "held out by id hash", minimum=0, maximum=100)
    on_malformed: str = setting(
        "error",
        "a malformed conversation: stop naming it, or skip and count",
        enum=["error", "skip"],
    )


@dataclass(frozen=True)
class ModelConfig:
    """A model's shape; `arch` picks its code (lmpipe.registry.ARCHITECTURES). An architecture
    with settings of its own has a config of its own: this shape and its settings' fields, flat
    (`model_class`), so a `models:` entry, the train params and meta.json stay one flat dict."""

    n_layer: int = required("transformer blocks", minimum=1)
    n_head: int = required("attention heads", minimum=1)
    n_embd: int = required("width: the embedding's size", minimum=1)
    block_size: int = setting(1024, "the longest sequence (context length)", minimum=1)
    vocab_size: int = setting(50257, "the tokenizer's vocabulary", minimum=1)
    padded_vocab_size: int = setting(50304, "the embedding's rows (vocab_size padded)", minimum=1)
    arch: str = setting("gpt2", "the architecture (lmpipe.registry.ARCHITECTURES)")
    tokenizer: str | None = optional(
        "a `tokenizers:` entry: the model reads text in its tokens (vocab_size must be its) and"
        " its export carries it; left out, GPT-2's BPE"
    )


@functools.cache
def model_class(arch: str) -> type:
    """The config dataclass of `arch`'s models: ModelConfig itself for an arch without settings
    (GPT-2), else a subclass with its settings' fields after the shape's and `arch` defaulting
    to its name (`ModernModelConfig` for `modern`: `config.qk_norm`, ...)."""
    settings = ARCHITECTURES[arch].settings
    if settings is None:
        return ModelConfig
    name = settings.__name__.removesuffix("Settings") + "ModelConfig"
    arch_field = ("arch", str, field(default=arch))
    cls = dataclasses.make_dataclass(name, [arch_field], bases=(settings, ModelConfig), frozen=True)
    cls.__module__ = __name__
    return cls


def model_config(data: dict[str, Any], where: str) -> ModelConfig:
    """A `models:` entry (or a job's `model`) as the config of its arch; an unknown arch, or a
    key of no setting of that arch, is a ConfigError naming `where` and the key (and the arch
    that has it). The config check (lmpipe.schema) calls it on every entry: the one check of a
    model's keys, which the schema cannot say (which keys are allowed depends on `arch`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    arch = data.get("arch", "gpt2")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"{where}.arch: unknown architecture {arch!r}{did_you_mean(str(arch), ARCHITECTURES)}"
            f" (known: {', '.join(ARCHITECTURES)})"
        )
    cls = model_class(arch)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(f"{where}: {_unknown_model_key(key, arch, names)}")
    if arch == "hf":
        data = data | hf_shape(data, where)
    return build(cls, data, where)


def hf_shape(data: dict[str, Any], where: str) -> dict[str, int]:
    """An `arch: hf` model's shape keys, from its config.json (lmpipe.hf_config): the model's
    own, never the entry's."""
    from lmpipe import hf_folder

    if not isinstance(data.get("path"), str):
        raise ConfigError(f"{where}: 'path' is required for model.arch hf (a folder or a hub id)")
    path, local = data["path"], None
    try:  # a local folder, or a hub id's snapshot in the local Hugging Face cache
        local = hf_folder.resolve(path, data.get("revision"))
    except ValueError as e:
        if Path(path).expanduser().is_absolute() or path.startswith("."):
            raise ConfigError(f"{where}.path: {e}") from None
    try:
        if local is not None:  # checked whole before any job: lmpipe.hf_folder
            hf_folder.check_folder(local, bool(data.get("trust_remote_code")))
            path = str(local)
        # else a hub id the download stage fetches: its config.json's copy in resources/
        s = read_shape(path, bool(data.get("trust_remote_code")))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where}.path: {e}") from None
    found = {
        "n_layer": s.n_layer,
        "n_head": s.n_head,
        "n_embd": s.n_embd,
        "block_size": s.max_positions,
        "vocab_size": s.vocab_size,
        "padded_vocab_size": s.vocab_size,
    }
    for key, value in data.items():  # (the config check refuses them; a job's dict may hold them)
        if key in found and value != found[key]:
            raise ConfigError(
                f"{where}.{key}: an `arch: hf` model's shape is its config.json's ({key} {value}"
                f" is not the model's {found[key]})"
            )
    return found


def _unknown_model_key(key: str, arch: str, names: typing.Iterable[str]) -> str:
    """'unknown key ...' of a model entry: a setting of another arch says so."""
    owners = [
        a.name
        for a in ARCHITECTURES.values()
        if a.settings and key in {f.name for f in dataclasses.fields(a.settings)}
    ]
    if owners:
        return (
            f"unknown key {key!r} for model.arch {arch!r} (a setting of model.arch"
            f" {owners[0]!r} only)"
        )
    return f"unknown key {key!r}{did_you_mean(key, names)}"


@dataclass(frozen=True)
class ScheduleConfig:
    """Linear warmup to each parameter group's peak lr, then cosine decay to `lr_floor` x peak;
    or, with `cooldown_steps`, the peak held until the last `cooldown_steps` steps, which decay
    linearly to the floor (warmup-stable-decay: modded-nanogpt's trapezoid)."""

    warmup_steps: int = setting(0, "linear warmup from 0 to the peak lr", minimum=0)
    lr_floor: float = setting(0.0, "final lr as a fraction of the peak", minimum=0, maximum=1)
    cooldown_steps: int = setting(
        0,
        "the last N steps decay linearly from the peak to the floor, the peak held before them"
        " (warmup-stable-decay, modded-nanogpt's schedule); 0: cosine after the warmup",
        minimum=0,
    )


# train.compile_scope and train.compile_mode (lmpipe.train.parallel compiles accordingly)
COMPILE_SCOPES = ("regions", "blocks", "model")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes with CUDA graphs


def compile_problem(mode: str, device: str) -> str | None:
    """Why train.compile_mode `mode` cannot run on `device` (None: it can), in one line: CUDA
    graphs are the GPU's."""
    if mode in CUDA_GRAPH_MODES and device != "cuda":
        return (
            f"train.compile_mode {mode!r} captures CUDA graphs: launch.device cuda only (here"
            f" {device}); default or max-autotune-no-cudagraphs run anywhere"
        )
    return None


def loss_kernel_problem(kernel: str, device: str) -> str | None:
    """Why train.loss_kernel `kernel` cannot run on `device` (None: it can), in one line: the
    fused kernels are Triton's, the GPU's (whether the package is installed is the trainer's
    check, on the machine that trains: lmpipe.models.head_loss.kernel_problem)."""
    if kernel != "pytorch" and device != "cuda":
        return (
            f"train.loss_kernel {kernel!r} is a Triton kernel: launch.device cuda only (here"
            f" {device}); pytorch runs anywhere"
        )
    return None


@dataclass(frozen=True)
class FSDPConfig:
    """How FSDP2 shards the model (lmpipe.train.parallel); docs/fsdp.md argues the defaults from
    the memory of the 124M and 350M runs on 8 GPUs."""

    reshard_after_forward: bool = setting(
        False,
        "free a block's gathered params after its forward (and gather them again for its"
        " backward); false keeps them for the backward",
    )
    prefetch_blocks: int = setting(
        1,
        "blocks all-gathered ahead of the one computing, forward and backward (0: FSDP2's"
        " implicit order)",
        minimum=0,
    )
    reduce_dtype: str = setting(
        "float32",
        "dtype of the gradient reduce-scatter (bf16 runs)",
        enum=["float32", "bfloat16"],
    )
    reduce_each_micro_step: bool = setting(
        False,
        "reduce-scatter the gradients after every micro-step's backward (each rank holds only its"
        " shard of them); false: once a step, after the last micro-step, each rank accumulating"
        " the unsharded gradients (in reduce_dtype) until then",
    )
    shard: str = setting(
        "always",
        "wrap the model in FSDP2 (always); never: a one-rank run trains the plain model (bf16 by"
        " autocast), without FSDP's copies and hooks; auto: never on one rank, always on several",
        enum=["always", "never", "auto"],
    )

    def sharded(self, world_size: int) -> bool:
        """Whether a run over `world_size` data-parallel ranks wraps its model in FSDP2."""
        if self.shard == "never" and world_size > 1:
            raise ValueError(
                f"train.fsdp.shard 'never' needs one rank; this run has {world_size}: set always"
                " or auto"
            )
        return self.shard == "always" or world_size > 1


@dataclass(frozen=True)
class TrainConfig:
    """How a run trains: batch, steps, optimizer and schedule, checkpoints, precision,
    sharding."""

    seq_len: int = required("tokens a sequence", minimum=1)
    micro_batch: int = required("sequences a rank a micro-step", minimum=1)
    batch_tokens: int = required("tokens an optimizer step, all ranks", minimum=1)
    # the settings dataclass of optimizer.name (lmpipe.registry.OPTIMIZERS)
    optimizer: Any = required(
        "name (lmpipe.registry.OPTIMIZERS) and its settings, e.g. {name: adamw, lr: 6.0e-4} or"
        " {name: muon, lr: 0.02}"
    )
    max_steps: int = optional(
        "optimizer steps; required for pretraining, a fine-tuning run's follow from sft.epochs",
        default=0,
        minimum=1,
    )
    seed: int = setting(1337, "the seed of the initial weights and the data order")
    schedule: ScheduleConfig = setting(
        ScheduleConfig(),
        "linear warmup to the optimizer's lr, then cosine decay to lr_floor x lr (or, with"
        " cooldown_steps, the peak, then a linear decay)",
    )
    grad_clip: float = setting(1.0, "the gradients' largest norm; 0 disables clipping", minimum=0)
    val_every: int = setting(250, "val loss every N steps; 0: only at the end", minimum=0)
    val_tokens: int = setting(1048576, "tokens of the val shard each time", minimum=1)
    checkpoint_every: int = setting(1000, "a checkpoint every N steps (and at the last)", minimum=0)
    keep_checkpoints: int = setting(2, "the newest N checkpoints kept", minimum=1)
    checkpoint_async: bool = setting(
        False,
        "write periodic checkpoints in a thread (torch.distributed.checkpoint.async_save) so that"
        " training goes on while they are written; the last save and the save on a signal stay"
        " synchronous. Never changes the trajectory",
    )
    dtype: str = setting("float32", "the compute dtype", enum=["float32", "bfloat16"])
    embedding_dtype: str = setting(
        "float32",
        "the embedding tables' storage dtype (every nn.Embedding: token, position, value"
        " embeddings): bfloat16 keeps them, their gradients and their optimizer moments in bf16,"
        " as modded-nanogpt's records (bf16_embeds); needs dtype bfloat16 and an untied head,"
        " and is refused with compile_scope model (the tables are an FSDP unit of their own)",
        enum=["float32", "bfloat16"],
    )
    compile: bool = setting(False, "torch.compile the model")
    compile_scope: str = setting(
        "regions",
        "what train.compile compiles (lmpipe.train.parallel): regions (the stem, each block and"
        " the tail, final norm -> LM head -> loss, each alone); blocks (each block and the loss"
        " alone, the stem and final norm eager); model (the whole model as one graph, sharded"
        " by FSDP2 as one unit)",
        enum=list(COMPILE_SCOPES),
    )
    compile_mode: str = setting(
        "default",
        "torch.compile's mode for every compiled part: default; reduce-overhead (CUDA graphs);"
        " max-autotune-no-cudagraphs; max-autotune (autotuned kernels and CUDA graphs). CUDA"
        " graphs need launch.device cuda",
        enum=list(COMPILE_MODES),
    )
    fp8: bool = setting(
        False,
        "the blocks' linears in FP8 (torchao float8, tensorwise scaling; FSDP2 all-gathers their"
        " weights in float8): a GPU of compute capability 8.9 or newer (H100, H200); on the CPU"
        " torchao's emulation, for tests (lmpipe.train.fp8)",
    )
    attention_backend: str = setting(
        "auto",
        "the SDPA kernel attention runs on (torch.nn.attention.sdpa_kernel): auto (PyTorch's"
        " choice); cudnn (cuDNN attention, Hopper); flash; efficient; math. On the CPU only auto,"
        " flash (its CPU kernel) and math",
        enum=["auto", "cudnn", "flash", "efficient", "math"],
    )
    loss_chunk_tokens: int = setting(
        0,
        "the LM head and loss in chunks of this many positions, never the full logits"
        " (lmpipe.models.head_loss); 0: in one piece",
        minimum=0,
    )
    loss_kernel: str = setting(
        "pytorch",
        "the LM head and loss's implementation: pytorch (plain, or chunked by"
        " loss_chunk_tokens); liger (Liger-Kernel's fused linear cross-entropy) or"
        " cut_cross_entropy (Apple's): Triton kernels that never hold the logits, CUDA only,"
        " their package installed on the GPU machine (lmpipe.models.head_loss)",
        enum=["pytorch", "liger", "cut_cross_entropy"],
    )
    activation_checkpointing: str = setting(
        "none",
        "recompute activations in the backward instead of keeping them (llm.c's -r): none;"
        " full (each block's, keeping its input only); selective (each block's but for the"
        " matmuls' and attention's outputs)",
        enum=["none", "full", "selective"],
    )
    fsdp: FSDPConfig = setting(
        FSDPConfig(), "how FSDP2 shards the model; docs/fsdp.md argues the defaults"
    )

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
    """Where and how a run's training job runs (SLURM resources included)."""

    device: str = required("where it trains", enum=["cpu", "cuda"])
    nodes: int = setting(1, "nodes (SLURM)", minimum=1)
    procs_per_node: int = setting(1, "ranks a node (GPUs a node on cuda)", minimum=1)
    cpus_per_task: int = setting(2, "CPUs a rank (SLURM)", minimum=1)
    mem_mb: int = setting(4000, "memory a node, MB (SLURM)", minimum=1)
    runtime: int = setting(60, "a job's time limit, minutes (SLURM)", minimum=1)
    signal_seconds: int = setting(
        300,
        "SIGTERM this long before the time limit (and on preemption): checkpoint, fail, retry",
        minimum=1,
    )
    gpu_model: str | None = optional("e.g. a100, h100 (cluster-specific)")
    peak_flops: float | None = setting(
        None,
        "peak FLOP/s a device, for MFU; null: the GPU found (lmpipe.hardware), 1e12 nominal on"
        " CPUs",
        exclusiveMinimum=0,
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def gres(self, gpus: int) -> str | None:
        """SLURM's --gres for `gpus` GPUs a node of the run's kind (`gpu[:model]:N`), the one
        builder of the train rule's and of the derived resources; None on the CPU."""
        if self.device != "cuda" or gpus == 0:
            return None
        return f"gpu:{self.gpu_model}:{gpus}" if self.gpu_model else f"gpu:{gpus}"


@dataclass(frozen=True)
class Placement:
    """The launch settings that shape a run's trajectory or its logs (the trainer gets these;
    memory, time limits and the like never retrain a run)."""

    device: str
    nodes: int
    procs_per_node: int
    peak_flops: float | None

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass(frozen=True)
class BaseConfig:
    """A fine-tuning run's initial weights: one of `run` (a run's final checkpoint) or `hf` (a
    Hugging Face folder)."""

    run: str | None = optional("a pretraining run: its train/final checkpoint")
    hf: str | None = optional("a Hugging Face GPT-2 folder (config.json, model.safetensors)")
    dataset: str | None = optional("with `hf`: the text dataset of the val loss")


@dataclass(frozen=True)
class SFTConfig:
    """Chat fine-tuning (with `base:` and a `kind: conversations` dataset): steps = epochs *
    (train rows // conversation rows a step); warmup = ratio * steps."""

    epochs: int = setting(3, "passes over the training conversations", minimum=1)
    warmup_ratio: float = setting(0.04, "warmup steps, a share of the steps", minimum=0, maximum=1)
    replay: float = setting(
        0.0,
        "a share of each step's rows drawn from the base's pretraining text (its run's dataset,"
        " or an `hf` base's base.dataset), the loss on every token, so that fine-tuning keeps"
        " what pretraining taught (lmpipe.chat.replay); 0: conversations only",
        minimum=0,
        exclusiveMaximum=1,
    )

    def steps(self, conversations: int, rows_per_step: int) -> int:
        """Optimizer steps for `epochs` passes over `conversations` training rows, when a step
        takes `rows_per_step` rows and a `replay` share of them is text: epochs * (conversations
        // the conversation rows a step); 0 when the rows are fewer than one step's."""
        per_step = rows_per_step * (1 - self.replay)  # rows_per_step itself when replay is 0
        return self.epochs * math.floor(conversations / per_step)


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases beside metrics.jsonl (lmpipe.train.wandb_log). Never in the train params:
    switching it on or off retrains nothing (the train rule passes it as `--wandb`)."""

    project: str = required("the W&B project", minLength=1)
    group: str | None = setting(None, "null: a sweep's points get the sweep's name (lmpipe.sweeps)")
    mode: str = setting(
        "online",
        "offline: files under train/wandb/ only (`wandb sync` them later)",
        enum=["online", "offline", "disabled"],
    )


@dataclass(frozen=True)
class LoggingConfig:
    """Where else a run's metrics go; metrics.jsonl and TensorBoard are always written."""

    wandb: WandbConfig | None = optional(
        "Weights & Biases (the [wandb] extra), rank 0, the records of metrics.jsonl; off when"
        " absent"
    )


@dataclass(frozen=True)
class RunConfig:
    name: str
    dataset: str
    model_name: str  # its entry in `models:` (d12, ...)
    model: ModelConfig
    train: TrainConfig | None  # None: a reference run (evaluated, never trained)
    launch: LaunchConfig
    eval: dict[str, Any] = field(default_factory=dict)  # section -> its settings dataclass
    base: BaseConfig | None = None
    sft: SFTConfig | None = None
    logging: LoggingConfig = LoggingConfig()

    @property
    def fine_tuning(self) -> bool:
        return self.sft is not None


@dataclass(frozen=True)
class TrainJob:
    """What the trainer gets: the train rule's params (`train_params`), typed."""

    run: str
    dataset: str
    model: ModelConfig
    train: TrainConfig
    launch: Placement
    base: BaseConfig | None = None
    sft: SFTConfig | None = None
    # the evaluations scored as the model trains: name -> its settings (`in_training`)
    during_training: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> TrainJob:
        data = json.loads(text)
        return build(cls, data, "train job", train=train_config, model=model_config)


@dataclass(frozen=True)
class EvalJob:
    """What an evaluation gets: the evaluate rule's params (`eval_params`), typed."""

    run: str
    evaluation: str
    settings: Any

    @classmethod
    def from_json(cls, text: str) -> EvalJob:
        data = json.loads(text)
        name = data.get("evaluation")
        if name not in EVALUATIONS:
            raise ConfigError(
                f"eval job: unknown evaluation {name!r}{did_you_mean(name, EVALUATIONS)}"
            )
        settings = EVALUATIONS[name].settings
        return cls(data["run"], name, build(settings, data["settings"], f"eval.{name}"))


# ----------------------------------------------------------------------------------------------
# building dataclasses from (validated) dicts


def build(cls: type[T], data: Any, where: str, **custom: Any) -> T:
    """Dataclass `cls` from a dict: nested dataclasses, tuples and optional fields converted;
    an unknown or missing key is a ConfigError naming `where.key`. `custom` maps a field name to
    a function(value, where) that builds it instead (a field whose type depends on its value)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: {f.name!r} is required")
            continue
        value, sub = data[f.name], f"{where}.{f.name}"
        if f.name in custom:
            kwargs[f.name] = custom[f.name](value, sub)
        else:
            kwargs[f.name] = _convert(value, hints[f.name], sub)
    return cls(**kwargs)


def _convert(value: Any, hint: Any, where: str) -> Any:
    if value is None:
        return None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if typing.get_origin(hint) is tuple:
        return tuple(value)
    return value


def optimizer_settings(data: dict[str, Any], where: str) -> type:
    """The settings dataclass of the optimizer `data` names; an unknown name is an error."""
    name = data.get("name")
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"{where}.name: unknown optimizer {name!r}{did_you_mean(str(name), OPTIMIZERS)}"
            f" (known: {', '.join(OPTIMIZERS)})"
        )
    return OPTIMIZERS[name].settings


def optimizer_config(data: dict[str, Any], where: str) -> Any:
    return build(optimizer_settings(data, where), data, where)


def train_config(data: dict[str, Any], where: str) -> TrainConfig:
    return build(TrainConfig, data, where, optimizer=optimizer_config)


def named_models(path: str | Path = DEFAULT_CONFIG) -> dict[str, ModelConfig]:
    """The `models:` of a config file (d12 = GPT-2 124M, d24 = 350M, ...; the sizes are written
    there only), for benchmarks and tools that take a size by name."""
    import yaml

    models = yaml.safe_load(Path(path).read_text())["models"]
    return {name: model_config(m, f"models.{name}") for name, m in models.items()}


def layout(config: dict[str, Any]) -> Layout:
    paths = config["paths"]
    return Layout(results=paths["results"], data=paths["data"])


# ----------------------------------------------------------------------------------------------
# reading the (validated) config


def run_config(config: dict[str, Any], run: str) -> RunConfig:
    """The typed config of one run (model resolved by name)."""
    r, where = config["runs"][run], f"runs.{run}"
    return RunConfig(
        name=run,
        dataset=r["dataset"],
        model_name=r["model"],
        model=model_config(config["models"][r["model"]], f"models.{r['model']}"),
        train=None if r["train"] is None else train_config(r["train"], f"{where}.train"),
        launch=build(LaunchConfig, r["launch"], f"{where}.launch"),
        eval={s: build(cls, r["eval"][s], f"{where}.eval.{s}") for s, cls in EVAL_SECTIONS.items()},
        base=build(BaseConfig, r["base"], f"{where}.base") if "base" in r else None,
        sft=build(SFTConfig, r["sft"], f"{where}.sft") if "sft" in r else None,
        logging=build(LoggingConfig, r.get("logging", {}), f"{where}.logging"),
    )


def is_reference(config: dict[str, Any], run: str) -> bool:
    """A reference run (`train: null`): a Hugging Face model evaluated as it is, never trained;
    its model/hf/ is that model's folder (the `reference` rule), not a conversion."""
    return config["runs"][run]["train"] is None


def hub_models(config: dict[str, Any]) -> list[str]:
    """The `arch: hf` models named by a hub id (a path that is no local folder): the ones the
    `download_model` rule fetches."""
    return [
        name
        for name, m in config["models"].items()
        if m.get("arch") == "hf" and not Path(m["path"]).is_dir()
    ]


def reference_source(config: dict[str, Any], run: str) -> str:
    """The folder a reference run's model is read from: a local folder as it is, a hub model's
    download."""
    name = config["runs"][run]["model"]
    if name in hub_models(config):
        return layout(config).hub_model_dir(name)
    return config["models"][name]["path"]


def base_source(config: dict[str, Any], run: str) -> str:
    """A fine-tuning run's starting weights: its base run's final checkpoint, or its `hf`
    folder; a hub id that is an `arch: hf` model's path, as the download stage fetched it."""
    base = config["runs"][run]["base"]
    if base.get("run"):
        return layout(config).final_checkpoint(base["run"])
    for name in hub_models(config):
        if config["models"][name]["path"] == base["hf"]:
            return layout(config).hub_model_dir(name)
    return base["hf"]


def exports_llmc(config: dict[str, Any], run: str) -> bool:
    """Whether a run gets model/llmc.bin: its architecture's `exports` hold "llmc"
    (lmpipe.registry; GPT-2). The one answer of the rules, the plan and the check below."""
    arch = config["models"][config["runs"][run]["model"]]["arch"]
    return "llmc" in ARCHITECTURES[arch].exports


def check_llmc_export(config: dict[str, Any], run: str) -> None:
    """A run's model/llmc.bin (the export_llmc rule) only where exports_llmc: asked of another,
    a ConfigError naming the run, its model and arch, before any job starts."""
    model = config["runs"][run]["model"]
    arch = config["models"][model]["arch"]
    exports = ARCHITECTURES[arch].exports
    if not exports_llmc(config, run):
        raise ConfigError(
            f"runs.{run}.model: model {model!r} is model.arch {arch!r}, which has no llm.c export"
            f" (model/llmc.bin: llm.c's format holds GPT-2 only; {arch} exports:"
            f" {', '.join(exports)})"
        )


def is_conversations(config: dict[str, Any], dataset: str) -> bool:
    return config["datasets"][dataset].get("kind") == "conversations"


def is_mixture(config: dict[str, Any], dataset: str) -> bool:
    """A `{mixture: {source: weight, ...}}` dataset (lmpipe.data.mixture): tokenized as its
    sources, never itself."""
    return "mixture" in config["datasets"][dataset]


def mixture_params(config: dict[str, Any], dataset: str) -> str:
    """What a mixture's manifest depends on: its weights (each source's own data is its input)."""
    return canonical_json(config["datasets"][dataset]["mixture"])


def is_fine_tuning(config: dict[str, Any], run: str) -> bool:
    return "sft" in config["runs"][run]


def text_dataset(config: dict[str, Any], run: str) -> str:
    """The text dataset a run is measured on (FineWeb val loss); a fine-tuning run's: its base's."""
    r = config["runs"][run]
    if "base" not in r:
        return r["dataset"]
    base = r["base"]
    return config["runs"][base["run"]]["dataset"] if base.get("run") else base["dataset"]


GPT2_VOCAB = 50257  # GPT-2's BPE: an `arch: hf` model of this vocabulary reads its tokens


TRAINED_TOKENS = "tok-"  # tokens_of of a trained tokenizer: `tok-{name}`


def tokens_of(config: dict[str, Any], run: str) -> str | None:
    """Whose tokens a run reads (the one answer: its text, its export, its evaluations):
    `tok-{name}` for a model with `tokenizer: name` (a tokenizer of `tokenizers:`, trained);
    the `models:` entry whose own tokenizer a run's text is tokenized with: an `arch: hf`
    model's, unless its vocabulary is GPT-2's 50,257 (the GPT-2 family's BPE: it reads the text's
    GPT-2 tokens, and its val loss pairs with our GPT-2 runs'); None for GPT-2's tokens.
    `tokenizer_folder` turns the answer into the tokenizer's folder."""
    name = config["runs"][run]["model"]
    m = config["models"][name]
    if m.get("tokenizer"):  # a tokenizer of `tokenizers:`, trained: tokens-tok-{name}/
        return TRAINED_TOKENS + m["tokenizer"]
    if m.get("arch") != "hf":
        return None
    vocab = _hf_vocab(m["path"], m.get("revision"), bool(m.get("trust_remote_code")), name)
    return None if vocab == GPT2_VOCAB else name


@functools.cache
def _hf_vocab(path: str, revision: str | None, trust_remote_code: bool, name: str) -> int:
    """An `arch: hf` model's vocabulary (its folder read once: a rule's every input asks)."""
    data = {"path": path, "revision": revision, "trust_remote_code": trust_remote_code}
    return hf_shape(data, f"models.{name}")["vocab_size"]


def text_tokens(config: dict[str, Any], run: str) -> str:
    """The tokens manifest of a run's text: its pretraining data (continued pretraining of an
    `arch: hf` model too) and its val loss's val shard."""
    return layout(config).tokens_manifest(text_dataset(config, run), tokens_of(config, run))


def hf_tokenizer_folder(config: dict[str, Any], model: str) -> str:
    """The folder of an `arch: hf` model's own tokenizer: a hub model's as the download stage
    fetched it, else its local folder (or the cache's snapshot)."""
    from lmpipe import hf_folder

    if model in hub_models(config):
        return layout(config).hub_model_dir(model)
    m = config["models"][model]
    return str(hf_folder.resolve(m["path"], m.get("revision")))


def trained_tokenizer(key: str | None) -> str | None:
    """The `tokenizers:` entry a tokens_of answer names, if it names one."""
    return key.removeprefix(TRAINED_TOKENS) if key and key.startswith(TRAINED_TOKENS) else None


def tokenizer_folder(config: dict[str, Any], key: str | None) -> str:
    """The folder of the tokenizer a tokens_of answer names: a trained one's, an `arch: hf`
    model's own, or GPT-2's (the config's `tokenizer`) for None."""
    if key is None:
        return config["tokenizer"]
    if (name := trained_tokenizer(key)) is not None:
        return layout(config).tokenizer_dir(name)
    return hf_tokenizer_folder(config, key)


def run_tokenizer_folder(config: dict[str, Any], run: str) -> str:
    """The folder of the tokenizer run `run` reads and exports (tokens_of)."""
    return tokenizer_folder(config, tokens_of(config, run))


def hub_model_in(config: dict[str, Any], folder: str) -> str | None:
    """The hub model of `models:` that the download stage fetches into `folder`, if any."""
    hub = (m for m in hub_models(config) if layout(config).hub_model_dir(m) == folder)
    return next(hub, None)


def tokenizer_key(config: dict[str, Any], folder: str) -> str:
    """What a tokenizer's outputs depend on, for rule params: a hub model's id and pinned
    revision (not downloaded yet when the DAG is planned), else its files' sha256."""
    from lmpipe import hf_folder

    trained = {layout(config).tokenizer_dir(t): t for t in config.get("tokenizers", {})}
    if folder in trained:  # not trained yet when the DAG is planned: its settings
        return tokenizer_params(config, trained[folder])
    if (name := hub_model_in(config, folder)) is not None:
        m = config["models"][name]
        return f"{m['path']}@{m.get('revision') or 'main'}"
    return hf_folder.tokenizer_identity(folder)


def chat_dataset(config: dict[str, Any], run: str) -> str | None:
    """The conversations a run's chat evaluations use: its own (fine-tuning), its fine-tunings'
    (a base run; a reference run of a Hugging Face base: those of its model from its text
    dataset), or None."""
    if is_fine_tuning(config, run):
        return config["runs"][run]["dataset"]
    me = config["runs"][run]
    children = {
        r["dataset"]
        for name, r in config["runs"].items()
        if r.get("base", {}).get("run") == run
        or (
            me["train"] is None
            and r.get("base", {}).get("hf")
            and r["model"] == me["model"]
            and text_dataset(config, name) == me["dataset"]
        )
    }
    return min(children) if children else None


def evaluations_of(config: dict[str, Any], run: str) -> list[str]:
    """The evaluations a run gets (lmpipe.registry.EVALUATIONS, in their order)."""
    has_chat = chat_dataset(config, run) is not None
    rc = run_config(config, run)
    return [e.name for e in EVALUATIONS.values() if e.applies(rc.eval[e.section], has_chat)]


def _hellaswag_file(config: dict[str, Any], run: str) -> str:
    return config["hellaswag"][run_config(config, run).eval["hellaswag"].file]


# the files a job reads besides the model, by kind (lmpipe.registry.Evaluation.inputs): each
# kind's one path function (config, run) -> path, which the evaluate rule's inputs and
# `python -m lmpipe.eval`'s flags (--tokens, --hellaswag, ...) follow
INPUT_FILES: dict[str, typing.Callable[[dict[str, Any], str], str]] = {
    "tokens": text_tokens,
    "hellaswag": _hellaswag_file,
    "suite": lambda config, run: layout(config).suite_manifest(),
    "conversations": lambda config, run: chat_tokens(config, run),
}


def task_texts(config: dict[str, Any], run: str) -> list[str]:
    """The evaluation texts a run's evaluations read, as lmpipe.eval.task_bytes counts them:
    `suite` (every task of its manifest) and `hellaswag-{file}` (the `hellaswag:` key)."""
    kinds = {k for e in evaluations_of(config, run) for k in EVALUATIONS[e].inputs}
    texts = ["suite"] if "suite" in kinds else []
    if "hellaswag" in kinds:
        texts.append(f"hellaswag-{run_config(config, run).eval['hellaswag'].file}")
    return texts


def task_bytes_files(config: dict[str, Any], runs: list[str]) -> list[str]:
    """The task_bytes results a report of `runs` shows: each text its runs' evaluations read, in
    GPT-2's tokenizer and in each of its runs' own."""
    texts = sorted({t for r in runs for t in task_texts(config, r)})
    tokens = sorted({tokens_of(config, r) for r in runs} - {None})
    return [layout(config).task_bytes(t, of) for t in texts for of in [None, *tokens]]


def task_bytes_input(config: dict[str, Any], text: str) -> str:
    """The file a task_bytes text names: the suite's manifest or a `hellaswag:` file."""
    if text == "suite":
        return layout(config).suite_manifest()
    return config["hellaswag"][text.removeprefix("hellaswag-")]


def eval_inputs(config: dict[str, Any], run: str, evaluation: str) -> dict[str, str]:
    """The files evaluation `evaluation` of `run` reads besides the model, by kind."""
    return {kind: INPUT_FILES[kind](config, run) for kind in EVALUATIONS[evaluation].inputs}


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


def tokenizer_params(config: dict[str, Any], name: str) -> str:
    """What a trained tokenizer depends on: its settings and its dataset's text column and val
    shard (the text held out); a change retrains it, and so retokenizes and retrains its runs."""
    t = config["tokenizers"][name]
    data = config["datasets"][t["dataset"]]
    return canonical_json({
        "tokenizer": _fields_of(TokenizerConfig, t) | {"name": name},
        "dataset": _fields_of(TokenizeConfig, data) | {"dataset": t["dataset"]},
    })  # fmt: skip


def tokenizing_models(config: dict[str, Any]) -> list[str]:
    """The `arch: hf` models whose runs read text in the model's own tokens, and the trained
    tokenizers (`tok-{name}`) some run reads (tokens_of)."""
    return sorted({m for r in config["runs"] if (m := tokens_of(config, r))})


def conversations_params(config: dict[str, Any], dataset: str, model: str | None = None) -> str:
    """What the prepared conversations depend on (lmpipe.chat.data): the dataset's settings and,
    in a tokenizer other than GPT-2's (`model`: a tokens_of answer), that tokenizer's identity
    (tokenizer_key: a changed tokenizer reruns them)."""
    d = _fields_of(ConversationsConfig, config["datasets"][dataset])
    if model is not None:
        d["tokenizer"] = tokenizer_key(config, conversations_tokenizer(config, model))
    return canonical_json(d | {"dataset": dataset})


def conversations_tokenizer(config: dict[str, Any], model: str | None) -> str:
    """The folder whose tokenizer prepares conversations in `model`'s tokens (a tokens_of
    answer): an `arch: hf` model's own, a trained one's (`tok-{name}`), or GPT-2's (the config's
    `tokenizer`) for None."""
    return tokenizer_folder(config, model)


def chat_tokens(config: dict[str, Any], run: str) -> str:
    """The prepared conversations a run fine-tunes on and its chat evaluations score: its chat
    dataset in the tokens of the run's own model (tokens_of), so one dataset entry serves any
    number of bases, each tokenized once per tokenizer."""
    return layout(config).conversations_manifest(chat_dataset(config, run), tokens_of(config, run))


def conversation_tokenizings(config: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Each (conversations dataset, model whose tokens it is prepared in; None: GPT-2's) that
    some run reads (chat_tokens)."""
    pairs = {
        (dataset, tokens_of(config, r))
        for r in config["runs"]
        if (dataset := chat_dataset(config, r)) is not None
    }
    return sorted(pairs, key=lambda p: (p[0], p[1] or ""))


# train keys added since runs were trained, with the value that behaves as they did
ADDED_TRAIN_KEYS = {
    "checkpoint_async": False,
    "loss_chunk_tokens": 0,
    "loss_kernel": "pytorch",
    "activation_checkpointing": "none",
    "fp8": False,
    "attention_backend": "auto",
    "compile_scope": "regions",
    "compile_mode": "default",
    "embedding_dtype": "float32",
}
# train.fsdp's: once-a-step reduction sums the same micro-steps' gradients as a reduction each
# micro-step did, in another order (equal up to rounding), so a run trained before the key
# existed is not trained again for it
ADDED_FSDP_KEYS = {"reduce_each_micro_step": False, "shard": "always"}
# the same for a fine-tuning run's sft settings
ADDED_SFT_KEYS = {"replay": 0.0}
# the same for the optimizer's settings (train.optimizer) and a model's (models:)
ADDED_OPTIMIZER_KEYS = {
    "momentum_warmup_steps": 0, "momentum_start": 0.85, "embed_lr": None, "scalar_lr": None,
}  # fmt: skip
ADDED_MODEL_KEYS: dict[str, Any] = {
    "rope_frequencies": "all", "no_attention": (), "embed_init_std": 0.02, "qkv": "fused",
    "unet_skips": False, "value_embeddings": 0, "embedding_mix": False,
    "document_mask": False, "attention_window": None, "attention_window_final": None,
    "tokenizer": None, "linear_init": "normal", "loss_over_padding": False,
}  # fmt: skip


def _as_before(settings: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """`settings` less the keys of `added` that hold the value they behave as before with (a
    list or tuple compared as a tuple: JSON gives lists, the dataclasses tuples)."""

    def before(key: str, value: Any) -> bool:
        old = added.get(key, object())
        return value == old or (isinstance(value, list | tuple) and tuple(value) == old)

    return {k: v for k, v in settings.items() if not before(k, v)}


def model_settings(model: Any) -> dict[str, Any]:
    """A model's config as a dict, less the keys added since runs were trained while they hold
    the value that behaves as before (ADDED_MODEL_KEYS): its part of a run's params and of its
    trajectory's hash."""
    return _as_before(dataclasses.asdict(model), ADDED_MODEL_KEYS)


def without_added_keys(train: dict[str, Any]) -> dict[str, Any]:
    """A train section's dict less the keys added since runs were trained while they hold the
    value that behaves as before (ADDED_TRAIN_KEYS, ADDED_OPTIMIZER_KEYS, ADDED_FSDP_KEYS): what
    a run's params and its trajectory's hash leave out alike."""
    out = _as_before(train, ADDED_TRAIN_KEYS)
    if isinstance(out.get("optimizer"), dict):
        out["optimizer"] = _as_before(out["optimizer"], ADDED_OPTIMIZER_KEYS)
    if isinstance(out.get("fsdp"), dict):
        out["fsdp"] = _as_before(out["fsdp"], ADDED_FSDP_KEYS)
    return out


def train_settings(train: TrainConfig) -> dict[str, Any]:
    """The train section as a dict, less the keys added since a run was trained
    (without_added_keys; and schedule.cooldown_steps) while they have the value that behaves
    as before: adding a key never reruns a finished run (Snakemake reruns a job whose params
    changed); lmpipe.train.loop.trajectory_hash leaves them out alike, so that a half-trained
    run's checkpoints still resume."""
    settings = without_added_keys(dataclasses.asdict(train))
    if not settings["schedule"]["cooldown_steps"]:
        del settings["schedule"]["cooldown_steps"]
    return settings


def in_training(rc: RunConfig) -> dict[str, dict[str, Any]]:
    """The evaluations a run scores as it trains (lmpipe.registry: an Evaluation with a
    `during_training` scorer whose section's `during_training.every` is on), each with its
    schedule, a null taking the section's setting of the same name (items, tasks), and the
    section's settings it reads (HellaSwag's file). In the train params: a change of them reruns
    the training, which resumes (they are not in the trajectory's hash)."""
    out = {}
    for e in EVALUATIONS.values():
        if e.during_training is None:
            continue
        section = rc.eval[e.section]
        schedule = dataclasses.asdict(section.during_training)
        if schedule["every"] > 0:
            resolved = {k: getattr(section, k) if v is None else v for k, v in schedule.items()}
            out[e.name] = resolved | {k: getattr(section, k) for k in e.during_training.reads}
    return out


def download_model_params(config: dict[str, Any], model: str) -> str:
    """A hub model's id and revision (what the download fetches)."""
    m = config["models"][model]
    return canonical_json({"model": model, "path": m["path"], "revision": m.get("revision")})


def reference_params(config: dict[str, Any], run: str) -> dict[str, Any]:
    """A reference run as the report shows it: its model (the hf entry: path, revision,
    trust_remote_code, the shape read from its config.json), data and placement."""
    rc = run_config(config, run)
    return {
        "run": run,
        "dataset": rc.dataset,
        "model": model_settings(rc.model),
        "reference": True,
        "launch": {f.name: getattr(rc.launch, f.name) for f in dataclasses.fields(Placement)},
    }


def train_params(config: dict[str, Any], run: str) -> str:
    """Model, training settings, placement (and a fine-tuning run's base and epochs): everything
    that shapes the trajectory or its logs, as a TrainJob."""
    rc = run_config(config, run)
    if rc.train is None:
        raise ConfigError(f"runs.{run}: a reference run (train: null) has no train job")
    job = {
        "run": run,
        "dataset": rc.dataset,
        "model": model_settings(rc.model),
        "train": train_settings(rc.train),
        # cluster-only resources (memory, time limit, ...) never retrain a run
        "launch": {f.name: getattr(rc.launch, f.name) for f in dataclasses.fields(Placement)},
    }
    name = config["runs"][run]["model"]
    if name in hub_models(config):  # the job reads the download stage's folder, never the hub
        job["model"]["path"] = layout(config).hub_model_dir(name)
    if rc.fine_tuning:
        job["base"] = {k: v for k, v in dataclasses.asdict(rc.base).items() if v is not None}
        job["sft"] = _as_before(dataclasses.asdict(rc.sft), ADDED_SFT_KEYS)
    if evals := in_training(rc):
        job["during_training"] = evals
    return canonical_json(job)


def wandb_settings(config: dict[str, Any], run: str) -> str | None:
    """A run's logging.wandb as canonical JSON, None when off. Not part of `train_params`: the
    train rule passes it apart, so that switching W&B on or off reruns nothing."""
    wandb = run_config(config, run).logging.wandb
    return None if wandb is None else canonical_json(dataclasses.asdict(wandb))


def eval_params(config: dict[str, Any], run: str, evaluation: str) -> str:
    """One evaluation of a run: only its own section's settings, so that changing another
    evaluation's settings never reruns it; nor its schedule during training (`during_training`:
    the train job's)."""
    section = EVALUATIONS[evaluation].section
    settings = dataclasses.asdict(run_config(config, run).eval[section])
    settings.pop("during_training", None)
    params = {"run": run, "evaluation": evaluation, "settings": settings}
    form = EVALUATIONS[evaluation].result_format
    return canonical_json(params | ({"result_format": form} if form > 1 else {}))


def report_params(config: dict[str, Any], report: str) -> str:
    rep = config["reports"][report]
    runs = {}
    for r in rep["runs"]:
        rc = run_config(config, r)
        # what each run was trained and evaluated with: the report shows them side by side
        if rc.train is None:
            how = reference_params(config, r)
        else:
            how = json.loads(train_params(config, r))
        runs[r] = how | {
            "eval": {s: dataclasses.asdict(v) for s, v in rc.eval.items()},
            "evaluations": evaluations_of(config, r),
            "text_dataset": text_dataset(config, r),
            "tokens_of": tokens_of(config, r),  # whose tokens its text is in (None: GPT-2's)
            "task_texts": task_texts(config, r),  # its tasks' text, counted (task_bytes)
            "chat_dataset": chat_dataset(config, r),
        }
    return canonical_json(
        {
            "report": report,
            "gpu_hour_price": rep["gpu_hour_price"],
            "runs": runs,
            "order": rep["runs"],  # canonical JSON sorts keys: the report's order, kept here
            **({"compare": rep["compare"]} if rep.get("compare") else {}),
        }
    )

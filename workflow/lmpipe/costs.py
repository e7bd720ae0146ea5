"""What each job of the DAG costs: its time, disk, GPUs and CPUs, estimated before it runs.

A job's time comes from measured throughputs where there are any (resources/throughputs.yaml:
tokenize tokens/s a core and on its one serial thread, train MFU on a GPU from gpu_check),
otherwise from the run's FLOPs (the architecture's own count, lmpipe.registry: llm.c's 6N + 6LCT
a token; 2N + 2LCT forward) over the GPU's dense bf16 peak (lmpipe.hardware) times an assumed
MFU; each estimate says which (`Job.basis`). Two readers: lmpipe.resources (what the rules
submit: a time limit of twice the estimate plus 10 minutes, a GPU of the run's kind) and
lmpipe.plan (the plan printed for people).

- tokenize: a node's CPUs (the most any GPU run on the dataset asks for), all encoding, but no
  faster than its one thread that reads the parquet and writes the shards;
- convert and evaluate of a GPU run: one GPU of the run's kind and the CPUs and memory that
  come with it (the run's share a GPU);
- train: the run's `launch:`; a run longer than its time limit continues in the next job from
  its checkpoint (SIGTERM signal_seconds before the limit), up to the profile's retries.

A job is flagged (`Job.problems`) when it cannot finish: an estimate over its time limit (or the
partition's, `cluster.max_runtime`), or a training that needs more jobs in a row than the retries
allow. Torch-free: the Snakefile imports it through lmpipe.resources.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from lmpipe import config as lmconfig
from lmpipe import manifests
from lmpipe.eval.suite.tasks import TASKS as SUITE_TASKS  # a definition module (no stage code)
from lmpipe.hardware import GPU_BF16_PEAK, GPU_MEMORY_GB, by_gpu, gpu_peak_flops
from lmpipe.hf_config import read_shape
from lmpipe.paths import REPO_ROOT
from lmpipe.registry import ARCHITECTURES, EVALUATIONS, HELLASWAG_ITEM_TOKENS, EvalRun, code
from lmpipe.throughputs import basis, figure, stated, throughputs

SLURM_PROFILE = REPO_ROOT / "slurm" / "config.yaml"
DEFAULT_GPU = "a100"  # llm.c's reference hardware, when a run names no gpu_model
MIN_LIMIT = 30  # minutes: the least a derived time limit asks for


@cache
def retries() -> int:
    """Jobs a training may take in a row: the slurm profile's retries + the first."""
    return int(yaml.safe_load(SLURM_PROFILE.read_text()).get("retries", 0))


# ----------------------------------------------------------------------------------------------
# the model's arithmetic


def num_params(model: lmconfig.ModelConfig) -> int:
    return ARCHITECTURES[model.arch].num_params(model)


def train_flops_per_token(model: lmconfig.ModelConfig, seq_len: int) -> float:
    """llm.c's formula, 6N + 6LCT (forward and backward): the architecture's one count
    (lmpipe.registry), which the model's MFU also reads."""
    return ARCHITECTURES[model.arch].flops_per_token(model, seq_len)


def forward_flops_per_token(model: lmconfig.ModelConfig, seq_len: int) -> float:
    return train_flops_per_token(model, seq_len) / 3


def startup_s(run: lmconfig.RunConfig, kind: str) -> float:
    """A job's start (`kind`: train or eval) on the run's device."""
    return figure(kind, "startup_s" if run.launch.device == "cuda" else "cpu_startup_s")


def gpu_name(run: lmconfig.RunConfig, gpu: str | None) -> str:
    return gpu or run.launch.gpu_model or DEFAULT_GPU


class UnknownGPU(ValueError):
    """A GPU without a known peak: the message says which are known and how to give one."""

    def __init__(self, name: str, where: str):
        known = ", ".join(sorted(GPU_BF16_PEAK))
        how = f"--gpu {name}=PEAK (e.g. {name}=165e12)" if where == "--gpu" else "launch.peak_flops"
        super().__init__(
            f"{where}: no known peak for GPU {name!r} (known: {known}); give its dense bf16"
            f" FLOP/s as {how} or add it to lmpipe.hardware"
        )


def gpu_hour_price(price: float | dict[str, float], gpu: str) -> float | None:
    """USD per GPU-hour of `gpu` under a report's `gpu_hour_price`: one figure for any GPU, or
    a figure by GPU type (matched as the peaks are); None where the mapping has no entry."""
    return float(price) if isinstance(price, int | float) else by_gpu(price, gpu)


def device_flops(run: lmconfig.RunConfig, gpu: str | None, kind: str) -> tuple[float, str]:
    """FLOP/s one device of the run achieves (`kind`: train or eval), and how it is known."""
    if run.launch.device != "cuda":
        return figure(kind, "cpu_flops_per_s"), f"CPU {basis(kind, 'cpu_flops_per_s')}"
    name = gpu_name(run, gpu)
    peak = gpu_peak_flops(name) or (None if gpu else run.launch.peak_flops)
    if peak is None:
        raise UnknownGPU(name, "--gpu" if gpu else f"runs.{run.name}.launch.gpu_model")
    label = name  # SLURM gives any GPU where the run names none: say what the plan assumed
    if not gpu and not run.launch.gpu_model:
        label = f"any GPU (launch.gpu_model unset) as {DEFAULT_GPU}"
    measured = (throughputs()["train"].get("gpu_mfu_measured") or {}).get(run.model_name, {})
    if kind == "train" and name.lower() in measured:
        return peak * measured[name.lower()], f"{label}, MFU {measured[name.lower()]:.0%} measured"
    mfu = figure(kind, "gpu_mfu")
    return peak * mfu, f"{label} peak x MFU {mfu:.0%} {basis(kind, 'gpu_mfu')}"


def block_values_a_token(m: lmconfig.ModelConfig) -> float:
    """Activations a block keeps for its backward, in values a token: Korthikanti et al.'s
    34 C bytes in bf16 (17 C values) for GPT-2's shape; for a Hugging Face model, from its
    config.json's shape (lmpipe.hf_config): the two norms' inputs and outputs (4 C), q, k and v
    (GQA's fewer k and v heads), the attention's output, and the MLP's inner activations (a gated
    MLP: gate, up, the activation and the product, 4 I; GPT-2's: 2 I)."""
    if m.arch != "hf":
        return 17 * m.n_embd
    s = read_shape(m.path, m.trust_remote_code)
    q, kv = s.n_head * s.head_dim, s.n_kv_head * s.head_dim
    return 4 * s.n_embd + 2 * q + 2 * kv + (4 if s.gated_mlp else 2) * s.intermediate


def gpu_memory_gb(run: lmconfig.RunConfig, recompute: str | None = None) -> float:
    """A GPU's peak memory in training, roughly: fp32 params, grads and AdamW's two moments
    sharded over the ranks (16N/W bytes); the bf16 params gathered for forward and backward (2N,
    kept between them unless fsdp.reshard_after_forward); with gradient accumulation reduced once
    a step (not fsdp.reduce_each_micro_step), the unsharded fp32 gradients accumulated until
    then (4N); the activations of bf16 blocks with
    flash attention (34 C bytes a token a layer, Korthikanti et al. 2022); the head's bf16 logits
    and their fp32 softmax (6 bytes a vocabulary entry a token).

    `recompute` (train.activation_checkpointing unless given): full keeps a block's input only
    (2 C bytes a token a layer) and one block's activations while it is recomputed; selective
    keeps the matmuls' and attention's outputs and the input (11 C values: 22 C bytes). With
    train.loss_chunk_tokens the head holds one chunk's logits, and dL/dx and dL/dW."""
    n, m, t = num_params(run.model), run.model, run.train
    recompute = recompute or t.activation_checkpointing
    tokens = t.micro_batch * t.seq_len
    act_bytes = 2 if t.dtype == "bfloat16" else 4
    params = 16 * n / run.launch.world_size + act_bytes * n
    if t.grad_accum_steps(run.launch.world_size) > 1 and not t.fsdp.reduce_each_micro_step:
        params += 4 * n
    block = block_values_a_token(m) * tokens * act_bytes
    kept = {"none": block, "selective": 22 / 34 * block, "full": 2 * m.n_embd * tokens}
    activations = kept[recompute] * m.n_layer + (block if recompute != "none" else 0)
    logits_rows = min(tokens, t.loss_chunk_tokens) if t.loss_chunk_tokens else tokens
    head = logits_rows * m.padded_vocab_size * (act_bytes + 4)
    if t.loss_chunk_tokens:  # dL/dx (tokens, C) and dL/dW in fp32
        head += tokens * m.n_embd * act_bytes + 4 * m.padded_vocab_size * m.n_embd
    return (params + activations + head) / 1e9


# ----------------------------------------------------------------------------------------------
# jobs


@dataclass
class Job:
    rule: str
    name: str  # its wildcards
    device: str  # "cuda" or "cpu" or "" (no compute: local rules)
    gpus: int = 0  # the job's, all nodes
    nodes: int = 1
    cpus: int = 1  # a node's
    mem_mb: int = 0  # a node's
    limit_min: int | None = None  # its time limit; None: a local rule (no limit)
    estimate_s: float = 0.0
    disk_bytes: float = 0.0
    basis: str = ""
    gpu: str = ""  # the GPU type it is estimated on (GPU jobs)
    gpu_mem_gb: float | None = None
    jobs_in_a_row: int = 1  # train: allocations, each resuming the last's checkpoint
    gres: str | None = None  # the GPUs it asks SLURM for a node (`gpu[:model]:N`); None: none
    problems: list[str] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.estimate_s / 3600


def derived_limit(estimate_s: float, max_runtime: int) -> int:
    """A time limit for a job estimated at `estimate_s`: twice the estimate plus 10 minutes, in
    whole quarter hours, at least MIN_LIMIT, at most the partition's."""
    minutes = 15 * math.ceil((2 * estimate_s / 60 + 10) / 15)
    return min(max(MIN_LIMIT, minutes), max_runtime)


def max_files(config: dict[str, Any], dataset: str) -> int | None:
    """The hub parquet files a dataset's download stops at (`max_files`: lmpipe.data.download
    takes the first N); None where it takes them all (a local file has no such cap)."""
    d = config["datasets"][dataset]
    return d.get("max_files") if d.get("source") == "huggingface" else None


def whole_dataset_tokens(config: dict[str, Any], dataset: str) -> float:
    """About how many tokens a text dataset holds in all: `approx_tokens`, a local file's size, or
    the most tokens a run trains on it."""
    d = config["datasets"][dataset]
    if d.get("approx_tokens"):
        return float(d["approx_tokens"])
    if d["source"] == "local" and Path(d["path"]).is_file():
        return Path(d["path"]).stat().st_size / 1.94  # bytes/token of the embedded sample
    trained = [
        r["train"]["max_steps"] * r["train"]["batch_tokens"]
        for r in config["runs"].values()
        if r["dataset"] == dataset and "max_steps" in (r["train"] or {})
    ]
    return float(max(trained, default=0))


def dataset_tokens(config: dict[str, Any], dataset: str) -> float:
    """About how many tokens of a text dataset are tokenized: all of it, but no more than the
    hub files its `max_files` downloads hold (their assumed bytes at the raw bytes a token)."""
    tokens = whole_dataset_tokens(config, dataset)
    files = max_files(config, dataset)
    if not files:
        return tokens
    in_files = files * figure("io", "hub_file_bytes") / figure("tokenize", "raw_bytes_per_token")
    return min(tokens, in_files) if tokens else in_files


def epochs(config: dict[str, Any], dataset: str, tokens: float) -> dict[str, float]:
    """The epochs of each source (a mixture's, by weight; else the dataset itself) that
    training on `tokens` tokens of `dataset` reads: above 1, the source repeats."""
    weights = config["datasets"][dataset].get("mixture") or {dataset: 1.0}
    total = sum(weights.values())
    return {s: tokens * w / total / train_tokens(config, s) for s, w in weights.items()}


def train_tokens(config: dict[str, Any], dataset: str) -> float:
    """A dataset's train tokens: its tokens manifest's count once tokenized, else about
    dataset_tokens."""
    manifest = Path(lmconfig.layout(config).tokens_manifest(dataset))
    if manifest.is_file():
        tokens = manifests.read_object(manifest, "tokens manifest")
        if "shards" in tokens and (counted := manifests.read_tokens(manifest).tokens("train")):
            return float(counted)
    return dataset_tokens(config, dataset)


def download_bytes(config: dict[str, Any], dataset: str) -> tuple[float, str]:
    """The bytes a dataset's download fetches, and how they are known: with `max_files` N, N of
    the hub's parquet files (at most: fewer where the dataset has fewer) whatever the runs train
    on; else the dataset's tokens at the raw bytes a token."""
    files = max_files(config, dataset)
    if files:
        size = stated("io", "hub_file_bytes", "{:.2g} GB", 1e-9)
        return files * figure("io", "hub_file_bytes"), f"max_files {files} x {size} (a hub file)"
    tokens = dataset_tokens(config, dataset)
    per_token = stated("tokenize", "raw_bytes_per_token", "{:g} bytes")
    return tokens * figure("tokenize", "raw_bytes_per_token"), f"{tokens:.3g} tokens x {per_token}"


DOWNLOAD_MEM_MB = 8000  # a download job: datasets' parquet writer, a model's safetensors
# the partition of the download jobs, one whose nodes reach the internet (slurm/config.yaml)
DOWNLOAD_PARTITION_ENV = "LMPIPE_DOWNLOAD_PARTITION"


def download_here(config: dict[str, Any]) -> bool:
    """Whether the download stages run where Snakemake runs (`cluster.downloads: local`: a
    login node with internet), not as jobs of their own (`job`, the default)."""
    return config["cluster"]["downloads"] == "local"


def download(
    config: dict[str, Any], rule: str, name: str, fetched: float, how: str, rate: bool = True
) -> Job:
    """A download stage: `fetched` bytes from the hub at its rate (`rate`; else a small file's
    minute), as a local rule or as a CPU job with a time limit (twice the estimate + 10 min)."""
    estimate = fetched / figure("io", "download_bytes_per_s") if rate else 60.0
    speed = stated("io", "download_bytes_per_s", "{:.0f} MB/s", 1e-6)
    basis = f"{fetched / 1e9:.3g} GB: {how}" + (f", at {speed}" if rate else "")
    if download_here(config):
        where = "local rule: where Snakemake runs, cluster.downloads local"
        return Job(
            rule, name, "", estimate_s=estimate, disk_bytes=fetched, basis=f"{basis} ({where})"
        )
    limit = derived_limit(estimate, config["cluster"]["max_runtime"])
    where = f"a job where the internet is: {DOWNLOAD_PARTITION_ENV}"
    return Job(
        rule, name, "cpu", cpus=1, mem_mb=DOWNLOAD_MEM_MB, limit_min=limit, estimate_s=estimate,
        disk_bytes=fetched, basis=f"{basis} ({where})",
    )  # fmt: skip


def download_job(config: dict[str, Any], dataset: str) -> Job:
    """A dataset's download: the raw bytes it fetches at the hub's rate."""
    raw, how = download_bytes(config, dataset)
    return download(config, "download", dataset, raw, how)


def download_model_job(config: dict[str, Any], model: str) -> Job:
    """A hub model's download: its weights (bf16/fp16 safetensors: 2 bytes a parameter, from its
    config.json's count) at the hub's rate."""
    m = lmconfig.model_config(config["models"][model], f"models.{model}")
    weights = 2 * num_params(m)
    return download(config, "download_model", model, weights, "weights, 2 bytes a parameter")


def small_download_job(config: dict[str, Any], rule: str) -> Job:
    """The HellaSwag file or the suite's task data: some 60 MB, a minute."""
    return download(config, rule, "", 60e6, "a few files", rate=False)


def tokenize_cpus(config: dict[str, Any], dataset: str, node_cpus: int | None = None) -> int:
    """A node's CPUs: the most any GPU run on the dataset asks for a node (16 where none does),
    at most `node_cpus`, the most a node of the cluster has (under SLURM: lmpipe.cluster)."""
    cpus = [
        r["launch"]["cpus_per_task"]
        for name, r in config["runs"].items()
        if r["launch"]["device"] == "cuda" and lmconfig.text_dataset(config, name) == dataset
    ]
    return min(max(cpus, default=16), node_cpus or math.inf)


def bpe_rate(cpus: int) -> float:
    """Tokens a second the pool of encoding threads gives on `cpus` cores: a core's measured rate
    times the cores at an assumed parallel efficiency."""
    per_core = figure("tokenize", "tokens_per_s_per_core")
    return per_core * max(1.0, cpus * figure("tokenize", "parallel_efficiency"))


def serial_rate() -> float:
    """Tokens a second of a tokenize job's one main thread, which reads the parquet and writes the
    shards while the pool encodes (lmpipe.data.tokenize): no number of cores makes a job faster.
    Its measured time a token on the CPU (a warm page cache), plus the raw file's bytes read (an
    upper bound: only the text column is) and the shard's 2 bytes written at the disk's rate."""
    cpu_s = 1 / figure("tokenize", "serial_tokens_per_s")
    io_bytes = figure("tokenize", "raw_bytes_per_token") + 2
    return 1 / (cpu_s + io_bytes / figure("io", "disk_bytes_per_s"))


def tokenize_rate(config: dict[str, Any], dataset: str, node_cpus: int | None = None) -> float:
    """Tokens a second of one tokenize job: its encoding on a node's cores or its one thread that
    reads and writes, whichever is slower."""
    return min(bpe_rate(tokenize_cpus(config, dataset, node_cpus)), serial_rate())


def tokenize_rate_basis(config: dict[str, Any], dataset: str, node_cpus: int | None = None) -> str:
    """How the tokenize rate is known: the slower part first, each figure measured or assumed."""
    cpus = tokenize_cpus(config, dataset, node_cpus)
    serial = (
        f"one thread reading and writing {serial_rate():.3g}/s (its CPU"
        f" {stated('tokenize', 'serial_tokens_per_s', '{:.3g}/s')};"
        f" {stated('tokenize', 'raw_bytes_per_token', '{:g} bytes a token read')}, 2 written,"
        f" at {stated('io', 'disk_bytes_per_s', '{:.0f} MB/s', 1e-6)})"
    )
    bpe = (
        f"BPE {bpe_rate(cpus):.3g}/s on {cpus} cores (a core's"
        f" {stated('tokenize', 'tokens_per_s_per_core', '{:.3g}/s')},"
        f" efficiency {stated('tokenize', 'parallel_efficiency', '{:g}')})"
    )
    if serial_rate() < bpe_rate(cpus):
        return f"capped by {serial}; {bpe}"
    return f"{bpe}; {serial}"


def tokenize_parts(config: dict[str, Any], dataset: str, node_cpus: int | None = None) -> int:
    """Jobs a dataset is tokenized in: more than one when one job's estimate would not fit in
    0.8 of the partition's time limit (the shards are then cut from the parts in one more job)."""
    estimate = dataset_tokens(config, dataset) / tokenize_rate(config, dataset, node_cpus) + 60
    return max(1, math.ceil(estimate / (0.8 * config["cluster"]["max_runtime"] * 60)))


def train_tokenizer_job(config: dict[str, Any], name: str) -> Job:
    """The train_tokenizer job: its text (the dataset's, or its budget in bytes or documents) at
    the measured rate of one thread."""
    t = config["tokenizers"][name]
    text = dataset_tokens(config, t["dataset"]) * figure("train_tokenizer", "text_bytes_per_token")
    if t.get("max_bytes"):
        text = min(text, t["max_bytes"])
    if t.get("max_documents"):
        text = min(text, t["max_documents"] * figure("train_tokenizer", "text_bytes_per_document"))
    rate = figure("train_tokenizer", "text_bytes_per_s")
    estimate = text / rate + 10
    how = (
        f"{text:.3g} bytes of text at {rate:.3g}/s: {basis('train_tokenizer', 'text_bytes_per_s')}"
    )
    return Job(
        "train_tokenizer", name, "cpu", cpus=1, mem_mb=8000, estimate_s=estimate,
        limit_min=120, basis=how,  # the rule asks for no time: the profile's default, 2 hours
    )  # fmt: skip


def tokenize_job(
    config: dict[str, Any], dataset: str, part: str = "", node_cpus: int | None = None
) -> Job:
    """The tokenize job (one; or, in parts, a part's `tokenize_part` job or the merge) on at most
    `node_cpus` CPUs."""
    tokens = dataset_tokens(config, dataset)
    parts = tokenize_parts(config, dataset, node_cpus)
    cpus = tokenize_cpus(config, dataset, node_cpus)
    rate = tokenize_rate(config, dataset, node_cpus)
    max_runtime = config["cluster"]["max_runtime"]
    how = f"{tokens:.3g} tokens at {rate:.3g}/s: {tokenize_rate_basis(config, dataset, node_cpus)}"
    if parts == 1:
        estimate, rule, name, disk = tokens / rate + 60, "tokenize", dataset, 2 * tokens
    elif part:  # a part: its share of the raw files
        estimate, rule, name, disk = tokens / parts / rate + 60, "tokenize_part", part, 0.0
        how = f"1/{parts} of {how}"
    else:  # the shards cut from the parts' streams: reading and writing 2 bytes a token
        estimate = 4 * tokens / figure("io", "disk_bytes_per_s") + 60
        rule, name, disk = "tokenize", dataset, 2 * tokens
        how = f"shards from {parts} parts: {4 * tokens / 1e9:.3g} GB read and written"
    return Job(
        rule, name, "cpu", cpus=cpus, mem_mb=int(figure("tokenize", "mem_mb")), estimate_s=estimate,
        disk_bytes=disk, limit_min=derived_limit(estimate, max_runtime), basis=how,
    )  # fmt: skip


@dataclass(frozen=True)
class EvalCost:
    """One evaluation during training (its section's during_training) against the training it
    interrupts."""

    name: str
    every: int
    evals: int  # at step 0, every `every` steps, and at the last
    items: int  # scored each time (all its tasks')
    seconds: float  # all its evals
    share: float  # of training's time (each at its own FLOP/s)
    flops_share: float  # of training's FLOPs


@dataclass(frozen=True)
class InTrainingCost:
    """Every evaluation during training of a run, together."""

    parts: list[EvalCost]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts)

    @property
    def share(self) -> float:
        return sum(p.share for p in self.parts)

    @property
    def flops_share(self) -> float:
        return sum(p.flops_share for p in self.parts)

    def part(self, name: str) -> EvalCost | None:
        return next((p for p in self.parts if p.name == name), None)


def forward_flops_of_items(
    model: lmconfig.ModelConfig, tokens: float, head_positions: float, row: float
) -> float:
    """Forward FLOPs of an item packed as `tokens` through the model (rows of `row` tokens, the
    attention term's length) at 2N + 2LCT a token less the LM head's 2VC (V padded), plus the
    head at the `head_positions` where an answer's token is predicted."""
    head = ARCHITECTURES[model.arch].head_flops_per_token(model) / 3  # forward: a third
    return tokens * (forward_flops_per_token(model, row) - head) + head_positions * head


def suite_item_count(task: str, limit: int | None) -> int:
    """Items of a suite task each eval: the first `limit`, or all (MMLU: of each of its
    subjects)."""
    total = SUITE_TASKS[task].items
    if limit is None:
        return total
    return min(total, limit * max(1, len(SUITE_TASKS[task].subjects)))


def suite_eval_flops(
    config: dict[str, Any], rc: lmconfig.RunConfig, settings: dict[str, Any]
) -> tuple[int, float]:
    """(items, forward FLOPs) of one eval of the suite's tasks during training: each item's
    tokens through the model (SuiteTask.item_tokens), its rows' length the attention's."""
    items, flops = 0, 0.0
    for task in settings["tasks"]:
        n = suite_item_count(task, settings["items"])
        tokens, head_positions = SUITE_TASKS[task].item_tokens
        row = tokens / SUITE_TASKS[task].choices  # the attention term's length, roughly
        items += n
        flops += n * forward_flops_of_items(rc.model, tokens, head_positions, row)
    return items, flops


def hellaswag_items(config: dict[str, Any], file: str, wanted: int) -> int:
    """Items the run's HellaSwag file gives of the `wanted` first: fewer where the file is
    there and holds fewer (the embedded sample's 503); `wanted` before it is downloaded."""
    path = Path(config["hellaswag"][file])
    if not path.is_file():
        return wanted
    with open(path, encoding="utf-8") as f:
        return min(wanted, sum(1 for line in f if line.strip()))


def hellaswag_eval_flops(
    config: dict[str, Any], rc: lmconfig.RunConfig, settings: dict[str, Any]
) -> tuple[int, float]:
    """(items, forward FLOPs) of one HellaSwag eval during training: each item's tokens packed
    (HELLASWAG_ITEM_TOKENS), a row's length hellaswag_tokens_per_item / 4."""
    items = hellaswag_items(config, settings["file"], settings["items"])
    row = figure("eval", "hellaswag_tokens_per_item") / 4
    return items, items * forward_flops_of_items(rc.model, *HELLASWAG_ITEM_TOKENS, row)


def in_training_eval(config: dict[str, Any], run: str, gpu: str | None) -> InTrainingCost | None:
    """The cost of a run's evaluations during training (lmpipe.config.in_training), each by the
    cost function its registry entry names; None when it has none. Training runs 6N + 6LCT a
    token (T = seq_len); each at its own FLOP/s (eval's, train's)."""
    rc = lmconfig.run_config(config, run)
    t = rc.train
    steps = t.max_steps or fine_tuning_steps(config, rc)
    evaluations = lmconfig.in_training(rc)
    if not evaluations or not steps:
        return None
    train_flops = steps * t.batch_tokens * train_flops_per_token(rc.model, t.seq_len)
    devices = rc.launch.world_size if rc.launch.device == "cuda" else 1  # CPU ranks share cores
    eval_rate = device_flops(rc, gpu, "eval")[0] * devices
    train_s = train_flops / (device_flops(rc, gpu, "train")[0] * devices)
    parts = []
    for name, settings in evaluations.items():
        items, flops = code(EVALUATIONS[name].during_training.cost)(config, rc, settings)
        every = settings["every"]
        evals = steps // every + 1 + (1 if steps % every else 0)
        seconds = evals * flops / eval_rate
        parts.append(
            EvalCost(
                name, every, evals, items, seconds, seconds / train_s, evals * flops / train_flops
            )
        )
    return InTrainingCost(parts)


def in_training_basis(cost: InTrainingCost) -> str:
    """The train job's basis for its evaluations during training."""
    each = ", ".join(
        f"{p.name} every {p.every} steps ({p.evals} x {p.items} items: {p.share:.1%})"
        for p in cost.parts
    )
    return (
        f"; during training {each}: {cost.share:.1%} of training"
        f" ({cost.flops_share:.2%} of its FLOPs)"
    )


def train_job(config: dict[str, Any], run: str, gpu: str | None) -> Job:
    rc = lmconfig.run_config(config, run)
    t, launch = rc.train, rc.launch
    steps = t.max_steps or fine_tuning_steps(config, rc)
    tokens = steps * t.batch_tokens
    flops_a_device, how = device_flops(rc, gpu, "train")
    devices = launch.world_size if launch.device == "cuda" else 1  # CPU ranks share the cores
    train_s = tokens * train_flops_per_token(rc.model, t.seq_len) / (flops_a_device * devices)
    validations = steps // t.val_every if t.val_every else 1
    val_s = (
        validations * t.val_tokens * forward_flops_per_token(rc.model, t.seq_len)
        / (flops_a_device * devices)
    )  # fmt: skip
    n = num_params(rc.model)
    checkpoint_bytes = 12 * n  # fp32 params and AdamW's two moments
    saves = steps // t.checkpoint_every if t.checkpoint_every else 0
    io_s = (saves * checkpoint_bytes + 4 * n) / figure("io", "disk_bytes_per_s")
    evals = in_training_eval(config, run, gpu)
    work_s = train_s + val_s + (evals.seconds if evals else 0.0) + io_s
    startup = startup_s(rc, "train")
    basis = f"{tokens:.3g} tokens; {how}" + (in_training_basis(evals) if evals else "")
    if launch.device == "cuda":
        basis += "; " + memory_basis(rc)
    if not rc.fine_tuning:
        repeats = {s: e for s, e in epochs(config, rc.dataset, tokens).items() if e > 1}
        basis += "".join(f"; {e:.1f} epochs of {s}" for s, e in repeats.items())
    job = Job(
        "train", run, launch.device, gpus=devices if launch.device == "cuda" else 0,
        nodes=launch.nodes, cpus=launch.cpus_per_task, mem_mb=launch.mem_mb,
        limit_min=launch.runtime, basis=basis,
        disk_bytes=(t.keep_checkpoints * checkpoint_bytes) + 4 * n,
        gpu_mem_gb=gpu_memory_gb(rc) if launch.device == "cuda" else None,
        gpu=gpu_name(rc, gpu) if launch.device == "cuda" else "",
        gres=launch.gres(launch.procs_per_node),
    )  # fmt: skip
    usable = launch.runtime * 60 - launch.signal_seconds - startup
    if usable <= 0:
        job.jobs_in_a_row = math.inf
        job.problems.append(
            f"launch.runtime {launch.runtime} min leaves no time to train after the start"
            f" ({startup:.0f} s) and the signal ({launch.signal_seconds} s)"
        )
    else:
        job.jobs_in_a_row = max(1, math.ceil(work_s / usable))
    job.estimate_s = work_s + startup * min(job.jobs_in_a_row, 10**6)
    allowed = retries() + 1
    if job.jobs_in_a_row > allowed:
        job.problems.append(
            f"needs {job.jobs_in_a_row} jobs of {launch.runtime} min in a row; the slurm profile"
            f" allows {allowed} (retries: {retries()}): raise launch.runtime or retries"
        )
    if launch.runtime > config["cluster"]["max_runtime"]:
        job.problems.append(
            f"launch.runtime {launch.runtime} min is over the partition's"
            f" cluster.max_runtime {config['cluster']['max_runtime']}"
        )
    if launch.device == "cuda":
        job.problems += memory_problems(rc, job.gpu)
    return job


def memory_basis(rc: lmconfig.RunConfig) -> str:
    """A GPU's memory under each train.activation_checkpointing, the run's marked."""
    modes = ", ".join(
        f"{mode}{'*' if mode == rc.train.activation_checkpointing else ''}"
        f" {gpu_memory_gb(rc, mode):.0f} GB"
        for mode in ("none", "selective", "full")
    )
    return f"memory a GPU by activation checkpointing: {modes}"


def memory_problems(rc: lmconfig.RunConfig, gpu: str) -> list[str]:
    """A train job whose estimated memory a GPU (gpu_memory_gb) is over what the GPU holds:
    what it needs, and what recompute (train.activation_checkpointing) would bring it to."""
    capacity = by_gpu(GPU_MEMORY_GB, gpu)
    need = gpu_memory_gb(rc)
    if capacity is None or need <= capacity:
        return []
    options = [
        f"{mode} {gpu_memory_gb(rc, mode):.0f} GB"
        for mode in ("selective", "full")
        if mode != rc.train.activation_checkpointing
    ]
    return [
        f"needs about {need:.0f} GB a GPU, over the {gpu}'s {capacity:.0f} GB: lower"
        f" train.micro_batch, or set train.activation_checkpointing ({', '.join(options)})"
    ]


def fine_tuning_steps(config: dict[str, Any], rc: lmconfig.RunConfig) -> int:
    """A fine-tuning run's steps, from its epochs and the conversations it will keep (a local
    file's count, or a hub dataset's `approx_conversations`, less the held-out share), as the
    worker derives them (SFTConfig.steps: more with sft.replay); 0 when the data is on the hub
    and its size not given (unknown yet)."""
    d = config["datasets"][rc.dataset]
    if d["source"] != "local" or not Path(d["path"]).is_file():
        count = d.get("approx_conversations") or 0
    else:
        text = Path(d["path"]).read_text()
        try:
            count = len(json.loads(text))
        except json.JSONDecodeError:
            count = sum(1 for line in text.splitlines() if line.strip())
    rows = int(count * (1 - d["val_percent"] / 100))
    return rc.sft.steps(rows, rc.train.batch_tokens // rc.train.seq_len)


def model_job(
    config: dict[str, Any], rule: str, run: str, estimate: float, how: str, gpu: str | None
) -> Job:
    """A convert or evaluate job: one GPU of the run's kind (and its share of the node) for a GPU
    run; for a CPU run, one core (two evaluations run side by side on two cores, or one beside
    a training of one rank: the demo's chat fine-tuning)."""
    rc = lmconfig.run_config(config, run)
    launch = rc.launch
    max_runtime = config["cluster"]["max_runtime"]
    if launch.device == "cuda":
        share = launch.procs_per_node
        job = Job(
            rule, "", "cuda", gpus=1, cpus=max(1, launch.cpus_per_task // share),
            mem_mb=max(8000, launch.mem_mb // share), gpu=gpu_name(rc, gpu), gres=launch.gres(1),
        )  # fmt: skip
    else:
        job = Job(rule, "", "cpu", cpus=1, mem_mb=8000)
    job.estimate_s, job.basis = estimate, how
    job.limit_min = derived_limit(estimate, max_runtime)
    return job


def convert_job(config: dict[str, Any], run: str, gpu: str | None = None) -> Job:
    rc = lmconfig.run_config(config, run)
    n = num_params(rc.model)
    rate = figure("io", "disk_bytes_per_s")
    estimate = startup_s(rc, "eval") + 12 * n / rate  # read 4N, write 4N + 4N
    read = f"{12 * n / 1e9:.2f} GB read and written"
    job = model_job(config, "convert", run, estimate, read, gpu)
    job.name, job.disk_bytes = run, 8 * n
    return job


def eval_tokens(config: dict[str, Any], rc: lmconfig.RunConfig, evaluation: str) -> float:
    """Tokens an evaluation runs through the model (forward only): its registry entry's cost."""
    entry = EVALUATIONS[evaluation]
    run = EvalRun(config, rc, lmconfig.chat_dataset(config, rc.name))
    return entry.cost(rc.eval[entry.section], run)


def eval_job(config: dict[str, Any], run: str, evaluation: str, gpu: str | None) -> Job:
    rc = lmconfig.run_config(config, run)
    flops_a_device, how = device_flops(rc, gpu, "eval")
    tokens = eval_tokens(config, rc, evaluation)
    compute = tokens * forward_flops_per_token(rc.model, rc.model.block_size) / flops_a_device
    estimate = startup_s(rc, "eval") + compute
    job = model_job(config, "evaluate", run, estimate, f"{tokens:.3g} tokens forward; {how}", gpu)
    job.name = f"{run}/{evaluation}"
    return job

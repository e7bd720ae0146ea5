"""Published figures the report and the benchmarks compare runs against, in one place.

A reference's `figures` are keyed like the report's headline columns (lmpipe.registry: an
evaluation's `Column.key`), so a new evaluation's published figures go here under its keys.
HellaSwag is kept as a fraction (0.2955), as the eval files write it, whatever the source printed.

Sources: llm.c's "Reproducing GPT-2 (124M) in llm.c in 90 minutes" (a discussion of
github.com/karpathy/llm.c: 10B FineWeb tokens, 8xA100 80GB), OpenAI's GPT-2 checkpoints
evaluated with llm.c's scoring, the GPT-2 paper (Radford et al. 2019, LAMBADA), the GPT-3 paper
(Brown et al. 2020, zero-shot HellaSwag), the lm-eval harness on OpenAI's gpt2, and the lm-eval
harness's published table of OPT-125M and OPT-350M (the zero-shot suite's same-size references).
A figure no source publishes is left out: an empty cell rather than an unsourced number.

`CHAT_REFERENCES`: published figures of chat models, shown in the report's chat section beside a
fine-tuned run and its base. nanochat's d20 "speedrun" report card (karpathy/nanochat README.md
at commit 3a5e0bc50b123f37220f1ace6813f080455d19f3, its summary table; the same table through
commit 348fbb3). No source read publishes GPT-2's (124M) GSM8K or HumanEval
figures, so none is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# tokens an optimizer step of llm.c's GPT-2 recipes (2**19)
LLMC_BATCH_TOKENS = 524_288


@dataclass(frozen=True)
class Reference:
    name: str
    source: str
    figures: dict[str, float] = field(default_factory=dict)  # headline column key -> figure
    # the split a figure was measured on, where it may differ from the runs' (a suite task is
    # scored on its validation split here): the report marks such a figure not comparable
    splits: dict[str, str] = field(default_factory=dict)
    setting: str | None = None  # how its figures were measured, where unlike these runs'
    tokens: int | None = None  # tokens trained
    wall_s: float | None = None
    gpus: int | None = None
    step_s: float | None = None  # seconds an optimizer step

    @property
    def tokens_per_s(self) -> float | None:
        if self.step_s is None:
            return None
        return LLMC_BATCH_TOKENS / self.step_s


REFERENCES: tuple[Reference, ...] = (
    Reference(
        name="llm.c GPT-2 124M",
        source="llm.c, 10B FineWeb tokens on 8xA100 80GB",
        # val_loss: FineWeb val loss; hellaswag: acc_norm, llm.c scoring (mean loss an ending token)
        figures={"val_loss": 3.28, "hellaswag": 0.299},
        tokens=10_000_000_000,
        wall_s=90 * 60,
        gpus=8,
        step_s=0.300,
    ),
    Reference(
        name="llm.c GPT-2 350M",
        source="llm.c's GPT-2 350M reproduction on FineWeb: 60,000 steps of 524,288 tokens"
        " (31.5B) on 8xA100, final val loss 2.9282",
        figures={"val_loss": 2.93},
    ),
    Reference(
        name="OpenAI GPT-2 124M",
        source="OpenAI checkpoint, evaluated with llm.c's scoring; LAMBADA: the GPT-2 paper "
        "(Radford et al. 2019, Table 3, the model it calls 117M)",
        figures={"val_loss": 3.425, "hellaswag": 0.2955, "lambada": 0.4599},
    ),
    Reference(
        name="OpenAI GPT-2 350M",
        source="OpenAI checkpoint, evaluated with llm.c's scoring; LAMBADA: the GPT-2 paper "
        "(Radford et al. 2019, Table 3, the model it calls 345M)",
        figures={"val_loss": 3.083, "hellaswag": 0.3752, "lambada": 0.5548},
    ),
    Reference(name="GPT-3 Small (125M)", source="GPT-3 paper", figures={"hellaswag": 0.337}),
    Reference(name="GPT-3 Medium (350M)", source="GPT-3 paper", figures={"hellaswag": 0.436}),
    # Same-size models through the lm-eval harness (v0.3's task versions, 0-shot): its published
    # table results/opt/opt-{125m,350m}/README.md in EleutherAI/lm-evaluation-harness. Each task's
    # headline metric as lmpipe.eval.suite reports it (acc_norm where the task has it, else acc);
    # LAMBADA is lambada_openai's acc. ARC and SciQ were scored on their test splits.
    Reference(
        name="OPT-125M (lm-eval)",
        source="lm-eval harness table results/opt/opt-125m (EleutherAI/lm-evaluation-harness)",
        figures={
            "suite/arc_easy": 0.3998,
            "suite/arc_challenge": 0.2278,
            "suite/piqa": 0.6202,
            "suite/sciq": 0.6690,
            "suite/winogrande": 0.5028,
            "lambada": 0.3790,
        },
        splits={"arc_easy": "test", "arc_challenge": "test", "sciq": "test"},
    ),
    Reference(
        name="OPT-350M (lm-eval)",
        source="lm-eval harness table results/opt/opt-350m (EleutherAI/lm-evaluation-harness)",
        figures={
            "suite/arc_easy": 0.4036,
            "suite/arc_challenge": 0.2389,
            "suite/piqa": 0.6474,
            "suite/sciq": 0.6690,
            "suite/winogrande": 0.5233,
            "lambada": 0.4516,
        },
        splits={"arc_easy": "test", "arc_challenge": "test", "sciq": "test"},
    ),
    Reference(
        name="lm-eval on GPT-2 124M",
        source="lm-eval harness on OpenAI's checkpoint (acc_norm per character)",
        figures={"hellaswag_lm_eval": 0.3114, "hellaswag_lm_eval_acc": 0.2892},
    ),
)


# nanochat's d20 speedrun (depth 20, one 8xH100 node, about 4 hours): its chat evaluations
# (scripts/chat_eval.py) put each problem as a user message in its own chat template, 0-shot, and
# score one greedy sample (temperature 0, up to 512 new tokens): GSM8K on all 1,319 test problems,
# the model's calculator tool calls (<<...>>) run; HumanEval on all 164. Its BASE column gives only
# CORE, no metric measured here; MID and SFT have no RL figure for HumanEval.
NANOCHAT_README = (
    "karpathy/nanochat README.md at 3a5e0bc50b123f37220f1ace6813f080455d19f3, the report card's"
    " summary table"
)
NANOCHAT_SETTING = (
    "a 20-layer model trained on 8xH100 for ~4 h; 0-shot in its chat template, greedy, all 1,319"
    " GSM8K and 164 HumanEval problems, GSM8K with calculator tool calls: not like for like"
)
CHAT_REFERENCES: tuple[Reference, ...] = (
    Reference(
        "nanochat d20 MID",
        NANOCHAT_README,
        {"gsm8k": 0.0250, "humaneval": 0.0671},
        setting=NANOCHAT_SETTING,
    ),
    Reference(
        "nanochat d20 SFT",
        NANOCHAT_README,
        {"gsm8k": 0.0455, "humaneval": 0.0854},
        setting=NANOCHAT_SETTING,
    ),
    Reference("nanochat d20 RL", NANOCHAT_README, {"gsm8k": 0.0758}, setting=NANOCHAT_SETTING),
)


def references_with(key: str) -> list[Reference]:
    """The references that publish figure `key` (e.g. "val_loss": lines on the loss plot)."""
    return [r for r in REFERENCES if key in r.figures]

"""Published figures the report and the benchmarks compare runs against, in one place.

A reference's `figures` are keyed like the report's headline columns (lmpipe.registry: an
evaluation's `Column.key`), so a new evaluation's published figures go here under its keys.
HellaSwag is kept as a fraction (0.2955), as the eval files write it, whatever the source printed.

Sources: llm.c's "Reproducing GPT-2 (124M) in llm.c in 90 minutes" (a discussion of
github.com/karpathy/llm.c: 10B FineWeb tokens, 8xA100 80GB), OpenAI's GPT-2 checkpoints
evaluated with llm.c's scoring, the GPT-3 paper (Brown et al. 2020, zero-shot HellaSwag), and the
lm-eval harness on OpenAI's gpt2.
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
        name="OpenAI GPT-2 124M",
        source="OpenAI checkpoint, evaluated with llm.c's scoring",
        figures={"val_loss": 3.425, "hellaswag": 0.2955},
    ),
    Reference(
        name="OpenAI GPT-2 350M",
        source="OpenAI checkpoint, evaluated with llm.c's scoring",
        figures={"val_loss": 3.083, "hellaswag": 0.3752},
    ),
    Reference(name="GPT-3 Small (125M)", source="GPT-3 paper", figures={"hellaswag": 0.337}),
    Reference(name="GPT-3 Medium (350M)", source="GPT-3 paper", figures={"hellaswag": 0.436}),
    Reference(
        name="lm-eval on GPT-2 124M",
        source="lm-eval harness on OpenAI's checkpoint (acc_norm per character)",
        figures={"hellaswag_lm_eval": 0.3114, "hellaswag_lm_eval_acc": 0.2892},
    ),
)


def references_with(key: str) -> list[Reference]:
    """The references that publish figure `key` (e.g. "val_loss": lines on the loss plot)."""
    return [r for r in REFERENCES if key in r.figures]

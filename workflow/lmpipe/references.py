"""Published figures the report and the benchmarks compare runs against, in one place.

The source is the reference table of DESIGN.md. HellaSwag is kept as a fraction (0.2955), as the
eval files write it, whatever the source printed; `None` means the source gives no figure.
"""

from __future__ import annotations

from dataclasses import dataclass

# tokens an optimizer step of llm.c's GPT-2 recipes (2**19)
LLMC_BATCH_TOKENS = 524_288


@dataclass(frozen=True)
class Reference:
    name: str
    source: str
    val_loss: float | None = None  # FineWeb validation loss
    hellaswag: float | None = None  # acc_norm, llm.c scoring (mean loss of the ending's tokens)
    hellaswag_lm_eval: float | None = None  # acc_norm, lm-eval harness (per-character normalised)
    hellaswag_lm_eval_acc: float | None = None
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
        val_loss=3.28,
        hellaswag=0.299,
        tokens=10_000_000_000,
        wall_s=90 * 60,
        gpus=8,
        step_s=0.300,
    ),
    Reference(
        name="OpenAI GPT-2 124M",
        source="OpenAI checkpoint, evaluated with llm.c's scoring",
        val_loss=3.425,
        hellaswag=0.2955,
    ),
    Reference(
        name="OpenAI GPT-2 350M",
        source="OpenAI checkpoint, evaluated with llm.c's scoring",
        val_loss=3.083,
        hellaswag=0.3752,
    ),
    Reference(name="GPT-3 Small (125M)", source="GPT-3 paper", hellaswag=0.337),
    Reference(name="GPT-3 Medium (350M)", source="GPT-3 paper", hellaswag=0.436),
    Reference(
        name="lm-eval on GPT-2 124M",
        source="lm-eval harness on OpenAI's checkpoint",
        hellaswag_lm_eval=0.3114,
        hellaswag_lm_eval_acc=0.2892,
    ),
)


def loss_references() -> list[Reference]:
    """The references with a FineWeb val loss: drawn as horizontal lines on the loss plot."""
    return [r for r in REFERENCES if r.val_loss is not None]

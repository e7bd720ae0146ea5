"""The chat evaluations in the report: HumanEval and GSM8K in the task table, gold-answer bits
per byte in a table of its own, and each fine-tuned run beside its base in the chat section.

Result files written by the contract of lmpipe.eval.humaneval, lmpipe.eval.gsm8k and
lmpipe.eval.gold_bpb (ids, per-item 0/1 or bits per byte)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from scipy import stats as scipy_stats
from test_report import layout, render, row_text, settings, write_run  # noqa: F401

from lmpipe.paths import Layout

CHAT_EVALS = ["sft_loss", "chat_samples", "gold_bpb", "humaneval", "gsm8k"]


def write_eval(lay: Layout, run: str, name: str, result: dict) -> None:
    (Path(lay.eval_dir(run)) / f"{name}.json").write_text(json.dumps(result))


def passed(ids: list[str], flags: list[int], key: str, **extra) -> dict:
    """A HumanEval (key "passed") or GSM8K (key "exact_match") result file."""
    n, p = len(flags), sum(flags) / len(flags)
    metric = "pass@1" if key == "passed" else "exact_match"
    return {
        "metric": metric,
        "value": p,
        "stderr": math.sqrt(p * (1 - p) / n),
        "items": n,
        "per_item": {"ids": ids, key: flags},
        "completions": [""] * n,
        **extra,
    }


def gsm8k(ids: list[str], flags: list[int], mode: str) -> dict:
    result = passed(ids, flags, "exact_match", mode=mode)
    result["per_item"] |= {"extracted": ["1"] * len(ids), "gold": ["1"] * len(ids)}
    return result


def gold_bpb(per_task: dict[str, tuple[list[str], list[float]]]) -> dict:
    tasks, per_item = {}, {}
    for task, (ids, values) in per_task.items():
        n = len(values)
        mean = sum(values) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        tasks[task] = {"bits_per_byte": mean, "stderr": sd / math.sqrt(n), "items": n, "bytes": 99}
        per_item[task] = {"ids": ids, "bits_per_byte": values}
    mean = sum(t["bits_per_byte"] for t in tasks.values()) / len(tasks)
    return {"metric": "gold_bpb", "value": mean, "tasks": tasks, "per_item": per_item}


def with_evals(s: dict, extra: list[str]) -> dict:
    s = json.loads(json.dumps(s))
    s["evaluations"] += extra
    return s


def chat_settings(base: str) -> dict:
    tuned = settings(1e-3) | {
        "dataset": "chatdata",
        "text_dataset": "toy",
        "chat_dataset": "chatdata",
        "base": {"run": base},
        "sft": {"epochs": 3},
    }
    return with_evals(tuned, CHAT_EVALS)


def test_gold_bpb_difference_is_the_paired_t_on_the_items_by_id(layout: Layout, tmp_path: Path):  # noqa: F811
    """Gold bpb of b against a, paired by id: the files list the items in other orders and b
    scored one item more. The mean difference, its 95% t interval and p equal a computation
    from scratch over the common ids (t quantile and tail from scipy's t distribution)."""
    ids = [f"HumanEval/{i}" for i in range(8)]
    a = dict(zip(ids, [1.10, 0.95, 1.30, 1.05, 0.90, 1.20, 1.00, 1.15], strict=True))
    b = dict(zip(ids, [1.00, 0.97, 1.12, 0.99, 0.86, 1.05, 1.01, 1.02], strict=True))
    b_ids = ids[::-1] + ["HumanEval/99"]  # reversed, and an item a did not score
    b_values = [b[i] for i in ids[::-1]] + [3.0]
    for run in ("a", "b"):
        write_run(layout, run)
    write_eval(layout, "a", "gold_bpb", gold_bpb({"codex_humaneval": (ids, list(a.values()))}))
    write_eval(layout, "b", "gold_bpb", gold_bpb({"codex_humaneval": (b_ids, b_values)}))
    runs = {r: with_evals(settings(3e-3), ["gold_bpb"]) for r in ("a", "b")}
    html = render(layout, runs, tmp_path)

    d = [b[i] - a[i] for i in ids]
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
    t = mean / se
    p = 2 * scipy_stats.t.sf(abs(t), n - 1)
    half = scipy_stats.t.ppf(0.975, n - 1) * se
    assert p < 0.05  # b is lower (better) on these items
    cell = row_text(html, "task-gold_bpb/codex_humaneval")
    assert f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]" in cell, cell
    assert f"p = {p:.2g}" in cell and "▲" in cell  # lower is better: ▲
    assert "tested on the 8 items both scored (a scored 8, b 9)" in cell
    assert 'id="task-gold_bpb/codex_humaneval"' not in html.split('id="gold-bpb-table"')[0]
    assert "better than a on HumanEval gold answer" in html


def test_humaneval_and_gsm8k_rows_pair_by_id(layout: Layout, tmp_path: Path):  # noqa: F811
    """HumanEval and GSM8K join the task table, each tested by McNemar on the items paired by
    id, Holm-adjusted over the run's tests. HumanEval: b gets every item right, a the first 8
    (p = 2/2^8). GSM8K: b's file lists the items in reverse; by id b is right where a is and on
    4 items more (p = 2/2^4), by position the two would disagree on 12 items (p = 0.39)."""
    n = 16
    ids = [f"HumanEval/{i}" for i in range(n)]
    a_flags = [1] * 8 + [0] * 8
    b_by_id = dict(zip(ids, [1] * n, strict=True))
    gids = [str(i) for i in range(n)]
    for run in ("a", "b"):
        write_run(layout, run)
    write_eval(layout, "a", "humaneval", passed(ids, a_flags, "passed"))
    write_eval(
        layout, "b", "humaneval", passed(ids[::-1], [b_by_id[i] for i in ids[::-1]], "passed")
    )
    write_eval(layout, "a", "gsm8k", gsm8k(gids, a_flags, "5-shot"))
    b_gsm = dict(zip(gids, [1] * 12 + [0] * 4, strict=True))
    write_eval(layout, "b", "gsm8k", gsm8k(gids[::-1], [b_gsm[i] for i in gids[::-1]], "chat"))
    runs = {r: with_evals(settings(3e-3), ["humaneval", "gsm8k"]) for r in ("a", "b")}
    html = render(layout, runs, tmp_path)

    human = row_text(html, "task-humaneval")
    assert "pass@1" in human and "100.0%" in human and "50.0%" in human
    p = 2 / 2**8
    holm = 2 * p  # two tests of b (GSM8K, HumanEval: HellaSwag here has no ids); p times 2
    assert f"p = {p:.2g} (Holm {holm:.2g})" in human and "▲" in human, human
    gsm = row_text(html, "task-gsm8k")
    p_gsm = 2 / 2**4  # Holm: the larger p times 1, not below the smaller's adjusted
    assert "exact_match" in gsm and f"p = {p_gsm:.2g} (Holm {p_gsm:.2g})" in gsm, gsm
    assert "▲" not in gsm and "▼" not in gsm
    assert "a was asked 5-shot, b chat: the prompt differs as well as the model" in gsm


def test_the_chat_section_puts_each_fine_tune_beside_its_own_base(layout: Layout, tmp_path: Path):  # noqa: F811
    """Two pretrained runs a (the report's first) and b; b-chat is fine-tuned from b. Its base
    row is b's, with b's figures, its intervals and the paired difference; the published
    figures beside them."""
    for run, val in (("a", 5.5), ("b", 4.25), ("b-chat", 4.75)):
        write_run(layout, run, val_loss=val)
    for run, loss in (("a", 3.0), ("b", 2.5), ("b-chat", 1.25)):
        write_eval(layout, run, "sft_loss", {"metric": "sft_loss", "value": loss})
        reply = f"reply of {run}"
        samples = {
            "metric": "chat_samples",
            "samples": [{"prompt": "Who are you?", "reply": reply}],
        }
        write_eval(layout, run, "chat_samples", samples)
    ids = [f"HumanEval/{i}" for i in range(4)]
    write_eval(layout, "b", "humaneval", passed(ids, [0, 0, 0, 0], "passed"))
    write_eval(layout, "b-chat", "humaneval", passed(ids, [1, 0, 0, 0], "passed"))
    write_eval(layout, "a", "humaneval", passed(ids, [1, 1, 1, 1], "passed"))
    runs = {
        "a": with_evals(settings(3e-3), CHAT_EVALS[:2] + ["humaneval"]),
        "b": with_evals(settings(1e-3), CHAT_EVALS[:2] + ["humaneval"]),
        "b-chat": chat_settings("b") | {"evaluations": ["val_loss", "humaneval", *CHAT_EVALS[:2]]},
    }
    html = render(layout, runs, tmp_path)
    base = row_text(html, "chat-b-chat-base")
    tuned = row_text(html, "chat-b-chat")
    assert base.split()[0] == "b" and "2.5000" in base and "4.2500" in base and "0.0%" in base
    assert "1.2500" in tuned and "25.0%" in tuned
    low, high = wilson_by_hand(1, 4)
    assert f"[{100 * low:.1f}%, {100 * high:.1f}%]" in tuned, tuned
    diff = row_text(html, "chat-b-chat-diff")
    assert "-1.2500" in diff and "+0.5000" in diff and "+25.0 points" in diff, diff
    assert "a result written without per-document losses" in diff  # these files have none
    published = re.findall(r'<tr class="ref" id="chat-b-chat-ref-\d+">(.*?)</tr>', html, re.S)
    # nanochat d20's MID and SFT publish HumanEval (its RL only GSM8K, no column here)
    assert len(published) == 2 and "8.5%" in published[1] and "SFT" in published[1]
    prompts = html.split('id="chat-prompts-b-chat"')[1].split("</table>")[0]
    assert "reply of b<" in prompts and "reply of b-chat" in prompts and "reply of a" not in prompts


def cr2_by_hand(sums: list[float], sizes: list[int]) -> tuple[float, float, float]:
    """A mean over tokens with its 95% interval cluster-robust over conversations, written out:
    Bell and McCaffrey's (2002) CR2 variance and their degrees of freedom."""
    total = sum(sizes)
    mean = sum(sums) / total
    var = sum((s - mean * n) ** 2 / (1 - n / total) for s, n in zip(sums, sizes, strict=True))
    var /= total**2
    r = [n * n / (1 - n / total) for n in sizes]
    dof = total**2 / (sum(n * n for n in sizes) + (sum(r) ** 2 - sum(x * x for x in r)) / total**2)
    half = scipy_stats.t.ppf(0.975, dof) * math.sqrt(var)
    return mean, mean - half, mean + half


def test_the_conversation_loss_has_its_interval_and_a_paired_difference(
    layout: Layout,  # noqa: F811
    tmp_path: Path,
):
    """sft_loss.json lists each held-out conversation's summed loss and tokens: the chat section
    gives the loss its interval over conversations, and the fine-tune's difference from its base
    paired on the same conversations, both equal to a computation by hand."""
    sizes = [30, 12, 45, 8, 25]
    per_run = {
        "b": [90.0, 40.0, 120.0, 30.0, 70.0],
        "b-chat": [30.0, 20.0, 35.0, 16.0, 26.0],
    }
    for run in ("a", "b", "b-chat"):
        write_run(layout, run, val_loss=4.0)
        losses = per_run.get(run, per_run["b"])
        result = {"metric": "sft_loss", "value": sum(losses) / sum(sizes),
                  "doc_losses": losses, "doc_tokens": sizes, "tokens": sum(sizes)}  # fmt: skip
        write_eval(layout, run, "sft_loss", result)
    runs = {
        "a": with_evals(settings(3e-3), CHAT_EVALS[:1]),
        "b": with_evals(settings(1e-3), CHAT_EVALS[:1]),
        "b-chat": chat_settings("b") | {"evaluations": ["val_loss", *CHAT_EVALS[:1]]},
    }
    html = render(layout, runs, tmp_path)
    mean, low, high = cr2_by_hand(per_run["b-chat"], sizes)
    tuned = row_text(html, "chat-b-chat")
    assert f"{mean:.4f}" in tuned and f"[{low:.4f}, {high:.4f}]" in tuned, tuned
    diffs = [t - b for t, b in zip(per_run["b-chat"], per_run["b"], strict=True)]
    mean, low, high = cr2_by_hand(diffs, sizes)
    diff = row_text(html, "chat-b-chat-diff")
    assert f"{mean:+.4f}" in diff and f"[{low:+.4f}, {high:+.4f}]" in diff, diff
    assert "5 conversations" in diff


def wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's score interval (Wilson 1927), written out."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_a_fine_tune_of_a_hugging_face_model_sits_beside_its_reference_run(
    layout: Layout,  # noqa: F811
    tmp_path: Path,
):
    """`base: {hf: DIR}`: the base column is the reference run measuring DIR (lmpipe.bases'
    `<model>-base`), not the report's first run."""
    for run, loss in (("a", 3.0), ("m-base", 2.0), ("m-chat", 1.0)):
        write_run(layout, run)
        write_eval(layout, run, "sft_loss", {"metric": "sft_loss", "value": loss})
    model = {"arch": "hf", "path": "/models/m", "revision": None, "trust_remote_code": False}
    ref = settings(0.0) | {"reference": True, "model": model}
    tuned = chat_settings("x") | {"base": {"hf": "/models/m"}}
    runs = {"a": settings(3e-3), "m-base": ref, "m-chat": tuned}
    html = render(layout, runs, tmp_path)
    base = row_text(html, "chat-m-chat-base")
    assert base.split()[0] == "m-base" and "2.0000" in base, base


@pytest.mark.parametrize("chat_evals", [False, True])
def test_a_report_without_chat_evaluations_renders_as_before(
    layout: Layout,  # noqa: F811
    tmp_path: Path,
    chat_evals: bool,
):
    """Two pretraining runs with HellaSwag alone: the task table holds HellaSwag only, and no
    chat section, gold-bpb table or chat evaluation's name appears. With HumanEval on both the
    same report gains its row (the check can see one)."""
    for run in ("a", "b"):
        write_run(layout, run)
        if chat_evals:
            write_eval(layout, run, "humaneval", passed(["HumanEval/0"], [1], "passed"))
    html = render(layout, {"a": settings(3e-3), "b": settings(1e-3)}, tmp_path)
    rows = re.findall(r'<tr id="task-([^"]+)">', html)
    if chat_evals:
        assert rows == ["hellaswag", "humaneval", "lambada"]
        return
    assert rows == ["hellaswag", "lambada"]  # LAMBADA: published figures only
    for absent in ('id="chat', 'id="gold-bpb', "HumanEval", "GSM8K", "gold answer", "nanochat"):
        assert absent not in html, absent

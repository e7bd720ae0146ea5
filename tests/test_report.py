"""The report on synthetic run folders written to the file contracts of docs/architecture.md."""

from __future__ import annotations

import html as html_lib
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_restarts import end, mark, start, write

from lmpipe.paths import Layout
from lmpipe.report import page as report
from lmpipe.report.figures import loss_panels
from lmpipe.report.references import REFERENCES
from lmpipe.report.runs import load_run, read_metrics

SHA = "ab" * 32


def settings(lr: float, lm_eval: bool = True, device: str = "cuda") -> dict:
    """A run's slice of report_params: what lmpipe.config.report_params gives for a tiny run."""
    evaluations = ["val_loss", "hellaswag", "samples"] + (["hellaswag_lm_eval"] if lm_eval else [])
    return {
        "run": "x",
        "dataset": "toy",
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 128},
        "train": {
            "seq_len": 128,
            "batch_tokens": 4096,
            "max_steps": 20,
            "optimizer": {"name": "adamw", "lr": lr},
            "schedule": {"warmup_steps": 2},
        },
        "launch": {"device": device, "nodes": 1, "procs_per_node": 2, "peak_flops": 1e12},
        "eval": {"hellaswag": {"items": 100, "lm_eval": lm_eval}},
        "evaluations": evaluations,
        "text_dataset": "toy",
        "chat_dataset": None,
    }


def write_run(
    layout: Layout,
    name: str,
    *,
    steps: int = 20,
    loss0: float = 10.0,
    finished: bool = True,
    hellaswag_curve: bool = False,
    val_loss: float = 5.4321,
    hellaswag: float = 0.2717,
    lm_eval: tuple[float, float] = (0.2813, 0.2505),  # acc_norm, acc
    tokens_per_s: float = 1000.0,
    mfu: float = 0.02,
    gpu_hours: float = 0.5,
) -> None:
    """A run folder as train + evaluate write it; `finished=False` stops halfway, no final/.
    The figures the headline shows are arguments, so that runs can differ in each."""
    train = Path(layout.train_dir(name))
    train.mkdir(parents=True)
    done = steps if finished else steps // 2
    lines = []
    for step in range(done):
        tokens = (step + 1) * 4096
        loss = loss0 * math.exp(-step / 10) + 5
        lines.append(
            {
                "step": step,
                "tokens": tokens,
                "loss": loss,
                "lr": 1e-3 * min(1, (step + 1) / 5),
                "grad_norm": 1.0,
                "tokens_per_s": tokens_per_s if step else 10.0,  # the first step is slow
                "mfu": mfu,
                "wall_s": 4.0 * (step + 1),
            }
        )
        if step % 5 == 4:
            lines.append({"step": step, "tokens": tokens, "val_loss": loss + 0.1, "wall_s": 1.0})
        if hellaswag_curve and step % 5 == 4:
            lines.append({"step": step, "tokens": tokens, "hellaswag": 0.25 + step / 1000})
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    (train / "metrics.jsonl").write_text(text)
    (train / "provenance.json").write_text(
        json.dumps(
            {
                "git_commit": "0123456789abcdef0123456789abcdef01234567",
                "git_dirty": True,
                "packages": {"torch": "2.13.0", "lmpipe": "0.1.0"},
                "host": "node-17",
                "hosts": ["node-17"],
                "python": "3.11.2",
                "platform": "Linux",
                "gpus": ["NVIDIA H200"],
                "time_utc": "2025-01-01T00:00:00+00:00",
                "world_size": 2,
                "device": "cpu",
                "nodes": 1,
                "settings_hash": f"hash-{name}",
            }
        )
    )
    if not finished:
        return
    final = train / "final"
    final.mkdir()
    meta = {
        "run": name,
        "step": steps,
        "tokens": steps * 4096,
        "world_size": 2,
        "wall_s": 4.0 * steps,
        "gpu_hours": gpu_hours,
        "settings_hash": f"hash-{name}",
    }
    (final / "meta.json").write_text(json.dumps(meta))
    ev = Path(layout.eval_dir(name))
    ev.mkdir(parents=True)
    produced = {
        "module": "lmpipe.evaluate",
        "model": f"runs/{name}/model/hf",
        "checkpoint": {"step": steps, "settings_hash": f"hash-{name}", "train": {"lr": 1}},
    }
    results = {
        "val_loss": {"metric": "val_loss", "value": val_loss, "tokens": 32768},
        "hellaswag": {"metric": "hellaswag", "value": hellaswag, "acc": 0.26},
        "hellaswag_lm_eval": {"metric": "hellaswag", "value": lm_eval[0], "acc": lm_eval[1]},
        "samples": {
            "metric": "samples",
            "samples": [{"prompt": "Hello, I'm a language model,", "completion": " <b>bold</b>"}],
        },
    }
    results["hellaswag"]["acc_norm"] = hellaswag
    results["hellaswag_lm_eval"]["acc_norm"] = lm_eval[0]
    for metric, data in results.items():
        data.setdefault("items", 100)
        (ev / f"{metric}.json").write_text(json.dumps(data | {"produced_by": produced}))


def write_manifest(layout: Layout) -> None:
    d = Path(layout.tokens_dir("toy"))
    d.mkdir(parents=True)
    shards = [
        {"file": "toy_val_000000.bin", "split": "val", "tokens": 1000, "sha256": SHA},
        {"file": "toy_train_000001.bin", "split": "train", "tokens": 5000, "sha256": "cd" * 32},
    ]
    manifest = {
        "dataset": "toy",
        "tokenizer": "gpt2",
        "eot": 50256,
        "shards": shards,
        "tokens": {"val": 1000, "train": 5000},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))


def params(runs: dict[str, dict], price: float = 2.0) -> dict:
    return {"report": "toy", "gpu_hour_price": price, "runs": runs}


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    lay = Layout(results=str(tmp_path / "results"), data=str(tmp_path / "results" / "data"))
    write_manifest(lay)
    return lay


def render(layout: Layout, runs: dict[str, dict], tmp_path: Path, price: float = 2.0) -> str:
    """Through the CLI, as the rule calls it."""
    out = tmp_path / "report.html"
    report.main(
        [
            "--config-json",
            json.dumps(params(runs, price)),
            "--results",
            layout.results,
            "--data",
            layout.data,
            "--out",
            str(out),
        ]
    )
    return out.read_text()


class Tags(HTMLParser):
    """Collects tags with their attributes, and the text of table cells by row id."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Tags()
    p.feed(html)
    return p.tags


def row_text(html: str, row_id: str) -> str:
    m = re.search(rf'<tr id="{re.escape(row_id)}">(.*?)</tr>', html, re.S)
    assert m, f"no row {row_id}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m.group(1)))


def test_headline_has_every_runs_metrics(layout: Layout, tmp_path: Path) -> None:
    """Each run's row holds that run's own figures (every headline column differs between the
    two runs), and none of the other's."""
    write_run(layout, "a")
    write_run(layout, "b", steps=30, val_loss=4.9876, hellaswag=0.3141, lm_eval=(0.3355, 0.3027),
              tokens_per_s=2500.0, mfu=0.035, gpu_hours=0.75)  # fmt: skip
    html = render(layout, {"a": settings(3e-3), "b": settings(1e-3)}, tmp_path, price=2.0)
    expected = {  # worked out by hand from what write_run wrote
        "a": {
            "val loss (eval/val_loss.json)": "5.4321",
            "HellaSwag acc_norm, llm.c scoring": "27.17%",
            "lm-eval acc_norm": "28.13%",
            "lm-eval acc": "25.05%",
            "tokens: 20 steps * 4096": "81.9K",
            "wall time: 20 steps * 4 s": "80.0 s",
            "GPU-hours": "0.50",
            "cost at $2/GPU-hour": "$1.00",
            "mean tokens/s, the slow first step left out": " 1,000 ",
            "MFU": "2.0%",
        },
        "b": {
            "val loss (eval/val_loss.json)": "4.9876",
            "HellaSwag acc_norm, llm.c scoring": "31.41%",
            "lm-eval acc_norm": "33.55%",
            "lm-eval acc": "30.27%",
            "tokens: 30 steps * 4096": "123K",
            "wall time: 30 steps * 4 s": "2.0 min",
            "GPU-hours": "0.75",
            "cost at $2/GPU-hour": "$1.50",
            "mean tokens/s, the slow first step left out": " 2,500 ",
            "MFU": "3.5%",
        },
    }
    rows = {run: row_text(html, f"headline-{run}") for run in expected}
    for run, figures in expected.items():
        assert "finished" in rows[run]
        other = rows["b" if run == "a" else "a"]
        for what, text in figures.items():
            assert text in rows[run], (run, what, text, rows[run])
            assert text not in other, (run, what, text, other)
    # the references sit beside the runs, marked as such
    # (those with a figure of a headline column: OPT's suite figures sit in the task table)
    columns = {"val_loss", "hellaswag", "hellaswag_lm_eval", "hellaswag_lm_eval_acc"}
    headline_refs = [r for r in REFERENCES if columns & set(r.figures)]
    assert html.count('class="badge reference"') == len(headline_refs) == 7
    values = ("3.425", "29.55%", "3.083", "37.52%", "33.70%", "43.60%", "31.14%", "28.92%", "2.93")
    for value in values:
        assert value in html, value


def test_a_mixtures_headline_val_loss_says_it_is_a_mean_of_its_sources(
    layout: Layout, tmp_path: Path
) -> None:
    """A mixture's val_loss is its sources' losses weighted: the headline cell says so, where a
    run of one dataset's cell is that shard's loss and says nothing."""
    write_run(layout, "one")
    write_run(layout, "mix", val_loss=4.5)
    path = Path(layout.eval_dir("mix")) / "val_loss.json"
    result = json.loads(path.read_text())
    result["sources"] = {
        "a": {"dataset": "a", "weight": 0.8, "value": 4.0, "tokens": 4096},
        "b": {"dataset": "b", "weight": 0.2, "value": 6.5, "tokens": 4096},
    }
    path.write_text(json.dumps(result))
    html = render(layout, {"one": settings(3e-3), "mix": settings(1e-3)}, tmp_path)
    assert "4.5000 weighted mean of 2 sources (Data table)" in row_text(html, "headline-mix")
    assert "sources" not in row_text(html, "headline-one")


def test_the_cost_is_at_the_price_of_each_runs_gpu_type(layout: Layout, tmp_path: Path) -> None:
    """gpu_hour_price one a GPU type: each run's GPU-hours at the price of the type the plan
    (lmpipe.plan.report_plan) names for it; a type without a price gets no cost."""
    write_run(layout, "a")  # 0.50 GPU-hours
    write_run(layout, "b", steps=30, gpu_hours=0.75)
    write_run(layout, "c", steps=30, gpu_hours=0.75)
    runs = {"a": settings(3e-3), "b": settings(1e-3), "c": settings(2e-3)}
    planned = {
        run: {"train_s": 60.0, "gpu_hours": 0.5, "gpu": gpu, "cost": None, "gpu_mem_gb": 1.0,
              "jobs_in_a_row": 1, "basis": "", "problems": []}
        for run, gpu in (("a", "a100"), ("b", "h100"), ("c", "l4"))
    }  # fmt: skip
    html = report.build_report(params(runs, {"a100": 2.0, "h100": 3.0}), layout, planned)
    assert "$1.00" in row_text(html, "headline-a")  # 0.50 h x $2
    assert "$2.25" in row_text(html, "headline-b")  # 0.75 h x $3
    assert "$" not in row_text(html, "headline-c")
    assert "$2.00 an a100-hour, $3.00 an h100-hour" in html


def test_cpu_runs_have_no_gpu_hours_or_cost(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")  # meta.json says 0.5 GPU-hours; the run's settings say CPU
    row = row_text(render(layout, {"a": settings(3e-3, device="cpu")}, tmp_path), "headline-a")
    assert "(CPU)" in row and "0.50" not in row and "$" not in row


def test_settings_differences_are_highlighted(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")
    write_run(layout, "b")
    html = render(layout, {"a": settings(3e-3), "b": settings(1e-3)}, tmp_path)
    diff_rows = re.findall(r'<tr class="diff">\s*<td><code>([^<]+)</code>', html)
    assert diff_rows == ["train.optimizer.lr"]
    assert re.search(r'id="differences">[^<]*<code>train\.optimizer\.lr</code>', html)
    # equal settings are listed but not highlighted
    assert "<code>train.seq_len</code></td>" in html


def test_unfinished_run_is_shown_not_failed(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")
    write_run(layout, "b", finished=False)
    html = render(layout, {"a": settings(3e-3), "b": settings(1e-3), "c": settings(1e-3)}, tmp_path)
    row = row_text(html, "headline-b")
    assert "not finished" in row
    assert "during training" in row  # val loss so far, from metrics.jsonl
    assert "41K" in row  # tokens so far: 10 of 20 steps
    assert "not finished" not in row_text(html, "headline-a")
    assert "not started" in row_text(html, "headline-c")
    assert re.search(r'id="status-b">.*train/final/meta\.json', html, re.S)
    assert 'id="figure-loss"' in html  # the curves so far are drawn


def test_lm_eval_is_optional_where_the_run_does_not_ask_for_it(
    layout: Layout, tmp_path: Path
) -> None:
    write_run(layout, "a")
    (Path(layout.eval_dir("a")) / "hellaswag_lm_eval.json").unlink()
    html = render(layout, {"a": settings(3e-3, lm_eval=False)}, tmp_path)
    assert "not finished" not in row_text(html, "headline-a")
    html = render(layout, {"a": settings(3e-3, lm_eval=True)}, tmp_path)
    assert "not finished" in row_text(html, "headline-a")


def test_self_contained_no_external_urls(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a", hellaswag_curve=True)
    html = render(layout, {"a": settings(3e-3)}, tmp_path)
    found = tags(html)
    imgs = [a for t, a in found if t == "img"]
    assert len(imgs) == 4  # loss, lr, throughput, HellaSwag during training
    for tag, attrs in found:
        for key in ("src", "href"):
            url = attrs.get(key)
            if url is not None:
                assert url.startswith(("data:", "#")), f"<{tag} {key}={url[:60]}>"
    assert "<script" not in html
    assert re.search(r"url\(\s*['\"]?(?!data:)", html) is None  # no CSS fetches either
    # figures are real PNGs
    import base64

    for img in imgs:
        assert img["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(img["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_hellaswag_plot_only_when_measured(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")
    html = render(layout, {"a": settings(3e-3)}, tmp_path)
    assert 'id="figure-hellaswag"' not in html
    assert 'id="figure-loss"' in html and 'id="figure-lr"' in html


def test_val_loss_against_wall_time_compares_two_runs_or_more(
    layout: Layout, tmp_path: Path
) -> None:
    """Recipes differ in what a step costs: a figure of val loss against the trainer's wall time,
    drawn for two runs or more of one dataset, with each val line's own wall_s."""
    from lmpipe.report.figures import wall_figure

    write_run(layout, "a")
    html = render(layout, {"a": settings(3e-3)}, tmp_path)
    assert 'id="figure-wall"' not in html  # one run: nothing to compare
    write_run(layout, "b")
    html = render(layout, {"a": settings(3e-3), "b": settings(1e-3)}, tmp_path)
    assert 'id="figure-wall"' in html and 'id="figure-loss"' in html
    runs = [load_run(layout, n, settings(3e-3)) for n in ("a", "b")]
    for r in runs:  # val lines logged before wall_s existed: no figure rather than a wrong one
        r.val = [{k: v for k, v in row.items() if k != "wall_s"} for row in r.val]
    assert wall_figure(runs) is None


def test_provenance_and_samples(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")
    html = render(layout, {"a": settings(3e-3)}, tmp_path)
    assert "0123456789abcdef0123456789abcdef01234567" in html
    assert "dirty" in html
    assert "hash-a" in html
    assert "torch==2.13.0" in html
    assert "node-17" in html and "NVIDIA H200" in html
    assert SHA in html and "toy_train_000001.bin" in html
    assert "5,000 train + 1,000 val tokens" in html
    assert "module=lmpipe.evaluate" in html  # produced_by of the eval files
    assert "checkpoint.step=20, checkpoint.settings_hash=hash-a" in html
    # samples are shown, escaped: model output is text, not markup
    assert "Hello, I&#39;m a language model," in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html


def test_resumed_steps_keep_the_later_line_and_tolerate_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "tokens": 1, "loss": 9.0},
        {"step": 1, "tokens": 2, "loss": 8.0},
        {"step": 1, "tokens": 2, "loss": 7.5},  # logged again after a resume
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 2, "to')
    m = read_metrics(path)
    assert [r["loss"] for r in m["train"]] == [9.0, 7.5]


# a run that survived a SLURM signal (job 50), a kill (job 53), and finished (job 57)
SURVIVOR = [
    start(1, 0, job="50"),
    mark("checkpoint", 1, 100, 5),
    mark("checkpoint", 1, 160, 8),  # the save on the signal
    end(1, 161, 8, "signal", signal="SIGUSR1"),
    start(2, 221, step=8, job="53"),  # 61 s lost
    mark("checkpoint", 2, 300, 10),
    mark("progress", 2, 370, 14),  # then killed: no end line
    start(3, 400, step=10, job="57"),  # 100 s lost, 4 steps (at least) redone
    end(3, 500, 20, "finished"),
]


def test_restarts_table_tells_what_each_run_survived(layout: Layout, tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        write_run(layout, name)
    write(Path(layout.attempts("a")), SURVIVOR)
    write(Path(layout.attempts("b")), [start(1, 0), end(1, 80, 20, "finished")])
    # c trained before attempts.jsonl existed: no row
    html = render(layout, {n: settings(3e-3) for n in "abc"}, tmp_path)
    a = row_text(html, "restarts-a")
    assert a.split()[:2] == ["a", "3"]  # three attempts, the last finished
    assert "1 signal SIGUSR1, 1 killed" in a and "≥ 4" in a and "2.7 min" in a  # 161 s
    assert "50, 53, 57" in a
    assert "attempt 1: signal SIGUSR1 at step 8, resumed from 8: 0 step(s) redone, 61.0 s" in a
    assert "attempt 2: killed at step 14+, resumed from 10: 4 step(s) redone, 100.0 s" in a
    b = row_text(html, "restarts-b")
    assert "none: one attempt, finished" in b and "not under SLURM" in b
    assert 'id="restarts-c"' not in html
    # no run with attempts.jsonl: no section
    html = render(layout, {"c": settings(3e-3)}, tmp_path)
    assert 'id="restarts-table"' not in html


def test_a_resumed_run_is_one_curve(layout: Layout) -> None:
    """Steps logged by a killed attempt and again after the resume (the trainer drops the first
    lines on resume; the reader keeps the later anyway): one line a step, one curve."""
    write_run(layout, "a")
    path = Path(layout.metrics("a"))
    again = [{"step": s, "tokens": s * 4096, "loss": 1.0, "wall_s": 0.0} for s in (10, 11, 12)]
    with open(path, "a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in again))
    train = load_run(layout, "a", settings(3e-3)).train
    assert [r["step"] for r in train] == list(range(20))
    assert [r["loss"] for r in train[10:13]] == [1.0, 1.0, 1.0]


def test_bad_metrics_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1}\nnot json\n{"step": 1, "loss": 1}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        read_metrics(path)


def test_bad_eval_file_names_it(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")
    (Path(layout.eval_dir("a")) / "hellaswag.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"hellaswag\.json"):
        render(layout, {"a": settings(3e-3)}, tmp_path)


def test_progress_report_from_a_config_file(tmp_path: Path) -> None:
    """The by-hand form (lmpipe.report.progress) on the repo's config, nothing trained yet."""
    from lmpipe.paths import DEFAULT_CONFIG
    from lmpipe.report import progress

    out = tmp_path / "progress.html"
    empty = ["--results", str(tmp_path / "none"), "--data", str(tmp_path / "none")]
    progress.main(
        ["--config", str(DEFAULT_CONFIG), "--report", "embedded", "--out", str(out)] + empty
    )
    html = out.read_text()
    assert "not started" in row_text(html, "headline-embedded-a")
    assert "not started" in row_text(html, "headline-embedded-b")
    assert "no tokens manifest found" in html
    with pytest.raises(ValueError, match="no report 'nope'"):
        progress.main(["--config", str(DEFAULT_CONFIG), "--report", "nope", "--out", str(out)])


def test_a_progress_report_takes_a_sites_settings_as_snakemake_does(tmp_path: Path) -> None:
    """`--configfile site.yaml` merged over the config (docs/cluster.md): the site's results
    folder is the one read, where embedded-a's metrics say it has trained 3 steps (12.3K
    tokens)."""
    from lmpipe.paths import DEFAULT_CONFIG
    from lmpipe.report import progress

    site = tmp_path / "site.yaml"
    site.write_text(f"paths:\n  results: {tmp_path / 'elsewhere'}\n  data: {tmp_path / 'd'}\n")
    train = tmp_path / "elsewhere/runs/embedded-a/train"
    train.mkdir(parents=True)
    lines = [{"step": s, "tokens": 4096 * s, "loss": 10.0 - s, "lr": 1e-3} for s in (1, 2, 3)]
    (train / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = tmp_path / "progress.html"
    args = ["--config", str(DEFAULT_CONFIG), "--report", "embedded", "--out", str(out)]
    progress.main([*args, "--configfile", str(site)])
    row = row_text(out.read_text(), "headline-embedded-a")
    assert "not finished" in row and "12.3K" in row, row


def test_fine_tuned_run_beside_its_base(layout: Layout, tmp_path: Path) -> None:
    """A chat fine-tuning run: chat evals side by side with its base's, measured on the base's
    text data (its own dataset is conversations, with no tokens manifest)."""
    write_run(layout, "a")
    write_run(layout, "a-chat", loss0=2.0)
    for run, loss, reply in (("a", 3.5, "the the the"), ("a-chat", 1.25, "I am Vicuna.")):
        ev = Path(layout.eval_dir(run))
        (ev / "sft_loss.json").write_text(json.dumps({"metric": "sft_loss", "value": loss}))
        chat = {"metric": "chat_samples", "samples": [{"prompt": "Who are you?", "reply": reply}]}
        (ev / "chat_samples.json").write_text(json.dumps(chat))
    chat_evals = ["sft_loss", "chat_samples"]
    base = settings(3e-3) | {"chat_dataset": "chatdata"}
    base["evaluations"] += chat_evals
    tuned = settings(1e-3) | {
        "dataset": "chatdata",
        "text_dataset": "toy",
        "chat_dataset": "chatdata",
        "base": {"run": "a"},
        "sft": {"epochs": 3},
    }
    tuned["evaluations"] += chat_evals
    html = render(layout, {"a": base, "a-chat": tuned}, tmp_path)
    assert "1.2500" in row_text(html, "chat-a-chat")  # the fine-tuned run's row
    assert "3.5000" in row_text(html, "chat-a-chat-base")  # its base's, beside it
    assert "I am Vicuna." in html and "the the the" in html
    assert "not finished" not in row_text(html, "headline-a-chat")
    assert html.count("5,000 train + 1,000 val tokens") == 2  # both on the base's text data
    # without its chat evals the fine-tuned run is not finished
    (Path(layout.eval_dir("a-chat")) / "chat_samples.json").unlink()
    html = render(layout, {"a": base, "a-chat": tuned}, tmp_path)
    assert "not finished" in row_text(html, "headline-a-chat")


def test_kinds_of_run_are_not_the_comparison(layout: Layout, tmp_path: Path) -> None:
    """Two pretraining runs differ in lr (the point of the report); the fine-tuning run differs
    from them in data, steps and more: those rows are the kind of run, apart from the comparison.
    A finished fine-tuning run shows the steps and warmup it derived, not the config's 0."""
    write_run(layout, "a")
    write_run(layout, "b")
    write_run(layout, "a-chat")
    meta = Path(layout.final_checkpoint("a-chat")) / "meta.json"
    used = settings(1e-3)["train"] | {"max_steps": 1100, "schedule": {"warmup_steps": 44}}
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"train": used}))
    tuned = settings(1e-3) | {"dataset": "chatdata", "base": {"run": "a"}, "sft": {"epochs": 10}}
    tuned["train"] = tuned["train"] | {"max_steps": 0, "schedule": {"warmup_steps": 0}}
    html = render(layout, {"a": settings(3e-3), "b": settings(1e-3), "a-chat": tuned}, tmp_path)
    diff_rows = re.findall(r'<tr class="diff">\s*<td><code>([^<]+)</code>', html)
    kind_rows = re.findall(r'<tr class="kind">\s*<td><code>([^<]+)</code>', html)
    assert diff_rows == ["train.optimizer.lr"]
    assert {"dataset", "sft.epochs", "base.run", "train.max_steps"} <= set(kind_rows)
    row = re.search(r"<code>train\.max_steps</code>.*?</tr>", html, re.S).group(0)
    assert re.findall(r"<td>([^<]*)</td>", row) == ["20", "20", "1100"]
    assert "Fine-tuning: a-chat" in html and "Pretraining: a, b" in html


def test_loss_panels_one_a_dataset(layout: Layout) -> None:
    write_run(layout, "a")
    write_run(layout, "a-chat")
    runs = [
        load_run(layout, "a", settings(3e-3)),
        load_run(layout, "a-chat", settings(3e-3) | {"dataset": "chatdata", "sft": {}}),
        load_run(layout, "never", settings(3e-3)),  # nothing logged: no panel
    ]
    assert {k: [r.name for r in v] for k, v in loss_panels(runs).items()} == {
        "toy": ["a"],
        "chatdata": ["a-chat"],
    }


def test_cpu_throughput_is_explained(layout: Layout, tmp_path: Path) -> None:
    write_run(layout, "a")
    html = render(layout, {"a": settings(3e-3, device="cpu")}, tmp_path)
    assert 'id="cpu-note"' in html and "shared" not in row_text(html, "headline-a")
    html = render(layout, {"a": settings(3e-3, device="cuda")}, tmp_path)
    assert 'id="cpu-note"' not in html


def test_accuracy_bands_are_wilson_intervals_and_labelled() -> None:
    """The in-training accuracy band: Wilson's interval (by hand: 0 of 50 reaches up to
    z^2 / (n + z^2) = 7.1%; the normal approximation's would be 0 wide), named in the legend."""
    import numpy as np

    from lmpipe.report.figures import (
        WILSON_LABEL,
        _accuracy_curve,
        _band_legend,
        plt,
        wilson_interval,
    )

    z2 = 1.959964**2
    assert wilson_interval(0.0, 50) == pytest.approx((0.0, z2 / (50 + z2)), abs=1e-6)
    # 20 of 50: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    p, n = 0.4, 50
    centre, half = p + z2 / (2 * n), z2**0.5 * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5
    lo, hi = (centre - half) / (1 + z2 / n), (centre + half) / (1 + z2 / n)
    assert wilson_interval(p, n) == pytest.approx((lo, hi), abs=1e-6)
    fig, ax = plt.subplots()
    rows = [{"tokens": 100, "acc": 0.0, "n": 50}, {"tokens": 200, "acc": 0.4, "n": 50}]
    _accuracy_curve(ax, "a", "C0", rows, "acc", "n")
    _band_legend(ax)
    band = ax.collections[0].get_paths()[0].vertices
    assert np.isclose(band[:, 1], hi).any() and np.isclose(band[:, 1], z2 / (50 + z2)).any()
    assert WILSON_LABEL in ax.get_legend_handles_labels()[1]
    plt.close(fig)


def test_a_reference_run_is_marked_measured_not_trained(layout: Layout, tmp_path: Path) -> None:
    """A reference run (no train/ folder, only its evaluations) beside a trained one: measured,
    not "not finished"; its path and revision shown, trust_remote_code only when on; not counted
    among the runs trained on CPU cores."""
    write_run(layout, "a")
    ev = Path(layout.eval_dir("ref"))
    ev.mkdir(parents=True)
    for name, data in (("val_loss", {"value": 3.4251}), ("hellaswag", {"acc_norm": 0.2955}),
                       ("samples", {"samples": []})):  # fmt: skip
        (ev / f"{name}.json").write_text(json.dumps(data))
    model = {"arch": "hf", "path": "openai-community/gpt2", "revision": "607a30d783dfa663",
             "trust_remote_code": False}  # fmt: skip
    ref = {"run": "ref", "dataset": "toy", "model": model, "reference": True,
           "launch": {"device": "cpu", "nodes": 1, "procs_per_node": 1},
           "evaluations": ["val_loss", "hellaswag", "samples"], "text_dataset": "toy"}  # fmt: skip
    html = render(layout, {"a": settings(3e-3, device="cpu"), "ref": ref}, tmp_path)
    row = row_text(html, "headline-ref")
    assert "reference: measured, not trained" in row and "measured" in row.split("trained")[1]
    assert "openai-community/gpt2 @ 607a30d783df" in row and "3.4251" in row
    assert "trust_remote_code" not in row and 'id="status-ref"' not in html
    assert re.search(r'id="cpu-note"[^>]*>\s*a trained on CPU', html)
    model["trust_remote_code"] = True
    html = render(layout, {"a": settings(3e-3, device="cpu"), "ref": ref}, tmp_path)
    assert "trust_remote_code: on" in row_text(html, "headline-ref")


def headline_cells(html: str) -> tuple[list[str], dict[str, list[str]]]:
    """The headline table's header labels and each run row's cells, as text."""
    table = re.search(r'<table id="headline-table">(.*?)</table>', html, re.S).group(1)

    def text(cell: str) -> str:
        return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", cell)).strip())

    header = [text(c) for c in re.findall(r"<th>(.*?)</th>", table, re.S)]
    rows = {
        name: [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)]
        for name, body in re.findall(r'<tr id="headline-([^"]+)">(.*?)</tr>', table, re.S)
    }
    return header, rows


def test_no_headline_column_mixes_two_tokenizers_losses(layout: Layout, tmp_path: Path) -> None:
    """A val loss in nats a token is in one tokenizer's tokens: runs of GPT-2's tokens and of an
    `arch: hf` model's own get a val-loss column each, labelled with whose tokens, each holding
    only its own runs' losses; bits per byte is the one column both fill. Runs of one tokenizer
    keep one unlabelled val-loss column, bits per byte beside it."""
    from lmpipe.report.figures import loss_panels
    from lmpipe.report.runs import load_run

    write_run(layout, "gpt", val_loss=3.25)
    write_run(layout, "llama", val_loss=2.125)
    for name, bpb, of in (("gpt", 1.1, None), ("llama", 1.3, "mine")):
        path = Path(layout.eval_dir(name)) / "val_loss.json"
        result = json.loads(path.read_text()) | {"bytes": 100_000, "bits_per_byte": bpb}
        path.write_text(json.dumps(result | ({"tokens_of": of} if of else {})))
    runs = {"gpt": settings(3e-3), "llama": settings(1e-3) | {"tokens_of": "mine"}}
    header, rows = headline_cells(render(layout, runs, tmp_path))
    losses = [i for i, h in enumerate(header) if h.startswith("FineWeb val loss")]
    assert [header[i] for i in losses] == [
        "FineWeb val loss (in GPT-2's tokens)", "FineWeb val loss (in mine's tokens)",
    ]  # fmt: skip
    assert [rows["gpt"][i] for i in losses] == ["3.2500", "—"]
    assert [rows["llama"][i] for i in losses] == ["—", "2.1250"]
    bpb = header.index("FineWeb val bits per byte")
    assert rows["gpt"][bpb] == "1.1000" and rows["llama"][bpb] == "1.3000"
    # the curves: one panel a tokenizer for losses in nats a token
    panels = loss_panels([load_run(layout, n, s) for n, s in runs.items()])
    assert {k: [r.name for r in v] for k, v in panels.items()} == {
        "toy, in GPT-2's tokens": ["gpt"], "toy, in mine's tokens": ["llama"],
    }  # fmt: skip
    # one tokenizer: one val-loss column, unlabelled, with bits per byte beside it
    header, rows = headline_cells(render(layout, {"gpt": settings(3e-3)}, tmp_path))
    assert [h for h in header if h.startswith("FineWeb val")] == [
        "FineWeb val loss", "FineWeb val bits per byte",
    ]  # fmt: skip

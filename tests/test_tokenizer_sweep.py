"""A sweep over a trained tokenizer's vocabulary size (`tokenizer.vocab_size`, lmpipe.sweeps): each
size its own tokenizer entry and model, trained once and cached; the sweep report compares the
points by bits per byte, their losses being in different tokens."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
import yaml
from test_tokenizer_stage import with_tokenizer

from conftest import make_workdir, planned, snakemake
from lmpipe import config as lmconfig
from lmpipe import schema, sweeps

REPORT = "results/report_sweep-vocab.html"


def sweep_config(sizes: list[int]) -> dict:
    """tok-a (tiny in a 1,024-id tokenizer of the embedded sample's first 400 documents), 4 steps
    its val loss and 8 HellaSwag items, swept over `sizes`."""
    c = with_tokenizer(max_documents=400)
    run = c["runs"]["tok-a"]
    run["train"] |= {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "val_tokens": 4096}
    run["eval"] = {"val_loss": {"tokens": 8192}, "hellaswag": {"items": 8, "lm_eval": False}}
    c["sweeps"] = {
        "vocab": {"base": "tok-a", "grid": {"tokenizer.vocab_size": sizes}, "gpu_hour_price": 0.0}
    }
    return c


def test_each_size_is_a_tokenizer_and_a_model_of_its_own():
    c = sweep_config([512, 2048])
    schema.validate(c)
    assert c["reports"]["sweep-vocab"]["runs"] == ["vocab/vocab_size=512", "vocab/vocab_size=2048"]
    for size in (512, 2048):
        run = f"vocab/vocab_size={size}"
        assert c["tokenizers"][f"tiny-v{size}"] == c["tokenizers"]["tiny"] | {"vocab_size": size}
        model = c["models"][c["runs"][run]["model"]]
        assert (model["tokenizer"], model["vocab_size"], model["padded_vocab_size"]) == (
            f"tiny-v{size}", size, size,
        )  # fmt: skip
        assert lmconfig.tokens_of(c, run) == f"tok-tiny-v{size}"
    params = json.loads(sweeps.report_params(c, "sweep-vocab"))["sweep"]
    assert params["points"]["vocab/vocab_size=512"] == {"tokenizer.vocab_size": 512}


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c["runs"]["tok-a"].update(model="tiny"),
         "sweeps.vocab.grid: tokenizer.vocab_size sets a trained tokenizer's setting, and run"
         " 'tok-a''s model 'tiny' has no `tokenizer:`"),
        (lambda c: c["sweeps"]["vocab"].update(grid={"tokenizer.vocab_sise": [512]}),
         "sweeps.vocab.grid: unknown key 'tokenizer.vocab_sise': a trained tokenizer has no such"
         " setting (did you mean 'vocab_size'?)"),
        (lambda c: c["sweeps"]["vocab"].update(grid={"tokenizer.vocab_size": [200]}),
         "tokenizers.tiny-v200.vocab_size: 200 is less than the minimum of 257"),
    ],
    ids=["no_trained_tokenizer", "unknown_setting", "too_small"],
)  # fmt: skip
def test_a_bad_tokenizer_sweep_is_one_line(edit, message):
    c = sweep_config([512])
    edit(c)
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(c)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_a_dry_run_plans_one_tokenizer_a_size(tmp_path):
    jobs = planned(make_workdir(tmp_path), sweep_config([512, 1024, 2048]), [REPORT])
    assert sorted(w for rule, w in jobs if rule == "train_tokenizer") == [
        "tokenizer=tiny-v1024", "tokenizer=tiny-v2048", "tokenizer=tiny-v512",
    ]  # fmt: skip
    assert sum(rule == "train" for rule, _ in jobs) == 3


def test_two_sizes_run_and_compare_by_bits_per_byte_and_a_third_trains_alone(tmp_path):
    """Two sizes through Snakemake (train_tokenizer -> tokenize -> train -> convert -> evaluate ->
    the sweep report): the report's best point is by bits per byte, each point's from its
    val_loss result; adding a size plans that point's chain only."""
    from test_browser import open_in_chromium

    workdir = make_workdir(tmp_path / "wd")
    config = sweep_config([512, 1024])
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    snakemake(workdir, "--cores", "2", REPORT)

    bpb = {}
    for size in (512, 1024):
        result = json.loads(
            (workdir / f"results/runs/vocab/vocab_size={size}/eval/val_loss.json").read_text()
        )
        assert result["tokens_of"] == f"tok-tiny-v{size}"
        bpb[size] = result["bits_per_byte"]
        tok = json.loads((workdir / f"results/tokenizers/tiny-v{size}/manifest.json").read_text())
        assert tok["vocab_size"] == size
    html = unescape((workdir / REPORT).read_text())
    best = min(bpb, key=bpb.get)
    found = re.search(r"Best point \(lowest final ([^)]*)\): <strong>([^<]*)</strong>", html)
    assert found and found.groups() == ("FineWeb val bits per byte", f"vocab/vocab_size={best}")
    assert f"{bpb[best]:.4f}" in html[found.end() :].split("</p>")[0]
    assert "compared by bits per byte" in html
    seen = open_in_chromium(workdir / REPORT, tmp_path / "sweep.png")
    assert not seen["errors"] and seen["images"], seen
    assert all(i["width"] > 0 for i in seen["images"]), seen["images"]

    jobs = planned(workdir, sweep_config([512, 1024, 768]), [REPORT])
    new = "vocab/vocab_size=768"
    assert {(rule, w) for rule, w in jobs if rule in ("train_tokenizer", "train")} == {
        ("train_tokenizer", "tokenizer=tiny-v768"), ("train", f"run={new}"),
    }, jobs  # fmt: skip
    others = {w for rule, w in jobs if rule in ("tokenize_for_model", "convert", "evaluate")}
    assert all("768" in w for w in others), jobs

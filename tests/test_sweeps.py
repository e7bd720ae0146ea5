"""Sweeps (lmpipe.sweeps): expansion into ordinary runs, their names, a size ladder's steps, the
sweep report's params; and the sweep report (lmpipe.report.sweep) on synthetic point folders."""

from __future__ import annotations

import copy
import json
import math
import re
from html import unescape

import pytest
import yaml
from test_report import settings, write_run

from conftest import CONFIG_FILE
from lmpipe import config as lmconfig
from lmpipe import costs, schema, sweeps
from lmpipe.paths import Layout
from lmpipe.report import page
from lmpipe.report.sweep import ladder_points

SHIPPED = yaml.safe_load(CONFIG_FILE.read_text())


@pytest.fixture
def cfg() -> dict:
    """The shipped config with a grid sweep of embedded-a added: lr x model."""
    c = copy.deepcopy(SHIPPED)
    c["models"]["tiny2"] = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 128}
    c["sweeps"]["lr"] = {
        "base": "embedded-a",
        "grid": {"train.optimizer.lr": [1.0e-3, 3.0e-3], "model": ["tiny", "tiny2"]},
    }
    return c


def test_a_grid_expands_into_every_combination_named_by_its_values(cfg):
    schema.validate(cfg)
    points = cfg["reports"]["sweep-lr"]["runs"]
    assert points == [
        "lr/lr=1e-3_model=tiny",
        "lr/lr=1e-3_model=tiny2",
        "lr/lr=3e-3_model=tiny",
        "lr/lr=3e-3_model=tiny2",
    ]
    run = cfg["runs"]["lr/lr=3e-3_model=tiny2"]
    assert run["train"]["optimizer"]["lr"] == 3.0e-3 and run["model"] == "tiny2"
    # everything else is the base's, defaults filled in: an ordinary run
    base = cfg["runs"]["embedded-a"]
    assert run["train"]["max_steps"] == base["train"]["max_steps"]
    assert run["eval"] == base["eval"] and run["launch"] == base["launch"]
    assert lmconfig.run_config(cfg, "lr/lr=3e-3_model=tiny2").model.n_layer == 2


def test_a_points_name_depends_only_on_its_own_values(cfg):
    """Adding a value leaves every existing point's name, and its train params, as they were."""
    schema.validate(cfg)
    before = {r: lmconfig.train_params(cfg, r) for r in cfg["reports"]["sweep-lr"]["runs"]}
    more = copy.deepcopy(SHIPPED)
    more["models"]["tiny2"] = cfg["models"]["tiny2"]
    more["sweeps"]["lr"] = copy.deepcopy(cfg["sweeps"]["lr"])
    more["sweeps"]["lr"]["grid"]["train.optimizer.lr"].insert(1, 2.0e-3)
    schema.validate(more)
    after = {r: lmconfig.train_params(more, r) for r in more["reports"]["sweep-lr"]["runs"]}
    assert set(after) - set(before) == {"lr/lr=2e-3_model=tiny", "lr/lr=2e-3_model=tiny2"}
    assert all(after[r] == before[r] for r in before)


def test_expanding_again_gives_the_same_config(cfg):
    """A config that holds its own expanded points (a validated config dumped and read back as
    --configfile) expands to the same runs: the points are replaced, not refused."""
    schema.validate(cfg)
    again = copy.deepcopy(cfg)
    schema.validate(again)
    assert again == cfg


@pytest.mark.parametrize(
    "value, text",
    [(6.0e-4, "6e-4"), (1.2e-3, "1.2e-3"), (3.0e-3, "3e-3"), (0.5, "0.5"), (0.0, "0"),
     (12, "12"), (True, "true"), ("d12", "d12"), ([0.9, 0.95], "0.9+0.95"), (2.0e5, "2e5")],
)  # fmt: skip
def test_values_as_names(value, text):
    assert sweeps.format_value(value) == text


def test_keys_that_share_a_last_part_are_named_in_full():
    short = sweeps.short_keys(["train.optimizer.lr", "train.seq_len", "eval.val_loss.tokens",
                               "eval.samples.tokens"])  # fmt: skip
    assert short == {
        "train.optimizer.lr": "lr",
        "train.seq_len": "seq_len",
        "eval.val_loss.tokens": "eval.val_loss.tokens",
        "eval.samples.tokens": "eval.samples.tokens",
    }


def test_a_ladder_trains_tokens_proportional_to_parameters():
    """The shipped ladder: max_steps = ceil(tokens_per_param * N / batch_tokens), N from the
    registry's count of each point's model."""
    c = schema.load_config(CONFIG_FILE)
    sweep = c["sweeps"]["embedded"]
    for run in c["reports"]["sweep-embedded"]["runs"]:
        rc = lmconfig.run_config(c, run)
        n = costs.num_params(rc.model)
        steps = math.ceil(sweep["tokens_per_param"] * n / rc.train.batch_tokens)
        assert rc.train.max_steps == steps, run
        tokens = rc.train.max_steps * rc.train.batch_tokens
        assert 0 <= tokens - sweep["tokens_per_param"] * n < rc.train.batch_tokens
    steps = {r: c["runs"][r]["train"]["max_steps"] for r in c["reports"]["sweep-embedded"]["runs"]}
    assert steps["embedded/lr=3e-3_model=tiny-s"] < steps["embedded/lr=3e-3_model=tiny"]
    assert steps["embedded/lr=3e-3_model=tiny"] < steps["embedded/lr=3e-3_model=tiny-l"]


def test_sweep_report_params_hold_the_values_and_the_ladders_compute():
    c = schema.load_config(CONFIG_FILE)
    params = json.loads(sweeps.report_params(c, "sweep-embedded"))
    s = params["sweep"]
    assert s["keys"] == ["train.optimizer.lr", "model"]
    assert s["points"]["embedded/lr=1e-2_model=tiny"] == {
        "train.optimizer.lr": 0.01,
        "model": "tiny",
    }
    ladder = s["ladder"]
    assert [p["run"] for p in ladder["presets"]] == ["124m", "350m"]
    rc = lmconfig.run_config(c, "124m")
    tokens = rc.train.max_steps * rc.train.batch_tokens  # 10B
    flops = costs.train_flops_per_token(rc.model, rc.train.seq_len) * tokens
    assert ladder["presets"][0]["compute"] == flops
    # N with the token embedding (padded vocab x width), which the report shows apart
    xs = "embedded/lr=3e-3_model=tiny-xs"
    assert ladder["params"][xs] == costs.num_params(lmconfig.run_config(c, xs).model)
    assert ladder["embedding"][xs] == 50304 * 16
    # an ordinary report has no sweep section
    assert "sweep" not in json.loads(sweeps.report_params(c, "embedded"))


def test_run_wildcard_matches_exactly_the_points():
    """A point's name holds . = + /: the constraint escapes them (a "." must not match "x")."""
    names = ["lr/lr=1e-3_model=tiny", "lr/lr=1.5e-3_model=tiny"]
    pattern = "|".join(re.escape(n) for n in names)  # common.smk's one_of
    assert re.fullmatch(pattern, "lr/lr=1.5e-3_model=tiny")
    assert not re.fullmatch(pattern, "lr/lr=1x5e-3_model=tiny")
    common = (CONFIG_FILE.parents[1] / "workflow" / "rules" / "common.smk").read_text()
    assert 'run=one_of(config["runs"])' in common and "re.escape(n)" in common


# ---- the sweep report, on synthetic point folders ----


def sweep_params(ladder: bool = True, sizes: int = 4) -> dict:
    """report_params of a ladder sweep (one lr, `sizes` sizes) and a second lr of m1."""
    names = {f"s/lr=1e-3_model=m{i}": (1e-3, f"m{i}") for i in range(sizes)}
    names["s/lr=3e-3_model=m1"] = (3e-3, "m1")
    params = {
        "report": "sweep-s",
        "gpu_hour_price": 0.0,
        "order": list(names),
        "runs": {n: settings(lr) for n, (lr, _) in names.items()},
        "sweep": {
            "name": "s",
            "base": "b",
            "keys": ["train.optimizer.lr", "model"],
            "short": {"train.optimizer.lr": "lr", "model": "model"},
            "points": {n: {"train.optimizer.lr": lr, "model": m} for n, (lr, m) in names.items()},
            "ladder": None,
        },
    }
    if ladder:
        size = {n: 10 ** (6 + int(m[1:]) / 2) for n, (_, m) in names.items()}
        params["sweep"]["ladder"] = {
            "tokens_per_param": 20,
            "params": {n: int(size[n]) for n in names},
            "embedding": {n: int(size[n]) // 2 for n in names},
            # ints, as lmpipe.sweeps computes them (the presets' past int64)
            "compute": {n: int(120 * size[n] ** 2) for n in names},
            "presets": [{"run": "350m", "compute": 7 * 10**19, "reference": "llm.c GPT-2 350M"}],
        }
    return params


def test_sweep_report_marks_the_best_leaves_unfinished_points_out_and_fits(tmp_path):
    layout = Layout(results=str(tmp_path), data=str(tmp_path / "data"))
    params = sweep_params()
    compute = params["sweep"]["ladder"]["compute"]
    for name in params["order"]:
        loss = 3.0 * (compute[name] / 1e14) ** -0.25 + 2.0  # a power law in compute
        if name == "s/lr=3e-3_model=m1":
            loss += 0.5  # the worse lr of m1: not the size's point of the fit
        write_run(layout, name, val_loss=loss)
    # m3: trained and its val loss measured, its HellaSwag still running: not finished
    (tmp_path / "runs/s/lr=1e-3_model=m3/eval/hellaswag.json").unlink()
    html = page.build_report(params, layout)
    assert re.search(r'id="point-s/lr=1e-3_model=m3">.*?not finished', html, re.S)
    # the best finished point (m2: m3 would be lower but did not finish)
    assert re.search(r'id="best">.*?<strong>s/lr=1e-3_model=m2</strong>', html, re.S)
    # the fit: the 3 finished sizes at the lr they all share; m1's other lr left out, and m3
    fit_rows = re.findall(r"<tr><td>(s/[^<]+)</td>", html.split('id="fit-table"')[1])
    assert fit_rows == ["s/lr=1e-3_model=m0", "s/lr=1e-3_model=m1", "s/lr=1e-3_model=m2"]
    assert "The ladder's points: sizes compared at lr 1e-3" in html
    left_out = html.split('id="left-out"')[1].split("</p>")[0]
    assert "s/lr=3e-3_model=m1</code> (lr 3e-3: not every size has it)" in left_out
    assert "s/lr=1e-3_model=m3</code> (not finished)" in left_out
    # 3 points, 3 parameters: no standard error, never bold, and the warning in words
    assert re.search(r'<span id="exponent">0\.25 \(no standard error\)</span>', html)
    warning = unescape(html.split('id="fit-warning"')[1].split("</p>")[0])
    assert "The power law is not identified" in warning
    assert "3 points for the law's 3 parameters leave 0 residual degrees of freedom" in warning
    assert "Exponents b from 0 to 5" in warning
    assert "N is the model's parameters, token embedding included" in html
    assert 'id="presets-table"' in html and "2.93" in html  # llm.c's 350M beside the fit
    assert html.count("<img ") == 4  # one a swept key, the ladder, the curves
    assert "<script" not in html and "http" not in html.split("</style>")[1]


def test_a_ladder_that_identifies_its_law_prints_the_exponent_bold_and_warns_of_nothing(tmp_path):
    """6 sizes on a law, no noise: b with its (tiny) standard error, bold, and no warning."""
    layout = Layout(results=str(tmp_path), data=str(tmp_path / "data"))
    params = sweep_params(sizes=6)
    compute = params["sweep"]["ladder"]["compute"]
    for name in params["order"]:
        write_run(layout, name, val_loss=3.0 * (compute[name] / 1e14) ** -0.25 + 2.0)
    html = page.build_report(params, layout)
    assert re.search(
        r'<strong id="exponent">0\.2500 ± &lt; 0\.0001 \(95%: 0\.25 to 0\.25\)</strong>', html
    )
    assert 'id="fit-warning"' not in html and "not identified" not in html
    assert "Exponents b from 0.25 to 0.25 fit the points within the 95% profile bound" in html


# ---- the ladder's points: one a size, under one rule ----


def shipped_ladder() -> dict:
    """The shipped sweep's report params: an lr sweep of tiny beside a ladder at lr 3e-3."""
    c = schema.load_config(CONFIG_FILE)
    return json.loads(sweeps.report_params(c, "sweep-embedded"))["sweep"]


def test_the_shipped_ladder_compares_every_size_at_the_lr_they_share():
    """tiny's best lr (here 1e-2) is not its point: the other sizes trained only at 3e-3."""
    sweep = shipped_ladder()
    runs = list(sweep["points"])
    loss = {r: 10.0 - sweep["ladder"]["params"][r] / 1e6 for r in runs}
    loss["embedded/lr=1e-2_model=tiny"] -= 1.0  # tiny's best lr
    ladder = ladder_points(sweep, runs, loss)
    assert ladder.rule == "sizes compared at lr 3e-3"
    assert [p["run"] for p in ladder.points] == [
        f"embedded/lr=3e-3_model={m}" for m in ("tiny-xs", "tiny-s", "tiny", "tiny-l")
    ]
    assert ladder.left_out == {
        "embedded/lr=1e-3_model=tiny": "lr 1e-3: not every size has it",
        "embedded/lr=1e-2_model=tiny": "lr 1e-2: not every size has it",
    }
    point = ladder.points[0]
    c = schema.load_config(CONFIG_FILE)
    tiny_xs = lmconfig.model_config(c["models"]["tiny-xs"], "model")
    assert point["params"] == costs.num_params(tiny_xs) and point["embedding"] == 50304 * 16


def grid_ladder(lrs: dict[str, list[float]]) -> dict:
    """A ladder's sweep params: model size -> the lrs it has a point at."""
    points = {f"g/lr={lr:g}_model={m}": {"train.optimizer.lr": lr, "model": m}
              for m, values in lrs.items() for lr in values}  # fmt: skip
    size = {m: 10 ** (6 + i) for i, m in enumerate(lrs)}
    return {
        "keys": ["train.optimizer.lr", "model"],
        "short": {"train.optimizer.lr": "lr", "model": "model"},
        "points": points,
        "ladder": {
            "params": {r: size[p["model"]] for r, p in points.items()},
            "embedding": {r: size[p["model"]] // 2 for r, p in points.items()},
            "compute": {r: 100 * size[p["model"]] ** 2 for r, p in points.items()},
        },
    }


def test_a_ladder_that_sweeps_lr_at_every_size_takes_each_sizes_best():
    sweep = grid_ladder({"a": [0.001, 0.003], "b": [0.001, 0.003], "c": [0.001, 0.003]})
    loss = dict(zip(sweep["points"], [5.0, 5.5, 4.5, 4.0, 3.0, 3.5], strict=True))
    ladder = ladder_points(sweep, list(loss), loss)
    assert (
        ladder.rule == "each size at its best of lr 1e-3; lr 3e-3 (every size has a point at each)"
    )
    assert [p["run"] for p in ladder.points] == [
        "g/lr=0.001_model=a", "g/lr=0.003_model=b", "g/lr=0.001_model=c"
    ]  # fmt: skip
    assert ladder.left_out["g/lr=0.003_model=a"] == "its size's best is lr 1e-3"
    # a size whose lrs have not all finished is left out, not fitted at a partial best
    loss["g/lr=0.003_model=c"] = None
    ladder = ladder_points(sweep, list(loss), loss)
    assert [p["run"] for p in ladder.points] == ["g/lr=0.001_model=a", "g/lr=0.003_model=b"]
    assert ladder.left_out["g/lr=0.001_model=c"] == "its size has points to come"
    assert ladder.left_out["g/lr=0.003_model=c"] == "not finished"


def test_sizes_that_share_no_lr_are_not_compared():
    sweep = grid_ladder({"a": [0.001], "b": [0.003], "c": [0.003]})
    loss = dict.fromkeys(sweep["points"], 4.0)
    ladder = ladder_points(sweep, list(loss), loss)
    assert ladder.points == [] and ladder.no_rule == (
        "no value of train.optimizer.lr that every model size has a point at"
    )

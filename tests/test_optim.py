"""The optimizer's groups, gradient clipping, the learning-rate schedule and the MFU figure, each
against numbers worked out by hand; the last three also as the training loop applies them (one
tiny in-process run: 1 gloo rank, FSDP, 4 steps)."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import async_save
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import CONFIG_FILE
from lmpipe import config as lmconfig
from lmpipe import schema
from lmpipe.config import ModelConfig, ScheduleConfig, TrainJob, train_config
from lmpipe.data.shards import write_shard
from lmpipe.models import build_model
from lmpipe.registry import AdamWSettings
from lmpipe.train import checkpoint, loop
from lmpipe.train.optim import build_optimizer, clip_grad_norm, lr_at
from lmpipe.train.parallel import init_distributed
from lmpipe.train.pretrain import pretraining

# ---- weight decay: 2-D weights only --------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}
    return build_model(ModelConfig(**shape, vocab_size=256, padded_vocab_size=256))


def test_weight_decay_groups_are_the_2d_weights_and_the_rest(gpt2):
    """Matmul and embedding weights decay; biases and LayerNorms do not; each parameter once."""
    opt = build_optimizer(gpt2, AdamWSettings(name="adamw", lr=1e-3, weight_decay=0.25))
    decay, no_decay = opt.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.25, 0.0)
    named = dict(gpt2.named_parameters())  # the tied head is wte, listed once
    ids = {id(p): n for n, p in named.items()}
    decayed = {ids[id(p)] for p in decay["params"]}
    kept = {ids[id(p)] for p in no_decay["params"]}
    per_layer = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]
    assert decayed == {"transformer.wte.weight", "transformer.wpe.weight"} | {
        f"transformer.h.{i}.{n}" for i in range(2) for n in per_layer
    }
    assert all(n.endswith(".bias") or ".ln_" in n for n in kept), kept
    assert len(kept) == 2 * 8 + 2  # 4 biases + 2 LayerNorms (weight, bias) a layer, and ln_f
    assert len(decay["params"]) + len(no_decay["params"]) == len(named)


def test_a_step_shrinks_only_the_2d_weights(gpt2):
    """With zero gradients an AdamW step is decay alone: 2-D weights x (1 - lr * wd), 1-D kept."""
    model = build_model(gpt2.config)
    model.load_state_dict(gpt2.state_dict())
    opt = build_optimizer(model, AdamWSettings(name="adamw", lr=0.5, weight_decay=0.1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 0.95 if p.dim() >= 2 else 1.0  # 1 - 0.5 * 0.1
        torch.testing.assert_close(p.detach(), before[n] * factor, rtol=1e-6, atol=0, msg=n)


# ---- gradient clipping --------------------------------------------------------------------------


def grads_3_4() -> torch.nn.Module:
    """Two parameters whose gradients are 3 and 4: total L2 norm 5."""
    m = torch.nn.Module()
    m.a, m.b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    m.a.grad, m.b.grad = torch.tensor([3.0]), torch.tensor([4.0])
    return m


def test_clip_scales_the_total_norm_down_to_the_clip_value():
    """Above the clip value, every gradient is scaled so the total norm is the clip value."""
    m = grads_3_4()
    assert clip_grad_norm(m, 1.0).item() == pytest.approx(5.0)  # the norm before clipping
    assert (m.a.grad.item(), m.b.grad.item()) == pytest.approx((0.6, 0.8), rel=1e-5)


@pytest.mark.parametrize("max_norm", [10.0, 0.0], ids=["below", "disabled"])
def test_clip_leaves_gradients_below_the_value_or_when_disabled(max_norm):
    """Below the clip value (or with grad_clip 0) the gradients are untouched."""
    m = grads_3_4()
    assert clip_grad_norm(m, max_norm).item() == pytest.approx(5.0)
    assert (m.a.grad.item(), m.b.grad.item()) == (3.0, 4.0)


# ---- the learning-rate schedule -----------------------------------------------------------------
# docstring: linear warmup to the peak ((step + 1) / warmup), then cosine to lr_floor x peak:
# floor + (peak - floor) * (1 + cos(pi * (step - warmup) / (max_steps - warmup))) / 2


@pytest.mark.parametrize(
    "warmup, floor, step, expected",
    [
        (0, 0.0, 0, 1.0),  # no warmup: the first step is at the peak
        (4, 0.0, 1, 0.5),  # (1 + 1) / 4
        (4, 0.0, 3, 1.0),  # the last warmup step reaches the peak
        (0, 0.0, 5, 0.5),  # halfway through the cosine: (1 + cos(pi / 2)) / 2
        (0, 0.0, 10, 0.0),  # the end of the cosine: the floor, 0
        (0, 0.2, 10, 0.2),
        (0, 0.2, 25, 0.2),  # past max_steps: stays at the floor
        (2, 0.0, 4, (1 + math.sqrt(0.5)) / 2),  # 2 of 8 decay steps: (1 + cos(pi / 4)) / 2
    ],
)
def test_lr_at_by_hand(warmup, floor, step, expected):
    """lr_at against the docstring's formula, worked out by hand (peak 1, max_steps 10)."""
    schedule = ScheduleConfig(warmup_steps=warmup, lr_floor=floor)
    assert lr_at(step, 1.0, schedule, max_steps=10) == pytest.approx(expected, abs=1e-12)
    assert lr_at(step, 3.0, schedule, max_steps=10) == pytest.approx(3 * expected, abs=1e-12)


@pytest.mark.parametrize(
    "warmup, step, expected",
    [
        (0, 0, 1.0),  # no warmup: the peak, held
        (0, 5, 1.0),  # the last step before the cooldown's 4 (steps 6..9)
        (0, 6, 1.0),  # the cooldown's first: (10 - 6) / 4
        (0, 7, 0.75),  # (10 - 7) / 4
        (0, 9, 0.25),  # the last step: modded-nanogpt's (num_iterations - it) / warmdown_iters
        (2, 0, 0.5),  # warmup first: (0 + 1) / 2
        (2, 4, 1.0),
    ],
)
def test_lr_at_with_a_cooldown_by_hand(warmup, step, expected):
    """schedule.cooldown_steps (warmup-stable-decay): the peak until the last 4 of 10 steps,
    then linearly to the floor (0 here; with floor 0.2: 0.2 + 0.8 x the same share)."""
    schedule = ScheduleConfig(warmup_steps=warmup, cooldown_steps=4)
    assert lr_at(step, 1.0, schedule, max_steps=10) == pytest.approx(expected, abs=1e-12)
    floored = ScheduleConfig(warmup_steps=warmup, lr_floor=0.2, cooldown_steps=4)
    if step >= warmup:
        want = 0.2 + 0.8 * expected
        assert lr_at(step, 1.0, floored, max_steps=10) == pytest.approx(want, abs=1e-12)


def test_a_schedule_without_cooldown_keeps_its_train_params():
    """cooldown_steps 0 (the default) is left out of the train params: no finished run reruns
    because the key was added; a cooldown is a trajectory setting and is in them."""
    config = schema.load_config(CONFIG_FILE)
    params = json.loads(lmconfig.train_params(config, "embedded-a"))
    assert params["train"]["schedule"] == {"warmup_steps": 4, "lr_floor": 0.0}
    config["runs"]["embedded-a"]["train"]["schedule"]["cooldown_steps"] = 8
    params = json.loads(lmconfig.train_params(config, "embedded-a"))
    assert params["train"]["schedule"]["cooldown_steps"] == 8


# ---- the loop: schedule, clip value and MFU as it applies them ----------------------------------

MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "vocab_size": 500,
         "padded_vocab_size": 512}  # fmt: skip
SEQ_LEN, BATCH_TOKENS, PEAK_FLOPS, GRAD_CLIP = 16, 64, 1e9, 0.5


def train_job(**train) -> TrainJob:
    t = {
        "seq_len": SEQ_LEN,
        "micro_batch": 2,
        "batch_tokens": BATCH_TOKENS,  # 2 micro-steps of 2 x 16 on one rank
        "max_steps": 4,
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "schedule": {"warmup_steps": 2, "lr_floor": 0.1},
        "grad_clip": GRAD_CLIP,
        "val_every": 0,
        "val_tokens": 64,
        "checkpoint_every": 0,
    } | train
    train = json.loads(json.dumps(dataclasses.asdict(train_config(t, "train"))))
    launch = {"device": "cpu", "nodes": 1, "procs_per_node": 1, "peak_flops": PEAK_FLOPS}
    job = {"run": "t", "dataset": "x", "model": MODEL, "train": train, "launch": launch}
    return TrainJob.from_json(json.dumps(job))


def tiny_data(folder: Path) -> Path:
    """Random tokens as a val shard and a train shard, with their manifest."""
    rng = np.random.default_rng(0)
    shards = []
    for i, split in enumerate(["val", "train"]):
        name = f"x_{split}_{i:06d}.bin"
        write_shard(folder / name, rng.integers(0, 500, 2000).astype(np.uint16))
        shards.append({"file": name, "split": split, "tokens": 2000})
    (folder / "manifest.json").write_text(json.dumps({"dataset": "x", "shards": shards}))
    return folder / "manifest.json"


def train_in_process(job: TrainJob, manifest: Path, out: Path) -> None:
    """The training loop in this process (one rank, gloo), its signal handlers put back after."""
    assert not dist.is_initialized()
    out.mkdir(parents=True, exist_ok=True)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    stop = loop.StopFlag()
    d = init_distributed("cpu")
    try:
        task = pretraining(job, manifest, d, None)
        assert loop.run(job, task, out, d, stop) == 0
    finally:
        dist.destroy_process_group()
        for s, h in handlers.items():
            signal.signal(s, h)


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory) -> tuple[list[dict], list[tuple[float, float, float]]]:
    """metrics.jsonl of a 4-step run, and (max_norm, norm before, norm after) of each clip."""
    manifest = tiny_data(tmp_path_factory.mktemp("tokens"))
    out = tmp_path_factory.mktemp("train")

    clips = []

    def recording_clip(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        norm = clip_grad_norm(model, max_norm)
        grads = [p.grad.full_tensor() for p in model.parameters() if p.grad is not None]
        after = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        clips.append((max_norm, norm.item(), after))
        return norm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "clip_grad_norm", recording_clip)
        train_in_process(train_job(), manifest, out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], clips


def test_loop_sets_the_scheduled_lr_each_step(loop_run):
    """Steps 1-4 of warmup 2, max_steps 4, floor 0.1, peak 1e-3: 0.5, 1, 1, 0.55 x peak."""
    rows, _ = loop_run
    expected = [0.5e-3, 1e-3, 1e-3, 0.1e-3 + 0.5 * 0.9e-3]  # the last: halfway down the cosine
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-12)


def test_loop_clips_to_the_configured_value(loop_run):
    """train.grad_clip reaches the clip, and the gradients the optimizer sees have that norm."""
    rows, clips = loop_run
    assert len(clips) == 4
    for (max_norm, before, after), row in zip(clips, rows, strict=True):
        assert max_norm == GRAD_CLIP
        assert before > GRAD_CLIP, "a clip value below the gradient norm, so clipping happens"
        assert after == pytest.approx(GRAD_CLIP, rel=1e-5)
        assert row["grad_norm"] == pytest.approx(before, rel=1e-6)  # logged before clipping


def test_mfu_is_llmc_flops_per_token_over_the_peak(loop_run):
    """MFU = (6 N + 6 L C T) FLOPs a token x tokens/s / (peak x ranks), N by hand."""
    rows, _ = loop_run
    L, C, T, Vp, block = 2, 32, SEQ_LEN, 512, 32
    per_layer = (
        2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)
    )  # ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj
    n_params = Vp * C + block * C + L * per_layer + 2 * C  # wte (padded, tied head), wpe, ln_f
    assert n_params == 42880
    flops_per_token = 6 * n_params + 6 * L * C * T
    for r in rows:
        assert r["mfu"] == pytest.approx(flops_per_token * r["tokens_per_s"] / PEAK_FLOPS, rel=1e-9)


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint (model and AdamW state), read in one process."""
    copy = folder.parent.parent / f"{folder.name}.pt"  # beside the run, not among its checkpoints
    dcp_to_torch_save(folder, copy)
    state = torch.load(copy, weights_only=False)

    def tensors(d: dict, prefix: str = "") -> dict[str, torch.Tensor]:
        flat = {}
        for key, value in d.items():
            if isinstance(value, dict):
                flat |= tensors(value, f"{prefix}{key}.")
            elif isinstance(value, torch.Tensor):
                flat[f"{prefix}{key}"] = value
        return flat

    return tensors(state)


def test_async_checkpoints_hold_each_step_s_state_as_synchronous_ones_do(tmp_path):
    """train.checkpoint_async: each periodic checkpoint is written while the next steps change
    the weights in place, so it must hold its own step's state: tensor for tensor what the
    synchronous saves of the same run hold. The last one is written before the run ends."""
    manifest = tiny_data(tmp_path)
    saved = {}
    for mode in (False, True):
        out = tmp_path / f"async-{mode}"
        job = train_job(checkpoint_every=1, keep_checkpoints=4, checkpoint_async=mode)
        calls = []

        def counted(*args, calls=calls, **kwargs):
            calls.append(kwargs["checkpoint_id"].name)
            return async_save(*args, **kwargs)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(checkpoint.dcp, "async_save", counted)
            train_in_process(job, manifest, out)
        # steps 1-3 in a thread; the last step's save is synchronous
        assert calls == ([f"step_00000{s}.tmp" for s in (1, 2, 3)] if mode else [])
        folders = sorted((out / "checkpoints").iterdir())
        assert [f.name for f in folders] == [f"step_{s:06d}" for s in (1, 2, 3, 4)]
        saved[mode] = {f.name: checkpoint_tensors(f) for f in folders}
    for name, tensors in saved[False].items():
        assert tensors.keys() == saved[True][name].keys()
        for key, value in tensors.items():
            assert torch.equal(value, saved[True][name][key]), (name, key)
    # the steps differ from each other, so a checkpoint holding a later step's state would fail
    wte = "model.transformer.wte.weight"
    assert not torch.equal(saved[True]["step_000001"][wte], saved[True]["step_000002"][wte])

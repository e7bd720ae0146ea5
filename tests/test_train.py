"""The trainer: real torchrun, real FSDP2 on gloo, real DCP checkpoints, real FineWeb text.

Every multi-rank run goes through `python -m lmpipe.train` (which starts torchrun, as the train
rule does) or plain `python -m lmpipe.train.pretrain` (one process). Runs are tiny: a 2-layer,
32-wide GPT-2 on sequences of 32 tokens, a few steps each; most of the time is process start-up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import REPO, TOKENIZER_DIR, kill_at_checkpoint, wandb_history
from lmpipe.config import ScheduleConfig, train_config
from lmpipe.data.loader import DataShare, ShardLoader
from lmpipe.data.mixture import write_mixture
from lmpipe.data.shards import write_shard
from lmpipe.data.tokenizer import gpt2_encoding
from lmpipe.models.gpt2.model import GPT, GPTConfig
from lmpipe.report.restarts import read_attempts, summarise
from lmpipe.report.runs import read_metrics
from lmpipe.train.metrics import Metrics
from lmpipe.train.optim import lr_at

MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}
TRAIN = {
    "seq_len": 32,
    "micro_batch": 4,
    "batch_tokens": 256,  # 32 * 4 * 2 ranks (1 micro-step), or 32 * 4 * 2 micro-steps on 1
    "max_steps": 8,
    "lr": 3e-3,
    "warmup_steps": 2,
    "lr_floor": 0.1,
    "val_every": 4,
    "val_tokens": 1024,
    "checkpoint_every": 4,
    "keep_checkpoints": 2,
}


def config(ranks: int, optimizer: dict | None = None, **train) -> dict:
    """The train rule's params (lmpipe.config.train_params) for a tiny run; defaults filled.
    `lr`, `warmup_steps` and `lr_floor` go to the optimizer and the schedule; `optimizer`, if
    given, replaces the AdamW one."""
    t = TRAIN | train
    t["optimizer"] = {"name": "adamw", "lr": t.pop("lr")}
    t["schedule"] = {"warmup_steps": t.pop("warmup_steps"), "lr_floor": t.pop("lr_floor")}
    t["optimizer"] |= {"weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8, "fused": False}
    if optimizer is not None:
        t["optimizer"] = optimizer
    full = json.loads(json.dumps(dataclasses.asdict(train_config(t, "train"))))
    model = MODEL | {"vocab_size": 50257, "padded_vocab_size": 50304, "arch": "gpt2"}
    launch = {"device": "cpu", "nodes": 1, "procs_per_node": ranks, "peak_flops": 1e12}
    return {"run": "test", "dataset": "embedded", "model": model, "train": full, "launch": launch}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, fineweb_texts) -> Path:
    """Real FineWeb text as llm.c shards: a val shard and two train shards, with a manifest."""
    enc = gpt2_encoding(str(TOKENIZER_DIR))
    tokens: list[int] = []
    for text in fineweb_texts[:120]:
        tokens += [50256, *enc.encode_ordinary(text)]
    tokens = np.array(tokens, dtype=np.uint16)
    out = tmp_path_factory.mktemp("tokens")
    parts = [("val", tokens[:8192]), ("train", tokens[8192:20000]), ("train", tokens[20000:])]
    shards = []
    for i, (split, part) in enumerate(parts):
        name = f"embedded_{split}_{i:06d}.bin"
        write_shard(out / name, part)
        shards.append({"file": name, "split": split, "tokens": len(part), "sha256": f"fake{i}"})
    (out / "manifest.json").write_text(json.dumps({"dataset": "embedded", "shards": shards}))
    return out / "manifest.json"


def command(cfg: dict, manifest: Path, out: Path) -> list[str]:
    """One process: the pretraining worker directly; several: the launcher (torchrun)."""
    one = cfg["launch"]["procs_per_node"] == 1
    module = "lmpipe.train.pretrain" if one else "lmpipe.train"
    args = ["--config-json", json.dumps(cfg), "--data", str(manifest), "--out", str(out)]
    return [sys.executable, "-m", module, *args]


def run(cfg: dict, manifest: Path, out: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        command(cfg, manifest, out), env=env, capture_output=True, text=True, timeout=300
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def losses(out: Path) -> list[float]:
    return [m["loss"] for m in metrics(out) if "loss" in m]


def load_final(out: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint as convert reads it: one process, no process group."""
    meta = json.loads((out / "final" / "meta.json").read_text())
    model_cfg = {k: meta["model"][k] for k in GPTConfig.__dataclass_fields__}
    state = GPT(GPTConfig(**model_cfg)).state_dict()
    dcp.load({"model": state}, checkpoint_id=out / "final")
    return state


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, manifest) -> Path:
    """An uninterrupted 2-rank run, the reference for several tests."""
    out = tmp_path_factory.mktemp("two_ranks")
    run(config(2), manifest, out)
    return out


# ---- pure parts --------------------------------------------------------------------------------


def test_lr_warmup_cosine_floor():
    schedule = ScheduleConfig(warmup_steps=10, lr_floor=0.1)

    def lr(step: int, peak: float = 1.0) -> float:
        return lr_at(step, peak, schedule, max_steps=100)

    assert lr(0) == pytest.approx(0.1)  # (step + 1) / warmup, as llm.c
    assert lr(9) == pytest.approx(1.0)
    assert lr(10) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr(55) == pytest.approx(0.55)  # halfway: (1 + 0.1) / 2
    assert lr(100) == pytest.approx(0.1)  # the floor
    assert all(lr(s) >= lr(s + 1) for s in range(10, 100))
    assert lr(55, peak=3.0) == pytest.approx(1.65)  # a group's own peak, the same shape


def test_a_resume_drops_a_torn_last_metrics_line_and_names_a_broken_one(tmp_path, caplog):
    """SIGKILL mid-write tears metrics.jsonl's last line: the resume must not crash on it."""
    rows = [json.dumps({"step": s, "tokens": s, "loss": 1.0}) for s in range(4)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(rows) + '\n{"step": 4, "tok')
    Metrics(tmp_path, resume_step=2, enabled=True).close()
    assert path.read_text().splitlines() == rows[:3]
    assert "metrics.jsonl:5: dropping a torn last line" in caplog.text

    path.write_text("\n".join([rows[0], "{oops", *rows[1:]]) + "\n")  # not a kill's doing
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not valid JSON"):
        Metrics(tmp_path, resume_step=2, enabled=True)


def test_loader_ranks_split_each_step_and_resume_exactly(manifest):
    files = [
        manifest.parent / "embedded_train_000001.bin",
        manifest.parent / "embedded_train_000002.bin",
    ]

    def steps(loaders: list[ShardLoader], n: int) -> list[torch.Tensor]:
        """Each step's sequences, rank by rank, micro-batch by micro-batch (= the global batch)."""
        out = []
        for _ in range(n):
            micro = [[ld.next_batch()[0] for _ in range(ld.micro_steps)] for ld in loaders]
            # the global order: micro-step i of rank r is slice i * W + r
            out.append(
                torch.cat([micro[r][i] for i in range(len(micro[0])) for r in range(len(loaders))])
            )
        return out

    one = steps([ShardLoader(files, 4, 32, 256, DataShare(0, 1))], 60)  # crosses a shard boundary
    two = steps([ShardLoader(files, 4, 32, 256, DataShare(r, 2)) for r in range(2)], 60)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    assert not torch.equal(one[0], one[1])

    loader = ShardLoader(files, 4, 32, 256, DataShare(1, 2))
    steps([loader], 50)
    state = loader.state_dict()
    assert state["shard"] == 1  # past the first shard: the position names the shard
    after = steps([loader], 5)
    restored = ShardLoader(files, 4, 32, 256, DataShare(1, 2))
    restored.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(after, steps([restored], 5), strict=True))


# ---- real runs ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_process(two_ranks, manifest, tmp_path):
    """Same global batch, same trajectory; tolerance 1e-4 on losses (fp32 sums in another order)."""
    one = tmp_path / "one"
    run(config(1), manifest, one)
    assert len(losses(one)) == len(losses(two_ranks)) == 8
    np.testing.assert_allclose(losses(two_ranks), losses(one), rtol=0, atol=1e-4)
    val_one = [m["val_loss"] for m in metrics(one) if "val_loss" in m]
    val_two = [m["val_loss"] for m in metrics(two_ranks) if "val_loss" in m]
    np.testing.assert_allclose(val_two, val_one, rtol=0, atol=1e-4)
    # the loss moved, so the comparison is not between two untrained models
    assert losses(one)[-1] < losses(one)[0] - 0.1

    # each rank holds about half of the parameters (FSDP shards every parameter on dim 0)
    prov = json.loads((two_ranks / "provenance.json").read_text())
    assert prov["world_size"] == 2 and len(prov["params_per_rank"]) == 2
    for held in prov["params_per_rank"]:
        assert held == pytest.approx(prov["params"] / 2, rel=0.01)

    # the final checkpoint loads in one process, and the weights agree too
    a, b = load_final(one), load_final(two_ranks)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-4, rtol=1e-3, msg=name)
    meta = json.loads((two_ranks / "final" / "meta.json").read_text())
    assert {"run", "model", "train", "settings_hash", "step", "tokens", "world_size"} <= set(meta)
    assert (meta["step"], meta["tokens"], meta["world_size"]) == (8, 8 * 256, 2)


def test_chunked_loss_and_recompute_train_as_the_plain_run(two_ranks, manifest, tmp_path):
    """train.loss_chunk_tokens and train.activation_checkpointing reach the model: one process
    with the head in chunks of 50 positions and selective recompute follows the plain 2-rank
    run's trajectory (fp32 sums in another order: 1e-4)."""
    out = tmp_path / "chunked"
    run(config(1, loss_chunk_tokens=50, activation_checkpointing="selective"), manifest, out)
    assert len(losses(out)) == 8
    np.testing.assert_allclose(losses(out), losses(two_ranks), rtol=0, atol=1e-4)
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["loss_chunk_tokens"] == 50 and prov["recompute"] == ["selective"] * 2
    plain = json.loads((two_ranks / "provenance.json").read_text())
    assert plain["loss_chunk_tokens"] == 0 and plain["recompute"] == ["none"] * 2


@pytest.mark.slow
def test_sigkill_after_checkpoint_then_restart_is_bit_identical(two_ranks, manifest, tmp_path):
    out = tmp_path / "killed"
    cfg = config(2)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    kill_at_checkpoint(command(cfg, manifest, out), env, out, step=4)

    restart = run(cfg, manifest, out)
    assert "resumed from" in restart.stderr and "step_000004" in restart.stderr
    assert losses(out) == losses(two_ranks)  # exactly, including the steps before the kill
    assert [m["step"] for m in metrics(out)] == [m["step"] for m in metrics(two_ranks)]
    a, b = load_final(out), load_final(two_ranks)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # the report's view: one continuous curve, and attempt 1 recorded by its missing end line
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")["train"]] == list(range(1, 9))
    restarts = summarise(read_attempts(out / "attempts.jsonl"))
    killed, resumed = restarts.attempts
    assert killed.end is None and killed.start["resumed_step"] == 0
    assert resumed.start == resumed.start | {"resumed_step": 4, "checkpoint": "step_000004"}
    assert resumed.start["world_size"] == 2 and resumed.end["how"] == "finished"
    assert resumed.end["step"] == 8
    (restart,) = restarts.restarts
    assert (restart.cause, restart.resumed_step, restart.at_least) == ("killed", 4, True)
    assert restart.steps_redone == 0  # killed as its checkpoint appeared: nothing after it known


# Muon (lmpipe.train.muon): Newton-Schulz in float32 here, so the two runs differ only by the
# order of fp32 sums (bfloat16, the default, rounds those differences up to its own 2^-8)
MUON = {"name": "muon", "lr": 0.02, "adam_lr": 3e-3, "ns_dtype": "float32"}


@pytest.fixture(scope="module")
def two_ranks_muon(tmp_path_factory, manifest) -> Path:
    """An uninterrupted 2-rank run with muon, the reference of the muon tests."""
    out = tmp_path_factory.mktemp("two_ranks_muon")
    run(config(2, optimizer=MUON), manifest, out)
    return out


@pytest.mark.slow
def test_muon_on_two_fsdp_ranks_matches_one_process(two_ranks_muon, manifest, tmp_path):
    """With muon, 2 ranks (each matrix gathered, orthogonalised on one rank, scattered back)
    train the weights one process (every matrix a DTensor of one shard) does, within 1e-5 (Muon's
    matrices: ~1e-6). The tied embedding is AdamW's, within 1e-4 as in the AdamW test above: a
    few rows of rare tokens whose gradient is near 0 move by +-lr as sign(g / sqrt(v)) flips on
    the reduction order's last bits (2e-5 seen)."""
    one = tmp_path / "one"
    run(config(1, optimizer=MUON), manifest, one)
    np.testing.assert_allclose(losses(two_ranks_muon), losses(one), rtol=0, atol=1e-5)
    assert losses(one)[-1] < losses(one)[0] - 0.1  # it trains
    a, b = load_final(one), load_final(two_ranks_muon)
    assert a.keys() == b.keys()
    for name in a:
        atol = 1e-4 if name in ("transformer.wte.weight", "lm_head.weight") else 1e-5
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)
    meta = json.loads((two_ranks_muon / "final" / "meta.json").read_text())
    assert meta["train"]["optimizer"]["name"] == "muon" and meta["world_size"] == 2


@pytest.mark.slow
def test_muon_sigkill_after_checkpoint_then_restart_is_bit_identical(
    two_ranks_muon, manifest, tmp_path
):
    """The momentum buffers are in the checkpoint (sharded, DCP): a run killed at step 4 and
    resumed ends with the uninterrupted run's losses and weights, bit for bit."""
    out = tmp_path / "killed"
    cfg = config(2, optimizer=MUON)
    kill_at_checkpoint(command(cfg, manifest, out), dict(os.environ, OMP_NUM_THREADS="1"), out, 4)
    saved = checkpoint_tensors(out / "checkpoints" / "step_000004")
    momentum = [k for k in saved if k.endswith(".momentum_buffer")]
    assert len(momentum) == 4 * MODEL["n_layer"], sorted(saved)
    assert all(saved[k].abs().sum() > 0 for k in momentum)

    restart = run(cfg, manifest, out)
    assert "resumed from" in restart.stderr and "step_000004" in restart.stderr
    assert losses(out) == losses(two_ranks_muon)
    a, b = load_final(out), load_final(two_ranks_muon)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """A DCP checkpoint's tensors by their flat key (`optim.state.<param>.<state>`), in one
    process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    copy = folder.parent.parent / f"{folder.name}.pt"
    dcp_to_torch_save(folder, copy)
    flat, todo = {}, [("", torch.load(copy, weights_only=False))]
    while todo:
        prefix, d = todo.pop()
        for key, value in d.items():
            if isinstance(value, dict):
                todo.append((f"{prefix}{key}.", value))
            elif isinstance(value, torch.Tensor):
                flat[f"{prefix}{key}"] = value
    return flat


@pytest.fixture(scope="module")
def mixture_manifest(tmp_path_factory, manifest) -> Path:
    """A mixture (lmpipe.data.mixture): the FineWeb shards at 0.7 and Tiny Shakespeare's at 0.3
    (a val shard and one train shard of 400 tokens: about 4 steps of its rows, so it wraps)."""
    enc = gpt2_encoding(str(TOKENIZER_DIR))
    text = (REPO / "resources" / "tinyshakespeare_20k.txt").read_text()
    tokens = np.array([50256, *enc.encode_ordinary(text)], dtype=np.uint16)
    out = tmp_path_factory.mktemp("mixture")
    (out / "books").mkdir()
    shards = []
    for i, (split, part) in enumerate([("val", tokens[:1024]), ("train", tokens[1024:1424])]):
        write_shard(out / "books" / f"{split}_{i}.bin", part)
        shards.append({"file": f"{split}_{i}.bin", "split": split, "tokens": len(part)})
    (out / "books" / "manifest.json").write_text(json.dumps({"dataset": "books", "shards": shards}))
    mix = out / "mix" / "manifest.json"
    mix.parent.mkdir()
    write_mixture(mix, "mix", {"embedded": 0.7, "books": 0.3},
                  {"embedded": manifest, "books": out / "books" / "manifest.json"})  # fmt: skip
    return mix


@pytest.mark.slow
def test_a_mixture_resumes_bit_for_bit_after_sigkill_and_logs_its_sources(
    mixture_manifest, tmp_path
):
    """2 ranks on the mixture, SIGKILLed as checkpoint 4 appears, restarted: the same losses and
    weights as an uninterrupted run, and each train line's tokens by source at 0.7 / 0.3 of the
    rows (8 rows a step: 6 and 2, then 5 and 3, ...)."""
    cfg = config(2, max_steps=12) | {"dataset": "mix"}
    whole = tmp_path / "whole"
    log = run(cfg, mixture_manifest, whole).stderr
    killed = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    kill_at_checkpoint(command(cfg, mixture_manifest, killed), env, killed, step=4)
    restart = run(cfg, mixture_manifest, killed)
    assert "step_000004" in restart.stderr
    assert losses(killed) == losses(whole)
    a, b = load_final(killed), load_final(whole)
    assert all(torch.equal(a[name], b[name]) for name in a)
    lines = [m for m in metrics(whole) if "loss" in m]
    for m in lines:
        rows = {k: v // 32 for k, v in m["tokens_by_source"].items()}
        assert sum(rows.values()) == 8 * m["step"]
        assert abs(rows["embedded"] - 0.7 * 8 * m["step"]) <= 1, m
    assert [m["tokens_by_source"] for m in metrics(killed) if "loss" in m] == [
        m["tokens_by_source"] for m in lines
    ]
    # the books' 400 train tokens wrap: each new epoch logged, and counted in the metrics
    assert "source books: epoch 3 begins" in log
    assert lines[-1]["epochs_by_source"]["books"] == pytest.approx(
        lines[-1]["tokens_by_source"]["books"] / 400
    )


@pytest.mark.slow
def test_sigusr1_checkpoints_exits_nonzero_and_resumes(manifest, tmp_path):
    out = tmp_path / "signalled"
    cfg = config(2, max_steps=24, checkpoint_every=0, val_every=0)  # no periodic checkpoints
    env = dict(os.environ, OMP_NUM_THREADS="1", SLURM_JOB_ID="50")  # through torchrun to rank 0
    proc = subprocess.Popen(
        command(cfg, manifest, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 240
    while not (out / "metrics.jsonl").exists() or len(losses(out)) < 2:
        assert proc.poll() is None and time.time() < deadline, "the run did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)  # to the launcher, as SLURM would
    log, _ = proc.communicate(timeout=120)
    log = log.decode()
    assert proc.returncode != 0, log
    saved = sorted((out / "checkpoints").glob("step_*"))
    assert len(saved) == 1, log
    step = int(saved[0].name.split("_")[1])
    assert 2 <= step < 24 and not (out / "final").exists()

    # the same settings: the restart resumes and finishes
    env["SLURM_JOB_ID"] = "53"  # a retry is another job
    restart = subprocess.run(
        command(cfg, manifest, out), env=env, capture_output=True, text=True, timeout=600
    )
    assert restart.returncode == 0, restart.stderr
    assert f"resumed from {saved[0]}" in restart.stderr
    assert [m["step"] for m in metrics(out) if "loss" in m] == list(range(1, 25))
    restarts = summarise(read_attempts(out / "attempts.jsonl"))
    (r,) = restarts.restarts  # the launcher passes the signal on as SIGUSR1
    assert (r.cause, r.why, r.reached, r.resumed_step) == ("signal", "SIGUSR1", step, step)
    assert r.steps_redone == 0 and not r.at_least and 0 < r.lost_s < 600
    assert restarts.job_ids == ["50", "53"] and restarts.last == "finished"


@pytest.mark.slow
def test_changed_settings_start_fresh_and_logging_settings_resume(manifest, tmp_path):
    out = tmp_path / "run"
    run(config(1, max_steps=4), manifest, out)
    first = json.loads((out / "final" / "meta.json").read_text())["settings_hash"]

    # val/checkpoint intervals do not shape the trajectory: the checkpoint of step 4 is resumed
    same = run(config(1, max_steps=4, val_every=2), manifest, out)
    assert "resumed from" in same.stderr

    changed = run(config(1, max_steps=4, lr=1e-3), manifest, out)
    assert "resumed from" not in changed.stderr
    assert "belongs to other settings" in changed.stderr and "starting fresh" in changed.stderr
    assert (out / "checkpoints" / "other-settings" / first / "step_000004").is_dir()  # kept
    assert metrics(out)[0]["step"] == 0  # one trajectory in metrics.jsonl, the new one
    assert [m["step"] for m in metrics(out) if "loss" in m] == [1, 2, 3, 4]
    meta = json.loads((out / "final" / "meta.json").read_text())
    assert meta["settings_hash"] != first and meta["train"]["optimizer"]["lr"] == 1e-3


@pytest.mark.slow
def test_loss_falls_on_real_text(manifest, tmp_path):
    out = tmp_path / "run"
    run(config(1, max_steps=30, warmup_steps=3, val_every=30, checkpoint_every=0), manifest, out)
    val = [m["val_loss"] for m in metrics(out) if "val_loss" in m]
    assert len(val) == 2 and val[0] == pytest.approx(np.log(50257), abs=0.3)  # uniform at start
    assert val[-1] < val[0] - 0.7, val  # from uniform toward unigram statistics and beyond
    rows = metrics(out)
    assert {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "wall_s"} <= set(
        rows[1]
    )
    # MFU is llm.c's FLOPs a token x tokens/s over the device's peak (1e12, nominal, on a CPU)
    model = GPT(GPTConfig(**MODEL))
    for row in rows[1:]:
        if "mfu" in row:
            implied = row["mfu"] * 1e12 / row["tokens_per_s"]
            assert implied == pytest.approx(model.flops_per_token(TRAIN["seq_len"]), rel=1e-6)
    assert list((out / "tb").glob("events.out.tfevents.*"))


def test_nan_loss_stops_with_a_clear_error(manifest, tmp_path):
    out = tmp_path / "run"
    # an absurd learning rate blows the weights up after the first step: the loss becomes NaN
    cfg = config(1, max_steps=6, lr=1e30, warmup_steps=0, grad_clip=0.0, checkpoint_every=1)
    proc = run(cfg, manifest, out, check=False)
    assert proc.returncode != 0
    assert "NonFiniteLossError" in proc.stderr
    assert "step 2: the training loss is nan" in proc.stderr
    assert "last good checkpoint is" in proc.stderr and "step_000001" in proc.stderr
    assert (out / "checkpoints" / "step_000001").is_dir()  # kept
    start, saved, end = read_attempts(out / "attempts.jsonl")  # the record says how it ended
    assert (start["event"], saved["event"], saved["step"]) == ("start", "checkpoint", 1)
    assert end == end | {"event": "end", "step": 1, "how": "error"}  # the last step completed
    assert end["error"].startswith("NonFiniteLossError: step 2: the training loss is nan")
    assert not (out / "checkpoints" / "step_000002").exists()
    assert not (out / "final").exists()


# ---- MFU's peak and the compile pre-flight -------------------------------------------------------


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("a100", 312e12),  # a SLURM GRES type
        ("NVIDIA A10G", 70e12),
        ("NVIDIA A10", 125e12),
        ("Some Future GPU", None),
    ],
)
def test_gpu_peaks_by_name(name, peak):
    from lmpipe.hardware import gpu_peak_flops

    assert gpu_peak_flops(name) == peak


def job_of(cfg: dict):
    from lmpipe.config import TrainJob

    return TrainJob.from_json(json.dumps(cfg))


def test_mfu_peak_is_the_gpu_found_unless_set(monkeypatch):
    from lmpipe.train.loop import peak_flops

    cpu = config(1)
    assert peak_flops(job_of(cpu), torch.device("cpu")) == 1e12  # nominal
    cuda = config(1)
    cuda["launch"] |= {"device": "cuda", "peak_flops": None}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert peak_flops(job_of(cuda), torch.device("cuda", 0)) == 989e12  # not the A100's 312e12
    cuda["launch"]["peak_flops"] = 5e14  # the setting overrides
    assert peak_flops(job_of(cuda), torch.device("cuda", 0)) == 5e14
    cuda["launch"]["peak_flops"] = None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery X1")
    with pytest.raises(ValueError, match="launch.peak_flops: no known peak for GPU 'Mystery X1'"):
        peak_flops(job_of(cuda), torch.device("cuda", 0))


def test_compile_on_a_gpu_without_a_c_compiler_stops_before_training(monkeypatch, tmp_path):
    from lmpipe.train.loop import check_compiler

    cfg = config(1, compile=True)
    cfg["launch"]["device"] = "cuda"
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no cc, gcc or clang
    with pytest.raises(RuntimeError, match="no C compiler is on PATH"):
        check_compiler(job_of(cfg))
    check_compiler(job_of(config(1, compile=True)))  # the CPU: no Triton, nothing to check
    (tmp_path / "gcc").write_text("#!/bin/sh\n")
    (tmp_path / "gcc").chmod(0o755)
    check_compiler(job_of(cfg))  # one compiler is enough


@pytest.mark.slow
def test_fresh_start_moves_the_checkpoints_aside_and_trains_from_step_0(manifest, tmp_path):
    """`LMPIPE_FRESH_START=1` (what the README gives with --forcerun): the same settings, but
    from scratch; the old checkpoints kept under checkpoints/retired/, none resumed."""
    out = tmp_path / "run"
    cfg = config(2, max_steps=4)
    run(cfg, manifest, out)
    before = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    assert before == ["step_000004"]
    again = run(cfg, manifest, out)  # without the flag: resumes (and has nothing left to do)
    assert "resumed from" in again.stderr
    env = dict(os.environ, OMP_NUM_THREADS="1", LMPIPE_FRESH_START="1")
    fresh = subprocess.run(
        command(cfg, manifest, out), env=env, capture_output=True, text=True, timeout=300
    )
    assert fresh.returncode == 0, fresh.stderr
    assert "resumed from" not in fresh.stderr and "fresh start: moved 1 checkpoint" in fresh.stderr
    (retired,) = (out / "checkpoints" / "retired").iterdir()
    assert sorted(p.name for p in retired.iterdir()) == before
    assert [m["step"] for m in metrics(out) if "loss" in m] == [1, 2, 3, 4]  # all trained again
    restarts = summarise(read_attempts(out / "attempts.jsonl"))  # a new history, the old kept
    assert restarts.earlier == 2 and len(restarts.attempts) == 1 and restarts.clean
    assert restarts.attempts[0].start["fresh_start"] and restarts.last == "finished"


@pytest.mark.slow
def test_wandb_offline_logs_the_losses_in_the_run_folder_and_no_secret(manifest, tmp_path):
    """logging.wandb on, W&B offline, an API key and an HF token in the environment: the
    offline run holds metrics.jsonl's losses, its files are under train/wandb/ (none in the home
    or the working directory), and neither secret is in any file of the run (provenance.json
    included) nor in the log. (The launcher passing --wandb on: tests/test_wandb.py.)"""
    secret = "lmpipe-test-secret-8d2f41"
    out, home, cwd = tmp_path / "train", tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    cfg = config(1, max_steps=4, val_every=2, checkpoint_every=2)
    wandb = {"project": "lmpipe-test", "group": "g", "mode": "offline"}
    cmd = command(cfg, manifest, out) + ["--wandb", json.dumps(wandb)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HOME=str(home))
    env |= {"WANDB_MODE": "offline", "WANDB_API_KEY": secret, "HF_TOKEN": secret}
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = wandb_history(out)
    assert [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r] == [
        (m["step"], m["loss"]) for m in metrics(out) if "loss" in m
    ]
    assert [r["step"] for r in rows if "val/val_loss" in r] == [0, 2, 4]
    assert len(list((out / "wandb" / "wandb").glob("offline-run-*"))) == 1
    assert not list(home.iterdir()) and not list(cwd.iterdir())
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert out / "provenance.json" in files
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in proc.stdout + proc.stderr


# ---- FP8 (lmpipe.train.fp8): torchao's float8 in emulation on the CPU ------------------------
# Two FSDP2 ranks on gloo with the float8 all-gather (torchao's FSDP hooks run on the CPU too).
# Tolerance: over these 8 steps the FP8 run's losses were at most 3.8e-4 from the fp32 run's
# (losses near 10.5); e4m3 rounds each GEMM input by up to 2^-4 relative, and the sums average
# that down. 5e-3 (5e-4 relative) leaves room for another BLAS's order of sums, not for a lost
# FP8 conversion's absence to go unseen (the test also asks the losses to differ).
FP8_LOSS_TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def two_ranks_fp8(tmp_path_factory, manifest) -> Path:
    """An uninterrupted 2-rank FP8 run (emulated), the reference of the FP8 tests."""
    out = tmp_path_factory.mktemp("two_ranks_fp8")
    proc = run(config(2, fp8=True), manifest, out)
    assert "torchao's float8 emulation" in proc.stdout + proc.stderr
    return out


@pytest.mark.slow
def test_fp8_emulation_trains_as_fp32_within_tolerance(two_ranks_fp8, two_ranks):
    prov = json.loads((two_ranks_fp8 / "provenance.json").read_text())
    # the 4 linears of each block converted (n_embd 32: every dim a multiple of 16), not the head
    assert prov["fp8_linears"] == 4 * MODEL["n_layer"] and prov["fp8_emulated"]
    fp8, fp32 = losses(two_ranks_fp8), losses(two_ranks)
    assert len(fp8) == len(fp32) == TRAIN["max_steps"]
    assert fp8 != fp32  # FP8 really ran: the casts change the losses
    assert max(abs(a - b) for a, b in zip(fp8, fp32, strict=True)) < FP8_LOSS_TOLERANCE
    assert fp8[-1] < fp8[0]


@pytest.mark.slow
def test_fp8_sigkill_after_checkpoint_then_restart_is_bit_identical(
    two_ranks_fp8, manifest, tmp_path
):
    out = tmp_path / "killed"
    cfg = config(2, fp8=True)
    kill_at_checkpoint(command(cfg, manifest, out), dict(os.environ, OMP_NUM_THREADS="1"), out, 4)
    restart = run(cfg, manifest, out)
    assert "resumed from" in restart.stderr and "step_000004" in restart.stderr
    assert losses(out) == losses(two_ranks_fp8)
    a, b = load_final(out), load_final(two_ranks_fp8)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_fp8_is_refused_in_one_line_where_it_cannot_run(monkeypatch):
    from lmpipe.train import fp8
    from lmpipe.train.loop import check_fp8

    check_fp8(job_of(config(1)))  # fp8 off: nothing to check
    with pytest.raises(RuntimeError, match=r"^runs.test: train.fp8 on the CPU .* set compile"):
        check_fp8(job_of(config(1, fp8=True, compile=True)))
    cuda = config(1, fp8=True)
    cuda["launch"]["device"] = "cuda"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(RuntimeError) as refused:
        check_fp8(job_of(cuda))
    line = str(refused.value)
    assert "\n" not in line and "A100" in line and "8.0" in line and "8.9" in line
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8(job_of(cuda))  # H100/H200: FP8 GEMMs
    assert not fp8.emulated(torch.device("cuda"))
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="torchao is not installed"):
        check_fp8(job_of(cuda))


def test_cuda_graphs_are_refused_in_one_line_off_cuda():
    """train.compile_mode with CUDA graphs stops a CPU job before the model is built (the config
    check refuses it before any job too: tests/test_config_errors.py)."""
    from lmpipe.train.loop import check_compile

    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(RuntimeError) as refused:
            check_compile(job_of(config(1, compile=True, compile_mode=mode)))
        line = str(refused.value)
        assert "\n" not in line
        assert line.startswith(f"runs.test: train.compile_mode '{mode}' captures CUDA graphs")
    for mode in ("default", "max-autotune-no-cudagraphs"):
        check_compile(job_of(config(1, compile=True, compile_mode=mode)))
    cuda = config(1, compile=True, compile_mode="reduce-overhead")
    cuda["launch"]["device"] = "cuda"
    check_compile(job_of(cuda))

"""Muon (lmpipe.train.muon): its update against torch.optim.Muon's and AdamW's, its groups, each
group's peak under the schedule, the config's refusals, and the Newton-Schulz step spread over
3 gloo ranks (uneven shards) against the whole matrices of one process. The runs of the real
trainer with muon (2 ranks against 1, a kill and resume) are in tests/test_train.py."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from test_optim import tiny_data, train_in_process, train_job
from torch.optim._muon import _zeropower_via_newtonschulz

from conftest import CONFIG_FILE
from lmpipe import config as lmconfig
from lmpipe import schema
from lmpipe.config import ModelConfig
from lmpipe.models import build_model
from lmpipe.registry import ARCHITECTURES, MuonSettings
from lmpipe.train import loop
from lmpipe.train import muon as muon_module
from lmpipe.train.muon import NS_COEFFICIENTS, Muon, newton_schulz
from lmpipe.train.optim import build_optimizer, lr_at

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}
PER_LAYER = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]


def settings(**kw) -> MuonSettings:
    return MuonSettings(name="muon", lr=kw.pop("lr", 0.02), **kw)


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(**SHAPE, vocab_size=256, padded_vocab_size=256))


# ---- the update: torch's Muon and AdamW ---------------------------------------------------------


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (24, 24)], ids=["tall", "wide", "square"])
def test_newton_schulz_in_bfloat16_is_torchs(shape):
    """In bfloat16 it is torch.optim.Muon's own iteration, bit for bit (and near-orthogonal)."""
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    ours = newton_schulz(g, 5, torch.bfloat16)
    assert torch.equal(ours, _zeropower_via_newtonschulz(g, NS_COEFFICIENTS, 5, 1e-7))
    small = min(shape)
    sv = torch.linalg.svdvals(newton_schulz(g, 5, torch.float32))
    assert sv.shape == (small,) and 0.6 < sv.min() and sv.max() < 1.25  # Keller's ~U(0.5, 1.5)


def record_zeropower(G: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """The record's zeropower_via_newtonschulz5 (records/010425_SoftCap/*.txt), as written
    there, but in `dtype` (the record's X = G.bfloat16())."""
    assert len(G.shape) == 2
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.to(dtype)
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


@pytest.mark.parametrize("scale", [1.0, 1e-7, 0.0], ids=["plain", "nearly-zero", "zero"])
def test_newton_schulz_is_normalised_as_the_records(scale):
    """X / (||X|| + 1e-7), the record's: before any iteration a gradient of norm 1e-7 is halved
    (torch's clamp at 1e-7 would leave its norm 1), a zero one stays zero; after 5 iterations
    each is the record's (float32, to float tolerance: the record's b A + c A A is one addmm
    here)."""
    g = torch.randn(24, 16, generator=torch.Generator().manual_seed(3))
    g = g / g.norm() * scale
    for steps in (0, 5):
        ours, record = (
            newton_schulz(g, steps, torch.float32),
            record_zeropower(g, steps, torch.float32),
        )
        torch.testing.assert_close(ours, record, rtol=1e-5, atol=1e-6, msg=f"{steps} steps")
    assert newton_schulz(g, 0, torch.float32).norm().item() == pytest.approx(
        {1.0: 1.0, 1e-7: 0.5, 0.0: 0.0}[scale], rel=1e-5
    )


def test_a_muon_step_is_torch_muons_bit_for_bit():
    """Three steps on a tall and a wide matrix: torch.optim.Muon (same lr, decay, momentum,
    nesterov, bfloat16 Newton-Schulz, its default lr scale) lands on the same weights."""
    gen = torch.Generator().manual_seed(2)
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(12, 4), (4, 12)]]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    s = settings(lr=0.05, weight_decay=0.1)
    opt = Muon([{"kind": "muon", "params": ours, "lr": s.lr, "weight_decay": s.weight_decay}], s)
    ref = torch.optim.Muon(theirs, lr=0.05, weight_decay=0.1, momentum=0.95, nesterov=True)
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
        assert opt.state[a]["momentum_buffer"].shape == a.shape


def record_muon_steps(p0: torch.Tensor, grads: list[torch.Tensor], lr: float) -> torch.Tensor:
    """modded-nanogpt's record of 2025-01-04 (records/010425_SoftCap/*.txt), its Muon and its
    training loop's momentum warmup, written out here (float32 Newton-Schulz, its `X.norm() +
    1e-7`): `frac = min(step / 300, 1)`, `momentum = (1 - frac) * 0.85 + frac * 0.95` before each
    step `step` (0, 1, ...); `buf.lerp_(g, 1 - momentum)`; `g = g.lerp_(buf, momentum)`; the
    update times `-lr * max(1, rows / cols) ** 0.5`. Here over 4 steps instead of 300."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    p, buf = p0.clone(), torch.zeros_like(p0)
    for step, g in enumerate(grads):
        frac = min(step / 4, 1)
        momentum = (1 - frac) * 0.85 + frac * 0.95
        buf.lerp_(g, 1 - momentum)
        g = g.clone().lerp_(buf, momentum)
        x = g.T if g.size(0) > g.size(1) else g
        x = x / (x.norm() + 1e-7)
        for _ in range(5):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        x = x.T if g.size(0) > g.size(1) else x
        p.add_(x, alpha=-lr * max(1, p.size(0) / p.size(1)) ** 0.5)
    return p


def test_the_momentum_warmup_is_the_records():
    """momentum_warmup_steps 4 from 0.85 to 0.95: six steps land where the record's loop does
    (0.85, 0.875, 0.9, 0.925, then 0.95); without the warmup, they do not."""
    gen = torch.Generator().manual_seed(5)
    p0 = torch.randn(12, 4, generator=gen)
    grads = [torch.randn(12, 4, generator=gen) for _ in range(6)]
    expected = record_muon_steps(p0, grads, lr=0.05)
    for warmup, equal in ((4, True), (0, False)):
        s = settings(lr=0.05, ns_dtype="float32", momentum_warmup_steps=warmup)
        p = torch.nn.Parameter(p0.clone())
        opt = Muon([{"kind": "muon", "params": [p], "lr": 0.05, "weight_decay": 0.0}], s)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        close = torch.allclose(p.detach(), expected, rtol=0, atol=1e-5)
        assert close == equal, (warmup, (p.detach() - expected).abs().max())
    assert int(opt.state[p].get("step", -1)) == -1  # no warmup: torch.optim.Muon's state only


def test_separate_qkv_orthogonalises_each_projection_alone():
    """qkv separate (the record's c_q, c_k, c_v): one Muon step moves each of the three as the
    record's Muon moves that matrix alone (record_muon_steps, one step at momentum 0.85); the
    fused c_attn, orthogonalised as one 3C x C matrix, does not land there."""
    gen = torch.Generator().manual_seed(7)
    w0, grad = torch.randn(96, 32, generator=gen), torch.randn(96, 32, generator=gen)
    shape = SHAPE | {"vocab_size": 256, "padded_vocab_size": 256}
    s = settings(lr=0.05, momentum=0.85, weight_decay=0.0, ns_dtype="float32")
    moved = {}
    for qkv in ("separate", "fused"):
        model = build_model(lmconfig.model_class("modern")(**shape, qkv=qkv))
        attn = model.transformer.h[0].attn
        parts = (attn.c_q, attn.c_k, attn.c_v) if qkv == "separate" else (attn.c_attn,)
        rows = 96 // len(parts)
        opt = build_optimizer(model, s)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with torch.no_grad():
            for i, lin in enumerate(parts):
                lin.weight.copy_(w0[rows * i : rows * (i + 1)])
                lin.weight.grad = grad[rows * i : rows * (i + 1)].clone()
        opt.step()
        moved[qkv] = torch.cat([lin.weight.detach() for lin in parts])
    expected = torch.cat(
        [record_muon_steps(w0[32 * i : 32 * (i + 1)], [grad[32 * i : 32 * (i + 1)]], lr=0.05)
         for i in range(3)]
    )  # fmt: skip
    torch.testing.assert_close(moved["separate"], expected, rtol=0, atol=1e-5)
    assert (moved["fused"] - expected).abs().max() > 1e-2


def test_the_scalars_at_their_own_lr_as_the_records():
    """The record's `dict(params=scalar_params, lr=0.04)` (scalar_params: its parameters of
    ndim < 2): with scalar_lr, the U-net's skip weights (1-D) in AdamW's undecayed group at it;
    without, at adam_lr."""
    shape = SHAPE | {"n_layer": 4, "vocab_size": 256, "padded_vocab_size": 256}
    model = build_model(lmconfig.model_class("modern")(**shape, unet_skips=True))
    for scalar_lr, lr in ((0.04, 0.04), (None, 0.008)):
        opt = build_optimizer(model, settings(adam_lr=0.008, scalar_lr=scalar_lr))
        (group,) = [
            g for g in opt.param_groups if any(p is model.skip_weights for p in g["params"])
        ]
        assert (group["kind"], group["lr"], group["weight_decay"]) == ("adamw", lr, 0.0)


def test_the_value_embeddings_at_the_embeddings_lr_as_the_records():
    """The record's `embed_params = [model.embed.weight, *model.value_embeds.parameters()]` at
    lr 0.6: with embed_lr, the value embeddings in the token embedding's group; the value and
    embedding mixes (1-D) at scalar_lr; Muon's matrices unchanged."""
    shape = SHAPE | {"n_layer": 4, "vocab_size": 256, "padded_vocab_size": 256}
    model = build_model(
        lmconfig.model_class("modern")(**shape, value_embeddings=2, embedding_mix=True)
    )
    opt = build_optimizer(model, settings(adam_lr=0.008, embed_lr=0.6, scalar_lr=0.04))
    names = {id(p): n for n, p in model.named_parameters()}
    got = {(g["kind"], g["lr"]): {names[id(p)] for p in g["params"]} for g in opt.param_groups}
    assert got[("adamw", 0.6)] == {"transformer.wte.weight", "value_embeds.0.weight",
                                   "value_embeds.1.weight"}  # fmt: skip
    lambdas = {f"transformer.h.{i}.{m}lambdas" for i in range(4) for m in ("", "attn.")}
    assert got[("adamw", 0.04)] == lambdas
    assert len(got[("muon", 0.02)]) == 4 * 4


def test_the_momentum_warmup_resumes_where_it_was():
    """The step count is in the optimizer's state: a new optimizer loaded from it after 2 steps
    continues the ramp (its state dict is what the checkpoint keeps)."""
    gen = torch.Generator().manual_seed(6)
    p0 = torch.randn(4, 12, generator=gen)
    grads = [torch.randn(4, 12, generator=gen) for _ in range(5)]
    s = settings(lr=0.05, ns_dtype="float32", momentum_warmup_steps=4)

    def fresh(weights):
        p = torch.nn.Parameter(weights.clone())
        return p, Muon([{"kind": "muon", "params": [p], "lr": 0.05, "weight_decay": 0.0}], s)

    p, opt = fresh(p0)
    for g in grads[:2]:
        p.grad = g.clone()
        opt.step()
    q, resumed = fresh(p.detach())
    resumed.load_state_dict(opt.state_dict())
    for g in grads[2:]:
        q.grad = g.clone()
        resumed.step()
    expected = record_muon_steps(p0, grads, lr=0.05)
    torch.testing.assert_close(q.detach(), expected, rtol=0, atol=1e-5)


def test_the_adamw_groups_step_as_torch_adamw():
    """The non-Muon groups are AdamW: three steps equal torch.optim.AdamW's, decay included."""
    gen = torch.Generator().manual_seed(3)
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(6, 4), (4,)]]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    s = settings(adam_lr=1e-2, adam_weight_decay=0.1, adam_betas=(0.8, 0.9), adam_eps=1e-6)
    opt = Muon([{"kind": "adamw", "params": ours, "lr": 1e-2, "weight_decay": 0.1}], s)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6)
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
        assert set(opt.state[a]) == set(ref.state[b]) == {"step", "exp_avg", "exp_avg_sq"}


# ---- the groups ---------------------------------------------------------------------------------


def test_muon_gets_the_blocks_matrices_and_adamw_the_rest(gpt2):
    """Muon: the blocks' attention and MLP weight matrices only; AdamW: wte (= the tied LM head)
    and wpe decayed at adam_weight_decay, gains and biases not; each group its own peak lr."""
    s = settings(lr=0.03, weight_decay=0.01, adam_lr=2e-3, adam_weight_decay=0.05)
    opt = build_optimizer(gpt2, s)
    names = {id(p): n for n, p in gpt2.named_parameters()}
    got = [(g["kind"], g["lr"], g["weight_decay"], {names[id(p)] for p in g["params"]})
           for g in opt.param_groups]  # fmt: skip
    matrices = {f"transformer.h.{i}.{n}" for i in range(2) for n in PER_LAYER}
    embeddings = {"transformer.wte.weight", "transformer.wpe.weight"}
    gains = set(names.values()) - matrices - embeddings
    assert got == [
        ("muon", 0.03, 0.01, matrices),
        ("adamw", 2e-3, 0.05, embeddings),
        ("adamw", 2e-3, 0.0, gains),
    ]
    assert all(n.endswith(".bias") or ".ln_" in n for n in gains), gains
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight  # the head is wte: AdamW's
    assert sum(len(g["params"]) for g in opt.param_groups) == len(names)


@pytest.mark.parametrize(
    "arch, extra, per_layer",
    [(a, {}, 4) for a in ARCHITECTURES if a != "hf"] + [("modern", {"qkv": "separate"}, 6)],
    ids=[a for a in ARCHITECTURES if a != "hf"] + ["modern-separate-qkv"],  # hf: its own shape
)
def test_the_registry_counts_the_models_muon_matrices(arch, extra, per_layer):
    """ARCHITECTURES' hidden_matrices (what the config check refuses muon on) counts the 2-D
    weights of the model's blocks, for 1 to 3 layers, for every architecture."""
    count = ARCHITECTURES[arch].hidden_matrices
    for n_layer in (1, 2, 3):
        shape = SHAPE | {"n_layer": n_layer, "vocab_size": 256, "padded_vocab_size": 256}
        m = build_model(lmconfig.model_class(arch)(**shape, **extra))
        held = [p for b in m.blocks() for p in b.parameters() if p.dim() == 2]
        assert count(m.config) == len(held) == per_layer * n_layer


def test_a_model_without_block_matrices_is_refused_by_the_job():
    """The job's own check (architectures that cannot count before the job): a model whose
    blocks hold no 2-D weights gets a one-line error naming the key."""

    class NoBlocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = torch.nn.Embedding(8, 4)

        def blocks(self) -> list[torch.nn.Module]:
            return []

    with pytest.raises(ValueError, match=r"^train\.optimizer\.name: muon .* has none") as e:
        build_optimizer(NoBlocks(), settings())
    assert "\n" not in str(e.value)


def test_each_groups_peak_follows_the_schedule(tmp_path):
    """The loop (1 rank, FSDP, 4 steps, warmup 2, floor 0.1) sets each group's lr to lr_at of
    its own peak at every step: Muon's 0.02, AdamW's 4e-3."""
    job = train_job(optimizer={"name": "muon", "lr": 0.02, "adam_lr": 4e-3})
    seen = []

    def recording(model, s):
        opt = build_optimizer(model, s)
        step = opt.step

        def recorded(*args, **kwargs):
            seen.append([g["lr"] for g in opt.param_groups])
            return step(*args, **kwargs)

        opt.step = recorded
        return opt

    with pytest.MonkeyPatch.context() as m:
        m.setattr(loop, "build_optimizer", recording)
        train_in_process(job, tiny_data(tmp_path), tmp_path / "train")
    tc = job.train
    peaks = [0.02, 4e-3, 4e-3]
    expected = [[lr_at(i, p, tc.schedule, tc.max_steps) for p in peaks] for i in range(4)]
    assert len(seen) == 4
    for got, want in zip(seen, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-12)
    assert seen[0] == pytest.approx([0.01, 2e-3, 2e-3])  # the schedule's shape, each its peak
    rows = [json.loads(r) for r in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if "loss" in r] == [e[0] for e in expected]  # Muon's is logged


# ---- the config's refusals, before any job ------------------------------------------------------

SHIPPED = yaml.safe_load(CONFIG_FILE.read_text())


def muon_run(**optimizer) -> dict:
    """The shipped config with run embedded-b on muon."""
    cfg = copy.deepcopy(SHIPPED)
    cfg["runs"]["embedded-b"]["train"]["optimizer"] = {"name": "muon", "lr": 0.02} | optimizer
    return cfg


def test_a_muon_run_passes_with_its_defaults_filled_in():
    cfg = muon_run()
    schema.validate(cfg)
    opt = lmconfig.run_config(cfg, "embedded-b").train.optimizer
    assert opt == settings()
    assert (opt.momentum, opt.nesterov, opt.ns_steps, opt.adam_lr) == (0.95, True, 5, 3.6e-3)


def test_an_unknown_muon_setting_is_refused_naming_it():
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(muon_run(ns_step=6))
    text = str(e.value)
    assert text.startswith(
        "runs.embedded-b.train.optimizer: unknown key 'ns_step' (did you mean 'ns_steps'?)"
    ), text
    assert "\n" not in text


def test_muon_on_a_model_without_block_matrices_is_refused_before_any_job(monkeypatch):
    """An architecture whose models have no 2-D weights in their blocks (GPT-2 always has 4 a
    layer, and n_layer >= 1: such a one stands in for it): the config check names the key."""
    none = dataclasses.replace(ARCHITECTURES["gpt2"], hidden_matrices=lambda m: 0)
    monkeypatch.setitem(ARCHITECTURES, "gpt2", none)
    schema.validate(copy.deepcopy(SHIPPED))  # adamw runs on it are fine
    with pytest.raises(lmconfig.ConfigError) as e:
        schema.validate(muon_run())
    assert str(e.value) == (
        "runs.embedded-b.train.optimizer.name: muon orthogonalises the 2-D weights of the"
        " model's blocks, and model 'tiny' (gpt2) has none: use adamw"
    )


# ---- the Newton-Schulz step over ranks ----------------------------------------------------------

RANKS, STEPS = 3, 2
# n_embd 20 splits unevenly over 3 ranks: attn.c_proj's 20 rows as 7 + 7 + 6, c_fc's 80 as
# 27 + 27 + 26 (c_attn's 60: 20 each)
SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 20, "block_size": 16, "vocab_size": 64,
         "padded_vocab_size": 64}  # fmt: skip
SETTINGS = {"lr": 0.05, "weight_decay": 0.1, "ns_dtype": "float32", "adam_weight_decay": 0.1}


def grads(model: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def sharded_steps(rank: int, store: str, out: str, mesh_shape: tuple[int, ...] = (RANKS,)) -> None:
    """One of the mesh's processes: the small GPT-2 sharded with lmpipe's FSDP2 over the mesh's
    last ("dp") dimension (a 2-D mesh: HSDP, replicated over the first), STEPS Muon steps on
    fixed gradients; writes its Newton-Schulz calls and (rank 0) the full weights."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from lmpipe.train.parallel import parallelize

    torch.set_num_threads(1)
    world = math.prod(mesh_shape)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    names = ("replicate", "dp")[-len(mesh_shape) :]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    calls = []
    real = muon_module.newton_schulz

    def counted(g, steps, dtype):
        calls.append(list(g.shape))
        return real(g, steps, dtype)

    muon_module.newton_schulz = counted
    torch.manual_seed(0)
    model = build_model(ModelConfig(**SMALL))
    model = parallelize(model, torch.device("cpu"), "float32", False, mesh=mesh)
    opt = build_optimizer(model, settings(**SETTINGS))
    for step in range(STEPS):
        full = grads(model, step)
        for n, p in model.named_parameters():
            p.grad = distribute_tensor(full[n], p.device_mesh, p.placements, src_data_rank=None)
        opt.step()
        calls.append("step")
    weights = {n: p.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(weights, Path(out) / "weights.pt")
    (Path(out) / f"calls_{rank}.json").write_text(json.dumps(calls))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("muon_ranks")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(sharded_steps, args=(str(out / "store"), str(out)), nprocs=RANKS, join=True)
    return out


@pytest.fixture(scope="module")
def sharded_2d(tmp_path_factory) -> Path:
    """4 ranks on a 2 x 2 mesh: 2 replicas (HSDP) of a model sharded over 2 data-parallel ranks."""
    out = tmp_path_factory.mktemp("muon_mesh")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(sharded_steps, args=(str(out / "store"), str(out), (2, 2)), nprocs=4, join=True)
    return out


def assert_whole_matrices(weights: dict[str, torch.Tensor]) -> None:
    """`weights` are where one process lands with the whole matrices (plain tensors, no FSDP)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**SMALL))
    opt = build_optimizer(model, settings(**SETTINGS))
    for step in range(STEPS):
        full = grads(model, step)
        for n, p in model.named_parameters():
            p.grad = full[n]
        opt.step()
    assert weights.keys() == dict(model.named_parameters()).keys()
    for n, p in model.named_parameters():
        torch.testing.assert_close(weights[n], p.detach(), rtol=0, atol=1e-6, msg=n)


@pytest.mark.slow
def test_muon_on_a_2d_mesh_gathers_over_its_data_parallel_dimension(sharded_2d):
    """A mesh of two dimensions (HSDP: replicas x data-parallel shards): each matrix's rows are
    gathered over the data-parallel dimension only, and the step is the whole matrices' step."""
    assert_whole_matrices(torch.load(sharded_2d / "weights.pt", weights_only=True))
    calls = [json.loads((sharded_2d / f"calls_{r}.json").read_text()) for r in range(4)]
    # ranks (replica, dp): the two replicas of a dp rank orthogonalise the same matrices
    assert calls[0] == calls[2] and calls[1] == calls[3] and calls[0] != calls[1]


def test_muon_refuses_matrices_split_by_columns():
    """What it cannot orthogonalise from gathered rows is refused, naming the placements."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        u = distribute_tensor(torch.randn(4, 6), mesh, [Shard(1)])
        with pytest.raises(ValueError, match=r"muon: matrices sharded as \(Shard\(dim=1\),\)"):
            muon_module.orthogonalise([u], 5, torch.float32)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sharded_newton_schulz_equals_the_whole_matrices(sharded):
    """3 ranks, each holding a third of every matrix's rows, land where one process does with
    the whole matrices (plain tensors, no FSDP): each matrix is orthogonalised whole."""
    weights = torch.load(sharded / "weights.pt", weights_only=True)
    assert_whole_matrices(weights)
    torch.manual_seed(0)
    start = build_model(ModelConfig(**SMALL)).state_dict()
    assert not torch.equal(weights["transformer.h.0.mlp.c_fc.weight"],
                           start["transformer.h.0.mlp.c_fc.weight"])  # fmt: skip


@pytest.mark.slow
def test_each_matrix_is_orthogonalised_on_one_rank(sharded):
    """Every step, the 8 matrices are orthogonalised once each, whole, not repeated on every
    rank, spread by work. Their work an iteration, m^2 (2n + m) with m <= n (C = 20: 400 x):
    c_fc and c_proj (80 x 20) 180 each, c_attn (60 x 20) 140, attn.c_proj (20 x 20) 60. Largest
    first, each to the least-loaded rank: the four 180s go 0, 1, 2, 0; the 140s to 1 and 2; the
    60s to 1 and 2: loads 360, 380, 380 (round robin: 500, 380, 240). In the group's order:"""
    C = SMALL["n_embd"]
    shapes = [[3 * C, C], [C, C], [4 * C, C], [C, 4 * C]] * SMALL["n_layer"]  # the group's order
    owners = [1, 1, 0, 1, 2, 2, 2, 0]
    per_rank = []
    for rank in range(RANKS):
        calls = json.loads((sharded / f"calls_{rank}.json").read_text())
        steps = [[]]
        for c in calls:
            steps[-1].append(c) if c != "step" else steps.append([])
        assert steps[-1] == [] and len(steps) == STEPS + 1
        per_rank.append(steps[:-1])
    for step in range(STEPS):
        for rank in range(RANKS):
            mine = [shape for shape, owner in zip(shapes, owners, strict=True) if owner == rank]
            assert per_rank[rank][step] == mine, (step, rank)
        assert sum(len(per_rank[r][step]) for r in range(RANKS)) == len(shapes)


def test_the_owners_share_the_work_largest_first():
    """Greedy largest-first: the most a rank gets is within one matrix of the mean; a function
    of the shapes alone."""
    shapes = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12  # GPT-2 124M's blocks
    for world in (1, 3, 5, 8):
        owners = muon_module.owners_by_work(shapes, world)
        load = [0] * world
        for shape, r in zip(shapes, owners, strict=True):
            load[r] += muon_module.newton_schulz_work(shape)
        biggest = max(muon_module.newton_schulz_work(s) for s in shapes)
        assert max(load) - sum(load) / world <= biggest, (world, load)
    assert muon_module.owners_by_work([(4, 4), (8, 8), (2, 2)], 2) == [1, 0, 1]


def bf16_gather(rank: int, store: str, out: str) -> None:
    """2 ranks: one 7 x 5 update sharded by rows, orthogonalised in bfloat16; each rank writes
    its rows and the dtypes it sent."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    sent = []
    gather, scatter = dist.gather, dist.scatter

    def record_gather(t, *args, **kw):
        sent.append(str(t.dtype))
        return gather(t, *args, **kw)

    def record_scatter(t, parts, *args, **kw):
        sent.extend(str(p.dtype) for p in parts or [])
        return scatter(t, parts, *args, **kw)

    dist.gather, dist.scatter = record_gather, record_scatter
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    g = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    u = distribute_tensor(g, mesh, [Shard(0)])
    (rows,) = muon_module.orthogonalise([u], 5, torch.bfloat16)
    torch.save({"rows": rows, "sent": sent}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_the_gathers_and_scatters_carry_bfloat16_and_change_nothing(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(bf16_gather, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    g = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    whole = muon_module.newton_schulz(g, 5, torch.bfloat16).float()
    assert torch.equal(torch.cat([r["rows"] for r in ranks]), whole)
    assert all(r["rows"].dtype == torch.float32 for r in ranks)  # the update's dtype
    sent = [d for r in ranks for d in r["sent"]]
    assert sent and set(sent) == {"torch.bfloat16"}, sent


def test_the_token_embedding_at_its_own_lr_and_init_as_the_records():
    """The record (records/010425_SoftCap/*.txt): `torch.optim.Adam([dict(params=embed_params,
    lr=0.6), dict(params=head_params, lr=0.008), ...])`, its embedding an `nn.Embedding`
    (initialised N(0, 1)). embed_lr 0.6 and embed_init_std 1.0 give the token embedding a group
    of its own at 0.6, the untied head 0.008; without embed_lr one group holds both."""
    from lmpipe.models.modern.model import modern_config

    shape = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16}
    torch.manual_seed(0)
    model = build_model(modern_config(**shape, embed_init_std=1.0))
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    assert wte.std().item() == pytest.approx(1.0, abs=0.01)  # 1.6M draws
    groups = muon_module.muon_groups(model, settings(lr=0.05, adam_lr=0.008, embed_lr=0.6))
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert (lr_of[id(wte)], lr_of[id(head)]) == (0.6, 0.008)
    plain = muon_module.muon_groups(model, settings(lr=0.05, adam_lr=0.008))
    assert any(id(wte) in map(id, g["params"]) and id(head) in map(id, g["params"]) for g in plain)

"""The GPT model: equal to HF GPT2LMHeadModel, padded vocab never predicted, llm.c init."""

from __future__ import annotations

import math

import pytest
import torch
import transformers  # a dependency of lmpipe: no test here skips without it

from lmpipe.config import named_models
from lmpipe.models.gpt2.model import GPT, GPTConfig

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)


def hf_copy(model: GPT) -> transformers.GPT2LMHeadModel:
    """A GPT2LMHeadModel with `model`'s weights (HF's Conv1D stores Linear weights transposed)."""
    c = model.config
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=c.vocab_size,
            n_positions=c.block_size,
            n_embd=c.n_embd,
            n_layer=c.n_layer,
            n_head=c.n_head,
            activation_function="gelu_new",  # GELU with the tanh approximation
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    ).eval()
    ours = model.state_dict()
    transposed = (
        "attn.c_attn.weight",
        "attn.c_proj.weight",
        "mlp.c_fc.weight",
        "mlp.c_proj.weight",
    )
    with torch.no_grad():
        for name, param in hf.state_dict().items():
            if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
                continue  # causal-mask buffers of older versions
            src = ours[name]
            if name.endswith(transposed):
                src = src.t()
            if name in ("transformer.wte.weight", "lm_head.weight"):
                src = src[: c.vocab_size]  # drop the padding rows
            assert param.shape == src.shape, name
            param.copy_(src)
    return hf


def test_logits_equal_hugging_face_gpt2():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    with torch.no_grad():  # larger than init weights, so every nonlinearity and bias matters
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    hf = hf_copy(model)
    idx = torch.randint(0, TINY.vocab_size, (2, 48))
    logits, _ = model(idx[:, :-1])
    no_logits, loss = model(idx[:, :-1], idx[:, 1:])
    assert no_logits is None  # with targets only the loss leaves the model
    with torch.no_grad():
        out = hf(idx[:, :-1], labels=idx[:, :-1])
    # fp32 on the CPU: the same maths in a different order; differences are ~1e-6
    torch.testing.assert_close(logits[..., : TINY.vocab_size], out.logits, atol=1e-4, rtol=1e-4)
    # HF shifts the labels itself; our targets are already shifted, except the last position
    hf_loss = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, TINY.vocab_size), idx[:, 1:-1].reshape(-1)
    )
    ours_loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), idx[:, 1:-1].reshape(-1)
    )
    torch.testing.assert_close(ours_loss, hf_loss, atol=1e-5, rtol=1e-5)
    # the training loss (computed without returning logits) is the cross-entropy of the logits
    full = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1)
    )
    torch.testing.assert_close(loss, full, atol=1e-5, rtol=1e-5)


def test_padded_vocab_is_never_predicted():
    model = GPT(TINY)
    idx = torch.zeros(1, 4, dtype=torch.long)
    logits, _ = model(idx)
    _, loss = model(idx, idx)
    assert model.transformer.wte.weight.shape[0] == 50304  # padded as llm.c does
    assert logits.shape[-1] == TINY.vocab_size == 50257  # but only real tokens are predicted
    assert torch.isfinite(logits).all()
    loss.backward()
    # the padding rows of the tied embedding get no gradient from the head
    assert model.lm_head.weight.grad[TINY.vocab_size :].abs().sum() == 0


def test_padded_head_matmul_gives_the_same_loss_and_gradients():
    """The GPU's aligned head (the whole padded weight, padded logits dropped inside the loss)
    changes no number: same loss, same gradients, no gradient into the padding rows."""
    torch.manual_seed(0)
    model = GPT(TINY)
    idx = torch.randint(0, TINY.vocab_size, (2, 24))
    targets = torch.randint(0, TINY.vocab_size, (2, 24))
    targets[0, :5] = -1
    results = []
    for padded in (False, True):
        model.zero_grad()
        model.padded_head_matmul = padded
        _, loss = model(idx, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (sliced, sliced_grads), (padded, padded_grads) = results
    torch.testing.assert_close(padded, sliced, rtol=1e-6, atol=1e-6)
    for a, b in zip(padded_grads, sliced_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert model.lm_head.weight.grad[TINY.vocab_size :].abs().sum() == 0


def test_head_on_counted_only_gives_the_same_loss_and_gradients():
    """Fine-tuning's shortcut (the head on positions whose target is not -1) changes no number."""
    torch.manual_seed(0)
    model = GPT(TINY)
    idx = torch.randint(0, TINY.vocab_size, (3, 40))
    targets = torch.randint(0, TINY.vocab_size, (3, 40))
    targets[:, :25] = -1  # a prompt that does not count
    targets[1, 30:] = -1  # padding
    results = []
    for counted_only in (False, True):
        model.zero_grad()
        model.head_on_counted_only = counted_only
        _, loss = model(idx, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (full, full_grads), (counted, counted_grads) = results
    torch.testing.assert_close(counted, full)
    for a, b in zip(counted_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b)
    # and the mean is over counted tokens only: all-ignored but one gives that token's loss
    targets[:] = -1
    targets[0, 0] = 7
    _, one = model(idx, targets)
    logits, _ = model(idx)
    torch.testing.assert_close(one, -torch.log_softmax(logits[0, 0], -1)[7])


def test_llmc_initialisation_and_tying():
    """llm.c's init (train_gpt2.py), tensor by tensor: attn.c_proj and mlp.c_proj weights
    N(0, 0.02 / sqrt(2 n_layer)); the other Linear weights, wte and wpe N(0, 0.02); every bias 0;
    LayerNorms weight 1, bias 0; lm_head is wte. Each tensor holds >= 16K values, so its std is
    measured to ~1% and a 5% tolerance still catches a wrong scale."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=8, n_head=4, n_embd=256, block_size=64)
    model = GPT(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    residual = 0.02 / math.sqrt(2 * config.n_layer)
    stds = {"transformer.wte.weight": 0.02, "transformer.wpe.weight": 0.02}
    for i in range(config.n_layer):
        stds |= {
            f"transformer.h.{i}.attn.c_attn.weight": 0.02,
            f"transformer.h.{i}.attn.c_proj.weight": residual,
            f"transformer.h.{i}.mlp.c_fc.weight": 0.02,
            f"transformer.h.{i}.mlp.c_proj.weight": residual,
        }
    layer_norms = [f"transformer.h.{i}.ln_{j}" for i in range(config.n_layer) for j in (1, 2)]
    layer_norms.append("transformer.ln_f")
    params = dict(model.named_parameters())  # tied: lm_head.weight is listed as wte's
    for name, std in stds.items():
        p = params.pop(name)
        assert p.std().item() == pytest.approx(std, rel=0.05), name
        assert abs(p.mean().item()) < 0.05 * std, name
    for name in layer_norms:
        assert torch.all(params.pop(f"{name}.weight") == 1), name
        assert torch.all(params.pop(f"{name}.bias") == 0), name
    # what is left: the Linear biases (c_attn, c_proj, c_fc), all zero
    assert len(params) == 4 * config.n_layer and all(n.endswith(".bias") for n in params)
    for name, p in params.items():
        assert torch.all(p == 0), name


def test_d12_is_gpt2_124m():
    with torch.device("meta"):
        model = GPT(named_models()["d12"])
    # 124,475,904 with the padded vocab (llm.c); 124,439,808 with 50257 (OpenAI's count)
    assert model.num_params() == 124_475_904
    assert model.flops_per_token(1024) == 6 * 124_475_904 + 6 * 12 * 768 * 1024


@pytest.mark.parametrize("name", ["tiny", "d12", "d24", "d36"])
def test_the_registry_counts_parameters_as_the_model_does(name):
    """The plan's FLOPs and bytes come from this count, made without torch."""
    from lmpipe.registry import ARCHITECTURES

    config = named_models()[name]
    with torch.device("meta"):
        model = GPT(config)
    assert ARCHITECTURES["gpt2"].num_params(config) == model.num_params()

"""train.attention_backend: the setting reaches SDPA's kernel choice (lmpipe.models.attention),
a backend the device has no kernel for is refused in one line before training, and the kernel
that ran, profiled, is what the trainer's provenance.json records."""

from __future__ import annotations

import json

import pytest
import torch
from test_train import config, job_of, manifest, run  # noqa: F401 (manifest: a fixture)

from lmpipe.models import attention
from lmpipe.models.attention import attend, use_backend


@pytest.fixture
def qkv():
    torch.manual_seed(0)
    yield [torch.randn(2, 2, 16, 8) for _ in range(3)]
    use_backend("auto")  # the module's setting is process-wide: leave it as found


def test_the_backend_setting_reaches_the_kernel_choice(qkv):
    default = attend(*qkv, None)
    use_backend("math")
    torch.testing.assert_close(attend(*qkv, None), default, rtol=1e-5, atol=1e-6)
    use_backend("flash")  # PyTorch's CPU flash kernel
    torch.testing.assert_close(attend(*qkv, None), default, rtol=1e-5, atol=1e-6)
    use_backend("efficient")  # no CPU kernel: SDPA, limited to it, has none to run
    with pytest.raises(RuntimeError, match="No viable backend"):
        attend(*qkv, None)


@pytest.mark.parametrize("name", ["cudnn", "efficient"])
def test_a_backend_without_a_cpu_kernel_is_refused_in_one_line(name):
    from lmpipe.train.loop import check_attention

    with pytest.raises(RuntimeError) as refused:
        check_attention(job_of(config(1, attention_backend=name)))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("runs.test: train.attention_backend")
    assert f"'{name}' has no kernel on the cpu" in line
    for ok in attention.CPU_BACKENDS:
        check_attention(job_of(config(1, attention_backend=ok)))


CPU_KERNELS = {  # what PyTorch's CPU runs for each setting (auto: its flash kernel)
    "math": "aten::_scaled_dot_product_attention_math",
    "flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
    "auto": "aten::_scaled_dot_product_flash_attention_for_cpu",
}


def test_the_kernel_that_runs_is_read_off_the_profiler(qkv):
    for name, kernel in CPU_KERNELS.items():
        use_backend(name)
        assert attention.kernel_that_runs(lambda: attend(*qkv, None)) == kernel
    assert attention.kernel_that_runs(lambda: torch.ones(3) @ torch.ones(3)) == "none"


@pytest.mark.filterwarnings("ignore::UserWarning")  # flex_attention unfused on the CPU
def test_flex_attention_is_named_where_a_models_mask_runs_as_flex(monkeypatch):
    """A modern model with the record's document mask runs FlexAttention where flex_on (CUDA;
    here forced, eager): the kernel is named flex_attention, not SDPA's; off it, SDPA's."""
    import torch.nn.attention.flex_attention as torch_flex

    from lmpipe.config import model_config
    from lmpipe.models import build_model

    monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)  # flex on the CPU
    shape = dict(n_layer=2, n_head=2, n_embd=32, block_size=256, vocab_size=512)
    model = build_model(model_config(dict(arch="modern", document_mask=True, **shape), "test"))
    idx = torch.randint(0, 512, (1, 256))
    with torch.no_grad():
        assert attention.kernel_that_runs(lambda: model(idx)) == CPU_KERNELS["auto"]
        monkeypatch.setattr(attention, "FLEX_OFF_CUDA", True)
        assert attention.kernel_that_runs(lambda: model(idx)) == attention.FLEX_KERNEL


def test_the_trainers_provenance_records_the_kernel_that_ran(manifest, tmp_path):  # noqa: F811
    """math and flash asked: provenance.json holds each setting and, apart, the kernel its
    profiled forward ran, which differ (the setting alone would not say what ran)."""
    recorded = {}
    for name in ("math", "flash"):
        out = tmp_path / name
        run(config(1, attention_backend=name, max_steps=1, val_every=0), manifest, out)
        prov = json.loads((out / "provenance.json").read_text())
        assert prov["attention_backend"] == name
        recorded[name] = prov["attention_kernel"]
    assert recorded == {name: CPU_KERNELS[name] for name in ("math", "flash")}

"""train.attention_backend: the setting reaches SDPA's kernel choice (lmpipe.models.attention),
and a backend the device has no kernel for is refused in one line before training."""

from __future__ import annotations

import pytest
import torch
from test_train import config, job_of

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

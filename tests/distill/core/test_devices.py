"""Device helpers shared by the teacher, the student and serving."""

from __future__ import annotations

import pytest
import torch

from distill.core.devices import attention_backends


@pytest.mark.parametrize("cuda", ["cuda", "cuda:0", torch.device("cuda")])
def test_cudnn_attention_is_off_on_cuda_only_unless_asked(cuda: str | torch.device) -> None:
    """No CUDA needed: the context only switches SDPA's backend flags."""
    cudnn = torch.backends.cuda.cudnn_sdp_enabled
    before = cudnn()
    with attention_backends(cuda, cudnn=False):
        assert not cudnn() and torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert cudnn() == before
    for device, allowed in ((cuda, True), ("cpu", False), (torch.device("cpu"), False), ("cpu", True)):
        with attention_backends(device, cudnn=allowed):
            assert cudnn() == before

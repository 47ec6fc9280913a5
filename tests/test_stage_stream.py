"""`StageStream`: a stage's work on a CUDA stream of its own, ordered after the engine
loop's work on the default stream and complete when `run` returns; a plain call off CUDA."""

from __future__ import annotations

import pytest
import torch

from voxline.kernels.cuda_graphs import StageStream


def test_off_cuda_it_is_a_plain_call():
    for device in (None, "cpu"):
        stream = StageStream(device)
        assert stream.stream is None
        assert stream.run(lambda a, b: a + b, 2, 3) == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_work_follows_the_default_stream_and_is_done_on_return():
    stream = StageStream("cuda")
    assert stream.stream is not None
    big = torch.randn(4096, 4096, device="cuda")
    x = torch.zeros(4, device="cuda")
    for _ in range(8):
        big = big @ big / 64  # keep the default stream busy before the write
    x.fill_(1.0)  # queued on the default stream, as the engine loop's copies are
    seen = []

    def work() -> torch.Tensor:
        seen.append(torch.cuda.current_stream() == stream.stream)
        return x * 2

    out = stream.run(work)
    assert seen == [True]
    assert stream.stream.query()  # nothing of the stage's left running
    assert out.tolist() == [2.0] * 4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_copy_in_fills_a_static_input_from_the_host(device):
    from voxline.kernels.cuda_graphs import copy_in

    dst = torch.zeros(2, 3, dtype=torch.long, device=device)
    src = torch.arange(6).view(2, 3)
    copy_in(dst, src)
    src.zero_()  # the host's tensor may change at once: the copy read a staging copy
    assert dst.tolist() == [[0, 1, 2], [3, 4, 5]]
    copy_in(dst[1], torch.tensor([7, 8, 9]))  # a view: only its rows change
    assert dst.tolist() == [[0, 1, 2], [7, 8, 9]]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_to_device_makes_the_tensor_there(device):
    from voxline.kernels.cuda_graphs import to_device

    t = to_device([3, 1, 2], torch.long, torch.device(device))
    assert t.device.type == device and t.dtype == torch.long and t.tolist() == [3, 1, 2]
    f = to_device([0.5, 1.0], torch.float32, torch.device(device))
    assert f.dtype == torch.float32 and f.tolist() == [0.5, 1.0]

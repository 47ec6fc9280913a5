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


@pytest.fixture
def urgent_streams_restored():
    from voxline.kernels.cuda_graphs import set_urgent_streams

    yield
    set_urgent_streams(True)  # the process-wide default


def test_urgent_stages_get_the_higher_cuda_priority(monkeypatch, urgent_streams_restored):
    from voxline.kernels import cuda_graphs

    made: list[int] = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: made.append(priority))
    assert StageStream("cuda", urgent=True).priority == cuda_graphs.URGENT_PRIORITY < 0
    normal = cuda_graphs.NORMAL_PRIORITY
    assert StageStream("cuda").priority == normal > cuda_graphs.URGENT_PRIORITY
    assert made == [cuda_graphs.URGENT_PRIORITY, normal]  # the streams are made with them
    cuda_graphs.set_urgent_streams(False)
    assert StageStream("cuda", urgent=True).priority == normal and made[-1] == normal
    # video below every voice stage, its decode (frames due now) above its denoise
    assert normal < cuda_graphs.VIDEO_DECODE_PRIORITY < cuda_graphs.VIDEO_DENOISE_PRIORITY
    assert cuda_graphs.URGENT_PRIORITY >= -3 and cuda_graphs.VIDEO_DENOISE_PRIORITY <= 0
    assert StageStream("cpu", urgent=True).stream is None  # off CUDA: no stream at all


def test_the_llm_stream_is_urgent_the_speech_stream_is_not(monkeypatch, urgent_streams_restored):
    from fakes import CountingLM, ToneTTS

    from voxline.engines.llm_stage import LLMStage
    from voxline.engines.speech_model import SentenceSpeechModel
    from voxline.engines.tts_stage import TTSStage
    from voxline.kernels.cuda_graphs import NORMAL_PRIORITY, URGENT_PRIORITY

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: object())
    lm, speech = CountingLM(max_slots=1), SentenceSpeechModel(ToneTTS())
    lm.device = speech.device = torch.device("cuda")  # as the models on a GPU say
    assert LLMStage(lm)._stream.priority == URGENT_PRIORITY
    assert TTSStage(speech)._stream.priority == NORMAL_PRIORITY


def test_gpu_stream_priority_setting(monkeypatch, urgent_streams_restored):
    from voxline.config import Settings
    from voxline.engines import factory
    from voxline.kernels import cuda_graphs

    factory.set_stream_priority(Settings())  # auto on the CPU: nothing to do, no error
    assert cuda_graphs.stream_priority(urgent=True) == cuda_graphs.URGENT_PRIORITY
    factory.set_stream_priority(Settings(asr_device="cuda", gpu_stream_priority="off"))
    # the ASR's stream made after this gets the speech steps' priority
    assert cuda_graphs.stream_priority(urgent=True) == cuda_graphs.NORMAL_PRIORITY
    factory.set_stream_priority(Settings(llm_device="cuda", gpu_stream_priority="auto"))
    assert cuda_graphs.stream_priority(urgent=True) == cuda_graphs.URGENT_PRIORITY
    # 'off' where neither the ASR nor an embedded LLM is on CUDA is refused, naming it
    with pytest.raises(ValueError, match="gpu_stream_priority=off applies to the ASR"):
        factory.set_stream_priority(Settings(gpu_stream_priority="off", tts_device="cuda"))
    with pytest.raises(ValueError, match="gpu_stream_priority=off .*llm=openai"):
        factory.set_stream_priority(Settings(gpu_stream_priority="off", llm_device="cuda",
                                             llm="openai:http://127.0.0.1:9/v1", llm_model="m"))
    with pytest.raises(ValueError, match="gpu_stream_priority"):
        Settings(gpu_stream_priority="high")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_an_urgent_stream_has_the_higher_priority(urgent_streams_restored):
    from voxline.kernels.cuda_graphs import NORMAL_PRIORITY, URGENT_PRIORITY

    urgent, normal = StageStream("cuda", urgent=True), StageStream("cuda")
    assert urgent.stream.priority == URGENT_PRIORITY
    assert normal.stream.priority == NORMAL_PRIORITY
    assert urgent.run(torch.cuda.current_stream).priority == URGENT_PRIORITY


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_packed_inputs_fill_in_numpy_and_arrive_in_one_copy(device):
    from voxline.kernels.cuda_graphs import PackedInputs, StaticStep

    packed = PackedInputs({"ints": ((3, 2), torch.int64), "floats": ((1, 3), torch.float32),
                           "flags": ((5,), torch.bool), "more": ((2,), torch.int64)}, device)
    assert [at for at, _, _ in packed.spans.values()] == [0, 48, 64, 72]  # 8-byte aligned
    raw, views = packed.host()
    views["ints"][:] = [[1, 2], [3, 4], [5, -6]]
    views["floats"][0] = [0.5, 1.5, -2.0]
    views["flags"][[1, 3]] = True
    views["more"][:] = [7, 1 << 40]
    packed.send(raw)
    raw[:] = 0  # the host buffer may be reused at once: the copy read a staging copy
    t = packed.tensors
    assert t["ints"].tolist() == [[1, 2], [3, 4], [5, -6]] and t["ints"].dtype == torch.int64
    assert t["floats"].tolist() == [[0.5, 1.5, -2.0]]
    assert t["flags"].tolist() == [False, True, False, True, False]
    assert t["more"].tolist() == [7, 1 << 40]
    assert all(v.device.type == device for v in t.values())
    step = StaticStep(lambda x, ints, floats, flags, more: {"y": x + ints.sum()},
                      {"x": torch.zeros(1, dtype=torch.int64, device=device)}, packed=packed)
    assert set(step.inputs) == {"x", "ints", "floats", "flags", "more"} and step.packed is packed
    assert step()["y"].tolist() == [9]

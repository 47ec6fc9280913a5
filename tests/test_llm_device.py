"""The embedded LLM on another torch device (``llm_device`` / ``voxline serve --device``).

On the CPU: the setting is validated (unknown device, no GPU, int8 weights off the CPU,
a remote reply model) with errors naming the field, and ``--device`` reaches the
settings. On CUDA (skipped without it): the same tiny Llama on the GPU gives the CPU's
logits and greedy tokens, prefill and batched decode, and a request seeded with a CPU
generator draws the same tokens as on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from test_llm_model import random_ids, tiny_config
from transformers import LlamaForCausalLM

from voxline.engines.models.llama.model import LlamaModel
from voxline.engines.models.sampling import sample

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def server_side():
    """The settings, factory and CLI (imported here: the CUDA tests below run on a GPU
    machine without the server's dependencies)."""
    from pydantic import ValidationError

    from voxline.cli import build_parser
    from voxline.config import Settings, settings_from_flags
    from voxline.engines import factory

    return ValidationError, Settings, factory, build_parser, settings_from_flags


def test_llm_device_defaults_to_the_cpu_and_rejects_unknown_devices(server_side):
    ValidationError, Settings, factory, _, _ = server_side
    assert factory.llm_device(Settings()) == "cpu"
    with pytest.raises(ValidationError, match="llm_device"):
        Settings(llm_device="gpu")


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch, server_side):
    _, Settings, factory, _, _ = server_side
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="llm_device=cuda.*no CUDA GPU"):
        factory.llm_device(Settings(llm_device="cuda", llm_dtype="bfloat16"))


def test_int8_weights_and_remote_models_stay_off_the_gpu(monkeypatch, server_side):
    _, Settings, factory, _, _ = server_side
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="llm_dtype=int8 runs on the CPU only"):
        factory.llm_device(Settings(llm_device="cuda"))  # int8 is the default dtype
    with pytest.raises(ValueError, match="embedded LLM.*remote"):
        factory.llm_device(Settings(llm_device="cuda:1", llm_dtype="bfloat16",
                                    llm="openai:http://127.0.0.1:9/v1"))
    assert factory.llm_device(Settings(llm_device="cuda:1", llm_dtype="bfloat16")) == "cuda:1"


def test_serve_device_flag_puts_llm_and_tts_on_the_device(capsys, server_side):
    _, _, _, build_parser, settings_from_flags = server_side

    def settings(*flags: str):
        return settings_from_flags(build_parser().parse_args(["serve", *flags]))

    args = build_parser().parse_args(["serve", "--device", "cuda"])
    assert args.device == "cuda"
    on_gpu = settings_from_flags(args)
    assert (on_gpu.llm_device, on_gpu.tts_device, on_gpu.asr_device) == ("cuda",) * 3
    assert on_gpu.llm_dtype == "bfloat16"  # int8 would be refused on a GPU
    assert settings("--device", "cpu").llm_dtype == "int8" and settings().llm_dtype == "int8"
    assert settings("--device", "cuda", "--llm-dtype", "float32").llm_dtype == "float32"
    assert settings("--device", "cuda", "--tts-device", "cpu").tts_device == "cpu"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--device", "tpu"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert "--device {cpu,cuda}" in capsys.readouterr().out


def _pair(device: str) -> tuple[LlamaModel, LlamaModel]:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(tiny_config()).eval()
    cpu = LlamaModel.from_state_dict(hf.config, hf.state_dict())
    gpu = LlamaModel.from_state_dict(hf.config, hf.state_dict(), device=device)
    return cpu, gpu


@cuda
def test_the_llm_on_cuda_gives_the_cpu_logits_and_tokens():
    cpu, gpu = _pair("cuda")
    assert gpu.device.type == "cuda"
    for m in (cpu, gpu):
        m.allocate_cache(max_slots=3, max_len=64)
    prompts = [random_ids(9, seed=1), random_ids(4, seed=2)]
    want = cpu.forward_batch([0, 2], prompts)
    got = gpu.forward_batch([0, 2], prompts)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)
    toks = [[int(t)] for t in want.argmax(-1)]
    for _ in range(6):  # batched greedy decode, both streams
        want = cpu.forward_batch([0, 2], toks)
        got = gpu.forward_batch([0, 2], toks)
        assert want.argmax(-1).tolist() == got.argmax(-1).tolist()
        toks = [[int(t)] for t in want.argmax(-1)]
    assert cpu.cache.lengths == gpu.cache.lengths


@cuda
def test_a_cpu_seeded_request_samples_the_same_tokens_on_cuda():
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(0)) * 2
    temps = [0.8, 0.0, 1.2]

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(5), None, torch.Generator().manual_seed(6)]

    a, b = gens(), gens()
    for _ in range(3):  # the generators advance alike on both
        want = sample(logits, temps, top_k=[0, 0, 40], generators=a)
        got = sample(logits.cuda(), temps, top_k=[0, 0, 40], generators=b)
        assert got.device.type == "cuda" and got.cpu().tolist() == want.tolist()

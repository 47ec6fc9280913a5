"""Capacity from the device (voxline.engines.capacity, model_memory, sizing.sized_for_device):
the pure plan on fake memory numbers, the footprints against the real allocations of tiny
models, and the start-up path with torch.cuda replaced by a fake H200. No GPU is used."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen_ref.harness import TINY_CODEC, TINY_MODEL

from voxline.cli import build_parser
from voxline.config import Settings, settings_from_flags
from voxline.engines import sizing
from voxline.engines.capacity import (
    ENGINE_CONTEXT_BYTES,
    GIB,
    DeviceBudget,
    Footprint,
    LatencyRow,
    find_latency_row,
    load_table,
    plan_capacity,
    with_row,
)
from voxline.engines.capacity_record import measured_row, record_row
from voxline.engines.model_memory import (
    LLM_POSITIONS,
    TTS_POSITIONS,
    llama_params,
    llm_footprint,
    qwen3_tts_footprint,
    safetensors_params,
)
from voxline.errors import VoxlineError

MIB = 1 << 20
DEFAULTS = {"max_sessions": 8, "max_responses": 8, "tts_max_streams": 8}
TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                  tie_word_embeddings=True, max_position_embeddings=4096)


def _gpu(free_gib: float, footprint: Footprint, device: str = "cuda:0",
         name: str = "NVIDIA H200") -> DeviceBudget:
    free = int(free_gib * GIB) + ENGINE_CONTEXT_BYTES  # usable = free_gib exactly
    return DeviceBudget(device, name, free + GIB, free, footprint)


# 1 GiB weights, 1 GiB per session (LLM) + 1 GiB per stream (TTS), no scratch, w = 0:
# with 20 GiB usable memory holds (20 - 1) / 2 = 9 sessions.
SPEECH = Footprint(weights=GIB, per_session=GIB, per_stream=GIB, parts=("LLM", "TTS"))


def _plan(devices, explicit=None, latency=None, w=0.0):
    return plan_capacity(devices, explicit=explicit or {}, defaults=DEFAULTS, latency=latency,
                         working_fraction=w)


# --------------------------------------------------------------------------- the plan


def test_no_latency_row_caps_at_the_default_and_memory_may_cap_lower():
    roomy = _plan([_gpu(100, SPEECH)])
    assert (roomy.max_sessions, roomy.memory_sessions, roomy.latency) == (8, 49, None)
    assert (roomy.max_responses, roomy.tts_max_streams) == (8, 8)
    tight = _plan([_gpu(12, SPEECH)])  # (12 - 1) / 2 = 5
    assert tight.values() == {"max_sessions": 5, "max_responses": 5, "tts_max_streams": 5}


def test_a_latency_row_caps_sessions_and_memory_still_bounds_them():
    row = LatencyRow("NVIDIA H200", sessions=64)
    assert _plan([_gpu(100, SPEECH)], latency=row).max_sessions == 49  # memory: 49 < 64
    assert _plan([_gpu(200, SPEECH)], latency=row).max_sessions == 64


def test_working_memory_scales_the_whole_static_footprint():
    # usable 30 GiB / (1 + 0.5) = 20 GiB for (1 + 2 S) GiB: 9 sessions
    assert _plan([_gpu(30, SPEECH)], w=0.5).memory_sessions == 9
    device = _gpu(30, SPEECH)
    assert device.need(9, 9, 0.5) == 1.5 * 19 * GIB <= device.usable < device.need(10, 10, 0.5)


def test_explicit_values_win_and_are_reported_above_the_cap():
    plan = _plan([_gpu(100, SPEECH)], explicit={"max_sessions": 20},
                 latency=LatencyRow("NVIDIA H200", sessions=8))
    assert plan.values() == {"max_sessions": 20, "max_responses": 20, "tts_max_streams": 20}
    assert plan.explicit == ("max_sessions",)
    assert "max_sessions=20 is above the 8 sessions measured at the latency bar" in plan.log_line()


def test_streams_default_to_what_fits_beside_explicit_sessions():
    # 40 sessions x 1 GiB + 1 GiB weights leave 59 GiB: 59 streams, but at most max_responses
    plan = _plan([_gpu(100, SPEECH)], explicit={"max_sessions": 40, "max_responses": 64})
    assert (plan.max_responses, plan.tts_max_streams) == (64, 59)


def test_explicit_streams_that_do_not_fit_name_the_field_and_the_numbers():
    with pytest.raises(VoxlineError) as err:
        _plan([_gpu(20, SPEECH)], explicit={"tts_max_streams": 30})
    text = str(err.value)
    assert text.startswith("tts_max_streams=30 does not fit cuda:0 (NVIDIA H200)")
    assert "8 sessions x 1024 MiB + 30 TTS streams x 1024 MiB" in text
    assert "20.0 GiB is usable" in text and "at most 11 TTS streams fit beside 8 sessions" in text


def test_explicit_sessions_that_leave_no_stream_are_refused():
    with pytest.raises(VoxlineError, match=r"^max_sessions=19: not even one TTS stream fits"):
        _plan([_gpu(20, SPEECH)], explicit={"max_sessions": 19})


def test_models_that_do_not_fit_at_all_are_refused():
    with pytest.raises(VoxlineError, match=r"the models do not fit cuda:0 \(NVIDIA H200\)"):
        _plan([_gpu(0.5, SPEECH)])
    with pytest.raises(VoxlineError, match="not even one session fits"):
        _plan([_gpu(1.5, SPEECH)])


def test_speech_off_the_gpu_leaves_the_stream_count_alone():
    llm_only = Footprint(weights=GIB, per_session=GIB, parts=("LLM",))
    plan = _plan([_gpu(100, llm_only)], explicit={"tts_max_streams": 3})
    assert (plan.max_sessions, plan.tts_max_streams, plan.speech_on_gpu) == (8, 3, False)
    assert _plan([_gpu(100, llm_only)]).tts_max_streams == 8


def test_the_tightest_device_decides_when_stages_are_on_two_gpus():
    llm = _gpu(100, Footprint(weights=GIB, per_session=4 * GIB, parts=("LLM",)))
    tts = _gpu(100, Footprint(weights=GIB, per_stream=GIB, parts=("TTS",)), device="cuda:1")
    plan = _plan([llm, tts], latency=LatencyRow("NVIDIA H200", sessions=64))
    assert (plan.memory_sessions, plan.max_sessions, plan.tts_max_streams) == (24, 24, 24)


def test_the_log_line_says_what_from_what_and_what_was_explicit():
    line = _plan([_gpu(100, SPEECH)], explicit={"tts_max_streams": 4},
                 latency=LatencyRow("NVIDIA H200", 8, source="results.json")).log_line()
    assert line.startswith("capacity: max_sessions=8 (NVIDIA H200 held 8 at the latency bar "
                           "(results.json); memory fits 49), max_responses=8, tts_max_streams=4")
    assert "cuda:0 NVIDIA H200 (LLM, TTS): 101.0 GiB free of 102.0 GiB" in line
    assert line.endswith("explicit: tts_max_streams")
    assert "\n" not in line


# --------------------------------------------------------------------------- the table


def test_a_row_applies_to_the_same_gpu_and_models_no_larger():
    rows = [LatencyRow("NVIDIA H200", 8, tts_params=2000, llm_params=1000),
            LatencyRow("NVIDIA H200", 32, tts_params=2000, llm_params=200),
            LatencyRow("NVIDIA H100 80GB HBM3", 50, tts_params=9000, llm_params=9000)]
    assert find_latency_row(rows, "NVIDIA H200", tts_params=2000, llm_params=1000).sessions == 8
    assert find_latency_row(rows, "NVIDIA H200", tts_params=1500, llm_params=150).sessions == 32
    assert find_latency_row(rows, "NVIDIA H200", tts_params=2001, llm_params=0) is None
    assert find_latency_row(rows, "NVIDIA A100-SXM4-80GB", tts_params=0, llm_params=0) is None


def test_a_row_counts_for_servers_whose_asr_ran_where_its_did():
    rows = [LatencyRow("NVIDIA H200", 8, tts_params=2000, llm_params=1000),
            LatencyRow("NVIDIA H200", 32, tts_params=2000, llm_params=1000, asr_device="cuda")]
    assert find_latency_row(rows, "NVIDIA H200", tts_params=2000, llm_params=1000).sessions == 8
    assert find_latency_row(rows, "NVIDIA H200", tts_params=2000, llm_params=1000,
                            asr_device="cuda").sessions == 32
    assert find_latency_row(rows[:1], "NVIDIA H200", tts_params=0, llm_params=0,
                            asr_device="cuda") is None


def test_the_packaged_table_holds_the_measured_h200_row(tmp_path):
    table = load_table()
    assert table.working_fraction == 0.5
    h200 = {r.asr_device: r for r in table.rows if r.gpu == "NVIDIA H200"}
    assert h200["cpu"].sessions == 8 and Path(h200["cpu"].source).name == "serve_h200_sweep.json"
    assert h200["cuda"].sessions == 64
    assert Path(h200["cuda"].source).name == "serve_h200_arrivals.json"
    assert load_table(tmp_path / "missing.json").rows == ()  # the fallback applies
    data = json.loads(Path(table.path).read_text())
    cpu = h200["cpu"]
    newer = with_row(data, LatencyRow("NVIDIA H200", 48, cpu.tts_params, cpu.llm_params))
    path = tmp_path / "table.json"
    path.write_text(json.dumps(newer))  # the CPU-ASR row replaced, the GPU-ASR one kept
    assert sorted((r.asr_device, r.sessions) for r in load_table(path).rows
                  if r.gpu == "NVIDIA H200") == [("cpu", 48), ("cuda", 64)]


# --------------------------------------------------------------------------- footprints


def test_llama_footprint_is_what_the_model_and_its_cache_allocate(tmp_path):
    from transformers import LlamaConfig

    from voxline.engines.models.llama.model import LlamaModel

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    footprint, params = llm_footprint(tmp_path, "bfloat16")
    model = LlamaModel(LlamaConfig(**TINY_LLAMA)).to(torch.bfloat16)
    assert params == llama_params(TINY_LLAMA) == sum(p.numel() for p in model.parameters())
    assert footprint.weights == sum(p.numel() * p.element_size() for p in model.parameters())
    cache = model.allocate_cache(1, LLM_POSITIONS)
    assert footprint.per_session == footprint.scratch == cache.k.nbytes + cache.v.nbytes
    untied = {**TINY_LLAMA, "tie_word_embeddings": False, "attention_bias": True}
    assert llama_params(untied) == sum(p.numel() for p in LlamaModel(LlamaConfig(**untied)).parameters())


def _tts_dir(root: Path) -> Path:
    (root / "speech_tokenizer").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(TINY_MODEL))
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(TINY_CODEC))
    return root


def test_qwen3_footprint_is_what_the_talker_and_codec_allocate(tmp_path):
    from voxline.engines.models.qwen3_tts.code2wav import Code2WavDecoder
    from voxline.engines.models.qwen3_tts.config import load_code2wav_config, load_config
    from voxline.engines.models.qwen3_tts.talker import Talker

    model_dir = _tts_dir(tmp_path / "tts")
    footprint, params = qwen3_tts_footprint(model_dir)
    talker = Talker(load_config(model_dir).talker).to(torch.bfloat16)
    decoder = Code2WavDecoder(load_code2wav_config(model_dir))
    assert params == sum(p.numel() for m in (talker, decoder) for p in m.parameters())
    assert footprint.weights == sum(p.numel() * p.element_size()
                                    for m in (talker, decoder) for p in m.parameters())
    cache = talker.allocate_cache(1, TTS_POSITIONS)
    state = decoder.new_state(1)
    codec = sum(x.nbytes for x in (*state.tails, *state.keys, *state.values, state.key_pos,
                                   state.frames))
    assert footprint.per_stream == cache.k.nbytes + cache.v.nbytes + 2 * codec
    assert footprint.scratch == cache.k.nbytes + cache.v.nbytes + codec


def test_safetensors_params_reads_only_the_headers(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "sub").mkdir()
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)},
              tmp_path / "model.safetensors")
    save_file({"c": torch.zeros(2, 2, 2)}, tmp_path / "sub" / "diffusion.safetensors")
    assert safetensors_params(tmp_path) == 12 + 5 + 8


# --------------------------------------------------------------------------- start-up


class FakeCuda:
    """torch.cuda as one GPU with `free` of `total` bytes (no GPU is touched)."""

    def __init__(self, monkeypatch, *, free: int, total: int, name: str = "NVIDIA H200") -> None:
        self.probes = 0
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "mem_get_info", self._info(free, total))

    def _info(self, free: int, total: int):
        def info(device=None):
            assert torch.device(device) == torch.device("cuda:0")
            self.probes += 1
            return free, total
        return info


@pytest.fixture
def checkpoints(tmp_path):
    llm = tmp_path / "llm"
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps(TINY_LLAMA))
    return _tts_dir(tmp_path / "tts"), llm


def _serve_settings(*flags: str) -> Settings:
    return settings_from_flags(build_parser().parse_args(["serve", *flags]))


def test_on_the_cpu_nothing_is_probed_or_changed(monkeypatch, checkpoints):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: pytest.fail("probed on the CPU"))
    tts, llm = checkpoints
    settings = _serve_settings("--tts", f"qwen3:{tts}", "--llm-checkpoint", str(llm))
    assert sizing.sized_for_device(settings) is settings
    assert (settings.max_sessions, settings.max_responses, settings.tts_max_streams) == (8, 8, 8)


def test_on_a_gpu_unset_fields_are_sized_and_logged(monkeypatch, checkpoints, caplog):
    tts, llm = checkpoints
    total = 143771 * MIB
    gpu = FakeCuda(monkeypatch, free=total - 600 * MIB, total=total, name="Tiny GPU")
    monkeypatch.setattr(sizing, "load_table", lambda: load_table(Path("/nonexistent")))
    settings = _serve_settings("--device", "cuda", "--tts", f"qwen3:{tts}",
                               "--llm-checkpoint", str(llm), "--max-responses", "6")
    with caplog.at_level(logging.INFO, logger="voxline.engines.sizing"):
        sized = sizing.sized_for_device(settings)
    assert gpu.probes == 1
    # tiny models fit thousands; an unmeasured GPU gets the default cap of 8 sessions
    assert (sized.max_sessions, sized.max_responses, sized.tts_max_streams) == (8, 6, 6)
    assert (settings.max_sessions, settings.tts_max_streams) == (8, 8)  # the input is untouched
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("capacity:")]
    assert "GPU not in the latency table for these models: capped at 8, the default" in line
    assert ("cuda:0 Tiny GPU (LLM 2048 positions, TTS 2048 positions, ASR): 139.8 GiB free of "
            "140.4 GiB") in line  # --device cuda puts the ASR there too
    assert "explicit: max_responses" in line
    assert line.endswith("CUDA-graph batch buckets: LLM 1,2,4,8, TTS 1,4,6")


def test_a_measured_gpu_gets_its_row_and_environment_values_count_as_set(
        monkeypatch, checkpoints, tmp_path):
    tts, llm = checkpoints
    FakeCuda(monkeypatch, free=100 * GIB, total=141 * GIB)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"rows": [{"gpu": "NVIDIA H200", "sessions": 40,
                                           "tts_params": 10**9, "llm_params": 10**9,
                                           "asr_device": "cuda"}]}))
    monkeypatch.setattr(sizing, "load_table", lambda: load_table(table))
    monkeypatch.setenv("VOXLINE_TTS_MAX_STREAMS", "12")
    sized = sizing.sized_for_device(_serve_settings(
        "--device", "cuda", "--tts", f"qwen3:{tts}", "--llm-checkpoint", str(llm)))
    assert (sized.max_sessions, sized.max_responses, sized.tts_max_streams) == (40, 40, 12)


def test_explicit_settings_that_do_not_fit_stop_the_start(monkeypatch, checkpoints):
    tts, llm = checkpoints
    FakeCuda(monkeypatch, free=2 * GIB, total=4 * GIB)
    settings = _serve_settings("--device", "cuda", "--asr-device", "cpu", "--tts", f"qwen3:{tts}",
                               "--llm-checkpoint", str(llm), "--tts-max-streams", "4000")
    with pytest.raises(VoxlineError, match=r"^tts_max_streams=4000 does not fit cuda:0"):
        sizing.sized_for_device(settings)
    buckets = _serve_settings("--device", "cuda", "--asr-device", "cpu", "--tts", f"qwen3:{tts}",
                              "--llm-checkpoint", str(llm), "--max-sessions", "2",
                              "--tts-batch-buckets", "1,4")
    with pytest.raises(VoxlineError, match=r"tts_batch_buckets must lie in 1..tts_max_streams \(2\)"):
        sizing.sized_for_device(buckets)


def test_a_gpu_that_is_not_there_is_named(monkeypatch, checkpoints):
    tts, _ = checkpoints
    FakeCuda(monkeypatch, free=GIB, total=GIB)
    settings = _serve_settings("--tts", f"qwen3:{tts}", "--tts-device", "cuda:1")
    with pytest.raises(VoxlineError, match=r"tts_device=cuda:1, but this machine has 1 CUDA GPU"):
        sizing.sized_for_device(settings)


@settings(max_examples=200, deadline=None)
@given(free_mib=st.integers(1, 200_000), weights_mib=st.integers(0, 50_000),
       session_kib=st.integers(1, 1 << 20), stream_kib=st.integers(0, 1 << 20),
       w=st.sampled_from([0.0, 0.25, 0.5]), cap=st.integers(1, 4096))
def test_a_sized_plan_fits_and_is_either_capped_or_one_session_short_of_full(
        free_mib, weights_mib, session_kib, stream_kib, w, cap):
    footprint = Footprint(weights=weights_mib * MIB, per_session=session_kib << 10,
                          per_stream=stream_kib << 10, scratch=(session_kib + stream_kib) << 10)
    device = DeviceBudget("cuda:0", "G", free_mib * MIB + GIB, free_mib * MIB + GIB, footprint)
    try:
        plan = _plan([device], latency=LatencyRow("G", cap), w=w)
    except VoxlineError as exc:  # only when not even one session fits
        assert device.need(1, 1 if stream_kib else 0, w) > device.usable, exc
        return
    streams = plan.tts_max_streams if stream_kib else 0
    assert device.need(plan.max_sessions, streams, w) <= device.usable * (1 + 1e-9)
    assert plan.max_sessions == cap or (
        device.need(plan.max_sessions + 1, streams + bool(stream_kib), w) > device.usable)


def test_the_benchmark_records_its_row_where_start_up_finds_it(monkeypatch, checkpoints, tmp_path):
    # what benchmarks/gpu_serving/record_capacity.py does with its arguments
    tts, llm = checkpoints
    bench = tmp_path / "audio.json"
    bench.write_text(json.dumps({"levels": [], "sessions_held": 24}))
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"working_memory_fraction": 0.5, "rows": []}))
    record_row(measured_row(bench, tts=tts, llm=llm, gpu="Tiny GPU", asr_device="cuda"), table)
    (tmp_path / "none.json").write_text(json.dumps({"levels": [], "sessions_held": None}))
    with pytest.raises(VoxlineError, match="no sessions_held"):
        measured_row(tmp_path / "none.json", gpu="Tiny GPU")
    FakeCuda(monkeypatch, free=100 * GIB, total=141 * GIB, name="Tiny GPU")
    monkeypatch.setattr(sizing, "load_table", lambda: load_table(table))
    sized = sizing.sized_for_device(_serve_settings(
        "--device", "cuda", "--tts", f"qwen3:{tts}", "--llm-checkpoint", str(llm)))
    assert sized.max_sessions == 24

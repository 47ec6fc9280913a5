"""Voice cloning through the engine and the API (Qwen3-TTS Base checkpoints).

The Base checkpoint is built here with seeded RANDOM weights (talker, speaker encoder,
codec encoder and decoder): its "clones" are noise, not voices. What is tested is the
plumbing: a reference through the stage equals the model-level clone (itself exact against
qwen-tts, see test_qwen3_tts_voice_clone.py), a cached reference runs neither encoder
again, and the API registers, lists, uses and deletes voices with clear errors.
"""

from __future__ import annotations

import base64
import copy
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import pytest_asyncio
import torch
from fakes import CountingLM, EnergyVAD, FixedASR
from qwen_ref.harness import BASE_MODEL, randomize_
from safetensors.torch import load_file, save_file
from test_qwen3_tts_stage import TEXTS, audio, make_stage, of, run, write_test_checkpoint

from voxline.codecs import wav_bytes
from voxline.codecs.opus import decode_audio_file
from voxline.config import Settings
from voxline.engines import protocol as p
from voxline.engines.client import InProcessEngineClient
from voxline.engines.core import EngineCore, Models
from voxline.engines.models.qwen3_tts import (
    CodecEncoder,
    SpeakerEncoder,
    TalkerGenerator,
    TalkerSampling,
    build_prompt,
    load_config,
    ref_text_ids,
)
from voxline.engines.models.qwen3_tts.reference import normalize_reference
from voxline.engines.models.qwen3_tts.speech_model import Qwen3SpeechModel
from voxline.engines.speech_model import SpeechJob
from voxline.realtime.app import create_app

REF_TEXT = "Fine, thank you!"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _flat_mimi_key(key: str) -> str:
    """transformers 5's nested Mimi names -> the checkpoint's flat ones (CodecEncoder's
    renames, reversed)."""
    for nested, flat in (("encoder.encoder_seanet.layers.", "encoder.layers."),
                         ("encoder.encoder_transformer.", "encoder_transformer."),
                         ("encoder.downsample.", "downsample.")):
        if key.startswith(nested):
            return flat + key[len(nested):]
    return key


def write_base_checkpoint(model_dir: Path, seed: int = 5) -> Path:
    """A random-weight Base checkpoint: the stage test's, plus speaker and codec encoders."""
    from transformers import MimiConfig, MimiModel

    write_test_checkpoint(model_dir, model=copy.deepcopy(BASE_MODEL), seed=seed)
    config = load_config(model_dir)
    spk = SpeakerEncoder(config.speaker_encoder)  # type: ignore[arg-type]
    randomize_(spk, seed + 10)
    weights = load_file(model_dir / "model.safetensors")
    weights.update({f"speaker_encoder.{k}": v.contiguous() for k, v in spk.state_dict().items()})
    save_file(weights, model_dir / "model.safetensors")

    codec_dir = model_dir / "speech_tokenizer"
    codec_cfg = json.loads((codec_dir / "config.json").read_text())
    mimi_cfg = MimiConfig(**codec_cfg["encoder_config"])
    torch.manual_seed(seed + 20)
    mimi = MimiModel(mimi_cfg)
    codec = load_file(codec_dir / "model.safetensors")
    for key, value in mimi.state_dict().items():
        if key.startswith(("decoder", "upsample")):
            continue
        if key.endswith("embed_sum"):  # default init is all zero: every code would be 0
            value = torch.randn(value.shape)
        codec[f"encoder.{_flat_mimi_key(key)}"] = value.contiguous()
    save_file(codec, codec_dir / "model.safetensors")
    return model_dir


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    return write_base_checkpoint(tmp_path_factory.mktemp("qwen3-base") / "model")


def clip(seconds: float = 1.5, rate: int = 16000, peak: float = 1.6, seed: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(len(t))
    wav = np.sin(2 * np.pi * (150 + 30 * seed) * t) + 0.3 * np.sin(2 * np.pi * 900 * t) + 0.1 * noise
    return (peak * wav / np.abs(wav).max()).astype(np.float32)


def reference(x: np.ndarray, rate: int, text: str | None = REF_TEXT,
              name: str | None = None) -> p.VoiceReference:
    return p.VoiceReference(x.astype("<f4").tobytes(), rate, text, name)


class Counted:
    """Counts calls of one method of an object (the encoders)."""

    def __init__(self, obj: object, method: str) -> None:
        self.calls = 0
        inner = getattr(obj, method)

        def wrapped(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        setattr(obj, method, wrapped)


# ------------------------------------------------------------------------------ stage


@pytest.mark.parametrize("ref_text", [REF_TEXT, None], ids=["icl", "xvector"])
def test_stage_clone_equals_model_level_clone(base_dir, ref_text):
    stage = make_stage(base_dir)
    raw = clip()
    outs = run(stage, {0: [SpeechJob(1, TEXTS[1], reference=reference(raw, 16000, ref_text))]})
    got = audio(of(outs, 1))

    model, tok = stage.model, stage.tokenizer
    x = normalize_reference(raw, 16000)  # the model level takes 24 kHz mono in [-1, 1]
    assert len(x) == 36000 and np.abs(x).max() == pytest.approx(1.0)
    assert model.speaker_encoder is not None
    emb = model.speaker_encoder.embed(x)
    codes = CodecEncoder.from_pretrained(base_dir).encode(x) if ref_text else None
    ids = tok.assistant_ids(TEXTS[1])
    assert ids is not None
    prompt = build_prompt(model.talker, model.config, ids, speaker_embedding=emb,
                          ref_ids=ref_text_ids(tok.text_ids(ref_text), tok.chat) if ref_text else None,
                          ref_codes=codes)
    gen = TalkerGenerator(model.talker, max_streams=1, max_len=256)
    (frames,) = gen.generate([prompt], TalkerSampling.greedy(max_frames=24))
    state = model.code2wav.new_state()
    if codes is not None:
        model.code2wav.prime(state, codes.T)
    want = model.code2wav.decode(state, frames.T).numpy()
    assert got.shape == want.shape and np.abs(want).max() > 1e-3
    assert np.abs(got - want).max() <= 1e-4


def test_cached_reference_gives_identical_audio_and_runs_no_encoder(base_dir):
    stage = make_stage(base_dir)
    assert stage.model.speaker_encoder is not None
    spk = Counted(stage.model.speaker_encoder, "embed")
    ref = reference(clip(), 16000)
    first = audio(of(run(stage, {0: [SpeechJob(1, TEXTS[1], reference=ref)]}), 1))
    codec = Counted(stage.codec_encoder, "encode")  # loaded on the first clone
    assert spk.calls == 1
    again = audio(of(run(stage, {0: [SpeechJob(2, TEXTS[1], reference=ref)]}), 2))
    assert np.array_equal(first, again)
    assert (spk.calls, codec.calls) == (1, 0)

    # The same clip registered under a name: found by content, still no encoder run.
    stage.register_voice(reference(clip(), 16000, name="Alice"))
    named = audio(of(run(stage, {0: [SpeechJob(3, TEXTS[1], voice="alice")]}), 3))
    assert np.array_equal(first, named) and (spk.calls, codec.calls) == (1, 0)
    # Unregistered: the name no longer clones (no preset voice on a Base checkpoint).
    stage.register_voice(p.VoiceReference(b"", 24000, None, "alice"))
    assert stage.reference_of(SpeechJob(4, "x", voice="alice")) is None


def test_custom_voice_checkpoint_refuses_to_clone(tmp_path):
    stage = make_stage(write_test_checkpoint(tmp_path / "cv"))
    assert not stage.can_clone
    with pytest.raises(ValueError, match="Base checkpoint"):
        stage.register_voice(reference(clip(), 16000, name="bob"))
    # A job that asks anyway ends with no audio, logged, and other jobs are unaffected.
    outs = run(stage, {0: [SpeechJob(1, TEXTS[1], reference=reference(clip(), 16000)),
                           SpeechJob(2, TEXTS[2])]})
    assert len(audio(of(outs, 1))) == 0 and len(audio(of(outs, 2))) > 0


# ------------------------------------------------------------------------------ API

CLONE_STAGE: dict[str, Qwen3SpeechModel] = {}


def make_clone_core(wake, model_dir: str) -> EngineCore:
    """Stand-in VAD/ASR/LLM around the real random-weight Base speech stage."""
    stage = make_stage(Path(model_dir), max_frames=12)
    CLONE_STAGE["stage"] = stage
    return EngineCore(Models(EnergyVAD(), FixedASR(), CountingLM(), stage), wake)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engine(base_dir):
    client = InProcessEngineClient(f"{__name__}:make_clone_core", {"model_dir": str(base_dir)})
    await client.start()
    yield client
    await client.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(engine, base_dir):
    app = create_app(Settings(tts=f"qwen3:{base_dir}"), engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test",
                                 timeout=120) as c:
        yield c


def clip_wav(seconds: float = 1.5, rate: int = 16000, seed: int = 1) -> bytes:
    return wav_bytes(clip(seconds, rate, peak=0.9, seed=seed), rate)


def assert_error(r: httpx.Response, status: int, param: str | None, needle: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    assert needle in err["message"], err


async def speak(client: httpx.AsyncClient, **body) -> np.ndarray:
    r = await client.post("/v1/audio/speech", json={"input": TEXTS[1], "response_format": "wav",
                                                    **body})
    assert r.status_code == 200, r.text
    return decode_audio_file(r.content)[0]


@pytest.mark.asyncio(loop_scope="module")
async def test_register_list_use_and_delete_a_voice(client):
    stage = CLONE_STAGE["stage"]
    data = clip_wav()
    # Inline reference (a data URL, as vllm-omni takes), then the same clip registered.
    url = "data:audio/wav;base64," + base64.b64encode(data).decode()
    inline = await speak(client, ref_audio=url, ref_text=REF_TEXT)
    assert stage.model.speaker_encoder is not None
    spk = Counted(stage.model.speaker_encoder, "embed")
    codec = Counted(stage.codec_encoder, "encode")
    again = await speak(client, ref_audio=base64.b64encode(data).decode(), ref_text=REF_TEXT)
    assert np.array_equal(inline, again) and (spk.calls, codec.calls) == (0, 0)

    r = await client.post("/v1/voices", data={"name": "narrator", "ref_text": REF_TEXT},
                          files={"audio": ("ref.wav", data, "audio/wav")})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "narrator" and r.json()["duration_seconds"] == 1.5
    r = await client.get("/v1/voices")
    assert [v["name"] for v in r.json()["data"]] == ["narrator"]
    named = await speak(client, voice="narrator")
    assert np.array_equal(inline, named) and (spk.calls, codec.calls) == (0, 0)

    assert_error(await client.post("/v1/voices", data={"name": "narrator"},
                                   files={"audio": ("ref.wav", data, "audio/wav")}),
                 409, "name", "already exists")
    r = await client.delete("/v1/voices/narrator")
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert (await client.get("/v1/voices")).json()["data"] == []
    assert_error(await client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "narrator"}),
                 400, "voice", "does not exist")
    assert_error(await client.delete("/v1/voices/narrator"), 404, "name", "does not exist")


@pytest.mark.asyncio(loop_scope="module")
async def test_a_realtime_session_speaks_with_a_registered_voice(client, engine):
    """The session's voice reaches the engine as a name; the stage clones with it."""
    r = await client.post("/v1/voices", data={"name": "rt-voice"},
                          files={"audio": ("ref.wav", clip_wav(seed=2), "audio/wav")})
    assert r.status_code == 201, r.text
    stage = CLONE_STAGE["stage"]
    spk = Counted(stage.model.speaker_encoder, "embed")
    chunks: list[np.ndarray] = []
    for rid in ("r1", "r2"):
        handle = await engine.open_stream(f"rt-{rid}", p.StreamConfig(turn_detection=None))
        handle.send(p.AddItem(handle.stream_id, "i1", "user", "hello"))
        handle.send(p.CreateResponse(handle.stream_id, rid, "a1",
                                     p.ResponseConfig(voice="rt-voice")))
        got = []
        while True:
            out = await handle.next()
            if isinstance(out, p.AudioChunk):
                got.append(np.frombuffer(out.audio, dtype="<f4"))
            elif isinstance(out, p.ResponseFinished):
                break
        await handle.aclose()
        chunks.append(np.concatenate(got))
    assert spk.calls == 1  # encoded once, on first use; cached for the next response
    assert len(chunks[0]) > 0 and np.array_equal(chunks[0], chunks[1])
    await client.delete("/v1/voices/rt-voice")


@pytest.mark.asyncio(loop_scope="module")
async def test_reference_errors_name_the_field(client):
    short = base64.b64encode(clip_wav(0.5)).decode()
    long = base64.b64encode(clip_wav(31, rate=8000)).decode()
    assert_error(await client.post("/v1/audio/speech", json={"input": "Hi.", "ref_audio": short}),
                 400, "ref_audio", "at least 1 s")
    assert_error(await client.post("/v1/audio/speech", json={"input": "Hi.", "ref_audio": long}),
                 400, "ref_audio", "at most 30 s")
    assert_error(await client.post("/v1/audio/speech", json={"input": "Hi.", "ref_audio": "%%"}),
                 400, "ref_audio", "base64")
    assert_error(await client.post("/v1/audio/speech", json={"input": "Hi.", "ref_text": "x"}),
                 400, "ref_text", "needs 'ref_audio'")
    assert_error(await client.post("/v1/voices", data={"name": "tiny"},
                                   files={"audio": ("r.wav", clip_wav(0.5), "audio/wav")}),
                 400, "audio", "at least 1 s")
    assert_error(await client.post("/v1/voices", data={"name": "bad name!"},
                                   files={"audio": ("r.wav", clip_wav(), "audio/wav")}),
                 400, "name", "letters")
    assert_error(await client.post("/v1/voices", data={"name": "nofile"}), 400, "audio",
                 "required")
    assert (await client.get("/v1/voices")).json()["data"] == []


@pytest.mark.parametrize("tts,needle", [("piper", "(piper) cannot clone"),
                                        ("custom_voice", "custom_voice model")])
@pytest.mark.asyncio(loop_scope="module")
async def test_cloning_needs_a_base_checkpoint(engine, tmp_path, tts, needle):
    if tts == "custom_voice":
        (tmp_path / "config.json").write_text(json.dumps({"tts_model_type": "custom_voice"}))
        tts = f"qwen3:{tmp_path}"
    app = create_app(Settings(tts=tts), engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        ref = base64.b64encode(clip_wav()).decode()
        assert_error(await c.post("/v1/audio/speech", json={"input": "Hi.", "ref_audio": ref}),
                     400, "ref_audio", needle)
        assert_error(await c.post("/v1/voices", data={"name": "v"},
                                  files={"audio": ("r.wav", clip_wav(), "audio/wav")}),
                     400, "audio", needle)


def test_realtime_websocket_session_uses_a_registered_voice(base_dir):
    """Over `/v1/realtime`: `session.audio.output.voice` names the registered voice."""
    from fastapi.testclient import TestClient

    engine = InProcessEngineClient(f"{__name__}:make_clone_core", {"model_dir": str(base_dir)})
    app = create_app(Settings(tts=f"qwen3:{base_dir}"), engine)
    with TestClient(app) as client:
        for _ in range(400):  # the app starts its engine in the background
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        r = client.post("/v1/voices", data={"name": "ws-voice", "ref_text": REF_TEXT},
                        files={"audio": ("ref.wav", clip_wav(seed=3), "audio/wav")})
        assert r.status_code == 201, r.text
        stage = CLONE_STAGE["stage"]
        spk = Counted(stage.model.speaker_encoder, "embed")
        with client.websocket_connect("/v1/realtime") as ws:
            assert ws.receive_json()["type"] == "session.created"
            ws.send_json({"type": "session.update", "session": {
                "type": "realtime", "audio": {"output": {"voice": "ws-voice"}}}})
            ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "hello"}]}})
            ws.send_json({"type": "response.create"})
            deltas = 0
            while True:
                event = ws.receive_json()
                assert event["type"] != "error", event
                deltas += event["type"] == "response.output_audio.delta"
                if event["type"] == "response.done":
                    break
        assert event["response"]["status"] == "completed" and deltas > 0
        assert spk.calls == 1  # the registered clip, encoded on first use

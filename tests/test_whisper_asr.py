"""The Whisper ASR path (`asr=whisper:DIR`) on a tiny random-weight checkpoint built here.

Random weights transcribe garbage, so behaviour is asserted: the forced language token
and the prompt reach the decoder, transcripts are deterministic and the same batched as
one by one, the ASR stage batches jobs of one kind, an engine turn is transcribed with
the stream's options, and sessions accept or refuse language / prompt by the server's ASR.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, ToneTTS, tone
from test_engine_core import has
from tiny_whisper import build_tiny_whisper

from voxline.config import Settings
from voxline.engines import protocol as p
from voxline.engines.asr_stage import ASRJob, ASRStage, TranscriptionOptions
from voxline.engines.core import EngineCore, Models
from voxline.engines.factory import load_asr
from voxline.engines.models.whisper_asr import WhisperASR
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.errors import ProtocolError
from voxline.realtime.session_host import SessionLimits, transcription_support
from voxline.sessions.capabilities import check_supported, stream_config
from voxline.sessions.settings import SessionSettings

pytest.importorskip("transformers")

RNG = np.random.default_rng(7)
CLIPS = [(RNG.standard_normal(n) * 0.1).astype(np.float32) for n in (16000, 9600, 24000)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "tiny")


@pytest.fixture(scope="module")
def asr(checkpoint) -> WhisperASR:
    model = load_asr(Settings(asr=f"whisper:{checkpoint}"), threads=1)  # the real path
    assert isinstance(model, WhisperASR)
    return model


def token(asr: WhisperASR, text: str) -> int:
    return asr.processor.tokenizer.convert_tokens_to_ids(text)


def first_decoder_inputs(asr: WhisperASR, run) -> list[list[int]]:
    """The decoder's input ids on its first call (the prompt it starts from) during `run`."""
    seen: list[list[list[int]]] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and not seen:
            seen.append(ids.tolist())

    handle = asr.model.model.decoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen[0]


def test_the_language_is_forced_as_the_decoder_language_token(asr):
    for lang in ("fr", "de"):
        ids = first_decoder_inputs(
            asr, lambda lang=lang: asr.transcribe_many(CLIPS[:1], [TranscriptionOptions(lang)]))
        assert ids[0][:4] == [token(asr, "<|startoftranscript|>"), token(asr, f"<|{lang}|>"),
                              token(asr, "<|transcribe|>"), token(asr, "<|notimestamps|>")]


def test_the_prompt_is_passed_as_prompt_ids_before_the_start_token(asr):
    opts = TranscriptionOptions("en", "hello there table")
    kwargs = asr.generate_kwargs(CLIPS[:1], opts)
    expected = asr.processor.get_prompt_ids("hello there table", return_tensors="pt")
    assert kwargs["prompt_ids"].tolist() == expected.tolist()
    assert kwargs["language"] == "en" and kwargs["task"] == "transcribe"
    ids = first_decoder_inputs(asr, lambda: asr.transcribe_many(CLIPS[:1], [opts]))
    sot = ids[0].index(token(asr, "<|startoftranscript|>"))
    assert ids[0][:sot] == expected.tolist()  # <|startofprev|> + the prompt's tokens
    assert expected.tolist()[0] == token(asr, "<|startofprev|>") and len(expected) > 1
    assert ids[0][sot + 1] == token(asr, "<|en|>")


def test_a_long_prompt_keeps_its_end_within_half_the_context(asr):
    ids = asr.prompt_ids(" ".join(["hello there"] * 100))
    assert len(ids) == asr.context // 2 - 1
    assert ids[0] == token(asr, "<|startofprev|>")


def test_transcripts_are_deterministic_and_batching_gives_the_same_text(asr, checkpoint):
    opts = [TranscriptionOptions("en"), TranscriptionOptions("fr", "bonjour"),
            TranscriptionOptions("en")]
    batched = asr.transcribe_many(CLIPS, opts)
    one_by_one = [asr.transcribe_many([c], [o])[0] for c, o in zip(CLIPS, opts, strict=True)]
    assert batched == one_by_one
    assert any(batched)  # garbage, but text
    again = WhisperASR.load(str(checkpoint)).transcribe_many(CLIPS, opts)
    assert again == batched
    assert asr.transcribe(CLIPS[0]) == asr.transcribe(CLIPS[0])
    assert asr.transcribe(np.zeros(800, np.float32)) == ""  # under 0.1 s


def test_an_unknown_language_names_the_checkpoints_languages(asr):
    with pytest.raises(ValueError, match="'es'.*de, en, fr"):
        asr.transcribe_many(CLIPS[:1], [TranscriptionOptions("es")])


class BatchCounter:
    """A batched model that records each call's clips and options."""

    max_batch = 3

    def __init__(self) -> None:
        self.calls: list[list[TranscriptionOptions]] = []

    def transcribe(self, audio: np.ndarray) -> str:
        return self.transcribe_many([audio], [TranscriptionOptions()])[0]

    def transcribe_many(self, clips, options) -> list[str]:
        self.calls.append(list(options))
        return [f" {len(c)} " for c in clips]


def test_the_stage_batches_jobs_of_one_kind_up_to_max_batch():
    model = BatchCounter()
    stage = ASRStage(model)
    audio = np.zeros(1600, np.float32)
    for i in range(4):
        stage.add(ASRJob(i, f"p{i}", audio, final=False, options=TranscriptionOptions("fr")))
    stage.add(ASRJob(9, "f9", audio, final=True))
    first = stage.schedule()
    assert [j.item_id for j in first] == ["f9"]  # a final never waits behind partials
    second = stage.schedule()
    assert [j.item_id for j in second] == ["p0", "p1", "p2"]
    assert stage.update(second, stage.execute(second)) == ["1600"] * 3
    assert model.calls[-1] == [TranscriptionOptions("fr")] * 3
    assert [j.item_id for j in stage.schedule()] == ["p3"] and not stage.has_work()


def test_a_one_clip_model_still_runs_one_job_a_plan():
    class One:
        def transcribe(self, audio):
            return "x"

    stage = ASRStage(One())
    for i in range(2):
        stage.add(ASRJob(i, f"p{i}", np.zeros(10, np.float32), final=False))
    assert len(stage.schedule()) == 1


class WhisperEngine(CoreDriver):
    def __init__(self, asr: WhisperASR) -> None:
        super().__init__()
        self.core = EngineCore(Models(EnergyVAD(), asr, CountingLM(),
                                      SentenceSpeechModel(ToneTTS())), self.woke.set)


def test_the_engine_transcribes_a_turn_with_the_streams_language(asr):
    h = WhisperEngine(asr)
    try:
        cfg = p.StreamConfig(transcription_language="fr", transcription_prompt="bonjour")
        h.send(p.OpenStream("s1", cfg))
        audio = np.concatenate([np.zeros(8000, np.float32), tone(0.6),
                                np.zeros(16000, np.float32)])
        ids = first_decoder_inputs(asr, lambda: (
            h.send(p.AppendAudio("s1", audio.astype("<f4").tobytes())),
            h.run_until(has(p.TranscriptFinal), timeout=60)))
        final, = h.of(p.TranscriptFinal)
        assert final.stream_id == "s1" and isinstance(final.text, str)
        assert token(asr, "<|fr|>") in ids[0] and ids[0][0] == token(asr, "<|startofprev|>")
    finally:
        h.close()


# ------------------------------------------------------------------ session capabilities

LANGUAGE = "session.audio.input.transcription.language"
PROMPT = "session.audio.input.transcription.prompt"


def transcription(**fields) -> SessionSettings:
    return SessionSettings().apply({"audio": {"input": {"transcription": {
        "model": "whisper-1", **fields}}}})


@pytest.mark.parametrize(("fields", "param"), [({"language": "fr"}, LANGUAGE),
                                               ({"prompt": "names"}, PROMPT)])
def test_moonshine_refuses_language_and_prompt_naming_the_field_and_the_asr_that_can(
        fields, param):
    with pytest.raises(ProtocolError) as caught:
        check_supported(transcription(**fields))  # the default: the server runs Moonshine
    assert caught.value.param == param
    assert "Moonshine" in str(caught.value) and "--asr whisper:" in str(caught.value)
    check_supported(transcription(language="en"))  # English is what it does


def test_a_whisper_server_accepts_its_languages_and_a_prompt(checkpoint):
    settings = Settings(asr=f"whisper:{checkpoint}")
    support = SessionLimits.from_settings(settings).transcription
    assert support == transcription_support(settings)
    assert sorted(support.languages) == ["de", "en", "fr"] and support.prompt
    session = transcription(language="fr", prompt="bonjour")
    check_supported(session, transcription=support)
    cfg = stream_config(session)
    assert (cfg.transcription_language, cfg.transcription_prompt) == ("fr", "bonjour")
    with pytest.raises(ProtocolError, match="'es'.*'de', 'en', 'fr'") as caught:
        check_supported(transcription(language="es"), transcription=support)
    assert caught.value.param == LANGUAGE



"""Token log-probabilities of transcripts (``include: ["item.input_audio_transcription.logprobs"]``):
every shipped ASR scores each greedy pick against the logits it was picked from, the engine
carries them as plain data, and the session splits them over its deltas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from speech import espeak
from tiny_whisper import build_tiny_whisper

from voxline.engines.asr_stage import ASRJob, ASRStage
from voxline.engines.models.asr_pool import ConcurrentASR
from voxline.engines.models.asr_tokens import ScoredTranscript, TokenLogprob, pick_logprob
from voxline.engines.models.moonshine_asr import MoonshineASR
from voxline.engines.models.whisper_asr import TranscriptionOptions, WhisperASR
from voxline.sessions.transcription import PartialTranscript, tokens_of_words, word_count

QUESTION = "What is the capital of France?"


def sane(tokens: tuple[TokenLogprob, ...], vocab: int) -> None:
    """A greedy pick is the most likely token: probability in [1/vocab, 1]."""
    assert tokens
    for t in tokens:
        assert math.isfinite(t.logprob)
        assert -math.log(vocab) - 1e-4 <= t.logprob <= 1e-6
        assert t.token == t.bytes.decode("utf-8", errors="replace")


def test_pick_logprob_is_the_softmax_of_the_pick() -> None:
    logits = np.array([1.0, 3.0, 2.0], np.float32)
    pick, logprob = pick_logprob(logits)
    probs = np.exp(logits) / np.exp(logits).sum()
    assert pick == 1 and logprob == pytest.approx(math.log(probs[1]))


@pytest.fixture(scope="module")
def moonshine() -> MoonshineASR:
    return MoonshineASR.load()


def test_moonshine_onnxruntime_scores_its_tokens(moonshine: MoonshineASR) -> None:
    audio = espeak(QUESTION)
    plain = moonshine.transcribe(audio)
    scored = moonshine.transcribe_scored(audio)  # drafted from the take before: same scores
    again = moonshine.transcribe_scored(audio)
    assert scored.text == plain == again.text
    assert "capital" in plain.lower()
    sane(scored.tokens, len(moonshine.tokenizer))
    # the tokens are the transcript, and a clear recording is mostly confident
    assert "".join(t.token for t in scored.tokens).strip() == scored.text
    assert [t.token for t in again.tokens] == [t.token for t in scored.tokens]
    assert [t.logprob for t in again.tokens] == pytest.approx([t.logprob for t in scored.tokens],
                                                               abs=1e-4)
    assert sum(math.exp(t.logprob) for t in scored.tokens) / len(scored.tokens) > 0.5


def test_the_pool_scores_side_by_side(moonshine: MoonshineASR) -> None:
    clips = [espeak(QUESTION), espeak("Good morning.")]
    pooled = ConcurrentASR(moonshine, workers=2)
    out = pooled.transcribe_many_scored(clips, [TranscriptionOptions()] * 2)
    assert [o.text for o in out] == [moonshine.transcribe(c) for c in clips]
    for o in out:
        sane(o.tokens, len(moonshine.tokenizer))


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> WhisperASR:
    return WhisperASR.load(str(build_tiny_whisper(tmp_path_factory.mktemp("whisper"))))


def test_tiny_whisper_scores_each_row_of_a_batch(whisper: WhisperASR) -> None:
    rng = np.random.default_rng(0)
    clips = [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in (16000, 32000)]
    opts = [TranscriptionOptions("en"), TranscriptionOptions("en", prompt="hello there")]
    scored = whisper.transcribe_many_scored(clips, opts)
    assert [s.text for s in scored] == whisper.transcribe_many(clips, opts)
    vocab = whisper.model.config.vocab_size
    for s in scored:
        sane(s.tokens, vocab)
        assert b"".join(t.bytes for t in s.tokens).decode("utf-8", "replace").strip() == s.text
    alone = whisper.transcribe_many_scored(clips[:1], opts[:1])[0]
    assert [t.logprob for t in alone.tokens] == pytest.approx(
        [t.logprob for t in scored[0].tokens], abs=1e-4)


def test_the_stage_keeps_tokens_for_the_jobs_that_ask(whisper: WhisperASR) -> None:
    stage = ASRStage(whisper)
    clip = (np.random.default_rng(1).standard_normal(16000) * 0.1).astype(np.float32)
    asks = ASRJob("s1", "item_1", clip, final=True, logprobs=True)
    plain = ASRJob("s2", "item_2", clip, final=True)
    for job in (asks, plain):
        stage.add(job)
    plan = stage.schedule()
    assert plan == [asks, plain]
    texts = stage.update(plan, stage.execute(plan))
    assert texts[0] == texts[1] and asks.tokens and plain.tokens is None
    # nobody asks: the plain path, no scores made
    stage.add(again := ASRJob("s2", "item_3", clip, final=True))
    plan = stage.schedule()
    out = stage.execute(plan)
    assert not isinstance(out[0], ScoredTranscript) and again.tokens is None


def _toks(*pieces: str) -> list[TokenLogprob]:
    return [TokenLogprob(p, -0.1 * i, p.encode()) for i, p in enumerate(pieces)]


def test_tokens_are_split_over_the_words_of_each_delta() -> None:
    tokens = _toks(" What", " is", " the", " capit", "al", " of", " France", "?")
    assert [t.token for t in tokens_of_words(tokens, 0, 2)] == [" What", " is"]
    assert [t.token for t in tokens_of_words(tokens, 3, 4)] == [" capit", "al"]
    assert [t.token for t in tokens_of_words(tokens, 5, 6)] == [" France", "?"]
    # deltas from agreeing hypotheses: each word's tokens go out exactly once
    partial = PartialTranscript()
    sent: list[str] = []
    for hyp in ("What is the", "What is the capital of", "What is the capital of France?"):
        before = word_count(partial.sent)
        partial.delta(hyp)
        sent += [t.token for t in tokens_of_words(tokens, before, word_count(partial.sent))]
    before = word_count(partial.sent)
    partial.final_delta("What is the capital of France?")
    sent += [t.token for t in tokens_of_words(tokens, before, word_count(partial.sent))]
    assert sent == [t.token for t in tokens]


"""Turn routing, in one home: input audio -> VAD frames -> turns -> ASR jobs -> transcripts.

Each stream's audio goes to the VAD stage (server turn detection) or straight into its
manual-commit buffer. VAD frames drive the stream's `InputAudio`, whose turn events
become `VoiceStarted`/`VoiceStopped` and ASR jobs: partials while the user speaks, a
pause transcript when a pause lasts `pause_ms`, and the final one when the turn ends.

A turn's final transcript comes from exactly one job: the final job, or the pause job
when no speech followed the pause (its transcript is reused when it is already in, or
becomes the final when it lands). Every final counted in `stream.pending_finals` lands
exactly once, transcribed or failed, so a response waiting for it always starts. A pause
transcript feeds semantic turn detection and may start a speculative reply
(`Responses.speculate`); one made stale by speech resuming (an older `generation`) is
void, and a failed one just means no speculation. Under semantic turn detection a pause
also goes to the end-of-turn model when one is loaded (`end_of_turn_stage`), whose
verdict joins the words' in the stream's `TurnDetector`; a stale or failed one is
ignored (the words decide alone).

The pause transcript is taken early: where the turn's speech falls silent (`SpeechEnded`,
one 32 ms VAD frame into the silence), before a pause can be reported, the turn so far
goes to ASR as an *early take* (`EarlyTake`). When the pause comes with no voice since that frame
(the detector's last voice unchanged), the take is the pause transcript: already in, the
pause needs no ASR at all; still running, the pause waits for it (moved ahead of the
partials). Otherwise (voice since, or early takes off) the pause is transcribed as it
stands. Either way the pause transcript is exactly a plain transcription of the audio its
job held (the utterance through the take's frame, or through the pause's), and it is the
turn's final transcript when no speech follows. Moonshine's encoder is not incremental:
a take is the whole utterance so far, only started earlier. A take replaces the turn's
queued partials and stops a running one early (it covers them); made stale by voice, it
is dropped unrun if still queued (`ASRJob.early`), and reports as a partial if it ran.

Under semantic turn detection the take can also start the reply (`early_speculation`):
when it lands with words that end a sentence (`end_of_turn.leans_complete`) and no voice
since, the speculative reply starts at once, before the pause is reported, so its first
segment and audio are made while the pause is still being judged. It answers exactly the
take's text, which is the pause transcript (and the final one) as long as no voice
follows; voice before the pause (a gap between words, a breath) makes the take stale and
discards the speculation unsent, as speech after the pause does (`TurnResumed`). The
end-of-turn model is not asked this early: its verdict 30-100 ms into a silence swings
(complete questions in the Piper voice from 0.03 to 0.99), so it judges the pause as
before and only the words gate the early start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voxline.engines import end_of_turn
from voxline.engines import protocol as p
from voxline.engines.asr_stage import ASRJob, ASRStage, TranscriptionOptions
from voxline.engines.end_of_turn_stage import EndOfTurnJob, EndOfTurnStage
from voxline.engines.input_audio import (
    PartialDue,
    SpeechEnded,
    TurnPaused,
    TurnResumed,
    TurnStarted,
    TurnStopped,
    Utterance,
)
from voxline.engines.models.asr_tokens import TokenLogprob
from voxline.engines.responses import Responses
from voxline.engines.stage import StreamId
from voxline.engines.streams import StreamRegistry, StreamState
from voxline.engines.trace import trace
from voxline.engines.vad_stage import VADFrame, VADPlan, VADStage
from voxline.engines.warm_prefill import WarmPrefills

logger = logging.getLogger(__name__)

# With speculation off, semantic turn detection still transcribes pauses this long.
SEMANTIC_PAUSE_MS = 160.0


def transcription_options(config: p.StreamConfig) -> TranscriptionOptions:
    """The stream's transcription language and prompt, as its ASR jobs carry them."""
    return TranscriptionOptions(config.transcription_language, config.transcription_prompt)


def asr_job(stream: StreamState, item_id: str, audio: np.ndarray, **kw: object) -> ASRJob:
    """A job over `audio` of the stream's turn `item_id`, with the stream's transcription
    options and its wish for token log-probabilities."""
    return ASRJob(stream.internal_id, item_id, audio,  # type: ignore[arg-type]
                  options=transcription_options(stream.config),
                  logprobs=stream.config.transcription_logprobs, **kw)


def wire_tokens(tokens: tuple[TokenLogprob, ...] | None) -> list[p.TokenLogprob] | None:
    """A transcript's tokens as the engine's outputs carry them (None: not asked for)."""
    if tokens is None:
        return None
    return [p.TokenLogprob(t.token, t.logprob, t.bytes) for t in tokens]


@dataclass
class EarlyTake:
    """A transcription of the turn at the frame its speech fell silent (`SpeechEnded`)."""

    utterance: Utterance
    job: ASRJob
    voice_ms: float  # the detector's last voiced frame then: the take is fresh while it holds
    text: str | None = None  # once landed
    asr_ms: float = 0.0
    tokens: tuple[TokenLogprob, ...] | None = None  # its log-probabilities, if asked for
    speculated: bool = False  # it started a speculative reply before any pause


class Turns:
    """Routes every stream's input audio through VAD and ASR; outputs go to `emit`.

    `speculate_after_ms` (0: off): a pause this long starts a speculative reply, while
    fewer than `max_responses` are in progress (never at the cost of running ones).
    `end_of_turn` (None: rules over the words alone) hears semantic-VAD pauses.
    `warm` (None: off) prefills the reply's prompt from each partial transcript.
    `early_pause`: take the pause transcript where the speech fell silent (see above).
    `early_speculation`: under semantic turn detection, such a take whose words end a
    sentence starts the speculative reply before the pause (see above).
    """

    def __init__(self, registry: StreamRegistry, vad: VADStage, asr: ASRStage,
                 responses: Responses, emit: Callable[[p.EngineOutput], None],
                 speculate_after_ms: float, max_responses: int,
                 end_of_turn: EndOfTurnStage | None = None,
                 warm: WarmPrefills | None = None, early_pause: bool = True,
                 early_speculation: bool = True) -> None:
        self.registry = registry
        self.early_pause = early_pause
        self.early_speculation = early_speculation
        self._takes: dict[StreamId, EarlyTake] = {}  # each stream's latest early take
        self.warm = warm
        self.end_of_turn = end_of_turn
        self.vad = vad
        self.asr = asr
        self.responses = responses
        self._emit = emit
        self.speculate_after_ms = speculate_after_ms
        self.max_responses = max_responses

    def _error(self, stream: StreamState, message: str, code: p.ErrorCode) -> None:
        self._emit(p.StreamError(stream.external_id, message, code))

    # ----------------------------------------------------------------------- inputs

    def pause_ms(self, config: p.StreamConfig) -> float:
        """How long a pause in a turn must last before it is transcribed: to speculate, or
        for semantic turn detection to judge the words (0: never)."""
        td = config.turn_detection
        if td is None:
            return 0.0
        if self.speculate_after_ms > 0:
            return self.speculate_after_ms
        return SEMANTIC_PAUSE_MS if td.eagerness is not None else 0.0

    def opened(self, stream: StreamState) -> None:
        self.vad.add_stream(stream.internal_id, enabled=stream.input.detector is not None)
        self.vad.set_noise_reduction(stream.internal_id, stream.config.noise_reduction)

    def configure(self, stream: StreamState, config: p.StreamConfig) -> None:
        """New stream settings: its turn detection (VAD on or off) and pause length."""
        stream.input.pause_ms = self.pause_ms(config)
        stream.input.configure(config.turn_detection)
        self.vad.enable(stream.internal_id, stream.input.detector is not None)
        self.vad.set_noise_reduction(stream.internal_id, config.noise_reduction)

    def append(self, stream: StreamState, audio: np.ndarray) -> None:
        """Audio for VAD, or (manual turns) for the buffer; raises `RequestRefused` past
        either one's bound, keeping none of it."""
        if stream.input.detector is None:  # denoised here; VAD's frames as they are framed
            stream.input.append_manual(self.vad.denoise(stream.internal_id, audio))
        else:
            self.vad.append(stream.internal_id, audio)

    def commit(self, stream: StreamState, item_id: str) -> None:
        utt = stream.input.commit()
        self._queue_final(stream, item_id, utt.audio())

    def clear(self, stream: StreamState) -> None:
        self.vad.clear(stream.internal_id)
        stream.input.clear()

    def closed(self, stream: StreamState) -> None:
        """Forget a closing stream's queued audio and jobs (a running job is void)."""
        self.asr.drop(stream.internal_id)
        self._takes.pop(stream.internal_id, None)
        if self.end_of_turn is not None:
            self.end_of_turn.drop(stream.internal_id)
        self.vad.remove_stream(stream.internal_id)

    # -------------------------------------------------------------------- VAD slot

    def on_frames(self, plan: VADPlan, frames: list[VADFrame], seconds: float) -> None:
        for frame in frames:
            stream = self.registry.live(frame.stream_id)
            if stream is not None and stream.input.detector is not None:
                self._on_frame(stream, frame.frame, frame.prob)

    def vad_failed(self, plan: VADPlan, error: Exception) -> None:
        self.vad.drop(plan)
        for sid in plan.stream_ids:
            if (stream := self.registry.live(sid)) is not None:
                self._error(stream, f"voice activity detection failed: {error}; the audio "
                            "waiting for it was discarded", p.ErrorCode.VAD_ERROR)

    def _on_frame(self, stream: StreamState, frame: np.ndarray, prob: float) -> None:
        cfg = stream.config
        turn = stream.input.on_frame(frame, prob, cfg.transcribe_partials, cfg.partial_interval_ms)
        sid = stream.external_id
        match turn:
            case TurnStarted():
                self._takes.pop(stream.internal_id, None)
                self.responses.discard_speculation(stream)  # (a lingering one: never asked for)
                self._emit(p.VoiceStarted(sid, int(turn.audio_start_ms), turn.utterance.item_id))
            case TurnStopped():
                trace(stream.internal_id, "turn_stopped")
                utt = turn.utterance
                self._takes.pop(stream.internal_id, None)  # (one in flight knows its pause)
                self._emit(p.VoiceStopped(sid, int(turn.audio_end_ms), utt.item_id))
                if utt.pause_text is not None:  # no speech since the pause: it is the final
                    self._final_transcript(stream, utt.item_id, utt.pause_text, utt.pause_asr_ms,
                                           utt.pause_tokens)
                elif utt.pause_asr:  # the pause transcript becomes the final when it lands
                    utt.ended = True
                    stream.pending_finals += 1
                else:
                    self._queue_final(stream, utt.item_id, utt.audio())
            case SpeechEnded() if self.early_pause:
                trace(stream.internal_id, "speech_ended")
                self._take_early(stream, turn.utterance)
            case TurnPaused():
                trace(stream.internal_id, "paused")
                self._paused(stream, turn.utterance)
            case TurnResumed():
                self.responses.discard_speculation(stream)
            case PartialDue():
                utt = turn.utterance
                self.asr.add(asr_job(stream, utt.item_id, utt.audio(), final=False))
        take = self._takes.get(stream.internal_id)
        if take is not None and take.speculated:
            self._check_early_speculation(stream, take)

    def _check_early_speculation(self, stream: StreamState, take: EarlyTake) -> None:
        """Voice before the pause made the take that speculated stale: the reply answered
        words the turn has outgrown (after the pause, `TurnResumed` governs)."""
        det = stream.input.detector
        if det is None or det.paused:
            return
        if self._fresh_take(stream, take.utterance) is not take:
            take.speculated = False
            trace(stream.internal_id, "early_speculation_stale")
            self.responses.discard_speculation(stream)

    def _paused(self, stream: StreamState, utt: Utterance) -> None:
        """The pause transcript: the fresh early take (landed, or waited for), else a job
        over the turn as it stands."""
        utt.pause_asr = True
        audio = utt.audio()
        self._hear_pause(stream, utt, audio)
        take = self._fresh_take(stream, utt)
        if take is None:
            self.asr.add(asr_job(stream, utt.item_id, audio, final=False, pause=utt,
                                 generation=utt.generation))
        elif take.text is not None:
            self._pause_text(stream, utt, take.text, take.asr_ms, take.tokens)
        else:  # it lands as this pause's transcript (`on_transcript`)
            take.job.pause, take.job.generation = utt, utt.generation
            self.asr.promote(take.job)

    def _take_early(self, stream: StreamState, utt: Utterance) -> None:
        """Transcribe the turn where its speech fell silent (see the module docstring)."""
        assert stream.input.detector is not None
        job = asr_job(stream, utt.item_id, utt.audio(), final=False)
        take = EarlyTake(utt, job, stream.input.detector.voiced_until_ms)
        self._takes[stream.internal_id] = take

        def wanted() -> bool:  # as a pause transcript, or still able to become one
            if job.pause is not None:
                return job.generation == utt.generation
            return self._fresh_take(stream, utt) is take

        job.early = wanted
        if self.asr.drop_partials(stream.internal_id):  # it covers them, and lands sooner
            utt.partial_queued = False
        self.asr.add(job)

    def _fresh_take(self, stream: StreamState, utt: Utterance) -> EarlyTake | None:
        """The stream's early take of `utt`, if no voice has come since it was taken."""
        take = self._takes.get(stream.internal_id)
        det = stream.input.detector
        if (take is None or take.utterance is not utt or stream.input.utterance is not utt
                or det is None or det.voiced_until_ms != take.voice_ms):
            return None
        return take

    def _hear_pause(self, stream: StreamState, utt: Utterance, audio: np.ndarray) -> None:
        """Semantic turn detection with a model: it judges the pause beside the words."""
        td = stream.config.turn_detection
        if self.end_of_turn is not None and td is not None and td.eagerness is not None:
            self.end_of_turn.add(EndOfTurnJob(stream.internal_id, utt, utt.generation, audio))
            if stream.input.detector is not None:
                stream.input.detector.expect_sound()

    def _queue_final(self, stream: StreamState, item_id: str, audio: np.ndarray) -> None:
        stream.pending_finals += 1
        self.asr.add(asr_job(stream, item_id, audio, final=True))

    # -------------------------------------------------------------------- ASR slot

    def on_transcript(self, job: ASRJob, text: str, seconds: float) -> None:
        stream = self.registry.live(job.stream_id)
        if stream is None:
            return  # closed meanwhile
        trace(stream.internal_id, "asr_landed", model_ms=round(seconds * 1000), kind=job.kind)
        if job.pause is not None:
            self._pause_transcribed(stream, job, text, seconds)
        elif job.final:
            self._final_transcript(stream, job.item_id, text, seconds * 1000, job.tokens)
            self.responses.transcript_landed(stream)
        elif job.early is not None:
            self._take_landed(stream, job, text, seconds)
        else:
            utt = stream.input.utterance
            if utt is not None and utt.item_id == job.item_id:
                utt.partial_queued = False
                if text:
                    self._emit(p.TranscriptPartial(stream.external_id, job.item_id, text,
                                                   wire_tokens(job.tokens)))
                    if self.warm is not None:
                        self.warm.partial(stream, job.item_id, text)

    def _take_landed(self, stream: StreamState, job: ASRJob, text: str, seconds: float) -> None:
        """An early take landed before any pause: kept for one, and a partial meanwhile."""
        take = self._takes.get(stream.internal_id)
        if take is not None and take.job is job:
            take.text, take.asr_ms, take.tokens = text, seconds * 1000, job.tokens
            self._speculate_early(stream, take)
        utt = stream.input.utterance
        if text and stream.config.transcribe_partials and utt is not None \
                and utt.item_id == job.item_id:
            self._emit(p.TranscriptPartial(stream.external_id, job.item_id, text,
                                           wire_tokens(job.tokens)))
            if self.warm is not None:
                self.warm.partial(stream, job.item_id, text)

    def _speculate_early(self, stream: StreamState, take: EarlyTake) -> None:
        """Semantic turn detection: a fresh take whose words end a sentence starts the
        reply now rather than at the pause (see the module docstring)."""
        td = stream.config.turn_detection
        det = stream.input.detector
        if (not self.early_speculation or self.speculate_after_ms <= 0 or td is None
                or td.eagerness is None or det is None or det.paused or not take.text
                or self._fresh_take(stream, take.utterance) is not take
                or self.responses.in_progress() >= self.max_responses):
            return
        if not end_of_turn.leans_complete(end_of_turn.ending(take.text), None):
            return
        if self.responses.speculate(stream, take.utterance.item_id, take.text):
            take.speculated = True
            trace(stream.internal_id, "early_speculation")

    def asr_failed(self, job: ASRJob, error: Exception) -> None:
        """A failed final lands as failed; a failed partial, early take or pause transcript
        is only missing (unless the turn ended meanwhile: then the pause one was its final)."""
        stream = self.registry.live(job.stream_id)
        if stream is None:
            return
        take = self._takes.get(stream.internal_id)
        if take is not None and take.job is job and job.pause is None:
            del self._takes[stream.internal_id]  # no pause waits for a take that failed
        utt = job.pause
        if utt is not None:
            if job.generation != utt.generation:
                return  # speech resumed after the pause: void
            utt.pause_asr = False
            if not utt.ended:
                return  # a failed pause transcript just means no speculation
        self._error(stream, f"transcription failed: {error}", p.ErrorCode.ASR_ERROR)
        if job.final or utt is not None:
            self.responses.transcript_landed(stream)

    def _final_transcript(self, stream: StreamState, item_id: str, text: str,
                          asr_ms: float, tokens: tuple[TokenLogprob, ...] | None = None) -> None:
        """The user item joins the conversation (a speculation may have added it already)."""
        if text and not stream.conversation.has(item_id):
            self.responses.conversation_changed(stream)
            stream.conversation.add(item_id, "user", text)
        self.responses.turn_ended(stream, item_id)
        self._emit(p.TranscriptFinal(stream.external_id, item_id, text, asr_ms,
                                     wire_tokens(tokens)))

    def _pause_transcribed(self, stream: StreamState, job: ASRJob, text: str,
                           seconds: float) -> None:
        """The final transcript if the turn ended meanwhile; else the words semantic turn
        detection judges and a speculative reply starts from."""
        utt = job.pause
        assert utt is not None
        if job.generation != utt.generation:
            return  # speech resumed after the pause: void
        self._pause_text(stream, utt, text, seconds * 1000, job.tokens)

    def _pause_text(self, stream: StreamState, utt: Utterance, text: str, asr_ms: float,
                    tokens: tuple[TokenLogprob, ...] | None = None) -> None:
        utt.pause_asr = False
        if utt.ended:
            self._final_transcript(stream, utt.item_id, text, asr_ms, tokens)
            self.responses.transcript_landed(stream)
            return
        utt.pause_text, utt.pause_asr_ms, utt.pause_tokens = text, asr_ms, tokens
        if stream.input.utterance is utt and stream.input.detector is not None:
            stream.input.detector.judge(text)
            trace(stream.internal_id, "words_judged", silence_ms=stream.input.detector.silence_ms)
        if self.speculate_after_ms > 0 and self.responses.in_progress() < self.max_responses:
            self.responses.speculate(stream, utt.item_id, text)

    # ------------------------------------------------------------- end-of-turn slot

    def on_turn_end_heard(self, job: EndOfTurnJob, probability: float, seconds: float) -> None:
        """The model's verdict on a pause joins the words' (if that pause still lasts)."""
        stream = self.registry.live(job.stream_id)
        if stream is None or stream.input.detector is None:
            return
        utt = job.utterance
        if stream.input.utterance is utt and job.generation == utt.generation:
            stream.input.detector.hear(probability)
            trace(stream.internal_id, "sound_heard", probability=round(probability, 3),
                  silence_ms=stream.input.detector.silence_ms)

    def turn_end_failed(self, job: EndOfTurnJob, error: Exception) -> None:
        """A failed verdict is only missing: the words decide that pause alone (logged by
        the stage table)."""
        stream = self.registry.live(job.stream_id)
        if stream is None or stream.input.detector is None:
            return
        if stream.input.utterance is job.utterance and job.generation == job.utterance.generation:
            stream.input.detector.sound_failed()

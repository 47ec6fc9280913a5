"""Replies' speech: their text segments to the TTS stage, its audio back to the caller.

A run's segments are spoken one at a time in order; a stage that takes streaming text
(`TTSStage.streams_text`) speaks the whole reply as one job, each segment appended to it
as it closes (one talker stream per reply, no fresh prefill per clause). Each audio chunk
extends the run's audio spans (what `truncate` later cuts) and its generated length,
which `PlayoutPacing` holds the run by. `route_speech` / `fail_speech` are the TTS row of
the engine's stage table.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from voxline.engines import protocol as p
from voxline.engines.conversation import AudioSpan
from voxline.engines.response_run import ResponseBook, ResponseRun
from voxline.engines.speech_model import SpeechOut
from voxline.engines.speech_pacing import PlayoutPacing
from voxline.engines.streams import StreamState
from voxline.engines.trace import trace
from voxline.engines.tts_stage import SpeechOwner, TTSPlan, TTSStage


class ReplySpeech:
    """The TTS half of the runs in `book`; `finish_if_done(stream)` ends a stream's
    response once its text and audio are all out."""

    def __init__(self, tts: TTSStage, book: ResponseBook, pacing: PlayoutPacing,
                 finish_if_done: Callable[[StreamState], None]) -> None:
        self.tts = tts
        self.book = book
        self.pacing = pacing
        self._finish_if_done = finish_if_done

    def speech_ready(self) -> bool:
        """Some response has a segment for the TTS stage."""
        return any(run.speech_ready for run in self.book.runs.values())

    def stop(self, run: ResponseRun) -> None:
        """Drop the run's unspoken segments and cancel the one being spoken."""
        run.tts_queue.clear()
        if run.tts_job is not None:
            self.tts.cancel(run.tts_job)
            run.tts_job = None
            run.tts_open = False

    def start_speech(self) -> None:
        """Hand every response its next segment for the TTS stage if none is being spoken;
        a streaming stage gets every segment of a reply in one job, then its end."""
        streaming = self.tts.streams_text
        for sid, run in self.book.runs.items():
            if not run.speech_ready:
                continue
            if run.tts_job is None:
                if not run.segments:
                    trace(sid, "first_segment",  # free text last: the fields split on spaces
                          tokens=len(run.request.generated) if run.request else None,
                          llm_ms=round(run.llm_ms), text=repr(run.tts_queue[0]))
                run.segments += 1
                run.tts_job = self.tts.add(SpeechOwner(sid, run.key),
                                           run.tts_queue.popleft(), run.speed, run.config.seed,
                                           run.config.voice, run.config.reference,
                                           more_text=streaming)
                run.tts_open = streaming
            if run.tts_open and run.speculative is None:  # a speculation: its first segment only
                while run.tts_queue:
                    self.tts.append_text(run.tts_job, run.tts_queue.popleft())
                if run.llm_done:
                    self.tts.end_text(run.tts_job)
                    run.tts_open = False

    def on_speech(self, stream: StreamState, owner: SpeechOwner, out: SpeechOut,
                  step_ms: float) -> None:
        response = self.book.runs.get(stream.internal_id)
        if response is None or response.key != owner.response_id:
            if not out.finished:  # stale: the response was cancelled or replaced
                self.tts.cancel(out.job_id)
            return
        response.tts_ms += step_ms
        if out.text and not len(out.audio) and response.spans:  # its audio was in earlier chunks
            response.spans[-1].text = f"{response.spans[-1].text} {out.text}"
        if len(out.audio):
            if not response.audio_ms:
                trace(stream.internal_id, "first_audio", held=response.speculative is not None,
                      step_ms=round(step_ms))
            audio = np.asarray(out.audio, dtype=np.float32)
            ms = len(audio) * 1000 / out.sample_rate
            if out.text or not response.spans:
                response.spans.append(AudioSpan(response.audio_ms, response.audio_ms, out.text))
            response.spans[-1].end_ms += ms  # a continuation extends the open span
            response.audio_ms += ms
            self.book.send(response, p.AudioChunk(stream.external_id, response.response_id,
                                              audio.tobytes(), out.sample_rate, ms, out.text))
            self.pacing.sent(response, ms)
        if out.finished:
            response.tts_job = None
            self._finish_if_done(stream)

    def speech_failed(self, stream: StreamState, owner: SpeechOwner, error: Exception) -> None:
        """The TTS step speaking the response's segment failed; the job is already dropped."""
        response = self.book.runs.get(stream.internal_id)
        if response is None or response.key != owner.response_id:
            self.book.error(stream, f"speech synthesis failed: {error}", p.ErrorCode.TTS_ERROR)
        else:
            self.book.error(stream, f"speech synthesis failed: {error}", p.ErrorCode.TTS_ERROR, response)
            response.tts_job = None
            response.tts_open = False
            self._finish_if_done(stream)

    def route_speech(self, plan: TTSPlan, routed: list[tuple[SpeechOwner, SpeechOut]],
                     seconds: float) -> None:
        for owner, out in routed:
            stream = self.book.live(owner.stream_id)
            if stream is not None:
                self.on_speech(stream, owner, out, seconds * 1000)

    def fail_speech(self, plan: TTSPlan, error: Exception) -> None:
        for _job_id, owner in self.tts.fail(plan):
            stream = self.book.live(owner.stream_id)
            if stream is not None:
                self.speech_failed(stream, owner, error)

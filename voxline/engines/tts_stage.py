"""The TTS stage: speech jobs of every stream's replies, stepped together on one model.

The model side is a `SpeechModel` (`speech_model`): it holds jobs and advances them
all a bounded amount per `step()`. This stage adds what the engine needs around it:
which stream and response own each job, and cancels that reach the model only between
steps (a step in flight is never mutated). Output of a job cancelled while its step
was running is dropped here, so a stale chunk never reaches a stream. Text appended to a
streaming job (`streams_text`) reaches the model between steps too, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxline.engines.protocol import VoiceReference
from voxline.engines.speech_model import SpeechJob, SpeechModel, SpeechOut, streams_text
from voxline.engines.stage import StreamId
from voxline.kernels.cuda_graphs import StageStream


@dataclass(frozen=True)
class SpeechOwner:
    stream_id: StreamId
    response_id: str


@dataclass(frozen=True)
class TTSPlan:
    job_ids: tuple[int, ...]  # the jobs the model holds for this step


class TTSStage:
    """Stage interface (see `voxline.engines.stage`) over a `SpeechModel`."""

    def __init__(self, speech: SpeechModel) -> None:
        self.speech = speech
        self._owners: dict[int, SpeechOwner] = {}  # live jobs
        self._to_start: list[SpeechJob] = []
        self._to_cancel: list[int] = []
        self._to_register: list[VoiceReference] = []
        self._to_feed: list[tuple[int, str | None]] = []  # appended text; None ends a job's text
        self._job_ids = 0
        self.streams_text = streams_text(speech)  # one job per reply, fed as text is written
        self._stream = StageStream(getattr(speech, "device", None))

    def register_voice(self, reference: VoiceReference) -> None:
        """Register (or, with empty audio, remove) a named voice on the model before its
        next step; a model that cannot clone (no ``register_voice``) ignores it."""
        self._to_register.append(reference)

    def add(self, owner: SpeechOwner, text: str, speed: float, seed: int | None,
            voice: str | None, reference: VoiceReference | None = None,
            more_text: bool = False) -> int:
        """Queue one text segment; it starts on the model at the next `schedule`.
        ``more_text`` (only when `streams_text`): `append_text`/`end_text` follow."""
        if more_text and not self.streams_text:
            raise ValueError("this speech model takes no streaming text (more_text)")
        self._job_ids += 1
        self._to_start.append(SpeechJob(self._job_ids, text, speed, seed, voice, reference,
                                        more_text))
        self._owners[self._job_ids] = owner
        return self._job_ids

    def append_text(self, job_id: int, text: str) -> None:
        """More text for a `more_text` job; reaches the model at the next `schedule`."""
        if job_id in self._owners:
            self._to_feed.append((job_id, text))

    def end_text(self, job_id: int) -> None:
        """The `more_text` job's text is complete."""
        if job_id in self._owners:
            self._to_feed.append((job_id, None))

    def cancel(self, job_id: int) -> None:
        """Disown the job now; the model drops it before its next step."""
        self._owners.pop(job_id, None)
        self._to_feed = [f for f in self._to_feed if f[0] != job_id]
        queued = [j for j in self._to_start if j.job_id != job_id]
        if len(queued) == len(self._to_start):
            self._to_cancel.append(job_id)
        self._to_start = queued

    def jobs_of(self, stream_id: StreamId) -> list[int]:
        """The stream's live jobs (queued or on the model)."""
        return [job_id for job_id, owner in self._owners.items() if owner.stream_id == stream_id]

    def load_note(self) -> str | None:
        """The speech model's own note for the stage load line, if it keeps one."""
        note = getattr(self.speech, "load_note", None)
        return note() if note is not None else None

    def has_work(self) -> bool:
        return (bool(self._to_start) or bool(self._to_feed) or bool(self._to_cancel)
                or self.speech.has_work())

    def schedule(self) -> TTSPlan | None:
        for job_id in self._to_cancel:
            self.speech.cancel(job_id)
        self._to_cancel.clear()
        register = getattr(self.speech, "register_voice", None)
        for ref in self._to_register:
            if register is not None:
                register(ref)
        self._to_register.clear()
        for job in self._to_start:
            self.speech.start(job)
        self._to_start.clear()
        for job_id, text in self._to_feed:
            if text is None:
                self.speech.end_text(job_id)  # type: ignore[attr-defined]
            else:
                self.speech.append_text(job_id, text)  # type: ignore[attr-defined]
        self._to_feed.clear()
        if not self.speech.has_work():
            return None
        return TTSPlan(tuple(self._owners))

    def execute(self, plan: TTSPlan) -> list[SpeechOut]:
        return self._stream.run(self.speech.step)

    def update(self, plan: TTSPlan, outs: list[SpeechOut]) -> list[tuple[SpeechOwner, SpeechOut]]:
        routed: list[tuple[SpeechOwner, SpeechOut]] = []
        for out in outs:
            owner = self._owners.get(out.job_id)
            if owner is None:
                continue  # cancelled while the step ran
            if out.finished:
                del self._owners[out.job_id]
            routed.append((owner, out))
        return routed

    def fail(self, plan: TTSPlan) -> list[tuple[int, SpeechOwner]]:
        """A failed step: cancel every job it held; returns them with their owners."""
        failed = [(job_id, self._owners[job_id]) for job_id in plan.job_ids
                  if job_id in self._owners]
        for job_id, _owner in failed:
            self.cancel(job_id)
        return failed

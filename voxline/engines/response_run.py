"""One response's state (`ResponseRun`), and the book of every stream's responses that
the units of `voxline.engines.responses` share (`ResponseBook`).

A run is one LLM `GenerationRequest` (none for `Speak`), the text chunker that closes
speakable segments as text arrives, the segments waiting for (or being spoken by) the
TTS stage, the audio spans spoken so far, and, while it is speculative, what it holds
back (`Speculative`). The book holds each stream's running response and the one waiting
for a transcript (`deferred`; a stream has at most one of the two), and the outbox:
`send` holds a speculative run's outputs instead of emitting them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from voxline.engines import protocol as p
from voxline.engines.conversation import AudioSpan
from voxline.engines.llm_stage import FinishReason, GenerationRequest
from voxline.engines.stage import StreamId
from voxline.engines.streams import StreamState
from voxline.engines.text_chunker import TextChunker

# A reply's first clause may be short ("Sure,") so its audio starts early; later
# segments are longer, which sounds more natural.
FIRST_CLAUSE_CHARS = 10
# A first sentence with no boundary is cut at a space by then (two words at least): the
# first audio is a few words ("The capital"), which the LLM writes and Piper speaks in a
# fraction of the time of a whole sentence. 24 -> 12 took the median end of speech -> first
# audio from 1491 to 1205 ms (benchmarks/cpu_latency/bench_pipeline.py, speculation on).
FIRST_MAX_CHARS = 12

_STATUS = {
    FinishReason.STOP: p.ResponseStatus.COMPLETED,
    FinishReason.LENGTH: p.ResponseStatus.INCOMPLETE,
    FinishReason.ABORT: p.ResponseStatus.CANCELLED,
    FinishReason.ERROR: p.ResponseStatus.FAILED,
}


def call_item_id(item_id: str, index: int) -> str:
    """The conversation item of a response's `index`-th function call."""
    return f"{item_id}_call{index}"


# A TTS that takes a reply's text as it is written (`TTSStage.streams_text`: Qwen3-TTS)
# speaks one text token per frame until the text ends, so its talker waits for every word
# the chunker still holds: an unpunctuated reply reached it as one 250-character segment.
# Such a reply's later segments are as short as its first (the segments only cut the
# text; the talker's frames are those of the whole text however it arrives).
STREAMED_MAX_CHARS = FIRST_MAX_CHARS


def new_chunker(streams_text: bool = False) -> TextChunker:
    """The chunker of one reply's text; ``streams_text``: for a TTS fed as text comes."""
    if streams_text:
        return TextChunker(min_clause_chars=FIRST_CLAUSE_CHARS, max_chars=STREAMED_MAX_CHARS)
    return TextChunker(first_clause_chars=FIRST_CLAUSE_CHARS, first_max_chars=FIRST_MAX_CHARS)


@dataclass
class Speculative:
    """What a speculative response holds until it is committed or discarded."""

    user_item: str | None  # the tentative user item it answers (None: the turn ended)
    slot_tokens: int  # KV tokens the slot held before it ran
    held: list[p.EngineOutput] = field(default_factory=list)
    dropped: frozenset[str] = frozenset()  # the retention cut before it ran
    speaks: bool = True  # it speaks its first segment while held (False: its text only)


@dataclass
class ResponseRun:
    response_id: str
    item_id: str
    config: p.ResponseConfig
    request: GenerationRequest | None  # None: speech only (`Speak`), no LLM behind it
    chunker: TextChunker
    speed: float
    emitted: str = ""
    tts_queue: deque[str] = field(default_factory=deque)
    tts_job: int | None = None  # the segment being spoken (segments are spoken in order)
    tts_open: bool = False  # tts_job is a streaming job that takes the next segments
    segments: int = 0  # segments handed to the TTS stage so far
    key: str = ""  # names the run's TTS jobs (the response id, which a speculation lacks)
    speculative: Speculative | None = None
    spans: list[AudioSpan] = field(default_factory=list)
    audio_ms: float = 0.0
    llm_done: bool = False
    llm_ms: float = 0.0
    tts_ms: float = 0.0
    played_ms: float | None = None  # playout its caller reported (None: none, never held)
    held: bool = False  # flow control: too far ahead of playout to generate more (see above)
    playout_until: float | None = None  # when its sent audio runs out (`speech_pacing`'s clock)

    def __post_init__(self) -> None:
        self.key = self.key or self.response_id

    @property
    def speech_ready(self) -> bool:
        """A segment waits and none is being spoken (or the streaming job takes it), or
        the streaming job's text has ended. A speculation speaks only its first segment;
        a held response none."""
        spec = self.speculative
        if self.held or (spec is not None and (self.segments or not spec.speaks)):
            return False
        if self.tts_open:
            return bool(self.tts_queue) or self.llm_done
        return bool(self.tts_queue) and self.tts_job is None

    @property
    def finished(self) -> bool:
        return self.llm_done and not self.tts_queue and self.tts_job is None

    def status(self) -> p.ResponseStatus:
        req = self.request
        return _STATUS[req.finish if req is not None and req.finish else FinishReason.STOP]


class ResponseBook:
    """Every stream's running and deferred response, and where their outputs go."""

    def __init__(self, emit: Callable[[p.EngineOutput], None],
                 live: Callable[[StreamId], StreamState | None]) -> None:
        self.emit = emit
        self.live = live  # an open stream by internal id (None: closed or closing)
        self.runs: dict[StreamId, ResponseRun] = {}
        self.deferred: dict[StreamId, p.CreateResponse] = {}

    def run(self, stream: StreamState) -> ResponseRun | None:
        return self.runs.get(stream.internal_id)

    def busy(self, stream: StreamState) -> bool:
        """The stream has a response running, speculating or waiting for its transcript."""
        return stream.internal_id in self.runs or stream.internal_id in self.deferred

    def send(self, run: ResponseRun | None, out: p.EngineOutput) -> None:
        """Emit `out` for `run`, or hold it while the run is speculative."""
        if run is not None and run.speculative is not None:
            run.speculative.held.append(out)
        else:
            self.emit(out)

    def error(self, stream: StreamState, message: str, code: p.ErrorCode,
              run: ResponseRun | None = None) -> None:
        self.send(run, p.StreamError(stream.external_id, message, code))

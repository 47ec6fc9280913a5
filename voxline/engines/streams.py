"""Stream identity and per-stream state.

A stream has the caller's external id (`OpenStream.stream_id`, carried back unchanged
on every output) and a unique internal id that names it inside the engine: stage
requests and the outcomes they return carry the internal id, so a result that comes
back for a stream that has since closed (or been replaced by a new stream under the
same external id) is never delivered to the wrong stream.

Lifecycle: `open` -> `close` (detached from its external id at once: no output of it
follows its `StreamClosed`, and the caller may open the id again) -> released once no
model step in flight still touches its resources (its KV slot). Between close and
release the stream is *closing*.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from voxline.engines import protocol as p
from voxline.engines.context_window import ContextWindow
from voxline.engines.conversation import Conversation
from voxline.engines.input_audio import InputAudio
from voxline.engines.llm_stage import Slot
from voxline.engines.stage import RequestRefused, StreamId


class StreamState:
    """One stream's state; stage requests name it by `internal_id`."""

    def __init__(self, internal_id: StreamId, external_id: str, config: p.StreamConfig,
                 conversation: Conversation, input_audio: InputAudio) -> None:
        self.internal_id = internal_id
        self.external_id = external_id  # what outputs carry
        self.config = config
        self.input = input_audio
        self.conversation = conversation
        self.window = ContextWindow()  # what of the conversation the prompt reads
        self.slot: Slot | None = None
        self.responses = 0  # responses started (numbers their LLM requests)
        self.pending_finals = 0  # utterances whose final transcript is still being made


class StreamRegistry:
    """Open streams by external id, and every unreleased stream by internal id."""

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        self._open: dict[str, StreamState] = {}
        self._open_by_id: dict[StreamId, StreamState] = {}
        self._closing: dict[StreamId, StreamState] = {}
        self._ids = itertools.count(1)

    @property
    def open_streams(self) -> Mapping[str, StreamState]:
        """External id -> its open stream."""
        return self._open

    def new_id(self, external_id: str) -> StreamId:
        """Check that `external_id` may be opened and reserve an internal id for it."""
        if external_id in self._open:
            raise RequestRefused(f"OpenStream: stream {external_id!r} is already open",
                                 "stream_exists")
        if len(self._open) >= self.max_streams:
            raise RequestRefused(f"OpenStream: engine is at capacity ({self.max_streams} "
                                 "streams)", "capacity", fatal=True)
        return next(self._ids)

    def add(self, stream: StreamState) -> None:
        self._open[stream.external_id] = stream
        self._open_by_id[stream.internal_id] = stream

    def get(self, external_id: str) -> StreamState | None:
        return self._open.get(external_id)

    def live(self, internal_id: StreamId) -> StreamState | None:
        """The open stream with this internal id (None once it is closing or gone)."""
        return self._open_by_id.get(internal_id)

    def close(self, external_id: str) -> list[StreamState]:
        """Detach the open stream behind `external_id` (any earlier one behind it is already
        closing); returns the streams to abort. They stay reachable by `closing` until
        `release`, but `live` no longer finds them, so nothing of theirs is routed."""
        stream = self._open.pop(external_id, None)
        if stream is None:
            return []
        del self._open_by_id[stream.internal_id]
        self._closing[stream.internal_id] = stream
        return [stream]

    def closing(self) -> list[StreamState]:
        return list(self._closing.values())

    def release(self, stream: StreamState) -> None:
        self._closing.pop(stream.internal_id, None)

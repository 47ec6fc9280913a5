"""Every error voxline raises on purpose.

    VoxlineError
    ├── ModelUnavailableError   a model's package or weight file is missing
    ├── AudioFormatError        audio bytes/arrays that cannot be decoded as claimed
    ├── EngineError             the engine failed a stream (carries the stream id)
    │   ├── EngineDeadError     the engine process died; every open stream gets this
    │   └── EngineBusyError     the engine's input queue is full: this input was refused
    └── ProtocolError           a client event was invalid (carries event_id and param)
"""

from __future__ import annotations


class VoxlineError(Exception):
    """Base class of voxline's own errors."""


class ModelUnavailableError(VoxlineError):
    """A shipped model cannot be loaded because a package or file is missing."""

    def __init__(self, model: str, missing: str, hint: str = "") -> None:
        self.model = model
        self.missing = missing
        self.hint = hint
        msg = f"{model}: missing {missing}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class AudioFormatError(VoxlineError, ValueError):
    """Audio data does not match its declared format."""


class EngineError(VoxlineError):
    """The engine could not serve a stream."""

    def __init__(self, message: str, stream_id: str | None = None) -> None:
        self.stream_id = stream_id
        super().__init__(message)


class EngineDeadError(EngineError):
    """The engine process exited; open streams end with this error."""


class EngineBusyError(EngineError):
    """The engine's bounded input queue is full, so this one input was refused (not
    queued, not dropped): the stream stays open and later inputs may pass."""


class ProtocolError(VoxlineError):
    """A client event was rejected. Names the event and the offending field."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_request_error",
        event_id: str | None = None,
        param: str | None = None,
    ) -> None:
        self.code = code
        self.event_id = event_id
        self.param = param
        super().__init__(message)

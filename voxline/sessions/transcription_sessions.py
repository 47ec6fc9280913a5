"""Transcription sessions: OpenAI's ``session.type: "transcription"``, the session's rules.

A transcription session is a session whose turns are transcribed and never answered: live
captions, a phone line shown on a dashboard. Turn detection (server or semantic VAD, or
none with manual commits), noise reduction and the ASR's hints work as in a conversation,
and every turn still becomes a user audio item with
``conversation.item.input_audio_transcription.delta`` events while it is spoken and one
``...completed`` when it ends. What differs, and is decided here:

- no response is ever started: not at the end of a turn, not on an idle timeout, and a
  client's ``response.create`` is refused with an error naming the session type;
- the engine stream asks for no reply (no ``auto_response``), so no speculative reply or
  warm prefill runs: the stream costs VAD and ASR only;
- transcription is the point of the session: it cannot be turned off (``null``);
- a session's type is fixed once its conversation has begun (before that, a
  ``session.update`` may switch it, for a client that connected without
  ``?intent=transcription``).
"""

from __future__ import annotations

from dataclasses import replace

from voxline.errors import ProtocolError
from voxline.sessions.settings import SessionSettings, Transcription


def check_session_kind(old: SessionSettings, new: SessionSettings, *,
                       conversation_started: bool) -> SessionSettings:
    """The settings a ``session.update`` from `old` to `new` leaves, or ProtocolError naming
    the field the update cannot change. A session switched to transcription transcribes
    with the server's ASR unless the update says how."""
    if new.kind == old.kind and new.kind == "realtime":
        return new
    if new.kind != old.kind and conversation_started:
        raise ProtocolError(f"session.update: session.type cannot change from {old.kind!r} to "
                            f"{new.kind!r} once the conversation has begun (open a new "
                            "session, with ?intent=transcription for a transcription one)",
                            code="invalid_value", param="session.type")
    if new.kind == "transcription" and new.transcription is None:
        if old.kind == "transcription":
            raise ProtocolError("session.update: a transcription session cannot turn "
                                "transcription off (session.audio.input.transcription is null)",
                                code="invalid_value", param="session.audio.input.transcription")
        return replace(new, transcription=Transcription())
    return new


def refuse_response(event: str = "response.create") -> ProtocolError:
    """The error for a response asked of a transcription session."""
    return ProtocolError(f"{event}: a transcription session (session.type 'transcription') makes "
                         "no responses; it only transcribes the input audio (open a realtime "
                         "session for replies)", code="invalid_value", param="type")

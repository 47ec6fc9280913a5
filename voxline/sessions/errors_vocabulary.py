"""OpenAI's error vocabulary for the client mistakes voxline also detects: the one home.

Realtime clients match on errors: LiveKit Agents ignores the barge-in cancel race by the
message "Cancellation failed: ..."; others match ``item_truncate_invalid_item_id``,
``input_audio_buffer_commit_empty`` or "Audio content of ...ms is already shorter than".
So for each mistake in :data:`VOCABULARY` voxline sends OpenAI's ``type`` and ``code``
and a message that *opens* with OpenAI's wording, followed by voxline's own detail in
parentheses (which names the event and the field, as every voxline error does)::

    Cancellation failed: no active response found (response.cancel: there is no
    response in progress)

Raise them with :func:`client_error`; a mistake OpenAI has no wording for keeps a plain
``ProtocolError``. The openings are OpenAI's server messages as clients and compatible
servers quote them (see tests/test_error_vocabulary.py, which checks each entry).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from voxline.errors import ProtocolError


class Mistake(enum.Enum):
    """A client mistake that OpenAI's server names with its own code and wording."""

    CANCEL_NOT_ACTIVE = enum.auto()
    RESPONSE_ALREADY_ACTIVE = enum.auto()
    COMMIT_EMPTY = enum.auto()
    RETRIEVE_UNKNOWN_ITEM = enum.auto()
    DELETE_UNKNOWN_ITEM = enum.auto()
    TRUNCATE_UNKNOWN_ITEM = enum.auto()
    CREATE_UNKNOWN_PREVIOUS_ITEM = enum.auto()
    CREATE_DUPLICATE_ITEM = enum.auto()
    TRUNCATE_PAST_AUDIO = enum.auto()
    MISSING_PARAMETER = enum.auto()
    INVALID_TYPE = enum.auto()


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """OpenAI's ``code`` and the opening of its ``message`` (a ``str.format`` template)."""

    code: str
    opening: str
    type: str = "invalid_request_error"

    def message(self, detail: str, **fields: Any) -> str:
        return f"{self.opening.format(**fields)} ({detail})"


VOCABULARY: dict[Mistake, ErrorShape] = {
    Mistake.CANCEL_NOT_ACTIVE: ErrorShape(
        "response_cancel_not_active", "Cancellation failed: no active response found"),
    Mistake.RESPONSE_ALREADY_ACTIVE: ErrorShape(
        "conversation_already_has_active_response",
        "Conversation already has an active response in progress: {response_id}. Wait "
        "until the response is finished before creating a new one."),
    Mistake.COMMIT_EMPTY: ErrorShape(
        "input_audio_buffer_commit_empty",
        "Error committing input audio buffer: buffer too small. Expected at least "
        "{min_ms}ms of audio, but buffer only has {have_ms:.2f}ms of audio."),
    Mistake.RETRIEVE_UNKNOWN_ITEM: ErrorShape(
        "item_retrieve_invalid_item_id",
        "Error retrieving item: the item with id '{item_id}' does not exist."),
    Mistake.DELETE_UNKNOWN_ITEM: ErrorShape(
        "item_delete_invalid_item_id",
        "Error deleting item: the item with id '{item_id}' does not exist."),
    Mistake.TRUNCATE_UNKNOWN_ITEM: ErrorShape(
        "item_truncate_invalid_item_id",
        "Error truncating item: the item with id '{item_id}' does not exist."),
    Mistake.CREATE_UNKNOWN_PREVIOUS_ITEM: ErrorShape(
        "item_create_invalid_previous_item_id",
        "Error adding item: the previous item with id '{previous_item_id}' does not exist."),
    Mistake.CREATE_DUPLICATE_ITEM: ErrorShape(
        "item_create_duplicate_item_id",
        "Error adding item: an item with id '{item_id}' already exists."),
    Mistake.TRUNCATE_PAST_AUDIO: ErrorShape(
        "invalid_value", "Audio content of {audio_ms}ms is already shorter than {audio_end_ms}ms"),
    Mistake.MISSING_PARAMETER: ErrorShape(
        "missing_required_parameter", "Missing required parameter: '{param}'."),
    Mistake.INVALID_TYPE: ErrorShape(
        "invalid_type", "Invalid type for '{param}': expected {expected}, but got {got} instead."),
}

# The event whose unknown `item_id` each item mistake answers.
UNKNOWN_ITEM: dict[str, Mistake] = {
    "conversation.item.retrieve": Mistake.RETRIEVE_UNKNOWN_ITEM,
    "conversation.item.delete": Mistake.DELETE_UNKNOWN_ITEM,
    "conversation.item.truncate": Mistake.TRUNCATE_UNKNOWN_ITEM,
}


def client_error(mistake: Mistake, detail: str, *, param: str | None = None,
                 event_id: str | None = None, **fields: Any) -> ProtocolError:
    """The ProtocolError for `mistake`: OpenAI's code, its opening filled from `fields`
    (and `param`), then `detail`."""
    shape = VOCABULARY[mistake]
    message = shape.message(detail, param=param, **fields)
    return ProtocolError(message, code=shape.code, event_id=event_id, param=param)


def json_type_words(value: Any) -> str:
    """A decoded JSON value's type as OpenAI's "but got ... instead" names it (an integer is
    ``an integer``, any other number ``a number``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"

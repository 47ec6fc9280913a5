"""The log lines of a phone call (Twilio, SIP): what the caller said, what the bot said, a
reply truncated at barge-in, a session error; one line each, under the call's `ids`."""

from __future__ import annotations

import logging

from voxline.sessions import events as ev


def log_call_event(log: logging.Logger, ids: str, event: ev.ServerEvent) -> None:
    """Log `event` if it is one a phone call's log tells; others are skipped."""
    if isinstance(event, ev.ErrorEvent):
        log.warning("%s: session error %s: %s", ids, event.error.code, event.error.message)
    elif isinstance(event, ev.InputTranscriptionCompleted):
        log.info("%s: caller said %r", ids, event.transcript)
    elif isinstance(event, ev.ItemTruncated):
        log.info("%s: reply %s truncated at %d ms", ids, event.item_id, event.audio_end_ms)
    elif isinstance(event, ev.AudioTranscriptDone):
        log.info("%s: bot said %r", ids, event.transcript)

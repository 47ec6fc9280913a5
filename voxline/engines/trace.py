"""Turn milestones on the ``voxline.trace`` logger (DEBUG), for latency work.

``trace(stream_id, "event", **fields)`` logs one line with the monotonic clock in ms
(``time.monotonic``, the clock the engine loop and the benchmarks share), so a turn's
path — speech fell silent, pause transcript queued and landed, speculation started,
first token, first segment, first audio, commit — can be lined up after a run:

    logging.getLogger("voxline.trace").setLevel(logging.DEBUG)

or, for a server and its engine process, ``VOXLINE_TRACE=1`` in the environment.
Off (the default) it costs one ``isEnabledFor`` check per milestone.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger("voxline.trace")
if os.environ.get("VOXLINE_TRACE", "") not in ("", "0"):
    logger.setLevel(logging.DEBUG)


def trace(stream_id: object, event: str, **fields: object) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        logger.debug("t=%.1f stream=%s %s%s", time.monotonic() * 1000, stream_id, event, extra)

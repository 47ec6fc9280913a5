"""Logging set-up and a timing helper for slow start-up work."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@contextmanager
def timed(logger: logging.Logger, what: str) -> Iterator[None]:
    """Log `what` when it starts and how long it took when it ends."""
    logger.info("%s ...", what)
    t0 = time.perf_counter()
    yield
    logger.info("%s done in %.2f s", what, time.perf_counter() - t0)

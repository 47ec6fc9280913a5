"""Small asyncio helpers shared by every layer."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel `tasks` and return once each has ended, whatever it raised.

    A cancellation of the caller itself still propagates. The familiar
    `task.cancel(); with suppress(CancelledError): await task` swallows it when the caller
    is cancelled while it waits: the caller runs on with its `cancelling()` count raised
    (`tests/test_aio.py`)."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    if live:
        await asyncio.gather(*live, return_exceptions=True)

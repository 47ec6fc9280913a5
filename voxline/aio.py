"""Small asyncio helpers shared by every layer."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel `tasks` and return once each has ended, whatever it raised.

    A cancellation of the caller itself still propagates. The familiar
    `task.cancel(); with suppress(CancelledError): await task` swallows it when the caller
    is cancelled while it waits, and leaves the caller's `cancelling()` count raised: the
    caller then runs on, and an anyio cancel scope around it (Starlette's, uvicorn's)
    reads the count as another scope's cancellation and lets a CancelledError escape."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    if live:
        await asyncio.gather(*live, return_exceptions=True)

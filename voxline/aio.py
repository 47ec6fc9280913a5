"""Small asyncio helpers shared by every layer."""

from __future__ import annotations

import asyncio


async def wait_ended(*tasks: asyncio.Future | None) -> None:
    """Return once each of `tasks` has ended, whatever it raised (its exception counts as
    retrieved). A cancellation of the caller itself propagates as the caller's own.

    Not `gather(*tasks, return_exceptions=True)`: cancelled while some tasks are still
    ending, 3.11's gather raises the cancellation of the *last task in its arguments*. If
    that one had already ended by someone else's cancel, the error carries that cancel's
    message, not the caller's, and an anyio cancel scope (Starlette's test client, uvicorn)
    cannot tell it for its own: it escapes the scope (`tests/test_aio.py`)."""
    live = [task for task in tasks if task is not None]
    pending = [task for task in live if not task.done()]
    if pending:
        await asyncio.wait(pending)
    for task in live:
        if not task.cancelled():
            task.exception()


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel `tasks` and return once each has ended, whatever it raised (`wait_ended`).

    A cancellation of the caller itself still propagates. The familiar
    `task.cancel(); with suppress(CancelledError): await task` swallows it when the caller
    is cancelled while it waits: the caller runs on with its `cancelling()` count raised
    (`tests/test_aio.py`)."""
    for task in tasks:
        if task is not None:
            task.cancel()
    await wait_ended(*tasks)

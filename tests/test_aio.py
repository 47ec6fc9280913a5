"""cancel_and_wait: stopping a child task never swallows the caller's own cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest

from voxline.aio import cancel_and_wait


async def _stubborn() -> None:
    """A child whose clean-up takes a while after it is cancelled."""
    try:
        await asyncio.sleep(10)
    finally:
        await asyncio.shield(asyncio.sleep(0.05))


async def _stop_with(stop) -> None:
    child = asyncio.create_task(_stubborn())
    await asyncio.sleep(0)
    await stop(child)
    await asyncio.sleep(10)  # reached only if the caller's cancellation was swallowed


async def _suppressing(child: asyncio.Task) -> None:
    child.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await child


@pytest.mark.asyncio
async def test_the_callers_cancellation_propagates_and_the_child_has_ended():
    caller = asyncio.create_task(_stop_with(cancel_and_wait))
    await asyncio.sleep(0.01)  # the caller waits for the child's clean-up
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()


@pytest.mark.asyncio
async def test_suppressing_around_await_swallows_it():
    """The pattern cancel_and_wait replaces: the caller runs on with its count raised."""
    caller = asyncio.create_task(_stop_with(_suppressing))
    await asyncio.sleep(0.01)
    caller.cancel()
    await asyncio.sleep(0.1)
    assert not caller.done() and caller.cancelling() == 1
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


@pytest.mark.asyncio
async def test_an_anyio_scope_absorbs_its_own_cancellation_through_it():
    """Starlette's test client and uvicorn run the app inside an anyio cancel scope: the
    scope's cancel, landing while the app stops a child, ends the app cleanly."""
    ended = asyncio.Event()

    async def app() -> None:
        with anyio.CancelScope() as scope:
            child = asyncio.create_task(_stubborn())
            await asyncio.sleep(0)
            asyncio.get_running_loop().call_later(0.01, scope.cancel)
            await cancel_and_wait(child)
            await asyncio.sleep(10)
        ended.set()

    await asyncio.wait_for(app(), 5)
    assert ended.is_set()


@pytest.mark.asyncio
async def test_finished_failed_and_missing_tasks_are_fine():
    async def boom() -> None:
        raise ValueError("x")

    failed = asyncio.create_task(boom())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await cancel_and_wait(failed, done, None)
    assert failed.done() and done.done()

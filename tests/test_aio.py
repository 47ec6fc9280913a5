"""cancel_and_wait and wait_ended: stopping child tasks never swallows the caller's own
cancellation, nor hands it on as someone else's."""

from __future__ import annotations

import asyncio
import contextlib
import time

import anyio
import anyio.from_thread
import pytest

from voxline.aio import cancel_and_wait, wait_ended


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


def _portal_task_after_its_scope_is_cancelled(stop) -> BaseException | None:
    """What Starlette's test client does with a WebSocket session: the app runs as a portal
    task inside an anyio cancel scope, and the scope is cancelled while the app stops two
    children (one already ended by its cancel, one still cleaning up). Returns what the
    task's future raised (None: it ended cleanly)."""
    async def app(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            slow = asyncio.ensure_future(_stubborn())
            quick = asyncio.ensure_future(asyncio.sleep(10))
            await asyncio.sleep(0.01)
            slow.cancel()
            quick.cancel()
            await stop(slow, quick)
            await anyio.sleep_forever()

    with anyio.from_thread.start_blocking_portal() as portal:
        future, scope = portal.start_task(app)
        time.sleep(0.02)  # the app is waiting for the slow child's clean-up
        portal.call(scope.cancel)
        try:
            future.result(timeout=5)
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            return exc
    return None


def test_gather_hands_on_a_childs_cancel_that_the_scope_cannot_tell_for_its_own():
    """3.11's gather raises the last argument's cancellation (here `quick`'s, with no
    message): the scope does not absorb it and the task ends cancelled, as the flaky
    Starlette WebSocket sessions did."""
    async def gather(*tasks):
        await asyncio.gather(*tasks, return_exceptions=True)

    assert type(_portal_task_after_its_scope_is_cancelled(gather)).__name__ == "CancelledError"


def test_wait_ended_lets_the_scope_absorb_its_own_cancellation():
    assert _portal_task_after_its_scope_is_cancelled(wait_ended) is None

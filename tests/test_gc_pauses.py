"""The garbage collector's full collections: measured (`GcPauses`) and kept off the
start-up heap (`freeze_startup_objects`)."""

from __future__ import annotations

import gc
import logging

import pytest

from voxline.logs import GC_PAUSES, GcPauses, freeze_startup_objects


def test_full_collections_are_timed_and_reset_on_take():
    pauses = GcPauses()
    gc.collect(2)
    assert pauses.take() is None  # not installed: nothing seen
    pauses.install()
    try:
        gc.collect(0)  # a young collection is not a pause worth noting
        assert pauses.take() is None
        gc.collect(2)
        gc.collect(2)
        note = pauses.take()
        assert note is not None and note.startswith("2 full gc collections, max ")
        assert pauses.take() is None
    finally:
        pauses.uninstall()
    assert pauses._on_gc not in gc.callbacks


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # give the test process's heap back to the collector
    GC_PAUSES.uninstall()


def test_freezing_leaves_a_full_collection_only_the_objects_made_since(unfrozen, caplog):
    heap = [[i] for i in range(200_000)]  # a start-up heap of tracked objects
    with caplog.at_level(logging.INFO):
        freeze_startup_objects(logging.getLogger("test"))
    assert gc.get_freeze_count() >= len(heap)
    assert GC_PAUSES.installed
    (record,) = [r for r in caplog.records if "froze" in r.getMessage()]
    assert "start-up objects out of the garbage collector: a full collection took" in record.getMessage()
    gc.collect(2)
    assert (GC_PAUSES.take() or "").startswith("1 full gc collections")

"""The voice store (realtime/http/voice_store.py) without any model: a directory that several
servers share, read fresh on every lookup, written atomically."""

from __future__ import annotations

import threading

import pytest

from voxline.realtime.http.voice_store import StoredVoice, VoiceExists, VoiceStore, VoiceStoreError


def _voice(name: str, created_at: int = 1, audio: bytes = b"\x00\x00\x80?" * 4) -> StoredVoice:
    return StoredVoice(name, audio, "hello", 0.5, created_at)


def test_a_voice_put_through_one_server_is_seen_by_another_sharing_the_directory(tmp_path):
    one, other = VoiceStore(tmp_path), VoiceStore(tmp_path)
    assert one.shared and other.all() == []
    one.put(_voice("Alice", 2))
    one.put(_voice("bob", 1))
    assert other.exists("alice") and other.exists("ALICE")  # names are case-insensitive
    got = other.get("alice")
    assert got == _voice("Alice", 2)
    assert [v.name for v in other.all()] == ["bob", "Alice"]  # oldest first
    assert all(v.audio == b"" for v in other.all())  # a listing reads no clips
    assert other.remove("ALICE") and not other.remove("alice")
    assert one.get("alice") is None and not one.exists("alice")
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["bob.json", "clip"]


def test_a_name_is_taken_once_even_by_concurrent_puts(tmp_path):
    stores = [VoiceStore(tmp_path) for _ in range(8)]
    won, lost = [], []
    start = threading.Barrier(len(stores))

    def put(i: int) -> None:
        start.wait()
        try:
            stores[i].put(_voice("same", audio=bytes([i]) * 8))
            won.append(i)
        except VoiceExists:
            lost.append(i)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    assert stores[0].get("same").audio == bytes([won[0]]) * 8  # the winner's clip, whole
    clips = list(tmp_path.glob("clip-*"))
    assert len(clips) == 1 and not list(tmp_path.glob(".tmp-*"))  # losers left nothing


def test_a_missing_directory_is_a_store_error_naming_it(tmp_path):
    store = VoiceStore(tmp_path / "gone")
    for call in (lambda: store.exists("a"), lambda: store.get("a"), store.all,
                 lambda: store.put(_voice("a"))):
        with pytest.raises(VoiceStoreError, match="gone"):
            call()


def test_without_a_directory_a_temporary_one_is_private_and_removed():
    store = VoiceStore()
    assert not store.shared
    store.put(_voice("a"))
    root = store.root
    assert store.get("a") is not None
    del store
    import gc
    gc.collect()
    assert not root.exists()

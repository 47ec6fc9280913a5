"""FrameChunker: whole frames out, remainder carried, nothing lost or duplicated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxline.codecs.chunker import FrameChunker, frame_samples
from voxline.errors import AudioFormatError


@pytest.mark.parametrize(
    ("rate", "ms", "expected"),
    [(8000, 20, 160), (16000, 32, 512), (22050, 20, 441), (24000, 40, 960), (48000, 2.5, 120)],
)
def test_frame_samples(rate: int, ms: float, expected: int) -> None:
    assert frame_samples(rate, ms) == expected


@pytest.mark.parametrize(("rate", "ms"), [(22050, 10), (8000, 0), (44100, 0.01)])
def test_frame_samples_rejects_fractional_or_empty_frames(rate: int, ms: float) -> None:
    with pytest.raises(AudioFormatError, match="whole positive count"):
        frame_samples(rate, ms)


def test_remainder_carries_over_and_flush_pads() -> None:
    c = FrameChunker(4)
    assert c.feed(np.arange(3, dtype=np.float32)) == []
    assert c.pending == 3
    frames = c.feed(np.arange(3, 9, dtype=np.float32))
    np.testing.assert_array_equal(np.stack(frames), [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_array_equal(c.flush(), [8, 0, 0, 0])
    assert c.flush() is None
    assert c.pending == 0


def test_flush_without_padding_returns_partial_frame() -> None:
    c = FrameChunker(4, dtype=np.int16)
    c.feed(np.array([1, 2], np.int16))
    out = c.flush(pad=False)
    assert out is not None and out.dtype == np.int16
    np.testing.assert_array_equal(out, [1, 2])


def test_frames_do_not_alias_input() -> None:
    c = FrameChunker(2)
    x = np.ones(4, np.float32)
    frames = c.feed(x)
    x[:] = 5
    assert all((f == 1).all() for f in frames)


def test_rejects_bad_shapes() -> None:
    with pytest.raises(AudioFormatError):
        FrameChunker(0)
    with pytest.raises(AudioFormatError, match="1-D"):
        FrameChunker(2).feed(np.zeros((2, 2), np.float32))


@given(
    frame=st.integers(1, 50),
    sizes=st.lists(st.integers(0, 200), max_size=20),
)
def test_frames_concatenate_to_input_prefix(frame: int, sizes: list[int]) -> None:
    data = np.arange(sum(sizes), dtype=np.float32)
    c = FrameChunker(frame)
    frames: list[np.ndarray] = []
    pos = 0
    for n in sizes:
        frames += c.feed(data[pos : pos + n])
        pos += n
        assert c.pending < frame
    assert all(len(f) == frame for f in frames)
    joined = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    assert len(joined) == len(data) // frame * frame
    np.testing.assert_array_equal(joined, data[: len(joined)])
    tail = c.flush(pad=True)
    if len(data) % frame:
        assert tail is not None and len(tail) == frame
        np.testing.assert_array_equal(tail[: len(data) % frame], data[len(joined) :])
        assert not tail[len(data) % frame :].any()
    else:
        assert tail is None

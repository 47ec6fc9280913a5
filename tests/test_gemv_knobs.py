"""The decode projections' tiles and launch options (``voxline.kernels.gemv.configure``,
``launch_options``) and the benchmarks' switches for them (``voxline/kernels/projection_knobs.py``).
The kernels themselves run on CUDA only; what is checked here is which options a launch
gets and how a sweep sets and restores them."""

from __future__ import annotations

import pytest

from voxline.kernels import gemv, projection_knobs

SHIPPED = dict(projection_knobs.SHIPPED)


@pytest.fixture(autouse=True)
def _restore():
    yield
    gemv.configure(**SHIPPED)


def test_one_row_block_gets_four_stages_and_wider_launches_three():
    assert gemv.launch_options(1)["num_stages"] == 4
    assert gemv.launch_options(gemv.BLOCK_M)["num_stages"] == 4
    wide = gemv.launch_options(gemv.BLOCK_M + 1)
    assert wide["num_stages"] == gemv.WIDE_STAGES == 3 and wide["num_warps"] == gemv.LAUNCH["num_warps"]
    assert gemv.LAUNCH["num_stages"] == 4  # the wide options are a copy


def test_configure_sets_tiles_that_split_for_reads():
    assert gemv.split_for(4096, 1024) == 2  # 128 blocks of 32 outputs: two slices fill 264 programs
    knobs = gemv.configure(block_k=512, block_n=16)
    assert knobs["block_k"] == gemv.BLOCK_K == 512 and knobs["block_n"] == 16
    assert gemv.split_for(4096, 1024) == 1  # 256 blocks of 16 outputs: one more slice would pass 264
    gemv.configure(**SHIPPED)
    assert gemv.configure() == SHIPPED and gemv.split_for(4096, 1024) == 2


def test_configure_refuses_an_unknown_knob_and_changes_nothing():
    with pytest.raises(ValueError, match="unknown knob 'stages'.*num_stages"):
        gemv.configure(num_warps=8, stages=2)
    assert gemv.configure() == SHIPPED  # num_warps was not set either


def test_arm_switches_parse_to_knobs():
    assert projection_knobs.knob_switch("s4") == ("num_stages", 4)
    assert projection_knobs.knob_switch("k512") == ("block_k", 512)
    assert projection_knobs.knob_switch("p528") == ("programs", 528)
    for other in ("pdl", "none", "inductor", "s", "sx"):
        assert projection_knobs.knob_switch(other) is None


def test_an_arm_sets_its_knobs_and_the_shipped_values_for_the_rest():
    knobs = projection_knobs.set_knobs({"pdl", "s2", "n16"})
    assert knobs == {**SHIPPED, "num_stages": 2, "block_n": 16}
    assert projection_knobs.set_knobs(set()) == SHIPPED  # the next arm starts from the shipped values
    with pytest.raises(SystemExit, match="given twice"):
        projection_knobs.set_knobs(["s2", "s3"])

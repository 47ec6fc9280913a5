"""The persistent projection chain of benchmarks/bench_persistent_chain.py, in Triton's
interpreter on the CPU (one program: its grid barrier never waits). The GPU comparison
with the chain of launches is the benchmark's; this checks the phase table and the
kernel's arithmetic, where Triton is installed (CUDA builds of torch; skipped otherwise).

The interpreter is chosen when ``@triton.jit`` runs, for every kernel including Triton's
own, so the checks run in a child process started with ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


def _interpreted(check: str) -> None:
    code = (f"import sys; sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT / 'benchmarks')!r}, {str(ROOT)!r}]; "
            f"import test_persistent_chain as t; t.{check}()")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]


def _bench():
    """The benchmark module, with the interpreter's scalars usable as loop bounds."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch_tensor(tensor, scope):  # noqa: ANN001, ANN202
        # The interpreter holds scalars as one-element arrays, which NumPy 2 will not turn
        # into an index: loop bounds read at run time (the phase table's N and K) need it.
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_tensor
    import bench_persistent_chain

    return bench_persistent_chain


def _layers(g: torch.Generator, n_layers: int, hidden: int, attn: int, qkv: int, inter: int):
    def rand(*shape: int, scale: float) -> torch.Tensor:  # float16: the interpreter's numpy has no bfloat16
        return (torch.randn(shape, generator=g) * scale).half()

    return [(rand(qkv, hidden, scale=hidden ** -0.5), rand(hidden, attn, scale=attn ** -0.5 / 4),
             rand(2 * inter, hidden, scale=hidden ** -0.5), rand(hidden, inter, scale=inter ** -0.5 / 4))
            for _ in range(n_layers)]


def check_chain() -> None:
    bench = _bench()
    hidden, attn, qkv, inter = 128, 256, 512, 512
    for rows in (1, 3):
        g = torch.Generator().manual_seed(rows)
        layers = _layers(g, 2, hidden, attn, qkv, inter)
        x = torch.randn(rows, hidden, generator=g).half()
        flat = bench.FlatChain(layers, x, repeats=2, attn=attn, inter=inter)
        ref = bench.reference(layers, x, 2, attn, inter)
        out = flat.run(programs=1).clone()  # every phase's tiles whole
        assert [r[7] for r in flat.table(1)[1]] == [1] * 16
        torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
        assert flat.bar.tolist() == [0, 0]  # reset for the next launch
        assert torch.equal(flat.run(programs=1), out)  # a second launch on the same buffers
        # K slices sized for 64 programs: the output and down projections' 8 tiles split in
        # 2 and 4, each tile finished by its last slice in slice order
        split = flat.run(programs=1, split_programs=64).clone()
        assert [r[7] for r in flat.table(64)[1]][:4] == [1, 2, 1, 4]
        torch.testing.assert_close(split, ref, rtol=2e-2, atol=2e-2)
        assert flat.cnt.tolist() == [0] * flat.cnt.numel() and flat.bar.tolist() == [0, 0]


def check_refusals() -> None:
    bench = _bench()
    with pytest.raises(ValueError, match="multiple of"):
        bench.phase_table([(100, 128, 0, 0, 128, 0, -1)], torch.device("cpu"), 1)
    with pytest.raises(ValueError, match="at most"):
        bench.persistent_chain(torch.zeros(1), torch.zeros(1), torch.zeros(1, 8, dtype=torch.int64),
                               torch.zeros(2, dtype=torch.int32), torch.zeros(1), torch.zeros(1, dtype=torch.int32),
                               17, 1)


def test_one_program_walks_the_chain_to_the_reference():
    _interpreted("check_chain")


def test_a_phase_that_does_not_tile_and_too_many_rows_are_refused():
    _interpreted("check_refusals")

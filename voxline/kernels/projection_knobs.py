"""The decode-row projections' knobs as benchmark switches (``bench_gemv_chain.py``'s
``--configs``, ``bench_pdl.py`` and ``bench_gpu_tts.py``'s ``--arms``): ``wN`` warps,
``sN`` pipeline stages, ``nN`` / ``kN`` tile outputs / reduction columns, ``pN`` the
program count the K slices aim for (:func:`voxline.kernels.gemv.configure`)."""

from __future__ import annotations

from voxline.kernels import gemv

KNOBS = {"w": "num_warps", "s": "num_stages", "n": "block_n", "k": "block_k", "p": "programs"}
SHIPPED = gemv.configure()  # the projection knobs as shipped, read before any switch changes them


def knob_switch(switch: str) -> tuple[str, int] | None:
    """The projection knob an arm's switch sets (``wN`` warps, ``sN`` pipeline stages,
    ``nN`` / ``kN`` tile outputs / reduction columns, ``pN`` the K slices' program target;
    :func:`~voxline.kernels.gemv.configure`), else None."""
    if switch[:1] in KNOBS and switch[1:].isdigit():
        return KNOBS[switch[0]], int(switch[1:])
    return None


def set_knobs(switches: set[str] | list[str]) -> dict[str, int]:
    """The projection knobs from an arm's switches, the shipped values for the others;
    returns all of them."""
    knobs = [kv for kv in map(knob_switch, switches) if kv is not None]
    if len({k for k, _ in knobs}) < len(knobs):
        raise SystemExit(f"--arms/--configs: a projection knob given twice in {'+'.join(sorted(switches))}")
    return gemv.configure(**{**SHIPPED, **dict(knobs)})

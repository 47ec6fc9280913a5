"""A static, slot-based KV cache for continuous batching (the Llama and the Qwen3-TTS talker).

One cache is allocated per model at load; each stream owns one slot. Its invariants are
in :class:`KVCache`; how a model writes it (new tokens at ``lengths[slot]..``, an
``advance=False`` step confirmed later with :meth:`KVCache.commit`, a rollback with
:meth:`KVCache.truncate`) is in :mod:`voxline.engines.models.llama.model`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    """Static K/V buffers ``[layers, slots, kv_heads, max_len, head_dim]``, allocated once.

    Invariants: ``0 <= lengths[s] <= written[s] <= max_len``. Positions ``< lengths[s]``
    hold confirmed K/V; positions in ``[lengths[s], written[s])`` hold K/V written by a
    ``forward_batch(..., advance=False)`` step that the caller may still :meth:`commit`.
    Anything at or past ``written[s]`` is stale and is never read. Rolling back is just
    lowering ``lengths``; later writes overwrite the stale entries.
    """

    def __init__(
        self,
        num_layers: int,
        max_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (num_layers, max_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_slots = max_slots
        self.max_len = max_len
        self.lengths: list[int] = [0] * max_slots
        self.written: list[int] = [0] * max_slots

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")

    def commit(self, slot: int, n: int) -> None:
        """Confirm ``n`` tokens written past ``lengths[slot]`` by an ``advance=False`` step."""
        self._check_slot(slot)
        if n < 0 or self.lengths[slot] + n > self.written[slot]:
            raise ValueError(
                f"slot {slot}: cannot commit {n} tokens "
                f"(length {self.lengths[slot]}, written {self.written[slot]})"
            )
        self.lengths[slot] += n

    def truncate(self, slot: int, n: int) -> None:
        """Roll slot back so that only its first ``n`` tokens remain (``n <= lengths``)."""
        self._check_slot(slot)
        if not 0 <= n <= self.lengths[slot]:
            raise ValueError(f"slot {slot}: cannot truncate to {n} (length {self.lengths[slot]})")
        self.lengths[slot] = n
        self.written[slot] = n

    def reset(self, slot: int) -> None:
        """Empty the slot for a new stream (no memory is touched)."""
        self.truncate(slot, 0)

    def export_prefix(self, slot: int, n: int) -> tuple[Tensor, Tensor]:
        """A copy of the K/V of the slot's first ``n`` confirmed tokens."""
        self._check_slot(slot)
        if not 0 < n <= self.lengths[slot]:
            raise ValueError(f"slot {slot}: cannot export {n} tokens (length {self.lengths[slot]})")
        return self.k[:, slot, :, :n].clone(), self.v[:, slot, :, :n].clone()

    def import_prefix(self, slot: int, kv: tuple[Tensor, Tensor]) -> int:
        """Make an exported prefix the slot's whole content; returns its token count.
        Exact: the same tokens at the same positions have the same K/V in any slot."""
        self._check_slot(slot)
        n = kv[0].shape[2]
        self.k[:, slot, :, :n] = kv[0]
        self.v[:, slot, :, :n] = kv[1]
        self.lengths[slot] = self.written[slot] = n
        return n

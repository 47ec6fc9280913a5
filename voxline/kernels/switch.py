"""A kernel's process-wide on/off switch, so benchmarks can A/B it in one process.

Each optional kernel module holds one :class:`KernelSwitch` and exports its ``set`` as
``set_enabled``; its availability check reads ``on``. Inside ``torch.compile`` that read
happens while tracing and Dynamo guards on it, so a flip takes effect for steps traced
or run after it (a compiled region recompiles; a captured graph keeps what it recorded).
"""

from __future__ import annotations

__all__ = ["KernelSwitch"]


class KernelSwitch:
    """On by default; :meth:`set` flips it."""

    def __init__(self) -> None:
        self.on = True

    def set(self, on: bool) -> bool:
        """Switch the kernel on or off process-wide; returns the old value. Only affects
        steps traced or run after the call."""
        old, self.on = self.on, on
        return old

"""voxline: a streaming real-time voice engine, and its embedded Python SDK.

``voxline.Engine`` runs the engine in this process, ``voxline.connect(url)`` reaches a
voxline server; both open sessions (``engine.session(...)``) whose events are the typed
``voxline.events`` the ``/v1/realtime`` WebSocket renders. The SDK loads on first use,
so importing a submodule (``voxline.codecs``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from voxline.version import __version__

if TYPE_CHECKING:
    from voxline.sdk import (
        Engine,
        RemoteEngine,
        Session,
        SessionError,
        ToolsNotAvailable,
        connect,
    )
    from voxline.sessions import events

_LAZY = {
    "Engine": "voxline.sdk", "RemoteEngine": "voxline.sdk", "Session": "voxline.sdk",
    "SessionError": "voxline.sdk", "ToolsNotAvailable": "voxline.sdk", "connect": "voxline.sdk",
    "events": "voxline.sessions.events",
}
__all__ = ["Engine", "RemoteEngine", "Session", "SessionError", "ToolsNotAvailable",
           "__version__", "connect", "events"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'voxline' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if name == "events" else getattr(loaded, name)
    globals()[name] = value
    return value

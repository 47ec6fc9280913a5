"""The embedded SDK: voice sessions from Python, in this process or on a voxline server.

    async with voxline.Engine() as engine:            # or: voxline.connect(url)
        async with engine.session(input_format="g711_ulaw",
                                  output_format="g711_ulaw") as call:
            await call.send_audio(frame)
            async for event in call: ...

Events are :mod:`voxline.sessions.events` objects in both modes.
"""

from voxline.sdk.engine import Engine
from voxline.sdk.remote import RemoteEngine, connect
from voxline.sdk.session import Session, SessionError, ToolsNotAvailable, session_patch

__all__ = ["Engine", "RemoteEngine", "Session", "SessionError", "ToolsNotAvailable", "connect",
           "session_patch"]

"""The API process's side of the engine: size it, then make its client.

`sized_for_device` (:mod:`voxline.engines.sizing`) fits the capacity settings to the GPU
before anything starts; `make_engine` returns the client `settings.engine` names, whose
core is built where it runs by the core factory `DEFAULT_CORE` names
(:func:`voxline.engines.factory.make_engine_core`, in the engine's thread or child
process). Nothing here imports torch or a model: the API process that serves sessions
never loads one.
"""

from __future__ import annotations

from voxline.config import EngineKind, Settings
from voxline.engines.client import EngineClient, InProcessEngineClient
from voxline.engines.sizing import sized_for_device
from voxline.errors import VoxlineError

__all__ = ["DEFAULT_CORE", "make_engine", "sized_for_device"]

DEFAULT_CORE = "voxline.engines.factory:make_engine_core"


def make_engine(settings: Settings) -> EngineClient:
    """The engine client `settings.engine` names (a thread, or a supervised child process),
    not started; its core is built from `settings` where it runs."""
    if settings.remote_llm and not settings.llm_model:
        raise VoxlineError(f"--llm {settings.llm} needs --llm-model (the model name the server "
                           "serves; its /v1/models lists them)")
    options = {"settings": settings.model_dump(mode="json")}
    if settings.engine == EngineKind.INPROCESS:
        return InProcessEngineClient(DEFAULT_CORE, options)
    from voxline.engines.process import MultiprocessEngineClient

    return MultiprocessEngineClient(DEFAULT_CORE, options, start_timeout=600)

"""Import boundaries the architecture promises, checked on the source (AST) and in a
fresh interpreter (sys.modules).

- `voxline/sessions/` speaks to the engine through its wire types (`engines.protocol`),
  its client (`engines.client`) and pure arithmetic (`engines.video_frames`) only: no
  engine implementation module (the remote LLM's httpx, the input buffer, a model).
- The API process sizes capacity (`engines.sizing`) without loading model code.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = ROOT / "voxline" / "sessions"
# What sessions may import of the engine: the wire types, the client, frame arithmetic.
SESSIONS_MAY_IMPORT = {"voxline.engines", "voxline.engines.protocol", "voxline.engines.client",
                       "voxline.engines.video_frames"}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _engine_module(name: str) -> bool:
    return name == "voxline.engines" or name.startswith("voxline.engines.")


@pytest.mark.parametrize("path", sorted(SESSIONS.glob("*.py")), ids=lambda p: p.name)
def test_sessions_import_no_engine_implementation_module(path: Path) -> None:
    engine = {n for n in imported_modules(path) if _engine_module(n)}
    # `from voxline.engines import protocol as ep` names the module voxline.engines.protocol
    modules = {n for n in engine if n.count(".") <= 2}
    for forbidden in ("voxline.engines.remote_llm", "voxline.engines.input_audio",
                      "voxline.engines.models"):
        assert not any(n == forbidden or n.startswith(forbidden + ".") for n in engine), (
            f"{path.name} imports {forbidden}")
    assert modules <= SESSIONS_MAY_IMPORT, (
        f"{path.name} imports engine modules {sorted(modules - SESSIONS_MAY_IMPORT)}")


def _private_actor_calls(path: Path) -> list[str]:
    """``actor._x`` / ``self.actor._x`` / ``self._actor._x`` reached from a helper module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        owner = node.value
        named = (owner.id if isinstance(owner, ast.Name)
                 else owner.attr if isinstance(owner, ast.Attribute) else "")
        if named in ("actor", "_actor", "a", "host"):
            found.append(f"{path.name}:{node.lineno} {named}.{node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(p for p in SESSIONS.glob("*.py") if p.name != "actor.py"),
                         ids=lambda p: p.name)
def test_helpers_use_the_actors_public_face_only(path: Path) -> None:
    assert _private_actor_calls(path) == []


def test_the_sessions_scan_sees_the_imports_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from voxline.engines.remote_llm import x\nimport voxline.engines.models.llama\n"
                      "from voxline.engines import protocol as ep\nself.actor._emit(1)\n")
    assert {"voxline.engines.remote_llm", "voxline.engines.models.llama",
            "voxline.engines.protocol"} <= imported_modules(sample)
    assert _private_actor_calls(sample) == ["sample.py:4 actor._emit"]


SIZE_ON_CPU = """
import json, sys
from voxline.config import Settings
from voxline.engines.sizing import sized_for_device
settings = Settings(max_sessions=3)
assert sized_for_device(settings) is settings
print(json.dumps(sorted(sys.modules)))
"""


def test_the_api_process_sizes_capacity_on_the_cpu_without_model_code() -> None:
    done = subprocess.run([sys.executable, "-c", SIZE_ON_CPU], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    models = sorted(m for m in loaded if m.startswith("voxline.engines.models"))
    assert not models, f"sizing imported model code: {models}"
    assert "voxline.engines.factory" not in loaded  # the engine child's loaders
    assert "torch" not in loaded  # on the CPU sizing needs no torch at all


def test_sizing_reads_the_shipped_llm_from_its_gguf_header_without_converting(tmp_path: Path) -> None:
    from voxline.engines.checkpoints import llm_config
    from voxline.engines.model_memory import llama_params

    config = llm_config(None, tmp_path)  # no converted copy in this cache
    assert llama_params(config) == 134_515_008  # SmolLM2-135M, tied embeddings
    assert (config["num_key_value_heads"], config["max_position_embeddings"]) == (3, 8192)
    assert list(tmp_path.iterdir()) == []  # nothing was converted or written

"""The architecture's one rule, checked: imports point one way (codecs/kernels <- engines
<- sessions <- realtime <- cli) and no module imports itself back through a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "voxline"
# errors, config, logs, version and aio (asyncio helpers) are the foundation every layer may use. The package
# root is the SDK's face, so it sits on top with sdk/, cli.py and commands.py.
RANK = {"codecs": 0, "kernels": 0, "errors": 0, "config": 0, "logs": 0, "version": 0, "aio": 0,
        "engines": 1, "sessions": 2, "realtime": 3}
TOP = 4  # voxline (the root), sdk/, cli.py and commands.py: the composition on top


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("voxline")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name.startswith("voxline"):
                out.add(name)
    return out


def rank(name: str) -> int:
    parts = name.split(".")
    if len(parts) < 2:
        return TOP
    return RANK.get(parts[1], TOP)


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_no_upward_import() -> None:
    upward = [(mod, dep) for mod, deps in graph().items() for dep in deps
              if rank(dep) > rank(mod)]
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    g = graph()
    known = set(g)

    def resolve(dep: str) -> str | None:
        while dep and dep not in known:
            dep = dep.rsplit(".", 1)[0] if "." in dep else ""
        return dep or None

    edges = {m: {r for d in deps if (r := resolve(d)) and r != m and not m.startswith(r + ".")}
             for m, deps in g.items()}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in edges.get(m, ()):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]) if d in path else d)
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == []

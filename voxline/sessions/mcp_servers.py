"""MCP servers as a session configures them (OpenAI's ``{"type": "mcp", ...}`` tools),
validated, and the requests / outcomes of the network work the runner does for them.
Pure data, no I/O; ``voxline.sessions.mcp`` holds the session side, ``mcp_client`` the I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from voxline.errors import ProtocolError

LABEL = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what Chat Completions servers accept


@dataclass(frozen=True)
class McpServer:
    """One ``mcp`` tool entry of the session, validated."""

    label: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    allowed: tuple[str, ...] | None = None  # tool names; None: all
    allowed_read_only: bool | None = None
    approval: str | dict[str, Any] = "always"  # OpenAI's default: ask

    def allows(self, tool: dict[str, Any]) -> bool:
        if self.allowed is not None and tool["name"] not in self.allowed:
            return False
        return self.allowed_read_only is None or _read_only(tool) == self.allowed_read_only

    def needs_approval(self, tool: dict[str, Any]) -> bool:
        if isinstance(self.approval, str):
            return self.approval == "always"
        never = self.approval.get("never")
        if never is not None and _matches(never, tool):
            return False
        always = self.approval.get("always")
        return always is None or _matches(always, tool)


def _read_only(tool: dict[str, Any]) -> bool:
    return bool((tool.get("annotations") or {}).get("readOnlyHint"))


def _matches(flt: dict[str, Any], tool: dict[str, Any]) -> bool:
    names = flt.get("tool_names")
    if names is not None and tool["name"] not in names:
        return False
    return flt.get("read_only") is None or _read_only(tool) == flt["read_only"]


# ------------------------------------------------------------------ requests / outcomes


@dataclass(frozen=True)
class ListMcpTools:
    item_id: str
    server: McpServer


@dataclass(frozen=True)
class CallMcpTool:
    item_id: str
    server: McpServer
    name: str
    arguments: str


McpRequest = ListMcpTools | CallMcpTool


@dataclass(frozen=True)
class McpToolsListed:
    item_id: str
    tools: tuple[dict[str, Any], ...] = ()
    error: str | None = None  # why listing failed (None: it worked)


@dataclass(frozen=True)
class McpCallDone:
    item_id: str
    output: str | None = None
    error: dict[str, Any] | None = None  # OpenAI's mcp_call error shape


McpOutcome = McpToolsListed | McpCallDone


# ------------------------------------------------------------------------- validation


def _bad(event: str, param: str, what: str) -> ProtocolError:
    return ProtocolError(f"{event}: {what}", code="invalid_value", param=param)


def parse_server(event: str, param: str, tool: dict[str, Any]) -> McpServer:
    """`tool` (one ``{"type": "mcp"}`` entry at `param`) as a server, or ProtocolError."""
    label = tool.get("server_label")
    if not isinstance(label, str) or not LABEL.match(label):
        raise _bad(event, f"{param}.server_label", "server_label must be 1-64 letters, digits, "
                   f"_ or -, got {label!r}")
    for unsupported in ("connector_id", "tunnel_id"):
        if tool.get(unsupported) is not None:
            raise _bad(event, f"{param}.{unsupported}", f"{unsupported} is not supported by "
                       "this server (give server_url)")
    url = tool.get("server_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise _bad(event, f"{param}.server_url", f"server_url must be an http(s) URL, got {url!r}")
    headers = tool.get("headers") or {}
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise _bad(event, f"{param}.headers", "headers must map strings to strings")
    if isinstance(tool.get("authorization"), str):
        headers = {**headers, "Authorization": f"Bearer {tool['authorization']}"}
    allowed, read_only = _parse_allowed(event, f"{param}.allowed_tools", tool.get("allowed_tools"))
    approval = tool.get("require_approval", "always")
    if approval is None:
        approval = "always"
    if not (approval in ("always", "never") or isinstance(approval, dict)):
        raise _bad(event, f"{param}.require_approval", "require_approval must be 'always', "
                   f"'never' or a filter object, got {approval!r}")
    return McpServer(label, url, tuple(sorted(headers.items())), allowed, read_only, approval)


def _parse_allowed(event: str, param: str, value: object) -> tuple[tuple[str, ...] | None,
                                                                     bool | None]:
    if value is None:
        return None, None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value), None
    if isinstance(value, dict):
        names = value.get("tool_names")
        if names is not None and not (isinstance(names, list)
                                      and all(isinstance(v, str) for v in names)):
            raise _bad(event, f"{param}.tool_names", "tool_names must be a list of strings")
        return (tuple(names) if names is not None else None), value.get("read_only")
    raise _bad(event, param, "allowed_tools must be a list of tool names or a filter object")


def servers_of(tools: tuple[dict, ...] | list[dict], event: str = "session.update",
               root: str = "session") -> dict[str, McpServer]:
    """The MCP servers among `tools`, by label; ProtocolError for a bad or repeated one."""
    out: dict[str, McpServer] = {}
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            server = parse_server(event, f"{root}.tools[{i}]", tool)
            if server.label in out:
                raise _bad(event, f"{root}.tools[{i}].server_label",
                           f"server_label {server.label!r} is used twice")
            out[server.label] = server
    return out

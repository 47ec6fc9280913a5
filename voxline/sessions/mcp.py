"""MCP tools in a session, sans I/O: OpenAI's ``{"type": "mcp", ...}`` tools.

Split. The engine never hears of MCP: it sees plain function tools (the tools a server
listed) and returns function calls. This module maps those names back to their server,
turns the calls into ``mcp_call`` / ``mcp_approval_request`` items and their events, and
asks for the network work as *requests* (`ListMcpTools`, `CallMcpTool`) that the runner
performs off the session's loop (``voxline.sessions.mcp_client``), bounded by a timeout;
their *outcomes* (`McpToolsListed`, `McpCallDone`) come back through
``SessionActor.on_mcp``. Nothing here does I/O or reads a clock.

Lifecycle. ``session.update`` with an MCP tool whose server is new (or changed) adds an
``mcp_list_tools`` item (``mcp_list_tools.in_progress``, then ``.completed`` or
``.failed`` with an ``error`` event naming the server); the listed tools allowed by
``allowed_tools`` become the engine's function tools. A call of one streams as
``response.mcp_call_arguments.delta/done`` and runs (``response.mcp_call.in_progress``,
then ``.completed`` with ``output`` or ``.failed`` with ``error``); the response ends once
its calls have, and a follow-up response lets the model use the results. A tool that
``require_approval`` covers becomes an ``mcp_approval_request`` item instead; the client's
``mcp_approval_response`` item runs the call (approve) or tells the model it was denied,
and a follow-up response answers. A failure of any kind ends the call with an error in the
item; the session lives on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.sessions import events as ev
from voxline.sessions import items as it
from voxline.sessions.actor_view import ActorView
from voxline.sessions.function_calls import output_call_item
from voxline.sessions.ids import new_id
from voxline.sessions.mcp_servers import (
    TOOL_NAME,
    CallMcpTool,
    ListMcpTools,
    McpCallDone,
    McpOutcome,
    McpRequest,
    McpServer,
    McpToolsListed,
    servers_of,
)
from voxline.sessions.records import ItemRecord

if TYPE_CHECKING:
    from voxline.sessions.records import ActiveResponse

# ---------------------------------------------------------------------- session state


@dataclass
class McpTools:
    """A session's MCP side; the actor delegates to it (see the module doc)."""

    actor: ActorView  # the SessionActor that owns this
    servers: dict[str, McpServer] = field(default_factory=dict)
    listed: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    requests: list[McpRequest] = field(default_factory=list)
    call_ids: dict[str, str] = field(default_factory=dict)  # call/approval item -> call_id
    running: dict[str, str | None] = field(default_factory=dict)  # call item -> response id
    answered: set[str] = field(default_factory=set)  # approval requests answered
    follow_up: bool = False  # results the model has not answered yet

    def take_requests(self) -> list[McpRequest]:
        out, self.requests = self.requests, []
        return out

    # ------------------------------------------------------------------ tools

    def configure(self, tools: tuple[dict, ...]) -> None:
        """Start listing the tools of servers new in `tools`; forget removed ones."""
        a = self.actor
        servers = servers_of(tools)
        for label in list(self.listed):
            if servers.get(label) != self.servers.get(label):
                del self.listed[label]
        for label, server in servers.items():
            if self.servers.get(label) == server:
                continue
            item = it.McpListToolsItem(id=new_id("item"), server_label=label)
            previous = a.order[-1] if a.order else None
            a.add_record(ItemRecord(item))
            a.emit(ev.ItemAdded(item=item, previous_item_id=previous))
            a.emit(ev.McpListToolsInProgress(item_id=item.id))
            self.requests.append(ListMcpTools(item.id, server))
        self.servers = servers

    def function_tools(self) -> tuple[dict[str, Any], ...]:
        """The listed tools as Realtime function tools for the engine (a name a function
        tool or an earlier server already has is left out)."""
        taken = {t.get("name") for t in self.actor.settings.tools if t.get("type") != "mcp"}
        out = []
        for label in self.servers:
            for tool in self.listed.get(label, ()):
                if tool["name"] in taken or not TOOL_NAME.match(tool["name"]):
                    continue
                taken.add(tool["name"])
                out.append({"type": "function", "name": tool["name"],
                            "description": tool.get("description") or "",
                            "parameters": tool.get("input_schema") or {}})
        return tuple(out)

    def owner(self, name: str) -> tuple[McpServer, dict[str, Any]] | None:
        """The server and tool behind a function name the model called (None: not MCP)."""
        if not any(t["name"] == name for t in self.function_tools()):
            return None
        for label, server in self.servers.items():
            for tool in self.listed.get(label, ()):
                if tool["name"] == name:
                    return server, tool
        return None

    def _listed(self, out: McpToolsListed, now: float) -> None:
        a = self.actor
        record = a.items.get(out.item_id)
        if record is None or not isinstance(record.item, it.McpListToolsItem):
            return  # deleted meanwhile
        label = record.item.server_label
        if out.error is not None:
            a.emit(ev.McpListToolsFailed(item_id=out.item_id))
            a.emit(ev.ItemDone(item=record.item, previous_item_id=a.previous_item(out.item_id)))
            a.send_error(f"session.update: listing the tools of MCP server {label!r} failed: "
                         f"{out.error}", code="mcp_list_tools_failed", type="server_error")
            return
        server = self.servers.get(label)
        tools = [t for t in out.tools if server is None or server.allows(t)]
        record.item = record.item.model_copy(update={"tools": tools})
        if server is not None:
            self.listed[label] = tuple(tools)
        a.emit(ev.McpListToolsCompleted(item_id=out.item_id))
        a.emit(ev.ItemDone(item=record.item, previous_item_id=a.previous_item(out.item_id)))
        a.commands.append(ep.UpdateStream(a.stream_id, a.engine_stream_config()))

    # ------------------------------------------------------------------ calls

    def on_call(self, r: ActiveResponse | None,
                out: ep.FunctionCallDelta | ep.FunctionCallDone) -> None:
        """The engine's function call `out` of a listed MCP tool, in response `r`."""
        if r is None:
            return
        if isinstance(out, ep.FunctionCallDone):
            self.call_done(r, out)
        elif r.cancel_reason is None:
            self.call_delta(r, out)

    def call_delta(self, r: ActiveResponse, out: ep.FunctionCallDelta) -> None:
        server, tool = self.owner(out.name) or (None, None)
        if server is None or tool is None or server.needs_approval(tool):
            return  # an approval request appears whole, once its arguments are known
        record, index = self._call_record(r, out, server)
        record.item = record.item.model_copy(
            update={"arguments": record.item.arguments + out.delta})  # type: ignore[union-attr]
        self.actor.emit(ev.McpCallArgumentsDelta(response_id=r.response.id,
                                                 item_id=out.item_id, output_index=index,
                                                  delta=out.delta))

    def call_done(self, r: ActiveResponse, out: ep.FunctionCallDone) -> None:
        a = self.actor
        server, tool = self.owner(out.name) or (None, None)
        assert server is not None and tool is not None
        self.call_ids[out.item_id] = out.call_id
        if server.needs_approval(tool):
            if not out.completed:
                return
            item: it.ConversationItem = it.McpApprovalRequestItem(
                id=out.item_id, server_label=server.label, name=out.name,
                arguments=out.arguments)
            record, index = self._call_record(r, out, server, item)
            a.emit(ev.OutputItemDone(response_id=r.response.id, output_index=index, item=item))
            a.emit(ev.ItemDone(item=item, previous_item_id=a.previous_item(out.item_id)))
            return
        if out.item_id not in r.calls and not out.completed:
            return
        record, index = self._call_record(r, out, server)
        record.item = record.item.model_copy(update={"arguments": out.arguments})
        a.emit(ev.McpCallArgumentsDone(response_id=r.response.id, item_id=out.item_id,
                                       output_index=index, arguments=out.arguments))
        if not out.completed:  # cut off by a cancel: never run
            self._finish(out.item_id, McpCallDone(out.item_id, error={
                "type": "tool_execution_error", "message": "the response was cancelled before "
                "the call's arguments were complete"}), index, r.response.id)
            return
        self._run(out.item_id, server, out.name, out.arguments, index, r.response.id)

    def _call_record(self, r: ActiveResponse, out: ep.FunctionCallDelta | ep.FunctionCallDone,
                     server: McpServer, item: it.ConversationItem | None = None
                     ) -> tuple[ItemRecord, int]:
        return output_call_item(self.actor, r, out.item_id, lambda: item or it.McpCallItem(
            id=out.item_id, server_label=server.label, name=out.name))

    def _run(self, item_id: str, server: McpServer, name: str, arguments: str, index: int,
             response_id: str | None) -> None:
        self.running[item_id] = response_id
        self.actor.emit(ev.McpCallInProgress(item_id=item_id, output_index=index))
        self.requests.append(CallMcpTool(item_id, server, name, arguments))

    def holds(self, response_id: str) -> bool:
        """Whether a call of that response is still running (its response.done waits)."""
        return response_id in self.running.values()

    def _call_finished(self, out: McpCallDone, now: float) -> None:
        response_id = self.running.pop(out.item_id, "")
        if response_id == "":
            return
        r = self.actor.response
        index = (r.calls.index(out.item_id) + 1
                 if r is not None and out.item_id in r.calls else 0)
        self._finish(out.item_id, out, index, response_id)

    def _finish(self, item_id: str, out: McpCallDone, index: int,
                response_id: str | None) -> None:
        a = self.actor
        record = a.items.get(item_id)
        if record is None or not isinstance(record.item, it.McpCallItem):
            return
        item = record.item.model_copy(update={"output": out.output, "error": out.error})
        record.item = item
        if out.error is None:
            a.emit(ev.McpCallCompleted(item_id=item_id, output_index=index))
        else:
            a.emit(ev.McpCallFailed(item_id=item_id, output_index=index))
        r = a.response
        if response_id is not None and r is not None and r.response.id == response_id:
            a.emit(ev.OutputItemDone(response_id=response_id, output_index=index, item=item))
        a.emit(ev.ItemDone(item=item, previous_item_id=a.previous_item(item_id)))
        result = out.output if out.error is None else f"error: {out.error['message']}"
        self._tell_engine(item.approval_request_id or item_id, result or "")
        if response_id is None or (r is not None and r.cancel_reason is None):
            self.follow_up = True

    def _tell_engine(self, call_item_id: str, text: str) -> None:
        a = self.actor
        call_id = self.call_ids.get(call_item_id, call_item_id)
        a.commands.append(ep.AddItem(a.stream_id, f"{call_item_id}_output",
                                     "function_call_output", ep.function_output_text(call_id, text),
                                     None))

    # --------------------------------------------------------------- approvals

    def approval(self, item: it.McpApprovalResponseItem, previous: str | None) -> None:
        """The client's ``mcp_approval_response``: run the call or tell the model no."""
        a = self.actor
        request = a.items.get(item.approval_request_id)
        if request is None or not isinstance(request.item, it.McpApprovalRequestItem):
            raise ProtocolError("conversation.item.create: no mcp_approval_request item with id "
                                f"{item.approval_request_id!r} in the conversation",
                                code="invalid_value", param="item.approval_request_id")
        if item.approval_request_id in self.answered:
            raise ProtocolError("conversation.item.create: mcp_approval_request "
                                f"{item.approval_request_id!r} was already answered",
                                code="invalid_value", param="item.approval_request_id")
        item = item.with_id()
        if item.id in a.items:
            raise ProtocolError(f"conversation.item.create: an item with id {item.id!r} "
                                "already exists", code="invalid_value", param="item.id")
        self.answered.add(item.approval_request_id)
        a.add_record(ItemRecord(item), previous)
        prev = a.previous_item(item.id)
        a.emit(ev.ItemAdded(item=item, previous_item_id=prev))
        a.emit(ev.ItemDone(item=item, previous_item_id=prev))
        req = request.item
        server = self.servers.get(req.server_label)
        if not item.approve or server is None:
            why = "the user denied this tool call" if item.approve is False else \
                f"MCP server {req.server_label!r} is no longer configured"
            reason = f": {item.reason}" if item.reason else ""
            self._tell_engine(req.id or "", json.dumps({"error": why + reason}))
            self.follow_up = True
            return
        call = it.McpCallItem(id=new_id("item"), server_label=req.server_label, name=req.name,
                              arguments=req.arguments, approval_request_id=req.id)
        a.add_record(ItemRecord(call))
        a.emit(ev.ItemAdded(item=call, previous_item_id=a.previous_item(call.id or "")))
        self._run(call.id or "", server, req.name, req.arguments, 0, None)

    # ---------------------------------------------------------------- outcomes

    def on_outcome(self, out: McpOutcome, now: float) -> None:
        if isinstance(out, McpToolsListed):
            self._listed(out, now)
        else:
            self._call_finished(out, now)

    def take_follow_up(self) -> bool:
        """Whether a response should now answer MCP results (once, when none is active)."""
        if self.follow_up and self.actor.response is None and not self.running:
            self.follow_up = False
            return True
        return False

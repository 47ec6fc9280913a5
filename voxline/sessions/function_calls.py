"""A reply's function calls as conversation items: the actor's half for client-run tools.

The engine streams a call as `FunctionCallDelta`s (its name first, then pieces of its
arguments) and one `FunctionCallDone`. Each call becomes a `function_call` item, announced
on first sight as the reply's next output (the reply's message is output 0), filled in
delta by delta, and done with its final arguments (``incomplete`` when the reply was cut
off). Calls to MCP tools go to `sessions.mcp` instead; the client runs these.

Parallel calls: a reply may make several calls at once (the remote model's ``tool_calls``
list); each is its own item, in the model's order, and the client may answer them in any
order. A ``response.create`` that arrives while some of the completed calls still lack
their ``function_call_output`` waits (:meth:`FunctionCalls.hold`) and starts once the last
one is answered, as OpenAI's API does: the model always reads every call with its output.
"""

from __future__ import annotations

from collections.abc import Callable

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions import items as it
from voxline.sessions.actor_view import ActorView
from voxline.sessions.records import ActiveResponse, ItemRecord


def output_call_item(host: ActorView, r: ActiveResponse, item_id: str,
                     make: Callable[[], it.ConversationItem]) -> tuple[ItemRecord, int]:
    """The call item `item_id` of reply `r` (a function or MCP call) and its output index:
    on first sight `make()` is added to the conversation and announced
    (`response.output_item.added`, `conversation.item.added`)."""
    if item_id not in r.calls:
        item = make()
        previous = host.order[-1] if host.order else None
        host.add_record(ItemRecord(item))
        r.calls.append(item_id)
        host.emit(ev.OutputItemAdded(response_id=r.response.id, output_index=len(r.calls),
                                     item=item))
        host.emit(ev.ItemAdded(item=item, previous_item_id=previous))
    return host.items[item_id], r.calls.index(item_id) + 1


class FunctionCalls:
    def __init__(self, actor: ActorView) -> None:
        self._actor = actor
        self.made: set[str] = set()  # call_ids of the calls replies made (not the client's)
        self.held: cmd.ResponseCreate | None = None  # waits for `unanswered()` to empty

    def unanswered(self) -> list[str]:
        """The call_ids of the latest reply's completed calls that have no output yet. The
        conversation is the record: a call deleted, or one from before a later reply (the
        user spoke on), waits for nothing."""
        a = self._actor
        items = [a.items[i].item for i in a.order]
        last_reply = max((n for n, item in enumerate(items) if isinstance(item, it.MessageItem)
                          and item.role == "assistant"), default=-1)
        answered = {i.call_id for i in items if isinstance(i, it.FunctionCallOutputItem)}
        return [i.call_id for i in items[last_reply + 1:]
                if isinstance(i, it.FunctionCallItem) and i.status == "completed"
                and i.call_id in self.made and i.call_id not in answered]

    def hold(self, e: cmd.ResponseCreate) -> bool:
        """True when `e` must wait for outputs of calls still unanswered (it is kept, and
        :meth:`answered` gives it back once the last output arrives)."""
        waiting = self.unanswered()
        if not waiting:
            return False
        if self.held is not None:
            raise ProtocolError("response.create: a response is already waiting for the "
                                "outputs of calls " + ", ".join(map(repr, waiting)),
                                code="conversation_already_has_active_response")
        self.held = e
        return True

    def answered(self) -> cmd.ResponseCreate | None:
        """After an output arrived: the held response.create, once no call waits."""
        if self.held is None or self.unanswered():
            return None
        held, self.held = self.held, None
        return held

    def _record(self, r: ActiveResponse, out: ep.FunctionCallDelta | ep.FunctionCallDone
                ) -> tuple[ItemRecord, int]:
        """The function_call item `out` adds to (made, and announced, on first sight) and its
        output index."""
        return output_call_item(self._actor, r, out.item_id, lambda: it.FunctionCallItem(
            id=out.item_id, call_id=out.call_id, name=out.name, arguments="",
            status="in_progress"))

    def delta(self, r: ActiveResponse | None, out: ep.FunctionCallDelta) -> None:
        """A piece of a call of the active reply `r` (None: not the active reply's)."""
        if r is None or r.cancel_reason is not None:
            return
        record, index = self._record(r, out)
        assert isinstance(record.item, it.FunctionCallItem)
        record.item = record.item.model_copy(
            update={"arguments": record.item.arguments + out.delta})
        self._actor.emit(ev.FunctionCallArgumentsDelta(
            response_id=r.response.id, item_id=out.item_id, output_index=index,
            call_id=out.call_id, delta=out.delta))

    def done(self, r: ActiveResponse | None, out: ep.FunctionCallDone) -> None:
        if r is None or (out.item_id not in r.calls and not out.completed):
            return  # a call cut off before anything of it was sent
        record, index = self._record(r, out)
        item = it.FunctionCallItem(id=out.item_id, call_id=out.call_id, name=out.name,
                                   arguments=out.arguments,
                                   status="completed" if out.completed else "incomplete")
        record.item = item
        if out.completed:
            self.made.add(out.call_id)
        actor = self._actor
        actor.emit(ev.FunctionCallArgumentsDone(
            response_id=r.response.id, item_id=out.item_id, output_index=index,
            call_id=out.call_id, name=out.name, arguments=out.arguments))
        actor.emit(ev.OutputItemDone(response_id=r.response.id, output_index=index, item=item))
        actor.emit(ev.ItemDone(item=item, previous_item_id=actor.previous_item(out.item_id)))

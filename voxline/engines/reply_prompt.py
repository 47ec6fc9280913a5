"""A reply's prompt and its generation request: the instructions rendered and checked
against the context window, the budget left for the conversation, the sampling settings
and tools of the response, resolved over the stream's.

`ReplyPrompts.new_run` makes the `ResponseRun` of a reply that generates from the
conversation as it stands (allocating the stream's KV slot on its first reply), or
refuses with an error naming the field and returns None.
"""

from __future__ import annotations

import torch

from voxline.engines import protocol as p
from voxline.engines.llm_stage import ChatModel, GenerationRequest, Slot
from voxline.engines.response_run import ResponseBook, ResponseRun, new_chunker
from voxline.engines.streams import StreamState
from voxline.engines.tts_stage import TTSStage


class ReplyPrompts:
    """Builds replies' prompts and requests for `model`; errors go to `book`."""

    def __init__(self, model: ChatModel, tts: TTSStage, book: ResponseBook) -> None:
        self.model = model
        self.tts = tts  # whether it takes streaming text decides the chunker
        self.book = book

    def new_run(self, stream: StreamState, cfg: p.ResponseConfig, response_id: str,
                item_id: str) -> ResponseRun | None:
        """A response generating from the conversation as it stands (None: no free slot)."""
        llm = self.model
        if stream.slot is None:
            index = llm.alloc_slot()
            if index is None:
                self.book.error(stream, "response: no free LLM slot (engine at capacity), try "
                                "again later", p.ErrorCode.CAPACITY)
                return None
            stream.slot = Slot(index)
        conversation = stream.conversation
        window, truncation = stream.window, stream.config.truncation
        max_tokens = cfg.max_output_tokens or stream.config.max_output_tokens
        # (a speculation that cannot start just does not; its response will say why)
        frame = self.prompt_frame(stream, cfg, report=bool(response_id))
        if frame is None:
            return None
        system, budget, header = frame
        temperature = stream.config.temperature if cfg.temperature is None else cfg.temperature
        generator = None
        if cfg.seed is not None:
            generator = torch.Generator().manual_seed(cfg.seed)
        stream.responses += 1
        tools = stream.config.tools if cfg.tools is None else cfg.tools
        tool_choice = stream.config.tool_choice if cfg.tool_choice is None else cfg.tool_choice
        if tools and not getattr(llm, "supports_tools", False):
            self.book.error(stream, "response: tools need a reply model that can call functions "
                            "(a remote OpenAI-compatible server); the embedded model has none",
                            p.ErrorCode.INVALID_VALUE)
            return None
        effort = cfg.reasoning_effort or stream.config.reasoning_effort
        if effort is not None and not getattr(llm, "supports_reasoning_effort", False):
            self.book.error(stream, "response: reasoning.effort needs a reasoning reply model (a "
                            "remote OpenAI-compatible server); the embedded model does not "
                            "reason", p.ErrorCode.INVALID_VALUE)
            return None
        request = GenerationRequest(
            request_id=f"{stream.internal_id}/{stream.responses}",
            slot=stream.slot,
            prompt=lambda: window.prompt(conversation, system, budget - len(system),
                                         truncation) + header,
            shared_prefix=len(system),
            max_tokens=max_tokens,
            temperature=temperature,
            generator=generator,
            stream_id=stream.internal_id,
            tools=tuple(tools),
            tool_choice=tool_choice,
            reasoning_effort=effort,
            parallel_tool_calls=stream.config.parallel_tool_calls
            if cfg.parallel_tool_calls is None else cfg.parallel_tool_calls,
        )
        return ResponseRun(response_id, item_id, cfg, request, new_chunker(self.tts.streams_text),
                           stream.config.speed)

    def prompt_frame(self, stream: StreamState, cfg: p.ResponseConfig,
                     report: bool = False) -> tuple[list[int], int, list[int]] | None:
        """What a reply's prompt is built of: the rendered instructions, the tokens they
        and the messages may take, the generation header (None: the instructions alone
        fill it; the error sent if `report`)."""
        header = self.model.generation_header()
        max_tokens = cfg.max_output_tokens or stream.config.max_output_tokens
        # room for the header and the reply (capped so a huge limit can't starve context)
        budget = self.model.max_len - len(header) - min(max_tokens, self.model.max_len // 4)
        system = self.system_prompt(stream, cfg, budget, report)
        return None if system is None else (system, budget, header)

    def system_prompt(self, stream: StreamState, cfg: p.ResponseConfig, budget: int,
                       report: bool) -> list[int] | None:
        """The rendered instructions, or None when they alone fill the `budget` (refused
        with an error naming the field, if `report`). A text longer than `budget` tokens
        can cover (`max_token_chars` each, where the model says) is refused untokenized:
        megabytes through a tokenizer would stall the engine loop for seconds."""
        llm = self.model
        text = cfg.instructions or stream.config.instructions
        unit = getattr(llm, "context_unit", "tokens")
        per_token = getattr(llm, "max_token_chars", None)
        if per_token is not None and len(text) > budget * per_token:
            size = f"{len(text)} characters"
        else:
            system = llm.render_message("system", text)
            if len(system) <= budget:
                return system
            size = f"{len(system)} {unit}"
        if report:
            field = "response.instructions" if cfg.instructions else "session.instructions"
            self.book.emit(p.StreamError(
                stream.external_id, f"{field} is {size}, more than the {budget} {unit} the "
                f"reply model can hold (its context window is {llm.max_len} {unit}, less room "
                "for the reply); shorten the instructions", p.ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                param=field))
        return None

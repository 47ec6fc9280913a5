"""The LLM stage: continuous batching of generation requests over per-stream KV slots.

Stage interface (`voxline.engines.stage`): `schedule` -> `StepPlan`, `execute(plan)`
-> a `StepResult`, logits and sampled tokens (worker thread), `update(plan, result)` ->
the (request, token) pairs confirmed.

Split in the vLLM way so the scheduling logic is pure and testable without a model:
`schedule()` builds a `StepPlan` (which slot feeds which tokens), the model runs the plan
and picks each sampling row's token (possibly on a worker thread while new inputs
arrive), and `update(plan, result)` confirms the tokens. A request whose inputs changed
while its step was in flight (its `epoch` moved) has that step's work discarded: the
cache is rolled back to the confirmed tokens and the sampled token is dropped.

A `paused` request (flow control: `Responses` holds a reply that is far enough ahead
of its playout) sits out of the batch, keeping its slot, until it is unpaused.

A `tentative` request (a warm prefill, `voxline.engines.warm_prefill`) only computes its
prompt's K/V: it samples nothing, runs only in a step no other request wants (lowest
priority, `TENTATIVE_CHUNK` tokens at a time, so a reply that arrives waits at most one
small chunk) and ends once its prompt is cached. Rolling its slot back ends it too. The
slot keeps the logits of its last step (`Slot.kept`): a reply whose prompt is exactly
the slot's tokens samples its first token from them, with no forward at all, instead of
feeding its last prompt token again.

Every step a request's prompt is recomputed as `target()`; only the part after the
longest common prefix with the slot's confirmed tokens is fed. That one rule covers
first prefill, a new turn appended to a cached conversation, edits that roll the cache
back, and decoding (where the uncached suffix is the last sampled token).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from voxline.config import setting_default
from voxline.engines.stage import StreamId
from voxline.kernels.cuda_graphs import StageStream

# A tentative (warm prefill) request's tokens per step: the most a reply that arrives
# meanwhile waits for.
TENTATIVE_CHUNK = 32
STEP_TOKENS: int = setting_default("llm_step_tokens")  # a step's token budget by default


class LanguageModel(Protocol):
    """What the stage needs from a causal LM with a slot-based KV cache."""

    eos_token_ids: frozenset[int]
    max_len: int

    def alloc_slot(self) -> int | None: ...

    def free_slot(self, slot: int) -> None: ...

    def truncate(self, slot: int, length: int) -> None: ...

    def save_prefix(self, slot: int, tokens: list[int]) -> None:
        """Keep the K/V of `slot`'s first tokens (`tokens`) for other streams to start from."""
        ...

    def load_prefix(self, slot: int, target: list[int]) -> int:
        """Fill the empty `slot` with the longest kept prefix of `target`; its length (0: none)."""
        ...

    def forward(self, slots: list[int], tokens: list[list[int]]) -> torch.Tensor:
        """Append `tokens[i]` to slot `slots[i]`'s cache; logits of each last token [B, V]."""
        ...

    def sample(self, logits: torch.Tensor, temperatures: list[float],
               generators: list[torch.Generator | None]) -> list[int]: ...


class ChatModel(LanguageModel, Protocol):
    """A LanguageModel plus its chat format."""

    def render_message(self, role: str, text: str) -> list[int]: ...

    def generation_header(self) -> list[int]: ...

    def message_footer(self) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


def forward_and_pick(model: LanguageModel, slots: list[int], tokens: list[list[int]],
                     temperatures: list[float], generators: list[torch.Generator | None]
                     ) -> tuple[torch.Tensor, list[int]]:
    """The model's step and one token per row: the model's own ``forward_and_pick`` where
    it has one (the embedded Llama picks inside its CUDA graphs), else ``forward`` then
    ``sample``."""
    own = getattr(model, "forward_and_pick", None)
    if own is not None:
        return own(slots, tokens, temperatures, generators)
    logits = model.forward(slots, tokens)
    return logits, model.sample(logits, temperatures, generators)


class FinishReason(enum.IntEnum):
    STOP = 1  # EOS
    LENGTH = 2  # max_output_tokens
    ABORT = 3  # cancelled / stream closed
    ERROR = 4  # context cannot fit


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    """A stream's KV slot and the tokens confirmed in it (a mirror of the cache)."""

    index: int
    tokens: list[int] = field(default_factory=list)
    stale: bool = False  # the cache may hold more than `tokens` (see `LLMStage.roll_back`)
    # A warm prefill's logits after its last token, and the tokens they follow.
    kept: torch.Tensor | None = None
    kept_after: list[int] = field(default_factory=list)

    def kept_logits(self) -> torch.Tensor | None:
        """The kept logits, if the slot still holds exactly the tokens they follow."""
        return self.kept if self.kept is not None and self.tokens == self.kept_after else None


@dataclass
class ToolCall:
    """A function call as the model writes it; `unsent` is argument text not yet emitted."""

    call_id: str
    name: str
    arguments: str = ""
    unsent: str = ""


@dataclass
class GenerationRequest:
    request_id: str
    slot: Slot
    prompt: Callable[[], list[int]]  # conversation + generation header, recomputed per step
    max_tokens: int
    temperature: float = 0.0
    generator: torch.Generator | None = None
    generated: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    epoch: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = -1  # prompt tokens found in the cache at first schedule
    stream_id: StreamId = 0  # the engine-internal stream the request serves
    # the prompt's first tokens every stream shares (the system prompt): their K/V are
    # kept once computed, so a new stream with the same instructions starts from them
    shared_prefix: int = 0
    # Set by a backend that supports tools (remote); the embedded stage has none.
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    reasoning_effort: str | None = None  # remote backend: chat completions' reasoning_effort
    parallel_tool_calls: bool | None = None  # remote backend, with tools
    calls: list[ToolCall] = field(default_factory=list)  # function calls the model made
    error: str | None = None  # why the backend failed it (FinishReason.ERROR), if it says
    first_token_ms: float | None = None  # remote backend: request sent -> first token
    reported_output_tokens: int | None = None  # the backend's count, where known
    # Held by flow control (its reply's audio is far enough ahead of playout): not
    # scheduled, and no work for the stage, until cleared; it keeps its slot and tokens.
    paused: bool = False
    # A warm prefill: computes the prompt's K/V and nothing else (see the module docstring).
    tentative: bool = False

    def target(self) -> list[int]:
        return self.prompt() + self.generated


@dataclass
class PlanEntry:
    request: GenerationRequest
    tokens: list[int]
    epoch: int
    samples: bool  # this chunk reaches the end of the target: sample a token from it
    kept: torch.Tensor | None = None  # no tokens fed: sample from the slot's kept logits


@dataclass
class StepResult:
    """What `execute` hands `update`: the fed rows' logits, and the token sampled for each
    entry that samples, in entry order."""

    logits: torch.Tensor
    picks: list[int]


@dataclass
class StepPlan:
    entries: list[PlanEntry]

    @property
    def fed(self) -> list[PlanEntry]:
        """The entries the model runs (not those sampled from kept logits), in row order."""
        return [e for e in self.entries if e.kept is None]

    @property
    def prompt_lengths(self) -> list[int]:
        """Tokens of each fed prompt (an entry feeding more than one token)."""
        return [len(e.tokens) for e in self.fed if len(e.tokens) > 1]

    @property
    def slots(self) -> list[int]:
        return [e.request.slot.index for e in self.fed]

    @property
    def tokens(self) -> list[list[int]]:
        return [e.tokens for e in self.fed]


def plan_kind(plan: StepPlan) -> str | None:
    """The stage load report times LLM plans by this: prompts slow a step that every
    speaking reply's next token waits for."""
    return None if not plan.fed else "with prompts" if plan.prompt_lengths else "decode only"


@dataclass
class PlanShapes:
    """What the stage's plans held since the last note: a step that carries prompts runs
    them beside the decode rows (eagerly, or from prefill graphs), and every speaking
    reply's next token waits for it."""

    plans: int = 0
    decode_rows: int = 0
    prompt_plans: int = 0
    prompt_tokens: int = 0
    max_tokens: int = 0

    def add(self, plan: StepPlan) -> None:
        fed = plan.fed
        prompts = plan.prompt_lengths
        self.plans += 1
        self.decode_rows += len(fed) - len(prompts)
        self.prompt_plans += bool(prompts)
        self.prompt_tokens += sum(prompts)
        self.max_tokens = max(self.max_tokens, sum(len(e.tokens) for e in fed))

    def describe(self) -> str | None:
        if not self.plans:
            return None
        return (f"{self.decode_rows / self.plans:.1f} decode rows a plan; {self.prompt_plans} "
                f"plans with prompts, {self.prompt_tokens / max(1, self.prompt_plans):.0f} "
                f"prompt tokens each; largest {self.max_tokens} tokens")


class LLMStage:
    """Continuous batching: requests join and leave the running batch on every step."""

    def __init__(self, model: LanguageModel, token_budget: int = STEP_TOKENS) -> None:
        self.model = model
        self.token_budget = token_budget
        self.running: dict[str, GenerationRequest] = {}
        self._in_flight: set[int] = set()  # slots of the step scheduled and not yet updated
        self._shapes = PlanShapes()
        # urgent: a reply's first words wait on its prompt and first tokens
        self._stream = StageStream(getattr(model, "device", None), urgent=True)
        self.keep_logits = True  # warm prefills keep their logits (off: benchmarks A/B it)

    def add(self, request: GenerationRequest) -> None:
        self.running[request.request_id] = request

    def abort(self, request_id: str) -> GenerationRequest | None:
        """Take the request out of the batch now; an in-flight step's token is discarded."""
        req = self.running.pop(request_id, None)
        if req is not None:
            req.finish = FinishReason.ABORT
            req.epoch += 1
        return req

    def roll_back(self, slot: Slot, length: int) -> None:
        """Forget every token of `slot` after the first `length`. If a step in flight may
        still be writing the slot, only the mirror changes now: the cache is cut when that
        step lands (`update` rolls it back) or before the slot's next step."""
        for req in list(self.running.values()):
            if req.tentative and req.slot is slot:
                self.abort(req.request_id)  # what it computes would follow the cut tokens
        del slot.tokens[length:]
        if slot.index in self._in_flight:
            slot.stale = True
        else:
            self.model.truncate(slot.index, length)

    def end_tentative(self, request_id: str) -> None:
        """End a tentative request: now, or once the step in flight lands (its tokens kept)."""
        req = self.running.get(request_id)
        if req is None:
            return
        if req.slot.index in self._in_flight:
            req.finish = FinishReason.STOP  # leaves the batch in `update`
        else:
            self.abort(request_id)

    def has_work(self) -> bool:
        return any(not r.paused for r in self.running.values())

    def _schedulable(self) -> list[GenerationRequest]:
        """Decodes first (1 token each, latency-critical), then prefills; tentative
        requests only when nothing else runs."""
        active = [r for r in self.running.values() if not r.paused and r.finish is None]
        replies = sorted((r for r in active if not r.tentative), key=lambda r: not r.generated)
        return replies or [r for r in active if r.tentative]

    def schedule(self) -> StepPlan | None:
        """Pick each running request's next tokens under the step's token budget."""
        self._in_flight.clear()  # (called only when no step is running)
        entries: list[PlanEntry] = []
        budget = self.token_budget
        for req in self._schedulable():
            if budget <= 0:
                break
            target = req.target()
            if len(target) + 1 > self.model.max_len:
                req.finish = FinishReason.ERROR
                continue
            if not req.slot.tokens and (n := self.model.load_prefix(req.slot.index, target)):
                req.slot.tokens[:] = target[:n]
                req.slot.stale = False
            keep = common_prefix(req.slot.tokens, target)
            if req.tentative and keep == len(target):  # all cached: nothing to do
                req.finish = FinishReason.STOP
                del self.running[req.request_id]
                continue
            kept = req.slot.kept_logits() if keep == len(target) == len(req.slot.tokens) else None
            if keep == len(target) and kept is None:  # fully cached: re-feed the last token
                keep -= 1
            if keep < len(req.slot.tokens) or req.slot.stale:
                self.model.truncate(req.slot.index, keep)
                del req.slot.tokens[keep:]
                req.slot.stale = False
            if req.cached_tokens < 0:
                req.cached_tokens = keep
                req.prompt_tokens = len(target)
            if kept is not None:  # a warm prefill computed this prompt whole: no forward
                entries.append(PlanEntry(req, [], req.epoch, samples=True, kept=kept))
                continue
            todo = target[keep:]
            chunk = todo[:min(budget, TENTATIVE_CHUNK) if req.tentative else budget]
            budget -= len(chunk)
            entries.append(PlanEntry(req, chunk, req.epoch,
                                     samples=len(chunk) == len(todo) and not req.tentative))
        plan = StepPlan(entries) if entries else None
        if plan is not None:
            self._in_flight.update(plan.slots)
            self._shapes.add(plan)
        return plan

    def load_note(self) -> str | None:
        """For the engine's stage load line: the shape of the plans since the last note."""
        shapes, self._shapes = self._shapes, PlanShapes()
        return shapes.describe()

    def execute(self, plan: StepPlan) -> StepResult:
        """Run the model on the plan and pick each sampling entry's token (safe to call
        from a worker thread). Picked here, on the stage's stream (inside the model's
        graphs where it has them), not in `update`: the engine loop neither launches the
        sampling nor waits for it."""
        return self._stream.run(self._forward_and_sample, plan)

    def _forward_and_sample(self, plan: StepPlan) -> StepResult:
        fed = plan.fed
        # rows that do not sample (a prompt chunk short of its end) pick greedily, unread
        temps = [e.request.temperature if e.samples else 0.0 for e in fed]
        gens = [e.request.generator if e.samples else None for e in fed]
        logits, fed_picks = (forward_and_pick(self.model, plan.slots, plan.tokens, temps, gens)
                             if fed else (torch.empty(0), []))
        kept = [e for e in plan.entries if e.kept is not None]
        kept_picks = (self.model.sample(torch.stack([e.kept for e in kept]),  # type: ignore[misc]
                                        [e.request.temperature for e in kept],
                                        [e.request.generator for e in kept]) if kept else [])
        fed_iter, kept_iter = iter(fed_picks), iter(kept_picks)
        picks = []
        for entry in plan.entries:
            pick = next(kept_iter) if entry.kept is not None else next(fed_iter)
            if entry.samples:
                picks.append(pick)
        return StepResult(logits, picks)

    def update(self, plan: StepPlan, result: StepResult) -> list[tuple[GenerationRequest, int]]:
        """Confirm the plan's tokens and its sampled ones; returns (request, new token) pairs.

        Finished requests (EOS, length, context error) leave the batch here; a request
        aborted while the step ran has its work rolled back and its token dropped.
        """
        self._in_flight.clear()
        logits, picks = result.logits, iter(result.picks)
        sampled: list[tuple[GenerationRequest, int]] = []
        row = -1  # the logits' row of the entry: the fed entries', in order
        for entry in plan.entries:
            req = entry.request
            row += entry.kept is None
            pick = next(picks) if entry.samples else None
            if req.epoch != entry.epoch or req.request_id not in self.running:
                if entry.kept is None:  # inputs changed mid-step: roll back what it wrote
                    self.model.truncate(req.slot.index, len(req.slot.tokens))
                continue
            req.slot.tokens.extend(entry.tokens)
            if 0 < req.shared_prefix <= len(req.slot.tokens):
                self.model.save_prefix(req.slot.index, req.slot.tokens[:req.shared_prefix])
                req.shared_prefix = 0  # saved (or already kept)
            if req.tentative and len(req.slot.tokens) >= len(req.target()):
                req.finish = FinishReason.STOP  # its prompt is cached
                if self.keep_logits:  # a reply over exactly these tokens samples from them
                    req.slot.kept, req.slot.kept_after = logits[row].clone(), list(req.slot.tokens)
            if pick is not None:
                sampled.append((req, pick))
        new_tokens: list[tuple[GenerationRequest, int]] = []
        for req, tok in sampled:
            if tok in self.model.eos_token_ids:
                req.finish = FinishReason.STOP
                continue
            req.generated.append(tok)
            new_tokens.append((req, tok))
            if len(req.generated) >= req.max_tokens:
                req.finish = FinishReason.LENGTH
        for req in list(self.running.values()):
            if req.finish is not None:
                del self.running[req.request_id]
        return new_tokens

    def finished_with_error(self) -> list[GenerationRequest]:
        """Requests that `schedule` rejected (context too long); they leave the batch."""
        out = [r for r in self.running.values() if r.finish == FinishReason.ERROR]
        for r in out:
            del self.running[r.request_id]
        return out

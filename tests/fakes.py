"""Hand-built stand-ins for models, for unit tests of scheduling and stream logic only.

End-to-end tests use the real shipped models; these exist so the engine's pure logic
can be tested fast and deterministically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

VOCAB = 64
EOS = 0
IM_START, IM_END, NL = 1, 2, 3


class CountingLM:
    """A causal 'LM' whose next token is last+1 (mod VOCAB, skipping specials) until
    `stop_after` tokens of a response, then EOS. Records every forward call."""

    def __init__(self, max_slots: int = 4, max_len: int = 256, stop_after: int = 8,
                 step_seconds: float = 0.0) -> None:
        self.step_seconds = step_seconds  # simulated compute time per forward
        self.eos_token_ids = frozenset({EOS})
        self.max_len = max_len
        self.stop_after = stop_after
        self.cache: dict[int, list[int]] = {}
        self.free = list(range(max_slots))
        self.calls: list[tuple[list[int], list[list[int]]]] = []
        self.prefixes: set[tuple[int, ...]] = set()

    def alloc_slot(self) -> int | None:
        if not self.free:
            return None
        slot = self.free.pop(0)
        self.cache[slot] = []
        return slot

    def free_slot(self, slot: int) -> None:
        del self.cache[slot]
        self.free.append(slot)

    def truncate(self, slot: int, length: int) -> None:
        del self.cache[slot][length:]

    def save_prefix(self, slot: int, tokens: list[int]) -> None:
        self.prefixes.add(tuple(tokens))

    def load_prefix(self, slot: int, target: list[int]) -> int:
        best = max((k for k in self.prefixes if tuple(target[:len(k)]) == k), key=len, default=())
        self.cache[slot] = list(best)
        return len(best)

    def forward(self, slots: list[int], tokens: list[list[int]]) -> torch.Tensor:
        self.calls.append((list(slots), [list(t) for t in tokens]))
        if self.step_seconds:
            time.sleep(self.step_seconds)
        logits = torch.full((len(slots), VOCAB), -1e9)
        for row, (slot, toks) in enumerate(zip(slots, tokens, strict=True)):
            self.cache[slot].extend(toks)
            ctx = self.cache[slot]
            # tokens generated since the last assistant header
            since = len(ctx) - 1 - max(i for i, t in enumerate(ctx) if t == IM_START)
            nxt = EOS if since - 2 >= self.stop_after else 10 + (ctx[-1] + 7) % 40
            logits[row, nxt] = 0.0
        return logits

    def sample(self, logits, temperatures, generators) -> list[int]:
        return logits.argmax(-1).tolist()

    # chat format: word tokens are 10..49; text is space-separated "wN"
    def render_message(self, role: str, text: str) -> list[int]:
        return [IM_START, 4 + len(role) % 5, NL] + [10 + (len(w) % 40) for w in text.split()] + [IM_END, NL]

    def generation_header(self) -> list[int]:
        return [IM_START, 9, NL]

    def message_footer(self) -> list[int]:
        return [IM_END, NL]

    def decode(self, tokens: list[int]) -> str:
        words = [f"w{t}" + ("." if t % 4 == 0 else "") for t in tokens]
        return "".join(" " + w for w in words)


class EnergyVAD:
    """Speech probability 1.0 for frames with RMS above 0.01."""

    def new_state(self) -> None:
        return None

    def process(self, frames: np.ndarray, states: list) -> np.ndarray:
        return (np.sqrt((frames**2).mean(axis=1)) > 0.01).astype(np.float32)


class FixedASR:
    def __init__(self, text: str = "hello there friend") -> None:
        self.text = text
        self.calls = 0

    def transcribe(self, audio: np.ndarray) -> str:
        self.calls += 1
        return self.text if len(audio) else ""


@dataclass
class FakeChunk:
    audio: np.ndarray
    sample_rate: int
    text: str


class ToneTTS:
    """10 ms of a tone per character, as one chunk per call."""

    sample_rate = 22050

    def __init__(self) -> None:
        self.texts: list[str] = []

    def synthesize(self, text: str, *, speed: float = 1.0, seed: int | None = None):
        self.texts.append(text)
        n = int(len(text) * 0.01 * self.sample_rate / speed)
        t = np.arange(n) / self.sample_rate
        yield FakeChunk((0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), self.sample_rate, text)


def tone(seconds: float, rate: int = 16000, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


def make_fake_core(wake, stop_after: int = 12, step_seconds: float = 0.0,
                   asr_text: str = "hello there friend", max_responses: int = 8,
                   max_slots: int = 4):
    """A real EngineCore over these stand-ins (core spec ``"fakes:make_fake_core"``)."""
    from voxline.engines.core import EngineCore, Models
    from voxline.engines.speech_model import SentenceSpeechModel

    lm = CountingLM(max_slots=max_slots, stop_after=stop_after, step_seconds=step_seconds)
    return EngineCore(Models(EnergyVAD(), FixedASR(asr_text), lm,
                             SentenceSpeechModel(ToneTTS())), wake, max_responses=max_responses)


class OnePieceDecode:
    """A video chunk decoded in one piece (the video stage's `ChunkDecode`), for fakes whose
    `denoise_next` makes the whole chunk at once."""

    def __init__(self, frames) -> None:
        self.frames = frames

    def next_piece(self):
        return self.frames, True

    def close(self) -> None:
        pass

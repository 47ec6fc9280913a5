"""Input transcription deltas that only ever append, and the tokens each delta covers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar


def _words(text: str) -> list[str]:
    return text.split()


@dataclass
class PartialTranscript:
    """Append-only transcription deltas from revisable ASR hypotheses.

    Only words two consecutive hypotheses agree on are sent, and only where they extend
    what was already sent, so concatenating the deltas never shows a retracted word.
    """

    last: list[str] = field(default_factory=list)
    sent: str = ""

    def delta(self, hypothesis: str) -> str:
        words = _words(hypothesis)
        stable: list[str] = []
        for a, b in zip(self.last, words, strict=False):
            if a != b:
                break
            stable.append(a)
        self.last = words
        return self._extend(" ".join(stable))

    def final_delta(self, transcript: str) -> str:
        return self._extend(" ".join(_words(transcript)))

    def _extend(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        if self.sent and text[len(self.sent)] != " ":
            return ""  # the last sent word grew ("capital" -> "capitals"): not an extension
        delta, self.sent = text[len(self.sent):], text
        return delta


class _Token(Protocol):
    token: str


T = TypeVar("T", bound=_Token)


def word_count(text: str) -> int:
    return len(_words(text))


def tokens_of_words(tokens: Sequence[T], first: int, stop: int) -> list[T]:
    """The tokens whose text starts in words `first` .. `stop` - 1 of the tokens' joined
    text (a token of whitespace only goes with the word before it)."""
    out: list[T] = []
    text = ""
    for tok in tokens:
        body = tok.token.lstrip()
        if not body:
            word = max(0, word_count(text) - 1)
        else:
            before = text + tok.token[:len(tok.token) - len(body)]
            word = word_count(before) - (0 if not before or before[-1].isspace() else 1)
        if first <= word < stop:
            out.append(tok)
        text += tok.token
    return out

"""Input transcription deltas that only ever append."""

from __future__ import annotations

from dataclasses import dataclass, field


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

"""A transcript with its tokens' log-probabilities, as the ASR models give them on request.

Greedy decoding picks each token from the decoder's logits; the pick's log-probability is
``logits[pick] - logsumexp(logits)`` over the distribution the pick was made from (after
the model's token suppression), one reduction per step the decoder already computed.
Special tokens (start, end, language, timestamps) carry no text and are left out, so
the tokens' text joined is the transcript (before its ends are stripped).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class TokenLogprob(NamedTuple):
    """One decoded token: its text (U+FFFD where it is part of a character), its raw
    UTF-8 bytes and the natural-log probability greedy decoding gave it."""

    token: str
    logprob: float
    bytes: bytes


@dataclass(frozen=True)
class ScoredTranscript:
    """A transcript and the tokens it was decoded as."""

    text: str
    tokens: tuple[TokenLogprob, ...] = ()


def token_of(raw: bytes, logprob: float) -> TokenLogprob:
    return TokenLogprob(raw.decode("utf-8", errors="replace"), float(logprob), raw)


def pick_logprob(logits: np.ndarray) -> tuple[int, float]:
    """The greedy pick of one row of logits and its log-probability."""
    row = np.asarray(logits, dtype=np.float64)
    pick = int(row.argmax())
    top = row[pick]
    return pick, float(-math.log(np.exp(row - top).sum()))


def joined(parts: Iterable[ScoredTranscript]) -> ScoredTranscript:
    """Windows of one clip transcribed apart, joined as their texts are (with a space)."""
    parts = [p for p in parts if p.text]
    return ScoredTranscript(" ".join(p.text for p in parts),
                            tuple(t for p in parts for t in p.tokens))

"""Semantic turn detection: how long a pause ends the turn, from the words said so far.

Rules over the transcript of the turn up to the pause (the engine transcribes every
pause anyway, to speculate). A turn whose words end a sentence ends after a short
pause; one that trails off on a connective ("and", "so", "for") or a filler ("um")
waits much longer, up to OpenAI's documented maxima (8 / 4 / 2 s for `low` / `medium` /
`high` eagerness); anything else waits a middling time. `auto` is `medium`.
"""

from __future__ import annotations

import enum
import re


class Ending(enum.IntEnum):
    COMPLETE = 0  # a sentence or question that stands on its own
    NEUTRAL = 1  # no sign either way (or no words yet)
    INCOMPLETE = 2  # trails off: more is coming


# (complete, neutral, incomplete) pause lengths in ms that end the turn
SILENCE_MS: dict[str, tuple[int, int, int]] = {
    "high": (250, 500, 2000),
    "medium": (350, 800, 4000),
    "auto": (350, 800, 4000),
    "low": (600, 1500, 8000),
}
EAGERNESS = tuple(SILENCE_MS)

_FILLERS = frozenset({"um", "umm", "uh", "uhh", "er", "erm", "hmm", "mm", "ah", "eh"})
# Words a finished thought rarely ends on: conjunctions, prepositions, articles,
# possessives, auxiliaries, "I". ASR punctuation is no guide after them (a cut-off "a
# table for" is often transcribed "A table for."), so they win over a period (not over
# a question mark: "Is that so?").
_CONNECTIVES = frozenset("""
    and or but so because then if when while although though unless until like than
    the a an to of for with in on at from about into onto by as over under between
    my your our their his her its this these those some any no every
    is are was were am be been being do does did have has had will would can could
    should shall may might must i i'm we're you're they're let's whether
""".split())
_WORD = re.compile(r"[a-z']+")


def ending(text: str) -> Ending:
    """How the transcript `text` ends."""
    text = text.strip()
    words = _WORD.findall(text.lower())
    if not words:
        return Ending.NEUTRAL
    if text.endswith((",", "-", "—", "…", "...", ":", ";")):
        return Ending.INCOMPLETE
    if words[-1] in _FILLERS:
        return Ending.INCOMPLETE
    if text.endswith("?"):  # "What is it?", "Is that so?": a question mark is trusted
        return Ending.COMPLETE
    if words[-1] in _CONNECTIVES:
        return Ending.INCOMPLETE
    if text.endswith((".", "!")):
        return Ending.COMPLETE
    return Ending.NEUTRAL


def silence_ms(eagerness: str, end: Ending) -> int:
    """The pause that ends a turn ending like `end`."""
    return SILENCE_MS[eagerness][end]

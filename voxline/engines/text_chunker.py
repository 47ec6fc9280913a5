"""Cut streamed LLM text into speakable segments for TTS.

`TextChunker` receives text deltas as the LLM produces them and hands back each segment as
soon as its end is certain, so TTS can start on the first clause while the LLM is still
writing. Rules, applied left to right:

- a newline always ends a segment;
- a sentence ends at a run of ``. ! ? …`` (plus closing quotes, brackets or markdown
  emphasis) followed by whitespace, except after an abbreviation (``Mr.``, ``e.g.``,
  ``U.S.``, a single initial such as ``J.``) or a list number at the start of a line
  (``1. Buy milk``); a ``.`` followed by a non-space (``3.14``, ``example.com``) never cuts;
- a clause ends at ``, ; : —`` followed by whitespace once the segment holds at least
  `min_clause_chars` characters (early first audio);
- a segment that reaches `max_chars` with no boundary is cut at its last space, keeping
  at least two words (past `max_chars` if need be).

Each decision depends only on the text itself (at most a few characters of look-ahead, for
which the chunker waits), so the segments are the same however the text is split into
deltas. Segments are cleaned of markdown a TTS would read aloud (``*``, ``#``, backticks,
bullets, link targets) and those without a letter or digit are dropped.
"""

from __future__ import annotations

import re

SENTENCE_ENDS = ".!?…"
CLAUSE_ENDS = ",;:—"
# Characters that may follow a sentence terminator before the whitespace that confirms it.
_CLOSERS = "\"')]}”’»*_`"
# Characters that may precede a word (stripped before the abbreviation check).
_OPENERS = "\"'([{“‘«*_`"

# Lower-case words that end in "." without ending a sentence. Kept small on purpose:
# a missed cut only delays audio a little; a wrong cut breaks a sentence in two.
ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "cf", "approx", "fig"}
)
# Initials and dotted abbreviations: "J", "e.g", "i.e", "U.S", "a.m".
_INITIALISM = re.compile(r"(?:[a-z]\.)*[a-z]")

_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_BULLET = re.compile(r"^[ \t]*(?:[-+•>][ \t]+)+", re.MULTILINE)
_HASHES = re.compile(r"(?<![A-Za-z0-9])#+")
_UNDERSCORES = re.compile(r"(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])")
_DROP = str.maketrans({"*": None, "`": None, "~": None, "|": " "})
_SPACES = re.compile(r"\s+")
_WHITESPACE = re.compile(r"[ \t]")
# A segment cut for length keeps at least this many words.
MIN_CUT_WORDS = 2


def clean_markdown(text: str) -> str:
    """`text` without the markdown a TTS would read aloud, whitespace collapsed and stripped.

    Letters and digits are kept, except the targets of ``[text](url)`` links.
    """
    text = _LINK.sub(r"\1", text)
    text = _BULLET.sub("", text)
    text = text.translate(_DROP)
    text = _HASHES.sub("", text)
    text = _UNDERSCORES.sub("", text)
    return _SPACES.sub(" ", text).strip()


def is_speakable(segment: str) -> bool:
    """True if `segment` has at least one letter or digit."""
    return any(ch.isalnum() for ch in segment)


class TextChunker:
    """Turns a stream of text deltas into speakable segments (pure logic, no model).

    `push` returns the segments completed by a delta; `flush` returns the rest at the end of
    the text and leaves the chunker empty for the next response. Not thread-safe.
    """

    def __init__(self, *, min_clause_chars: int | None = 30, max_chars: int | None = 250,
                 first_clause_chars: int | None = None,
                 first_max_chars: int | None = None) -> None:
        """`min_clause_chars`: cut at ``, ; : —`` only once a segment has this many
        characters (None: cut only at sentence ends). `first_clause_chars`: the same for
        the first segment only (a short first clause means earlier first audio; default:
        `min_clause_chars`). `max_chars`: cut a segment with no boundary at its last
        space once it is this long (None: no limit); `first_max_chars` the same for the
        first segment (a reply without punctuation still starts speaking early)."""
        if min_clause_chars is not None and min_clause_chars < 1:
            raise ValueError(f"min_clause_chars must be >= 1 or None, got {min_clause_chars}")
        if max_chars is not None and max_chars < 2:
            raise ValueError(f"max_chars must be >= 2 or None, got {max_chars}")
        self.min_clause_chars = min_clause_chars
        self.first_clause_chars = first_clause_chars if first_clause_chars else min_clause_chars
        self._first = True  # no segment returned yet
        self._max_chars = max_chars
        self.first_max_chars = first_max_chars if first_max_chars else max_chars
        self._buf = ""  # raw text after the last cut
        self._scanned = 0  # positions of _buf before this are known not to be cuts

    @property
    def pending(self) -> str:
        """Raw text received but not yet returned as a segment."""
        return self._buf

    def push(self, delta: str) -> list[str]:
        """Add `delta`; return the cleaned segments whose end is now certain."""
        self._buf += delta
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End of the text: return every remaining segment and reset."""
        out = self._drain(final=True)
        rest = self._buf
        self._buf, self._scanned, self._first = "", 0, True
        return out + self._emit(rest)

    def reset(self) -> None:
        """Drop pending text (e.g. the response was cancelled)."""
        self._buf, self._scanned = "", 0
        self._first = True

    @property
    def max_chars(self) -> int | None:
        return self.first_max_chars if self._first else self._max_chars

    @property
    def _clause_chars(self) -> int | None:
        return self.first_clause_chars if self._first else self.min_clause_chars

    # -- internals -------------------------------------------------------------------

    def _drain(self, *, final: bool) -> list[str]:
        out: list[str] = []
        while True:
            cut = self._find_cut(final)
            if cut is None:
                return out
            segment, self._buf, self._scanned = self._buf[:cut], self._buf[cut:], 0
            emitted = self._emit(segment)
            self._first = self._first and not emitted
            out.extend(emitted)

    @staticmethod
    def _emit(raw: str) -> list[str]:
        segment = clean_markdown(raw)
        return [segment] if is_speakable(segment) else []

    def _find_cut(self, final: bool) -> int | None:
        """End index of the first segment in the buffer, or None if not certain yet.

        Advances `_scanned` over positions that are decided not to be cuts; stops at the
        first position whose look-ahead has not arrived. At `final`, the end of the text
        counts as whitespace (and the leftover is returned by `flush`).
        """
        buf = self._buf
        n = len(buf)
        i = self._scanned
        while i < n:
            if self.max_chars is not None and i >= self.max_chars:
                cut = self._forced_cut()
                if cut is not None:
                    return cut
            ch = buf[i]
            if ch == "\n":
                return i + 1
            if ch in SENTENCE_ENDS and not (i > 0 and buf[i - 1] in SENTENCE_ENDS):
                j = i
                while j < n and buf[j] in SENTENCE_ENDS:
                    j += 1
                k = j
                while k < n and buf[k] in _CLOSERS:
                    k += 1
                if k == n:
                    if final:
                        return None  # the rest is one segment; flush returns it
                    self._scanned = i
                    return None
                if buf[k].isspace() and not (j == i + 1 and ch == "." and self._keeps_dot(i)):
                    return k
            elif ch in CLAUSE_ENDS and self._clause_chars is not None:
                if i + 1 == n:
                    if final:
                        return None
                    self._scanned = i
                    return None
                if (
                    buf[i + 1].isspace()
                    and len(clean_markdown(buf[: i + 1])) >= self._clause_chars
                ):
                    return i + 1
            i += 1
        self._scanned = n
        return None

    def _forced_cut(self) -> int | None:
        """Cut a segment that reached `max_chars` after its last space, else hard.

        A segment keeps at least `MIN_CUT_WORDS` words: a lone word spoken on its own (a
        short first segment, "First") sounds choppy. So when the last space leaves one
        word, the cut moves to the space after the next word, or None until it arrives
        (at most `max_chars` further; then the one word goes alone).
        """
        assert self.max_chars is not None
        buf = self._buf
        head = buf[: self.max_chars]
        space = max(head.rfind(" "), head.rfind("\t"))
        if space <= 0 or not head[:space].strip():
            return self.max_chars  # no word boundary at all (a long URL): hard
        if len(head[:space].split()) >= MIN_CUT_WORDS:
            return space + 1
        for match in _WHITESPACE.finditer(buf, space + 1):
            if len(buf[: match.start()].split()) >= MIN_CUT_WORDS:
                return match.start() + 1
        return space + 1 if len(buf) >= 2 * self.max_chars else None

    def _keeps_dot(self, i: int) -> bool:
        """True if the "." at `i` closes an abbreviation or a leading list number."""
        start = i
        while start > 0 and not self._buf[start - 1].isspace():
            start -= 1
        word = self._buf[start:i].lstrip(_OPENERS).lower()
        if word in ABBREVIATIONS or _INITIALISM.fullmatch(word):
            return True
        return word.isdigit() and not clean_markdown(self._buf[:start])


def split_sentences(text: str) -> list[str]:
    """Complete `text` cut into cleaned, speakable sentences (no clause cuts)."""
    chunker = TextChunker(min_clause_chars=None)
    return chunker.push(text) + chunker.flush()

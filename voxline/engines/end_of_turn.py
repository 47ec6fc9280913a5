"""Semantic turn detection: how long a pause ends the turn, from the words and the sound.

Two witnesses judge each pause in a turn:

- the words: rules over the transcript of the turn up to the pause (the engine
  transcribes every pause anyway, to speculate). Words that end a sentence are
  COMPLETE; words that trail off on a connective ("and", "so", "for") or a filler
  ("um") are INCOMPLETE, unless a wh-clause strands its preposition ("what is it
  famous for"); anything else is NEUTRAL. Until the transcript lands the
  words are pending.
- the sound: an end-of-turn model (Smart Turn v3.2, `models.smart_turn`) hears the last
  8 s and gives the probability that the speaker sounds finished; `sound` reads it as
  FINISHED, LEANS_FINISHED, UNSURE or GOING_ON by the eagerness's thresholds
  (`SOUND_THRESHOLDS`).

`decide` combines them. Either witness saying "more is coming" waits long: words that
trail off (a sentence that grammatically goes on is not ended by its intonation) or a
sound confidently mid-phrase (ASR often writes "to the," as "to that."). Otherwise a
finished sound moves the words' verdict one step shorter, and both agreeing on
"finished" waits least. Agreeing takes less than overruling: complete words need only a
sound that leans finished (at `medium` the model's own decision threshold, 0.5), where
shortening words with no sign either way takes a confidently finished one. A trailing
comma alone (after a word that could end the sentence) is the one "more is coming" a
finished sound overrules: it reads as NEUTRAL.

    words / sound   CONFIDENT  FINISHED   LEANS        UNSURE       GOING_ON     AWAITED      none
    COMPLETE        CONFIDENT  AGREED     AGREED       COMPLETE     INCOMPLETE   COMPLETE     COMPLETE
    NEUTRAL         AGREED     COMPLETE   NEUTRAL      NEUTRAL      INCOMPLETE   NEUTRAL      NEUTRAL
    INCOMPLETE      INCOMPLETE INCOMPLETE INCOMPLETE   INCOMPLETE   INCOMPLETE   INCOMPLETE   INCOMPLETE
    pending         AGREED     COMPLETE   INCOMPLETE*  INCOMPLETE*  INCOMPLETE   INCOMPLETE*  NEUTRAL

Each verdict is a pause length per eagerness (`SILENCE_MS`, `AGREED_MS`, `CONFIDENT_MS`):
INCOMPLETE waits up to OpenAI's documented maxima (8 / 4 / 2 s for `low` / `medium` /
`high`). A CONFIDENT sound (the top band of FINISHED, `CONFIDENT_AT`) is a FINISHED one
that moves the verdict one step shorter still; it only ever shortens the COMPLETE and
AGREED waits, never the NEUTRAL or INCOMPLETE ones, so a pause that sounds or reads
unfinished waits as long as before.
`auto` is `medium`. With no model (or before it has answered) the sound is "none", and
the table is the words' rules alone, as before the model. The model usually answers
before the transcript (a Whisper-tiny encoder over 8 s against Moonshine over the whole
turn), so a confidently finished-sounding pause ends the turn at the COMPLETE length
without waiting for the words; *a less certain one waits for them (the transcript re-decides
when it lands) rather than timing out at NEUTRAL while a slow transcript is still coming;
*so does a pause whose model verdict is still being computed (AWAITED) while no words
are in either: on a loaded machine neither witness may answer within NEUTRAL's wait.
The thresholds are high on purpose: a mid-clause pause that sounds finished is a cut-off.
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
# The pause that ends a turn whose words are complete and which sounds finished.
AGREED_MS: dict[str, int] = {"high": 160, "medium": 200, "auto": 200, "low": 400}
# ... and which sounds confidently finished (`CONFIDENT_AT`). At or below the engine's
# 160 ms pause point, the turn ends as soon as the model's verdict on the pause lands.
CONFIDENT_MS: dict[str, int] = {"high": 160, "medium": 160, "auto": 160, "low": 300}


class Sound(enum.IntEnum):
    FINISHED = 0  # the speaker sounds done
    UNSURE = 1
    GOING_ON = 2  # mid-phrase intonation: more is coming
    AWAITED = 3  # the model is judging this pause (never a reading of a probability)
    LEANS_FINISHED = 4  # more finished than not, short of FINISHED: agrees, never overrules
    CONFIDENT = 5  # FINISHED, and surely so: shortens the finished verdicts one step more


# (finished at or above, leans finished at or above, going on below) the model's
# probability, per eagerness: a more eager detector believes "finished" sooner. 0.5 is
# Smart Turn's own decision threshold.
SOUND_THRESHOLDS: dict[str, tuple[float, float, float]] = {
    "high": (0.8, 0.4, 0.1),
    "medium": (0.9, 0.5, 0.1),
    "auto": (0.9, 0.5, 0.1),
    "low": (0.95, 0.7, 0.1),
}
# The model's probability at or above which a finished sound is CONFIDENT, per eagerness.
# Smart Turn scores most finished questions in the shipped Piper voice 0.95-0.99 190 ms
# into the pause; of the end-of-turn bench's mid-clause pauses, only ones whose words
# trail off (which wait regardless) or that a FINISHED verdict already cuts reach it.
CONFIDENT_AT: dict[str, float] = {"high": 0.9, "medium": 0.95, "auto": 0.95, "low": 0.98}

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
# A wh-question may end on its preposition ("What is it famous for?", "Who are you talking
# to?", "Where are you from?"): when the last clause opens with one of these words, such
# an ending reads NEUTRAL (the sound decides) rather than INCOMPLETE. ASR often drops the
# question mark that would have said so, and the turn waited the INCOMPLETE pause (4 s).
_STRANDED = frozenset("for to from about with of in on at by into".split())
_WH = frozenset("what which who whom whose where".split())
_CLAUSE = re.compile(r"[,.;:?!]|\b(?:and|but|or|so)\b")


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
    if words[-1] in _STRANDED and _wh_clause(text):
        return Ending.NEUTRAL
    if words[-1] in _CONNECTIVES:
        return Ending.INCOMPLETE
    if text.endswith((".", "!")):
        return Ending.COMPLETE
    return Ending.NEUTRAL


def _wh_clause(text: str) -> bool:
    """The last clause of `text` (after its last punctuation or and/but/or/so) opens with
    a wh-word."""
    last = _CLAUSE.split(text.lower().rstrip(" .!"))[-1]
    words = _WORD.findall(last)
    return len(words) > 1 and words[0] in _WH


def comma_only(text: str) -> bool:
    """`text` is INCOMPLETE by its trailing comma (colon, semicolon) alone, after a word
    that could end a sentence: weak evidence, as Moonshine writes one at the end of many
    finished questions ("How far is the moon from the earth,")."""
    text = text.strip()
    if not text.endswith((",", ":", ";")):
        return False
    return ending(text.rstrip(",:; ")) != Ending.INCOMPLETE


def silence_ms(eagerness: str, end: Ending) -> int:
    """The pause that ends a turn ending like `end`."""
    return SILENCE_MS[eagerness][end]


def sound(eagerness: str, probability: float) -> Sound:
    """How the end-of-turn model's `probability` (speaker finished) reads at `eagerness`."""
    finished, leans, going_on = SOUND_THRESHOLDS[eagerness]
    if probability >= CONFIDENT_AT[eagerness]:
        return Sound.CONFIDENT
    if probability >= finished:
        return Sound.FINISHED
    if probability >= leans:
        return Sound.LEANS_FINISHED
    return Sound.GOING_ON if probability < going_on else Sound.UNSURE


def decide(eagerness: str, words: Ending | None, heard: Sound | None,
           comma: bool = False) -> int:
    """The pause (ms) that ends a turn whose words end like `words` (None: not transcribed
    yet) and which sounds like `heard` (None: no model, or not yet); the module docstring
    has the table. `comma`: the words are INCOMPLETE by a trailing comma alone
    (`comma_only`), which a finished sound overrules: they read as NEUTRAL."""
    finished = heard in (Sound.FINISHED, Sound.CONFIDENT)
    if comma and words == Ending.INCOMPLETE and finished:
        words = Ending.NEUTRAL
    if words is None:
        if heard is None:
            return silence_ms(eagerness, Ending.NEUTRAL)
        if heard == Sound.CONFIDENT:
            return AGREED_MS[eagerness]
        return silence_ms(eagerness, Ending.COMPLETE if finished else Ending.INCOMPLETE)
    if heard == Sound.GOING_ON:
        return silence_ms(eagerness, Ending.INCOMPLETE)
    if words == Ending.COMPLETE and heard == Sound.CONFIDENT:
        return CONFIDENT_MS[eagerness]
    if words == Ending.COMPLETE and heard in (Sound.FINISHED, Sound.LEANS_FINISHED):
        return AGREED_MS[eagerness]
    if words == Ending.NEUTRAL and heard == Sound.CONFIDENT:
        return AGREED_MS[eagerness]
    if words == Ending.NEUTRAL and heard == Sound.FINISHED:
        return silence_ms(eagerness, Ending.COMPLETE)
    return silence_ms(eagerness, words)


def leans_complete(words: Ending | None, heard: Sound | None) -> bool:
    """Whether the evidence on a pause so far leans towards the turn being complete, so a
    reply is worth starting before the pause is judged: words that end a sentence (and no
    sound of more to come), or a finished sound over words with no sign either way."""
    if heard == Sound.GOING_ON or words is None or words == Ending.INCOMPLETE:
        return False
    return words == Ending.COMPLETE or heard in (Sound.FINISHED, Sound.CONFIDENT)

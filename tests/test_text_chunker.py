"""TextChunker: streamed LLM text -> speakable segments (pure logic)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxline.engines.text_chunker import TextChunker, clean_markdown, split_sentences


def run_chunker(pieces: list[str], **kw: int | None) -> list[str]:
    chunker = TextChunker(**kw)  # type: ignore[arg-type]
    out: list[str] = []
    for piece in pieces:
        out += chunker.push(piece)
    return out + chunker.flush()


def alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


# Words and marks an LLM emits, including the traps (decimals, abbreviations, markdown).
TOKENS = [
    *"Hello world the weather is fine today Mr. Smith e.g. U.S. 3.14 1,000 12:30".split(),
    *"1. 2) J. Dr. etc. a.m. . , ; : ! ? ?! ... … — * ** # ` \" ' ( ) _ x_y".split(),
    *["\n", "\n\n", "- "],
]
SPACES = ["", " ", " ", " ", "  ", "\t"]
texts = st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from(SPACES)), max_size=60).map(
    lambda parts: "".join(tok + sp for tok, sp in parts)
)


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, prev = [], 0
    for p in points:
        pieces.append(text[prev:p])
        prev = p
    return [*pieces, text[prev:]]


@settings(max_examples=400, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=40))
def test_streaming_equals_one_push(text: str, cuts: list[int]) -> None:
    for kw in ({}, {"min_clause_chars": None}, {"min_clause_chars": 5, "max_chars": 20}):
        assert run_chunker(split_at(text, cuts), **kw) == run_chunker([text], **kw)


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_char_by_char_equals_one_push(text: str) -> None:
    assert run_chunker(list(text)) == run_chunker([text])


@settings(max_examples=400, deadline=None)
@given(text=texts)
def test_segments_keep_every_letter_and_digit(text: str) -> None:
    for kw in ({}, {"min_clause_chars": 5, "max_chars": 20}):
        segments = run_chunker([text], **kw)
        assert alnum("".join(segments)) == alnum(text)
        for seg in segments:
            assert seg == seg.strip() and seg
            assert any(ch.isalnum() for ch in seg)
            assert not set(seg) & set("*`\n")


def test_sentences() -> None:
    assert split_sentences("Hi there. How are you? Great!  Bye") == [
        "Hi there.",
        "How are you?",
        "Great!",
        "Bye",
    ]


def test_no_split_inside_numbers_and_abbreviations() -> None:
    text = "Mr. Smith paid 3.14 dollars, e.g. for pie at 5 p.m. today. Then Dr. J. Doe left."
    assert split_sentences(text) == [
        "Mr. Smith paid 3.14 dollars, e.g. for pie at 5 p.m. today.",
        "Then Dr. J. Doe left.",
    ]


def test_segment_is_held_until_its_end_is_certain() -> None:
    chunker = TextChunker()
    assert chunker.push("Pi is 3.") == []  # "3." may become "3.14"
    assert chunker.push("14") == []
    assert chunker.push(". Hello Mr.") == ["Pi is 3.14."]
    assert chunker.push(" Smith") == []  # "Mr." is not a sentence end
    assert chunker.push(".") == []
    assert chunker.push(" ") == ["Hello Mr. Smith."]
    assert chunker.flush() == []


def test_early_clause_cut() -> None:
    chunker = TextChunker(min_clause_chars=30)
    out = chunker.push("Sure, ")  # too short to cut yet
    assert out == []
    out = chunker.push("I can certainly help you with that, because ")
    assert out == ["Sure, I can certainly help you with that,"]
    assert chunker.flush() == ["because"]


def test_clause_cut_off_keeps_clauses_together() -> None:
    text = "Sure, I can certainly help you with that, because it is easy."
    assert run_chunker([text], min_clause_chars=None) == [text]


def test_newlines_and_markdown() -> None:
    text = (
        "# Steps\n\n1. Open the **lid**.\n2. Pour `water` in.\n- Wait for [the timer](https://x.y/z).\n"
        "---\nDone."
    )
    assert split_sentences(text) == [
        "Steps",
        "1. Open the lid.",
        "2. Pour water in.",
        "Wait for the timer.",
        "Done.",
    ]


def test_quotes_and_brackets_close_a_sentence() -> None:
    assert split_sentences('He said "hi." Then (he left!) Ok?! Yes... no') == [
        'He said "hi."',
        "Then (he left!)",
        "Ok?!",
        "Yes...",
        "no",
    ]


def test_punctuation_only_segments_are_dropped() -> None:
    assert split_sentences("... ?! -- **") == []
    assert split_sentences("") == []
    assert split_sentences("   \n  ") == []


def test_max_chars_cuts_at_a_space() -> None:
    words = " ".join(["word"] * 30)  # 149 chars, no punctuation
    segments = run_chunker([words], max_chars=50)
    assert all(len(s) <= 50 for s in segments)
    assert " ".join(segments) == words


def test_flush_resets() -> None:
    chunker = TextChunker()
    chunker.push("First response")
    assert chunker.flush() == ["First response"]
    assert chunker.pending == ""
    assert chunker.push("Second. ") == ["Second."]


def test_clean_markdown_keeps_identifiers() -> None:
    assert clean_markdown("Use `snake_case` in __init__ and C# *now*") == (
        "Use snake_case in init and C# now"
    )


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        TextChunker(min_clause_chars=0)
    with pytest.raises(ValueError):
        TextChunker(max_chars=1)


def test_first_clause_can_be_cut_earlier_than_later_ones():
    text = "Sure, here it is, the answer: the capital of France is Paris, a big city."
    early = TextChunker(min_clause_chars=30, first_clause_chars=5)
    segments = early.push(text) + early.flush()
    assert segments[0] == "Sure,"
    late = TextChunker(min_clause_chars=30)
    assert (late.push(text) + late.flush())[0] != "Sure,"
    # after the first segment the normal minimum applies again
    assert all(len(s) >= 30 or s == segments[-1] for s in segments[1:])


def test_first_segment_without_any_boundary_is_cut_at_a_space():
    text = "Aleph Aleph Lavater Lavater " * 10
    chunker = TextChunker(first_max_chars=40)
    first = chunker.push(text)[0]
    assert len(first) <= 40 and text.startswith(first) and not first.endswith("Lav")
    assert all(len(s) <= 250 for s in chunker.flush())


def test_a_length_cut_keeps_two_words_even_past_the_limit() -> None:
    chunker = TextChunker(first_max_chars=12)
    # the last space within 12 chars leaves one word: wait for the second word's end
    assert chunker.push("First senten") == []
    assert chunker.push("ce here.") == ["First sentence"]  # its end is the space after it
    assert chunker.push(" And") == ["here."]
    assert chunker.flush() == ["And"]
    chunker = TextChunker(first_max_chars=12)
    assert chunker.push("The capital of France is Paris. ") == ["The capital", "of France is Paris."]
    # no second word within twice the limit: the one word goes alone
    chunker = TextChunker(first_max_chars=8)
    assert chunker.push("Hello worldwide") == []
    assert chunker.push("s") == ["Hello"]
    assert chunker.flush() == ["worldwides"]

"""Rule-based sentence splitter."""

from __future__ import annotations

from widenet_ds.data.sentences import sentence_spans


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` as strings, as the spans cut it."""
    return [text[start:end] for start, end in sentence_spans(text)]


def test_abbreviations_initials_decimals_and_quotes_do_not_split():
    text = ('Mr. Smith paid $3.50 to Dr. Brown at 5 p.m. on Jan. 3. J. R. R. Tolkien wrote it, e.g. this. '
            '"Really?" she asked. (It was.) The U.S. Army came... Then it left!')
    assert split_sentences(text) == [
        "Mr. Smith paid $3.50 to Dr. Brown at 5 p.m. on Jan. 3.",
        "J. R. R. Tolkien wrote it, e.g. this.",
        '"Really?" she asked.',
        "(It was.)",
        "The U.S. Army came...",
        "Then it left!",
    ]


def test_hard_wrapped_lines_join_and_blank_lines_always_break():
    text = "The first sentence is\nwrapped over lines. The second\none too.\n\n  \nA heading\n\nText after it."
    assert split_sentences(text) == ["The first sentence is\nwrapped over lines.", "The second\none too.",
                                     "A heading", "Text after it."]


def test_spans_point_into_the_text_without_surrounding_whitespace():
    text = "  First one.   Second one!\n\n\tThird?  "
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == ["First one.", "Second one!", "Third?"]
    assert split_sentences("") == [] and split_sentences(" \n\n ") == []


def test_lower_case_after_a_period_continues_the_sentence():
    assert split_sentences("It costs 3 vs. 4 units. it is cheap.") == ["It costs 3 vs. 4 units. it is cheap."]

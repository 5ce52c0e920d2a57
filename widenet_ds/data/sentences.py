"""Sentence segmentation for pretraining text.

A rule-based splitter: ALBERT/BERT only need approximate sentence boundaries (segments are packed
into pairs of up to 512 tokens, and SOP swaps whole chunks), so speed and determinism matter more
than linguistic precision. Why not a library: `blingfire` (last release 2021, a native binary) and
`nltk` punkt (models shipped as pickles or a separate data download) add a dependency for a small
gain; the rules below cover the cases that matter in Wikipedia and books — abbreviations, initials,
decimals, ellipses and closing quotes — and run at regex speed.

Boundaries are returned as character offsets so the caller can tokenize a whole document in one call
and cut the token sequence at these offsets (much faster than one tokenizer call per sentence).
"""

from __future__ import annotations

import itertools
import re

# Lower-cased abbreviations that end with a period but rarely end a sentence.
_ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr prof sr jr st mt ft rev gen col lt sgt capt cmdr adm gov pres sen rep hon
    vs etc al e.g i.e cf viz approx ca no nos vol vols p pp ch fig figs eq eqs sec ed eds
    jan feb mar apr jun jul aug sep sept oct nov dec inc ltd co corp bros dept univ assn est
    u.s u.k u.n a.m p.m b.c a.d ph.d
    """.split()
)

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, then whitespace and
# a character that can start a sentence (upper case, digit, opening quote/bracket).
_CANDIDATE = re.compile(r"""([.!?]+)(["'\u2019\u201d)\]]*)\s+(?=["'\u2018\u201c(\[]?[A-Z0-9])""")
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*(?=\n)")
_WORD_BEFORE = re.compile(r"(\S+)$")


def _is_abbreviation(text: str, period_pos: int) -> bool:
    """True when the period at `period_pos` closes an abbreviation or an initial ("J. R. R.")."""
    match = _WORD_BEFORE.search(text, max(0, period_pos - 20), period_pos)
    if match is None:
        return False
    word = match.group(1).lstrip("\"'(\u201c\u2018[").lower()
    if not word:
        return False
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`, in order.

    A blank line always ends a sentence (paragraphs, headings); a single line break is just
    whitespace, so hard-wrapped books and one-sentence-per-line corpora both split correctly.
    Spans exclude surrounding whitespace; blank text produces nothing.
    """
    spans: list[tuple[int, int]] = []
    paragraph_start = 0
    for paragraph_end in itertools.chain((m.start() for m in _PARAGRAPH_BREAK.finditer(text)), [len(text)]):
        start = paragraph_start
        for match in _CANDIDATE.finditer(text, paragraph_start, paragraph_end):
            if match.group(1) == "." and _is_abbreviation(text, match.start(1)):
                continue
            _append_stripped(text, start, match.end(2), spans)
            start = match.end()
        _append_stripped(text, start, paragraph_end, spans)
        paragraph_start = paragraph_end + 1
    return spans


def _append_stripped(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append((start, end))

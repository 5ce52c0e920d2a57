"""SQuAD v1.1 / v2.0 examples from the official JSON files or HF `datasets` (`squad`, `squad_v2`).

Every answer's `answer_start` is checked against its text: a mismatch means the file was edited or
re-encoded, and training on it would teach wrong spans, so it is an error naming the question id
(none of the official dev files has one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.formats import load_json


@dataclass(frozen=True)
class SquadAnswer:
    text: str
    start: int  # character offset in the context


@dataclass(frozen=True)
class SquadExample:
    qid: str
    title: str
    question: str
    context: str
    answers: tuple[SquadAnswer, ...]  # all gold answers; training uses the first
    is_impossible: bool


@dataclass
class SquadData:
    examples: list[SquadExample]
    version: str  # "1.1" or "2.0"
    source: str

    @property
    def n_impossible(self) -> int:
        return sum(e.is_impossible for e in self.examples)

    def summary(self) -> str:
        return (f"SQuAD {self.version} ({self.source}): {len(self.examples)} questions, "
                f"{self.n_impossible} without answer")


def _check_answer(qid: str, context: str, answer: SquadAnswer, where: str) -> None:
    found = context[answer.start: answer.start + len(answer.text)]
    if found != answer.text:
        raise DataError(f"{where}: question {qid!r}: answer_start {answer.start} points at {found!r}, not at the "
                        f"answer text {answer.text!r}; fix the offset (character index into the context)")


def _require(obj: dict, key: str, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"{where}: missing key {key!r}; is this a SQuAD JSON file?")
    return obj[key]


def read_squad_json(path: str | os.PathLike) -> SquadData:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    raw = load_json(path, DataError)
    examples: list[SquadExample] = []
    seen: set[str] = set()
    for a, article in enumerate(_require(raw, "data", str(path))):
        for p, paragraph in enumerate(_require(article, "paragraphs", f"{path} article {a}")):
            context = _require(paragraph, "context", f"{path} article {a} paragraph {p}")
            for qa in _require(paragraph, "qas", f"{path} article {a} paragraph {p}"):
                qid = _require(qa, "id", f"{path} article {a} paragraph {p}")
                where = f"{path} question {qid!r}"
                if qid in seen:
                    raise DataError(f"{where}: duplicate question id")
                seen.add(qid)
                answers = tuple(SquadAnswer(_require(ans, "text", where), int(_require(ans, "answer_start", where)))
                                for ans in _require(qa, "answers", where))
                for answer in answers:
                    _check_answer(qid, context, answer, str(path))
                impossible = bool(qa.get("is_impossible", False))
                if impossible and answers:
                    raise DataError(f"{where}: is_impossible is true but the question has answers")
                if not impossible and not answers:
                    raise DataError(f"{where}: no answers and not marked is_impossible")
                examples.append(SquadExample(qid, article.get("title", ""), _require(qa, "question", where),
                                             context, answers, impossible))
    version = str(raw.get("version", "")).lstrip("v")
    if version not in ("1.1", "2.0"):
        version = "2.0" if any(e.is_impossible for e in examples) else "1.1"
    return SquadData(examples, version, str(path))


def squad_examples_from_hf_rows(rows: Iterable[dict], source: str = "hf") -> list[SquadExample]:
    """HF `squad`/`squad_v2` rows: id, title, context, question, answers{text[], answer_start[]}."""
    examples = []
    for row in rows:
        answers = tuple(SquadAnswer(t, int(s)) for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"]))
        for answer in answers:
            _check_answer(row["id"], row["context"], answer, source)
        examples.append(SquadExample(row["id"], row.get("title", ""), row["question"], row["context"], answers,
                                     is_impossible=not answers))
    return examples


def load_squad(version: str, split: str, path: str | os.PathLike | None = None) -> SquadData:
    """SQuAD from a local JSON file, or with no `path` from HF `datasets` (`squad` / `squad_v2`)."""
    if version not in ("1.1", "2.0"):
        raise ConfigError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
    if path is not None:
        data = read_squad_json(path)
        if data.version != version:
            raise DataError(f"{path} holds SQuAD {data.version} but version {version} was asked for")
        return data
    if split not in ("train", "dev"):
        raise ConfigError(f"SQuAD split must be 'train' or 'dev', got {split!r}")
    import datasets  # lazy: only the download path needs it

    name = "squad" if version == "1.1" else "squad_v2"
    rows = datasets.load_dataset(name, split="train" if split == "train" else "validation")
    return SquadData(squad_examples_from_hf_rows(rows, f"hf:{name}"), version, f"hf:{name}/{split}")


def squad_json_from_examples(examples: Iterable[SquadExample], version: str) -> dict:
    """The official JSON layout (one paragraph per question), so the official scorer can read data
    that came through HF `datasets`."""
    data = [{"title": e.title, "paragraphs": [{"context": e.context, "qas": [{
        "id": e.qid, "question": e.question, "is_impossible": e.is_impossible,
        "answers": [{"text": a.text, "answer_start": a.start} for a in e.answers]}]}]} for e in examples]
    return {"version": "1.1" if version == "1.1" else "v2.0", "data": data}

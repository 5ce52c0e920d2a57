"""What a finished run scored: each task's results.json is a frozen dataclass of its own package
(widenet_ds/tasks/<task>/results.py: `to_json` gives the entries results.json has always had, `from_json` reads
them back after widenet_ds/formats.py has upgraded a file of an earlier version); what they share is here: the
scores of a split, the reader of one results.json object that names the file and the key of any entry of another
shape (keys this version does not know are left out, not refused), and how the console shows a score beside its
scale.

Imports neither torch nor DeepSpeed: the report reads results on machines that only have run folders.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Self

from widenet_ds.errors import RunFolderError
from widenet_ds.formats import VERSION_KEY, upgrade

# split -> metric -> value; numbers, and now and then a text (a GLUE baseline's "note")
Scores = dict[str, dict[str, Any]]


class Results(Protocol):
    """A results.json as a task writes it (`RunFolder.write_results` adds the version of its kind, `FORMAT`)."""

    FORMAT: ClassVar[str]  # its kind in widenet_ds/formats.py

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: Any, where: str) -> Self: ...


def is_number(value: Any) -> bool:
    """An int or float, NaN included (a diverged loss is still a result); JSON true/false are bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def with_scale(value: float, scale: str) -> str:
    """`value` as the console shows it on its `scale` (the task's `score_scale`): a percentage with its sign, a
    fraction as it is."""
    return f"{value:.4f}%" if scale == "0-100" else f"{value:.4f}"


def numbers(scores: Scores) -> dict[str, dict[str, float]]:
    """The numeric values of each split (texts left out)."""
    return {split: {name: float(v) for name, v in values.items() if is_number(v)} for split, values in scores.items()}


class ResultFields:
    """The keys of one results.json object of the kind `kind` (upgraded to its current version), each checked for
    its type; errors name the file and the key."""

    def __init__(self, data: Any, where: str, what: str, kind: str | None = None) -> None:
        if not isinstance(data, dict):
            raise RunFolderError(f"{where}: {what} must be a JSON object, not {type(data).__name__}; the file was "
                                 f"edited or damaged: restore it, or run again into another folder.")
        self.data, self.where, self.what = upgrade(kind, data, where) if kind else data, where, what

    def keys(self) -> list[str]:
        """The file's entries (its format version left out)."""
        return [key for key in self.data if key != VERSION_KEY]

    def _bad(self, key: str, why: str) -> RunFolderError:
        return RunFolderError(f"{self.where}: {self.what}: {key!r} {why}; the file was edited or damaged: restore it, "
                              f"or run again into another folder.")

    def get(self, key: str, check, kind: str, default: Any = ..., *, nullable: bool = False) -> Any:
        """The value of `key`, which `check` accepts (`kind` says what it should be); `default` when it is
        absent (no default: the key is required)."""
        if key not in self.data:
            if default is ...:
                raise self._bad(key, "is missing")
            return default
        value = self.data[key]
        if (value is None and nullable) or check(value):
            return value
        raise self._bad(key, f"is {value!r}, not {kind}")

    def integer(self, key: str, default: Any = ..., **kw) -> Any:
        return self.get(key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", default, **kw)

    def number(self, key: str, default: Any = ..., **kw) -> Any:
        return self.get(key, is_number, "a number", default, **kw)

    def text(self, key: str, default: Any = ..., **kw) -> Any:
        return self.get(key, lambda v: isinstance(v, str), "a text", default, **kw)

    def scores(self, key: str, default: Any = ...) -> Any:
        return self.get(key, lambda v: isinstance(v, dict) and all(isinstance(s, dict) for s in v.values()),
                        "an object of splits, each an object of metrics", default)

    def scalars(self, keys: list[str]) -> dict[str, float]:
        """Flat metrics ("valid/loss": 2.3, ...): each a number."""
        return {key: self.number(key) for key in keys}

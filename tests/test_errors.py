"""User-facing errors: every problem of a configuration in one error, and the command-line convention (one
`prog: error: ...` line, exit status 2, no traceback) for errors caused by the input."""

from __future__ import annotations

import pytest

from widenet_ds.errors import ConfigError, DataError, exit_status, raise_config_problems


def test_every_problem_in_one_error():
    raise_config_problems([], "the settings")  # nothing to report
    with pytest.raises(ConfigError, match=r"^--seeds must be positive\.$"):
        raise_config_problems(["--seeds must be positive."], "the settings")
    with pytest.raises(ConfigError) as caught:
        raise_config_problems(["a is wrong; fix a.", "b is wrong; fix b."], "the glue settings")
    assert str(caught.value) == "2 problems with the glue settings:\n  - a is wrong; fix a.\n  - b is wrong; fix b."


def test_an_input_error_is_one_line_and_status_2_other_errors_are_not_hidden(capsys):
    def bad_input():
        raise DataError("data/x has no manifest.json; run widenet-ds prepare-data first.")

    assert exit_status("widenet-ds verify-data", bad_input) == 2
    assert capsys.readouterr().err == ("widenet-ds verify-data: error: data/x has no manifest.json; run widenet-ds "
                                       "prepare-data first.\n")
    assert exit_status("widenet-ds params", lambda: None) == 0 and exit_status("x", lambda: 3) == 3
    with pytest.raises(ZeroDivisionError):  # a bug is not an input error: its traceback is kept
        exit_status("x", lambda: 1 / 0)

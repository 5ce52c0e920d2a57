"""TrainingLog: its TensorBoard and metrics.jsonl read back, a resume rewriting later steps, silent other ranks; the
console with and without a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time

from widenet_ds.run_folder import RunFolder, read_metrics
from widenet_ds.training.log import TrainingLog


def test_log_writes_tensorboard_and_jsonl_and_a_resume_rewrites_later_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=True, progress_bar=False, start_step=0, max_steps=4)
    for step in range(1, 5):
        log.record(step, {"optim/lr": 0.1 * step, "x/y": 1.0 / 3.0 + step})
    log.event(4, "checkpoint saved")
    log.close()
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in metrics.records] == [1, 2, 3, 4] and [e["step"] for e in metrics.events] == [4]
    assert metrics.records[0]["x/y"] == 1.0 / 3.0 + 1  # full float repr, bit for bit

    # Resume from step 2: records of steps 3-4 of the interrupted run go, the new ones come after.
    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=True, progress_bar=False, start_step=2, max_steps=4)
    log.record(3, {"optim/lr": 0.33, "x/y": 7.0})
    log.close()
    assert [(r["step"], r.get("optim/lr")) for r in read_metrics(tmp_path / "metrics.jsonl").records] == \
        [(1, 0.1), (2, 0.2), (3, 0.33)]
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [(e.step, round(e.value, 6)) for e in accumulator.Scalars("optim/lr")] == [(1, 0.1), (2, 0.2), (3, 0.33)]


def test_disabled_log_on_other_ranks_writes_nothing(tmp_path):
    log = TrainingLog(RunFolder(tmp_path / "out"), enabled=False, tensorboard=True, progress_bar=True, start_step=0,
                      max_steps=1)
    log.record(1, {"optim/lr": 1.0})
    log.event(1, "x")
    log.close()
    assert not (tmp_path / "out").exists()


def test_without_a_terminal_a_progress_line_comes_when_nothing_was_printed_for_a_while(tmp_path, capsys):
    """A log file's stand-in for the bar: after `progress_every_s` without a line, one saying where the run is;
    a record's line starts the wait again; --no-progress-bar prints none."""
    log = TrainingLog(RunFolder(tmp_path / "a"), enabled=True, tensorboard=False, progress_bar=True, start_step=0,
                      max_steps=10, progress_every_s=0.2)
    log.advance()  # within the wait: nothing
    time.sleep(0.25)
    log.advance()
    log.console(2, "loss 1.0")
    log.advance()  # the record's line was just printed
    log.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1] == "[step 2] loss 1.0", lines
    assert re.fullmatch(r"\[step 2\] step 2 of 10: 0\.\d\d s per step, about \d s to go", lines[0]), lines

    quiet = TrainingLog(RunFolder(tmp_path / "b"), enabled=True, tensorboard=False, progress_bar=False, start_step=0,
                        max_steps=10, progress_every_s=0.0)
    quiet.advance()
    quiet.close()
    assert capsys.readouterr().out == ""


def test_on_a_terminal_the_bar_starts_with_the_steps_and_ends_above_the_last_lines(tmp_path, monkeypatch):
    """A real pseudo-terminal: nothing of the bar before the first step (the start-up's lines come first); each
    record a whole line above the bar, however wide (never cut into the bar's text); after `end_progress` the bar is
    drawn no more, and the lines that follow stand alone."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows of 100 columns
    terminal = os.fdopen(side, "w")
    monkeypatch.setattr(sys, "stderr", terminal)  # the bar's
    monkeypatch.setattr(sys, "stdout", terminal)  # the lines', as a terminal shows both
    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=False, progress_bar=True, start_step=0,
                      max_steps=4)
    assert log.bar is None
    long_line = "loss 1.0 | " + "x" * 300
    for step in (1, 2):
        log.advance()
        log.console(step, long_line)
    log.end_progress()
    log.event(2, "stopped by SIGTERM; resume with --resume")
    log.close()
    terminal.flush()
    shown = b""
    while select.select([main], [], [], 0.2)[0]:
        shown += os.read(main, 65536)
    text = shown.decode()
    assert "[step 2] " + long_line in text  # whole (the bar's own text would be cut at the width)
    bars = text.count("/4 [")
    after_stop = text.split("stopped by SIGTERM", 1)[1]
    assert bars >= 2 and "/4 [" not in after_stop, text[-600:]
    os.close(main)

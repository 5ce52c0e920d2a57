"""Where a training run reports: TensorBoard, `metrics.jsonl`, the console.

`TrainingLog` (rank 0) writes the scalars a task measured (widenet_ds/training/metrics.py) to TensorBoard
and to `metrics.jsonl` (floats written with their full repr, so two runs compare bit for bit), and prints a line per
record, with a progress bar below the lines on a terminal; in a log file, a plain progress line wherever nothing was
printed for PROGRESS_EVERY_S (a slow step or a long log interval is never a silent minute). What a line says is the
task's.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import torch

from widenet_ds.run_folder import RunFolder, keep_records_up_to

PROGRESS_EVERY_S = 30.0  # without a terminal: a progress line when nothing was printed for this long


def memory_mib() -> float:
    """Peak memory of this process: CUDA allocations on a GPU, resident set size on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class TrainingLog:
    """Rank 0's sinks. Other ranks get one with `enabled=False`, whose methods do nothing.

    On resume from step k, records after k from the interrupted run are dropped (TensorBoard's
    purge_step, and a rewrite of metrics.jsonl), so each step appears once.
    """

    def __init__(self, folder: RunFolder, *, enabled: bool, tensorboard: bool, progress_bar: bool,
                 start_step: int, max_steps: int, console_label: str | None = None,
                 progress_every_s: float = PROGRESS_EVERY_S) -> None:
        self.enabled = enabled
        self.label = console_label  # console lines read "[<label> step N]" (finetuning: "seed 3")
        self.writer = None
        self.bar = None
        self.metrics_path = folder.metrics
        self.step, self.max_steps = start_step, max_steps
        # The bar on a terminal (drawn from the first step on, below what the start-up printed), else plain lines
        self.on_terminal = progress_bar and sys.stderr.isatty()
        self.plain_progress = progress_bar and not self.on_terminal
        self.progress_every_s = progress_every_s
        self.printed_at = self.window = None  # when the last line was printed; (time, step) a progress line counts from
        if not enabled:
            return
        self.printed_at = time.monotonic()
        self.window = (self.printed_at, start_step)
        folder.path.mkdir(parents=True, exist_ok=True)
        keep_records_up_to(self.metrics_path, start_step)
        self.metrics_file = open(self.metrics_path, "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder.tensorboard), purge_step=start_step + 1)

    def record(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()
        self.metrics_file.write(json.dumps({"step": step, "time": time.time(), **scalars}) + "\n")
        self.metrics_file.flush()

    def console(self, step: int, line: str) -> None:
        """A line of the task's about `step` (on a terminal above the bar, whole: a bar's text is cut at the
        terminal's width)."""
        if not self.enabled:
            return
        self._print(f"{self._prefix(step)} {line}")

    def advance(self, steps: int = 1) -> None:
        """`steps` more trained: the bar moves on a terminal; elsewhere a progress line if none was printed for
        `progress_every_s`."""
        if not self.enabled:
            return
        self.step += steps
        if self.on_terminal:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=self.max_steps, initial=self.step - steps, unit="step", dynamic_ncols=True)
            self.bar.update(steps)
        elif self.plain_progress and time.monotonic() - self.printed_at >= self.progress_every_s:
            self._print(f"{self._prefix(self.step)} {self._progress()}")

    def _progress(self) -> str:
        """The steps done and to go, with the time per step since the last progress line."""
        now, (since, first) = time.monotonic(), self.window
        self.window = (now, self.step)
        per_step = (now - since) / max(1, self.step - first)
        left = per_step * max(0, self.max_steps - self.step)
        return (f"step {self.step} of {self.max_steps}: {per_step:.2f} s per step, about "
                f"{f'{left / 60:.0f} min' if left >= 90 else f'{left:.0f} s'} to go")

    def end_progress(self) -> None:
        """The steps are over (done, or stopped by a signal): the bar drawn a last time and closed, so that the
        lines that follow (checkpoint, stop, evaluation, results) come after it, each once."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.on_terminal = self.plain_progress = False

    def event(self, step: int | None, message: str) -> None:
        """A notable moment (checkpoint saved, resumed, stopped by a signal): console + metrics.jsonl.
        `step` None: an event of the run rather than of a training step (data read, results written)."""
        if not self.enabled:
            return
        record = {"time": time.time(), "event": message} if step is None else {"step": step, "time": time.time(),
                                                                               "event": message}
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        self._print(f"{self._prefix(step)} {message}")

    def _prefix(self, step: int | None) -> str:
        if step is None:
            return f"[{self.label or 'run'}]"
        return f"[{self.label} step {step}]" if self.label else f"[step {step}]"

    def close(self) -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            self.writer.close()
        self.end_progress()
        self.metrics_file.close()

    def _print(self, line: str) -> None:
        self.printed_at = time.monotonic()
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

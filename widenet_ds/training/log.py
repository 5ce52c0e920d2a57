"""Where a training run reports: TensorBoard, `metrics.jsonl`, the console.

`TrainingLog` (rank 0) writes the scalars a task measured (widenet_ds/training/metrics.py) to TensorBoard
and to `metrics.jsonl` (floats written with their full repr, so two runs compare bit for bit), and shows a
progress bar on a terminal or one line per record in a log file; what a line says is the task's.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import torch

from widenet_ds.run_folder import RunFolder, keep_records_up_to


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
                 start_step: int, max_steps: int, console_label: str | None = None) -> None:
        self.enabled = enabled
        self.label = console_label  # console lines read "[<label> step N]" (finetuning: "seed 3")
        self.writer = None
        self.bar = None
        self.metrics_path = folder.metrics
        if not enabled:
            return
        folder.path.mkdir(parents=True, exist_ok=True)
        keep_records_up_to(self.metrics_path, start_step)
        self.metrics_file = open(self.metrics_path, "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder.tensorboard), purge_step=start_step + 1)
        if progress_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=max_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def record(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()
        self.metrics_file.write(json.dumps({"step": step, "time": time.time(), **scalars}) + "\n")
        self.metrics_file.flush()

    def console(self, step: int, line: str, *, status: bool = False) -> None:
        """A line of the task's about `step`; `status` (the training figures): the progress bar's text on a
        terminal, a line otherwise."""
        if not self.enabled:
            return
        if status and self.bar is not None:
            self.bar.set_postfix_str(line, refresh=True)
        else:
            self._print(f"{self._prefix(step)} {line}")

    def advance(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

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
        if self.bar is not None:
            self.bar.close()
        self.metrics_file.close()

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

"""What a pretraining run reports, and where: TensorBoard, `metrics.jsonl`, the console.

`StepMetrics` gathers per-micro-batch figures on every rank (losses, accuracies, expert load per
routing call, dropped routes, tokens) and reduces them over the data-parallel ranks with one
all-reduce. `TrainingLog` (rank 0) writes the same scalars to TensorBoard and to `metrics.jsonl`
(floats written with their full repr, so two runs compare bit for bit), and shows a progress bar on
a terminal or one line per record in a log file.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from widenet_ds.atomic import atomic_write_text

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class WindowSums:
    """Per-rank sums over a logging window (or an evaluation), and the routing of each routing call;
    one all-reduce sums them over ranks. A subclass names its sums (`SUMS`, "micro_batches" among them).

    Losses are averaged over micro-batches and ranks; accuracies are correct / counted over all of
    them; expert load is the fraction of routes per expert of each routing call (summed counts), the
    dropped fraction the mean over micro-batches and ranks.
    """

    SUMS: tuple[str, ...] = ()

    def __init__(self, blocks_of_calls: list[int], num_experts: int) -> None:
        self.blocks_of_calls = blocks_of_calls  # block index of each routing call
        self.num_experts = num_experts
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(len(self.SUMS), dtype=torch.float64)
        self.expert_counts = torch.zeros(len(self.blocks_of_calls), self.num_experts, dtype=torch.float64)
        self.dropped = torch.zeros(len(self.blocks_of_calls), dtype=torch.float64)

    def _add(self, values: dict[str, Any], routing) -> None:
        self.sums += torch.tensor([float(values[name]) for name in self.SUMS], dtype=torch.float64)
        if routing is not None and self.blocks_of_calls:
            self.expert_counts += routing.expert_counts.detach().to(torch.float64).cpu()
            self.dropped += routing.dropped_fraction.detach().to(torch.float64).cpu()

    def _reduce(self, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
        """Collective: every rank must call it at the same point. The sums over ranks, and (for the "train"
        prefix) each routing call's expert load and dropped fraction as scalars; then a new window."""
        flat = torch.cat([self.sums, self.expert_counts.flatten(), self.dropped])
        if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
            device = "cuda" if torch_dist.get_backend() == "nccl" else "cpu"
            flat = flat.to(device)
            torch_dist.all_reduce(flat)
            flat = flat.cpu()
        sums = dict(zip(self.SUMS, flat[: len(self.SUMS)].tolist()))
        routing = {}
        if prefix == "train":
            counts = flat[len(self.SUMS): len(self.SUMS) + self.expert_counts.numel()].view_as(self.expert_counts)
            dropped = flat[len(self.SUMS) + self.expert_counts.numel():] / max(sums["micro_batches"], 1.0)
            for call, block in enumerate(self.blocks_of_calls):
                load = counts[call] / counts[call].sum().clamp(min=1.0)
                for expert in range(self.num_experts):
                    routing[f"moe/block_{block:02d}/expert_{expert:02d}_load"] = load[expert].item()
                routing[f"moe/block_{block:02d}/dropped_fraction"] = dropped[call].item()
        self.reset()
        return sums, routing


class StepMetrics(WindowSums):
    """MLM + SOP pretraining's window sums."""

    SUMS = ("loss", "mlm_loss", "sop_loss", "balance_loss", "mlm_correct", "mlm_count", "sop_correct",
            "sop_count", "samples", "tokens", "micro_batches")

    @torch.no_grad()
    def add(self, output, batch: dict[str, torch.Tensor]) -> None:
        """One micro-batch: `output` of WideNetForPreTraining with labels, `batch` its inputs."""
        mlm_labels, sop_labels = batch["mlm_labels"], batch["sop_labels"]
        predicted = mlm_labels != -100
        mlm_correct = (output.mlm_logits.argmax(-1) == mlm_labels) & predicted
        self._add({
            "loss": output.loss, "mlm_loss": output.mlm_loss, "sop_loss": output.sop_loss,
            "balance_loss": output.balance_loss, "mlm_correct": mlm_correct.sum(), "mlm_count": predicted.sum(),
            "sop_correct": (output.sop_logits.argmax(-1) == sop_labels).sum(), "sop_count": sop_labels.numel(),
            "samples": sop_labels.numel(), "tokens": batch["attention_mask"].sum(), "micro_batches": 1,
        }, output.routing)

    def reduce(self, prefix: str) -> tuple[dict[str, float], float, float]:
        """Collective. The scalars (named `prefix/...`), and the samples and real (unpadded) tokens of the
        window over all ranks."""
        sums, routing = self._reduce(prefix)
        n = max(sums["micro_batches"], 1.0)
        scalars = {f"{prefix}/{name}": sums[name] / n for name in ("loss", "mlm_loss", "sop_loss", "balance_loss")}
        scalars[f"{prefix}/mlm_accuracy"] = sums["mlm_correct"] / max(sums["mlm_count"], 1.0)
        scalars[f"{prefix}/sop_accuracy"] = sums["sop_correct"] / max(sums["sop_count"], 1.0)
        return {**scalars, **routing}, sums["samples"], sums["tokens"]


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

    def __init__(self, output_dir: Path, *, enabled: bool, tensorboard: bool, progress_bar: bool,
                 start_step: int, max_steps: int, console_label: str | None = None) -> None:
        self.enabled = enabled
        self.label = console_label  # console lines read "[<label> step N]" (finetuning: "seed 3")
        self.writer = None
        self.bar = None
        self.metrics_path = Path(output_dir) / METRICS_FILE
        if not enabled:
            return
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        _truncate_jsonl(self.metrics_path, after_step=start_step)
        self.metrics_file = open(self.metrics_path, "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(output_dir) / TENSORBOARD_DIR), purge_step=start_step + 1)
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
        if "train/loss" in scalars:
            self._console(step, scalars)
        elif "valid/loss" in scalars:
            self._print(f"[step {step}] validation: loss {scalars['valid/loss']:.4f} | mlm {scalars['valid/mlm_loss']:.4f}"
                        f" acc {scalars['valid/mlm_accuracy']:.3f} | sop {scalars['valid/sop_loss']:.4f}"
                        f" acc {scalars['valid/sop_accuracy']:.3f}")

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

    def _console(self, step: int, s: dict[str, float]) -> None:
        if "train/mlm_loss" in s:  # pretraining
            figures = (f"loss {s['train/loss']:.4f} | mlm {s['train/mlm_loss']:.4f} acc {s['train/mlm_accuracy']:.3f}"
                       f" | sop {s['train/sop_loss']:.4f} acc {s['train/sop_accuracy']:.3f}")
        else:  # finetuning
            figures = (f"loss {s['train/loss']:.4f} | task {s['train/task_loss']:.4f}"
                       f" | balance {s['train/balance_loss']:.4f}")
        figures += f" | lr {s['optim/lr']:.3g} | {s['perf/samples_per_second']:.1f} samples/s"
        if self.bar is not None:
            self.bar.set_postfix_str(figures, refresh=True)
        else:
            self._print(f"{self._prefix(step)} {figures}")

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)


def _truncate_jsonl(path: Path, after_step: int) -> None:
    """Keep the records of steps <= after_step (a resumed run rewrites what came after)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= after_step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl (events included)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

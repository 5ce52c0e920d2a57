"""Preemption: a signal asks every rank to stop at the same step, save, and exit 0 (Slurm requeues)."""

from __future__ import annotations

import signal

import torch
import torch.distributed as torch_dist


class StopRequest:
    """SIGTERM / SIGUSR1 (Slurm preemption, `scancel`, the deepspeed launcher's shutdown) set a flag; the
    training loop asks `agreed()` after each step so that all ranks stop, and save, at the same step."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous = {}

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self) -> bool:
        """Collective: True on every rank if any rank was signalled."""
        flag = torch.tensor([1.0 if self.signal_name else 0.0])
        if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
            device = "cuda" if torch_dist.get_backend() == "nccl" else "cpu"
            flag = flag.to(device)
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX)
        return bool(flag.item())

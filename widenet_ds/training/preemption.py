"""Preemption: a signal asks every rank to stop at the same step, save, and exit 0 (Slurm requeues);
`SavePoints`: where the training loops write checkpoints and stop."""

from __future__ import annotations

import signal

import torch
import torch.distributed as torch_dist

from widenet_ds.distributed.collective_timeouts import use_training_timeout


class StopRequest:
    """SIGTERM / SIGUSR1 (Slurm preemption, `scancel`, the deepspeed launcher's shutdown) set a flag; the
    training loop asks `agreed()` after each step so that all ranks stop, and save, at the same step."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous = {}

    def install(self, *signals: signal.Signals) -> None:
        """Catch `signals` (all of SIGNALS when none are named) from now on."""
        for sig in signals or self.SIGNALS:
            if sig not in self._previous:
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


class SavePoints:
    """A loop saves every `save_interval` steps, at its last step and when stopped by a signal (then it
    stops); never twice for one step. Asked between batches (a ParaFormer prefix batch's steps belong
    together), so a batch of several steps saves when it crosses a multiple of the interval."""

    def __init__(self, checkpoints, stop: StopRequest, log, save_interval: int, max_steps: int,
                 saved_step: int | None) -> None:
        self.checkpoints, self.stop, self.log = checkpoints, stop, log
        self.save_interval, self.max_steps = save_interval, max_steps
        self.saved_step = saved_step  # the step already on disk (a resumed run's), None for a fresh run
        self.stopping = False

    def crosses(self, since: int, step: int) -> bool:
        """Whether a batch from step `since` to `step` ends at a checkpoint due by the interval or the run's end
        (known before the batch runs; a signal's stop is not)."""
        return step // self.save_interval > since // self.save_interval or step == self.max_steps

    def due(self, step: int, since: int) -> bool:
        """Collective (`StopRequest.agreed`): whether `step`, reached from step `since`, is to be saved. A step has
        run: from now on every collective has the training bound (distributed/collective_timeouts.py)."""
        use_training_timeout()
        self.stopping = self.stop.agreed()
        return self.stopping or self.crosses(since, step)

    def save(self, engine, state, loader, meta) -> bool:
        """Write `state.step`'s checkpoint (unless on disk already); True when the loop is to stop now."""
        if self.stopping or state.step >= self.max_steps:  # the last step: the progress bar ends above what follows
            self.log.end_progress()
        if self.saved_step != state.step:
            tag_dir = self.checkpoints.save(engine, state, loader, meta)
            self.saved_step = state.step
            self.log.event(state.step, f"checkpoint saved: {tag_dir}")
        if self.stopping:
            self.log.event(state.step, f"stopped by {self.stop.signal_name or 'a signal on another rank'}; "
                                       f"resume with --resume")
        return self.stopping

    def after_batch(self, since: int, engine, state, loader, meta) -> bool:
        """`due` then `save`: True when the loop is to stop now."""
        return self.save(engine, state, loader, meta) if self.due(state.step, since) else False

"""Which branches of a ParaFormer layout train at each optimizer step.

* `joint`: all branches from the start.
* `prefix` (the authors' code and the paper's Algorithm 1): training alternates two phases of
  `cycle_batches` batches each (default: one epoch, as the code). In the first, every batch takes one
  optimizer step on each nested prefix of branches (1, 2, ..., N: N steps per batch); in the second, one
  joint step per batch. Earlier branches keep training in every later prefix; later ones rest.
* `staged` (the paper's text and its Fig. 3): branch i + 1 joins at optimizer step S_i (`stage_steps`),
  one step per batch throughout.

The loop works in batches: `branch_counts(batch)` gives the prefix sizes to step on for the batch with that
index, each one optimizer step. Checkpoints and stops fall between batches, so the position is a pure
function of the step count (`batch_at_step`), and a run's length is rounded up to a batch boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from widenet_ds.engine.ds_config import DeepSpeedSettings
from widenet_ds.errors import ConfigError

ScheduleKind = Literal["joint", "prefix", "staged"]
SCHEDULES = ("joint", "prefix", "staged")


@dataclass(frozen=True)
class BranchSchedule:
    kind: ScheduleKind
    num_branches: int
    cycle_batches: int = 1            # prefix: batches in each of the two phases
    stage_steps: tuple[int, ...] = ()  # staged: the step at which branch 2, 3, ..., N joins

    @classmethod
    def build(cls, kind: str, num_branches: int, batches_per_epoch: int, cycle_batches: int | None = None,
              stage_steps: list[int] | None = None) -> "BranchSchedule":
        """Checked construction; errors name the flag to fix."""
        if kind not in SCHEDULES:
            raise ConfigError(f"--branch-schedule {kind!r} is not one of {list(SCHEDULES)}.")
        if kind != "joint" and num_branches == 1:
            raise ConfigError(f"--branch-schedule {kind} needs a model with branches (num_branches > 1); this one has "
                              f"one: use a ParaFormer preset (e.g. paraformer-tiny-3x4) or --branch-schedule joint.")
        if cycle_batches is not None and kind != "prefix":
            raise ConfigError("--prefix-cycle-batches applies to --branch-schedule prefix only; drop it.")
        if stage_steps and kind != "staged":
            raise ConfigError("--stage-steps applies to --branch-schedule staged only; drop it.")
        if kind == "prefix":
            cycle = cycle_batches if cycle_batches is not None else batches_per_epoch
            if cycle <= 0:
                raise ConfigError(f"--prefix-cycle-batches must be positive, got {cycle}.")
            return cls(kind, num_branches, cycle_batches=cycle)
        if kind == "staged":
            return cls(kind, num_branches, stage_steps=_stage_thresholds(stage_steps, num_branches))
        return cls(kind, num_branches)

    # -- the schedule --------------------------------------------------------------------------------
    @property
    def cycle_steps(self) -> int:
        """prefix: optimizer steps in one cycle of both phases."""
        return self.cycle_batches * (self.num_branches + 1)

    def branch_counts(self, batch: int, step: int) -> list[int]:
        """The prefix sizes to take one optimizer step on each, for batch number `batch` (0-based) that
        starts at optimizer step `step`."""
        if self.kind == "prefix":
            if batch % (2 * self.cycle_batches) < self.cycle_batches:
                return list(range(1, self.num_branches + 1))
            return [self.num_branches]
        if self.kind == "staged":
            return [1 + sum(step >= s for s in self.stage_steps)]
        return [self.num_branches]

    def batch_at_step(self, step: int) -> int:
        """The batch index that starts at optimizer step `step` (a batch boundary)."""
        if self.kind != "prefix":
            return step
        cycles, rest = divmod(step, self.cycle_steps)
        first_phase = self.cycle_batches * self.num_branches
        if rest < first_phase:
            if rest % self.num_branches:
                raise ConfigError(f"step {step} falls inside a batch's prefix steps; prefix checkpoints are written "
                                  f"between batches only, so this one comes from another schedule: resume with the "
                                  f"--branch-schedule it was written with.")
            return cycles * 2 * self.cycle_batches + rest // self.num_branches
        return cycles * 2 * self.cycle_batches + self.cycle_batches + rest - first_phase

    def end_step(self, max_steps: int) -> int:
        """The first batch boundary at or after `max_steps`: where the run ends."""
        if self.kind != "prefix":
            return max_steps
        cycles = max(0, max_steps // self.cycle_steps - 1)
        step, batch = cycles * self.cycle_steps, cycles * 2 * self.cycle_batches
        while step < max_steps:
            step += len(self.branch_counts(batch, step))
            batch += 1
        return step

    def describe(self) -> str:
        if self.kind == "prefix":
            return (f"prefix schedule over {self.num_branches} branches: {self.cycle_batches} batches of "
                    f"{self.num_branches} nested-prefix steps, then {self.cycle_batches} joint steps, repeated")
        if self.kind == "staged":
            return "staged schedule: branch 1 from step 0, " + ", ".join(
                f"branch {i + 2} from step {s}" for i, s in enumerate(self.stage_steps))
        return f"joint schedule: all {self.num_branches} branches every step"


def _stage_thresholds(stage_steps: list[int] | None, num_branches: int) -> tuple[int, ...]:
    if not stage_steps:
        raise ConfigError(f"--branch-schedule staged needs --stage-steps: one value S (branch i + 1 joins at step "
                          f"i * S) or {num_branches - 1} increasing steps, one per joining branch.")
    if len(stage_steps) == 1:
        stage_steps = [stage_steps[0] * i for i in range(1, num_branches)]
    if len(stage_steps) != num_branches - 1:
        raise ConfigError(f"--stage-steps has {len(stage_steps)} values; the model has {num_branches} branches, so "
                          f"give one value or {num_branches - 1}.")
    if any(s <= 0 for s in stage_steps) or any(b <= a for a, b in zip(stage_steps, stage_steps[1:])):
        raise ConfigError(f"--stage-steps {','.join(map(str, stage_steps))} must be positive and increasing.")
    return tuple(stage_steps)


def check_branch_updates_isolated(ds: DeepSpeedSettings, kind: str) -> None:
    """Refuse the set-ups that would update resting branches. Only fp32 ZeRO 0 keeps one tensor per
    parameter, so that a branch without gradients is skipped whole by the optimizer; ZeRO 1-2 and DeepSpeed's
    fp16/bf16 optimizers update flat buffers, where a resting branch's zero gradients would still move its
    Adam/LAMB moments, its weight decay and the trust ratio of the flat piece."""
    problems = ds.per_tensor_update_problems()
    if problems:
        raise ConfigError(f"--branch-schedule {kind} trains some branches while others rest, and a resting branch must "
                          f"get no update of any kind; that holds only with fp32 ZeRO stage 0 ({'; '.join(problems)}), "
                          f"or use --branch-schedule joint.")


def plan_branch_schedule(kind: str, num_branches: int, batches_per_epoch: int, ds: DeepSpeedSettings,
                         cycle_batches: int | None = None, stage_steps: list[int] | None = None) -> BranchSchedule:
    """The run's schedule, refused before any model is built when the DeepSpeed set-up cannot keep resting
    branches still."""
    schedule = BranchSchedule.build(kind, num_branches, batches_per_epoch, cycle_batches, stage_steps)
    if schedule.kind != "joint":
        check_branch_updates_isolated(ds, schedule.kind)
    return schedule

"""A resume on another shape (ranks, expert-parallel size, ZeRO stage, branch groups, precision, micro batch): what
must hold, checked before anything loads, and what the continuation then is. The checkpoint is read whole and put
into this run's engine (checkpoint/relayout.py).

Step for step: with the same micro batch, the step the run continues with computes the same thing as on the old
shape, because the micro-batches of a step do not depend on the shape (data/batch_order.py); only sums run in
another order. Statistically (said on the resume line, never silent): a new micro batch of the same global batch
(the same samples in other micro-batches: the balance loss and capacity routing see other groups of tokens), a new
precision (fp32 <-> bf16: the fp32 master weights and moments carry over, the forward and backward compute in the
other one), another branch group with a shared MoE that has a balance loss or drops routes (each rank of a group
routes its own branches' tokens) or a model that draws random numbers (each rank's stream is new)."""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.shape_free import RELAID_OUT, fp16_refusal
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.data.batch_order import (
    GLOBAL_CHUNKS,
    LOSS_PER_MICRO_BATCH,
    LOSS_PER_STEP,
)
from widenet_ds.distributed.parallel import ParallelPlan
from widenet_ds.engine.ds_config import DeepSpeedSettings, validate_ds_config
from widenet_ds.errors import CheckpointError, ConfigError

MICRO_BATCH_KEY = "train_micro_batch_size_per_gpu"  # its line in the changes since the checkpoint


@dataclass(frozen=True)
class Shape:
    world_size: int
    ep_size: int
    zero_stage: int
    precision: str = "fp32"
    branch_parallel: int = 1
    micro_batch: int | None = None  # None: not recorded

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.branch_parallel

    def words(self, other: Shape) -> str:
        """This shape, naming besides ranks, ep and ZeRO what either side has otherwise (branch groups, 16-bit
        precision, a micro batch that changes)."""
        said = [f"{self.world_size} rank{'s' if self.world_size != 1 else ''}", f"ep {self.ep_size}",
                f"ZeRO {self.zero_stage}"]
        if max(self.branch_parallel, other.branch_parallel) > 1:
            said.append(f"branch-parallel {self.branch_parallel}")
        if "fp32" != self.precision or "fp32" != other.precision:
            said.append(self.precision)
        if self.micro_batch != other.micro_batch:
            said.append(f"micro batch {self.micro_batch}")
        return ", ".join(said)

    def __str__(self) -> str:
        return self.words(self)


@dataclass(frozen=True)
class NewShape:
    """A resume that re-lays the checkpoint out: from which shape to which, and what the continuation is."""

    old: Shape
    new: Shape
    statistical: tuple[str, ...] = ()  # why it does not continue step for step (empty: it does)
    step_for_step_while: str = ""  # what must not happen for it to (empty: nothing)
    loss_normalisation: str = LOSS_PER_STEP  # how the run weighs its per-token losses from here on
    accepted_changes: tuple[str, ...] = ()  # settings a changed shape needs (no --accept-changed-settings asked)

    def __str__(self) -> str:
        return f"{self.old.words(self.new)} -> {self.new.words(self.old)}"

    def words(self) -> str:
        """How the console and the log say the re-layout: on another shape, or a resharded checkpoint on the
        shape it was resharded for."""
        return (f"on another shape ({self})" if self.old != self.new else
                f"re-laid out from its resharded state (on its own shape, {self.new})")

    def continuation(self) -> str:
        """What the resumed run then is, for the resume line."""
        if self.statistical:
            return "continues statistically, not step for step: " + "; ".join(self.statistical)
        while_ = f" while {self.step_for_step_while}" if self.step_for_step_while else ""
        return f"continues step for step (the same micro-batches; sums in another order){while_}"


def trained_world_size(meta: CheckpointMeta) -> int:
    """The ranks the checkpoint's run trained on (a resharded tag records the new ones, and where it came from)."""
    return (meta.run.get("resharded_from") or {}).get("world_size") or meta.world_size


def trained_branch_parallel(meta: CheckpointMeta) -> int:
    """The ranks of a branch group of the checkpoint's run (a resharded tag has none: its source's are recorded)."""
    return (meta.run.get("resharded_from") or {}).get("branch_parallel") or meta.branch_parallel


def saved_settings(meta: CheckpointMeta, has_moe: bool) -> DeepSpeedSettings | None:
    """The checkpoint's DeepSpeed settings as its run resolved them (None: a marker that did not record them; an
    fp16 run's on a machine without CUDA too: what it computed is read, not run)."""
    if not meta.deepspeed_config:
        return None
    return validate_ds_config(meta.deepspeed_config,
                              world_size=trained_world_size(meta) // max(1, trained_branch_parallel(meta)),
                              has_moe=has_moe,
                              cuda_available=True)


def random_draws(model_config) -> dict[str, object]:
    """The settings under which a step draws random numbers (dropout, routing noise), with their values."""
    draws = {name: getattr(model_config, name) for name in ("hidden_dropout", "attention_dropout", "classifier_dropout")
             if getattr(model_config, name, 0.0)}
    if model_config.is_moe and model_config.moe.noise != "none":
        draws["moe.noise"] = model_config.moe.noise
    return draws


def routing_per_rank(model_config) -> dict[str, object]:
    """The settings under which a branch group's ranks route differently from one rank (a shared MoE routes each
    rank's branches in one call, one rank's all branches in one): the balance loss, a mean over the call's tokens,
    and a capacity that drops what overflows an expert, a share of the call's tokens; with their values. Dropless
    routing without a balance loss is the same on any branch group."""
    if not (model_config.is_moe and model_config.num_branches > 1):
        return {}
    moe, found = model_config.moe, {}
    if moe.balance_loss_weight:
        found["moe.balance_loss_weight"] = moe.balance_loss_weight
    if moe.dispatch != "dropless" and moe.drop_tokens:
        found["moe.dispatch"] = moe.dispatch
    return found


def routing_words(routing: dict[str, object]) -> str:
    """`the balance loss (moe.balance_loss_weight 0.01) and the expert capacity (moe.dispatch compact)`."""
    words = {"moe.balance_loss_weight": "the balance loss", "moe.dispatch": "the expert capacity"}
    return " and ".join(f"{words[name]} ({name} {value})" for name, value in routing.items())


def routing_fixes(routing: dict[str, object]) -> list[str]:
    return [{"moe.balance_loss_weight": "--set moe.balance_loss_weight=0",
             "moe.dispatch": "--set moe.dispatch=dropless"}[name] for name in routing]


def micro_batches_that_fit(train_batch: int, data_parallel_size: int) -> list[int]:
    """Every micro batch that forms `train_batch` on `data_parallel_size` ranks (any accumulation)."""
    per_rank, rest = divmod(train_batch, data_parallel_size)
    return [] if rest else [m for m in range(1, per_rank + 1) if per_rank % m == 0]


def check_micro_batches_divide(checkpoint: CheckpointSource, data_parallel_size: int, has_moe: bool) -> None:
    """A resume on ranks that cannot split the checkpoint's micro-batches of a step: its message first (the
    DeepSpeed JSON's batch arithmetic would otherwise suggest a change of the global batch the resume refuses)."""
    source = checkpoint.tag_dir
    saved = saved_settings(checkpoint.meta, has_moe)
    if saved is None:
        return
    train, micro = saved.batch.train_batch_size, saved.batch.micro_batch_size
    per_step = train // micro
    if per_step % data_parallel_size:
        fits = _splitting(per_step)
        micros = [m for m in micro_batches_that_fit(train, data_parallel_size) if m != micro]
        other_micro = (f"set {MICRO_BATCH_KEY} to {' or '.join(map(str, micros))} in the DeepSpeed JSON (the same "
                       f"train_batch_size {train}; the run then continues statistically: the same samples per step in "
                       f"other micro-batches), " if micros else "")
        raise ConfigError(
            f"checkpoint {source} trained {per_step} micro-batch(es) of {micro} per step (train_batch_size {train}); "
            f"{data_parallel_size} data-parallel rank(s) cannot split them. Keep train_batch_size {train} and "
            f"{other_micro}resume on {' or '.join(map(str, fits))} data-parallel rank(s) (step for step), or start a "
            f"new run from its weights with --init-from {source} (a new optimizer and schedule).")


def continuation_on(checkpoint: CheckpointSource, world_size: int) -> str:
    """How `--resume` of `checkpoint` continues on `world_size` data-parallel ranks (`convert reshard`'s promise):
    as it is where they split its micro-batches (the resume line then says whether step for step), with another
    micro batch where one forms its global batch; refused, naming the rank counts that do, where none does (the
    resume would be refused)."""
    meta = checkpoint.meta
    saved = saved_settings(meta, (meta.model_config or {}).get("ffn") == "moe") if meta else None
    if saved is None:
        return "continues the run (on that shape or another)"
    train, micro = saved.batch.train_batch_size, saved.batch.micro_batch_size
    per_step = train // micro
    if per_step % world_size == 0:
        return f"continues the run on {world_size} rank(s), or on another shape"
    micros = micro_batches_that_fit(train, world_size)
    if micros:
        return (f"continues the run on {world_size} rank(s) with {MICRO_BATCH_KEY} {' or '.join(map(str, micros))} in "
                f"the DeepSpeed JSON (the same train_batch_size {train}: the same samples per step in other "
                f"micro-batches, so statistically), or as it is on {' or '.join(map(str, _splitting(per_step)))} "
                f"rank(s)")
    raise ConfigError(
        f"--world-size {world_size}: checkpoint {checkpoint.tag_dir} trained {per_step} micro-batch(es) of {micro} per "
        f"step (train_batch_size {train}), which {world_size} ranks cannot form with any micro batch, so a --resume "
        f"there would be refused. Reshard for {' or '.join(map(str, _splitting(per_step)))} rank(s), or pass "
        f"--model-states-only to start a new run from its weights (--init-from).")


def _splitting(per_step: int) -> list[int]:
    """The rank counts that split `per_step` micro-batches."""
    return [n for n in range(1, per_step + 1) if per_step % n == 0]


def _statistical(old: Shape, new: Shape, meta: CheckpointMeta, model_config) -> tuple[str, ...]:
    """Why a continuation from `old` on `new` is not step for step."""
    why = []
    if old.micro_batch != new.micro_batch:
        why.append(f"micro-batches of {new.micro_batch} samples instead of {old.micro_batch} (the same samples per "
                   f"step): the balance loss and capacity routing see other groups of tokens")
        if meta.loss_normalisation == LOSS_PER_MICRO_BATCH and meta.task in (None, "pretrain"):
            why.append("the MLM loss, each micro-batch's own mean until now, is the mean over the step's masked "
                       "tokens from here on")
    if old.precision != new.precision:
        why.append(f"the forward and backward compute in {new.precision} instead of {old.precision} (the fp32 master "
                   f"weights and optimizer state carry over)")
    routing = routing_per_rank(model_config)
    if old.branch_parallel != new.branch_parallel and "moe.balance_loss_weight" in routing:
        why.append(f"branch groups of {new.branch_parallel} instead of {old.branch_parallel} rank(s): each rank routes "
                   f"its own branches' tokens in one call, so {routing_words(routing)} are computed over other groups "
                   f"of tokens")
    draws = random_draws(model_config)
    if draws:
        why.append("new random streams for " + ", ".join(f"{name} {value}" for name, value in draws.items()))
    return tuple(why)


def _capacity_condition(old: Shape, new: Shape, model_config) -> str:
    """A branch group's change with a capacity that drops routes (and no balance loss, which is statistical): the
    kept routes are the same only while none overflows, each rank counting its own branches' tokens."""
    if old.branch_parallel == new.branch_parallel or "moe.dispatch" not in routing_per_rank(model_config):
        return ""
    return (f"no route overflows an expert's capacity (moe.dispatch {model_config.moe.dispatch}: each rank of a branch "
            f"group counts it over its own branches' tokens; --set moe.dispatch=dropless drops none)")


def plan_new_shape(checkpoint: CheckpointSource, parallel: ParallelPlan, ds: DeepSpeedSettings,
                   model_config) -> NewShape | None:
    """None when the checkpoint (opened for --resume) was written on this run's shape; else the re-layout, after
    refusing, with the fix, a shape it cannot continue on. A resharded checkpoint's state (`convert reshard`) is
    always re-laid out: its old shape is the run's it came from."""
    meta, source = checkpoint.meta, checkpoint.tag_dir
    saved = saved_settings(meta, model_config.is_moe)
    resharded = meta.run.get("resharded_from") or {}
    old = Shape(trained_world_size(meta), resharded.get("ep_size") or meta.ep_size,
                saved.zero_stage if saved else ds.zero_stage, saved.precision if saved else ds.precision,
                trained_branch_parallel(meta), saved.batch.micro_batch_size if saved else ds.batch.micro_batch_size)
    new = Shape(parallel.world_size, parallel.ep_size, ds.zero_stage, ds.precision, parallel.branch_parallel,
                ds.batch.micro_batch_size)
    if old == new and not meta.shape_free_state:
        return None
    own_shape = (f"resume on its own shape ({old}), or start a new run from its weights with --init-from {source} "
                 f"(a new optimizer and schedule)")
    if meta.data_order != GLOBAL_CHUNKS:
        raise CheckpointError(f"checkpoint {source} was written in the rank-strided data order of earlier widenet-ds "
                              f"versions, whose micro-batches depend on the number of ranks, so it cannot continue "
                              f"on {new}: {own_shape}.")
    if saved is None:
        raise CheckpointError(f"checkpoint {source} does not record its DeepSpeed settings; {own_shape}.")
    if old.precision not in RELAID_OUT:  # its state cannot move, whatever this run computes in
        raise ConfigError(f"{fp16_refusal(f'checkpoint {source} was trained in {old.precision}')}: {own_shape}.")
    if new.precision not in RELAID_OUT:
        raise ConfigError(f"{fp16_refusal(f'this run is {new.precision}')}: {own_shape}; or continue it in "
                          f"{' or '.join(RELAID_OUT)} on another shape.")
    if saved.batch.train_batch_size != ds.batch.train_batch_size:
        fits = micro_batches_that_fit(saved.batch.train_batch_size, parallel.data_parallel_size)
        raise ConfigError(
            f"checkpoint {source} trained with train_batch_size {saved.batch.train_batch_size}; on {new} this run has "
            f"{ds.batch.train_batch_size}. A step of another size would take other samples at another point of the "
            f"schedule: set train_batch_size {saved.batch.train_batch_size} in the DeepSpeed JSON (with "
            f"{MICRO_BATCH_KEY} {' or '.join(map(str, fits)) or 'of a rank count that divides it'}) and leave "
            f"gradient_accumulation_steps out, or start a new run from its weights with --init-from {source}.")
    forced = (saved.batch.train_batch_size // saved.batch.micro_batch_size) % parallel.data_parallel_size != 0
    micro_changed = old.micro_batch != new.micro_batch
    statistical = _statistical(old, new, meta, model_config)
    return NewShape(old, new, statistical, "" if statistical else _capacity_condition(old, new, model_config),
                    LOSS_PER_STEP if micro_changed else meta.loss_normalisation,
                    (MICRO_BATCH_KEY,) if micro_changed and forced else ())

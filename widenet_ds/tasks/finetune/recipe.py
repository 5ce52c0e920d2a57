"""A finetuning recipe: the defaults of one dataset (each finetuning task keeps its rows: tasks/glue/recipes.py,
tasks/squad/recipes.py); `source` says where the numbers come from.

The model-side settings (capacity factor, balance weight, dropout, max length) are applied to the model
and can be overridden by flags. The optimisation settings (steps, warmup, batch size, learning rate) live
in the DeepSpeed JSON, which a finetuning run checks against the recipe (`FinetuneRecipe.differences`).

- "widenet-table7": the WideNet paper's Table 7 (MNLI, SST-2, SQuAD v1.1 / v2.0).
- "albert+widenet-moe": steps, warmup, batch, lr and dropout of the ALBERT paper's finetuning table
  (Lan et al. 2020, appendix A.4; WideNet takes MNLI and SQuAD unchanged from it), with the MoE
  settings WideNet uses for GLUE (C = 1.2, lambda = 0.01). Not given by the WideNet paper: a stated
  default, not a reproduction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from widenet_ds.errors import ConfigError


@dataclass(frozen=True)
class FinetuneRecipe:
    steps: int
    warmup_steps: int
    batch_size: int  # global, over all ranks and accumulation steps
    learning_rate: float
    capacity_factor: float  # MoE capacity C during finetuning
    balance_weight: float  # lambda, weight of the load-balance loss
    dropout: float  # hidden/attention dropout of the encoder
    classifier_dropout: float
    max_seq_length: int
    source: str

    def differences(self, *, batch_size: int, learning_rate: float | None, warmup_steps: int | None,
                    steps: int | None) -> list[str]:
        """`name: recipe value vs the given value` for each optimisation setting that differs (the
        DeepSpeed JSON's; None: the JSON does not set it, e.g. no scheduler)."""
        given = {"batch size": (self.batch_size, batch_size), "learning rate": (self.learning_rate, learning_rate),
                 "warmup steps": (self.warmup_steps, warmup_steps), "schedule steps": (self.steps, steps)}
        return [f"{name} {want:g} in the recipe, {'not set' if got is None else f'{got:g}'} in the DeepSpeed JSON"
                for name, (want, got) in given.items()
                if got is None or not math.isclose(want, got, rel_tol=1e-9)]

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_seq_length"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ConfigError(f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps}")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.capacity_factor <= 0:
            raise ConfigError(f"capacity_factor must be positive, got {self.capacity_factor}")
        if self.balance_weight < 0:
            raise ConfigError(f"balance_weight must be >= 0, got {self.balance_weight}")
        for name in ("dropout", "classifier_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")


def albert_recipe(steps, warmup, batch, lr, dropout) -> FinetuneRecipe:
    return FinetuneRecipe(steps, warmup, batch, lr, capacity_factor=1.2, balance_weight=0.01, dropout=dropout,
                          classifier_dropout=0.1, max_seq_length=512, source="albert+widenet-moe")


def table7_recipe(steps, warmup, batch, lr, c, lam, dropout, max_len) -> FinetuneRecipe:
    return FinetuneRecipe(steps, warmup, batch, lr, capacity_factor=c, balance_weight=lam, dropout=dropout,
                          classifier_dropout=0.1, max_seq_length=max_len, source="widenet-table7")

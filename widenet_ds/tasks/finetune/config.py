"""The settings every finetuning task shares: the data, the tokenizer, the seeds, the lengths and subsets, the
recipe check, scoring only, saving the finetuned model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from widenet_ds.errors import ConfigError
from widenet_ds.results import Scores, is_number, with_scale
from widenet_ds.tasks.finetune.results import FinetuneResults
from widenet_ds.training.flags import flag
from widenet_ds.training.run_config import (
    DATA_HELP,
    EVAL_SUBSET_HELP,
    HF_DATA,
    LATEST,
    MONITORING,
    RunConfig,
    missing,
)

# The help of flags several finetuning tasks take: one meaning per flag (docs/flags.md).
TRAIN_FILE_HELP = ("the file to train on, in the task's format (default: the task's training file in --data; SQuAD: "
                   "train-v<version>.json, or --data itself when it is a file)")


@dataclass(kw_only=True)
class FinetuneConfig(RunConfig):
    """Finetuning runs seeds SEED..SEED+SEEDS-1, each trained from the same weights for max_steps, evaluated,
    and summarised (median) in results.json; each seed is a run folder `seed<N>/` of the output folder.
    The recipe of what it finetunes on (tasks/finetune/recipe.py) gives dropout, capacity factor, balance weight
    and the max length; `--set` changes any of them. Each finetuning task extends it with its own settings."""

    POSITIVE: ClassVar[tuple[str, ...]] = ("seeds", "max_train_examples", "max_eval_examples", "max_seq_length")
    EXAMPLE_DS_CONFIG: ClassVar[str] = "finetune_cpu_small.json"
    PATH_SETTINGS: ClassVar[frozenset[str]] = RunConfig.PATH_SETTINGS | {"data", "tokenizer"}

    data: str = field(metadata=flag(DATA_HELP))
    tokenizer: str | None = field(default=None, metadata=flag(
        "tokenizer.json / vocab.txt / prepared data folder (default: the one saved with --init-from)"))
    seeds: int = field(default=1, metadata=flag("runs with seeds SEED..SEED+N-1; the median is reported", metavar="N"))
    max_seq_length: int | None = field(default=None, metadata=flag(
        "default: the recipe's, capped by the model's positions"))
    max_train_examples: int | None = field(default=None, metadata=flag("train on the first N examples only",
                                                                       metavar="N"))
    max_eval_examples: int | None = field(default=None, metadata=flag(EVAL_SUBSET_HELP, metavar="N",
                                                                      group=MONITORING))
    allow_recipe_mismatch: bool = field(default=False, metadata=flag(
        "train with a DeepSpeed JSON whose batch size, learning rate or schedule differ from the task recipe "
        "(recorded in results.json)"))
    eval_only: bool = field(default=False, metadata=flag(
        "score --init-from (e.g. a model written by --save-model) without training"))
    save_model: bool = field(default=False, metadata=flag(
        "write each seed's finetuned model as a checkpoint folder seed<N>/model (with the tokenizer)"))

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.model_config is not None and self.init_from is not None:
            problems.append("--model-config is the model of a random initialisation; with --init-from the model is "
                            "the checkpoint's (change its fields with --set): pass only one of them.")
        if self.eval_only and self.init_from is None:
            problems.append("--eval-only scores trained weights: pass --init-from with a finetuned checkpoint.")
        if self.eval_only and (self.seeds != 1 or self.resume):
            problems.append("--eval-only scores one set of weights once; drop --seeds and --resume.")
        if self.resume not in (None, LATEST):
            problems.append(f"--resume {self.resume}: a finetuning run continues from its own output folder (each seed "
                            f"from its latest checkpoint); pass --resume without a value.")
        return problems

    def data_problems(self) -> list[str]:
        if self.data == HF_DATA:
            return []
        return missing("--data", Path(self.data), "pass the folder (or file) in the original format, or `--data hf` to "
                                                  "download through HF datasets")

    def cpu_recipe_flags(self) -> str | None:
        """The finetuning JSONs are the paper's GPU recipes: the small CPU JSON trains with --allow-recipe-mismatch
        (an --eval-only run trains nothing: no advice)."""
        return None if self.eval_only else "--allow-recipe-mismatch"

    def schedule_change_flags(self, resuming: bool) -> str:
        """A finetuning run also takes a schedule other than its task recipe's with --allow-recipe-mismatch only,
        and compares its settings with its run_config.json whenever --resume finds one (whichever seed is next)."""
        compared = self.resume is not None and self.folder.run_config.is_file()
        flags = [flag for flag, needed in (("--accept-changed-settings", compared and not self.accept_changed_settings),
                                           ("--allow-recipe-mismatch", not self.allow_recipe_mismatch)) if needed]
        return f" and pass {' '.join(flags)} (a schedule other than the run's or the recipe's needs it)" if flags else ""

    @property
    def data_path(self) -> Path | None:
        return None if self.data == HF_DATA else Path(self.data)

    @property
    def seed_values(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    @property
    def weights_source(self) -> str:
        return str(self.init_from) if self.init_from is not None else f"preset:{self.model_config}"

    def complete_results(self) -> FinetuneResults | None:
        """The results.json of a finished run resumed with the same seeds. Asked for another --max-steps, it cannot
        be continued: every seed trains from its start weights to the end of its schedule."""
        folder = self.folder
        if not (self.resume and folder.results.is_file()):
            return None
        results = folder.read_results(FinetuneResults)
        if results.seeds != self.seeds:
            return None
        done, asked = results.steps, self.max_steps
        if asked is not None and asked != done:  # pretraining continues to a new --max-steps; finetuning cannot
            raise ConfigError(
                f"the run in {self.output_dir} is complete: each seed trained {done} steps ({folder.results}); "
                f"--max-steps {asked} cannot be applied to it, as every seed trains from its start weights to the end "
                f"of its schedule. Drop --max-steps to read its results, or train {asked} steps into a new "
                f"--output-dir.")
        return results

    def results_line(self, results: FinetuneResults) -> str:
        return (f"{results.seeds} seed(s) of {results.steps} steps, median {self.scores_line(results.median)} "
                f"(trivial baseline: {self.scores_line(results.baseline)})")

    def scores_line(self, scores: Scores) -> str:
        """Each split's scores as the console shows them, each on its task's scale (`score_scale`)."""
        return "; ".join(f"{split} " + ", ".join(f"{name} {with_scale(value, self.score_scale(name))}"
                                                 for name, value in values.items() if is_number(value))
                         for split, values in scores.items())

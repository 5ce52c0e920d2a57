"""Finetuning on your own labelled texts trains exactly what the GLUE task trains on the same examples: the shared SST-2
files (sentences) rewritten as a user's CSV, JSON lines and Parquet files (the CSV with two seeds), RTE (pairs of
sentences, classes named by words) and STS-B (pairs scored 0-5: regression), train with the same seeds to the same
loss at every step and write the same predictions file, byte for byte, and the same scores and median, as the GLUE
task does on the original TSVs (each run in this process, 1 rank, on this machine: bit-identical). The scores:
accuracy and macro-F1, or Pearson and Spearman."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.labelled_files import glue_rows, typed, write_rows
from tests.support.launching import REPO
from tests.support.pretrain_support import train_in_process
from widenet_ds.cli import main as widenet_ds
from widenet_ds.errors import ConfigError
from widenet_ds.run_folder import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dist")]  # ten short seeds' runs (a few minutes on 2 cores)

# What both tasks share: the model, the data's slice, the schedule (the CPU JSON, not the recipes').
COMMON = ["--model-config", "widenet-tiny-e4", "--deepspeed_config", str(REPO / "ds_configs/finetune_cpu_small.json"),
          "--allow-recipe-mismatch", "--max-train-examples", "1024", "--max-eval-examples", "200", "--max-seq-length",
          "48", "--log-interval", "1", "--no-tensorboard", "--no-progress-bar"]
# GLUE's dataset: its task's options, the own-data task's options, the steps (SST-2's long enough for the model to
# predict both classes, so that equal predictions are no accident) and the seeds
GLUE = {
    "SST-2": (["--glue-task", "sst2"], ["--text-fields", "sentence"], 60, 2),
    # the RTE recipe's dropout, which the own-data task's recipe (SST-2's) sets to 0
    "RTE": (["--glue-task", "rte"], ["--text-fields", "sentence1,sentence2", "--set", "hidden_dropout=0.1", "--set",
                                     "attention_dropout=0.1"], 8, 1),
    "STS-B": (["--glue-task", "stsb"], ["--text-fields", "sentence1,sentence2", "--label-field", "score",
                                        "--regression"], 8, 1),
}
# The user's files of each: (the run, GLUE's dataset, its train and dev files as the user names them, its seeds:
# every seed of GLUE's run once, the first seed for the other formats, whose reading test_data.py holds to GLUE's)
CASES = {
    "SST-2-csv": ("SST-2", "train.csv", "validation.csv", 2),
    "SST-2-jsonl": ("SST-2", "train.jsonl", "dev.jsonl", 1),
    "SST-2-parquet": ("SST-2", "train.parquet", "validation.parquet", 1),
    "RTE": ("RTE", "train.jsonl", "validation.parquet", 1),  # (--save-model: its classes' names go to HF)
    "STS-B": ("STS-B", "train.parquet", "dev.csv", 1),
}
SEEDS = (1234, 1235)


def predictions(path: Path) -> list[str]:
    """Each example's predicted class (its name) or score, in a predictions file's order."""
    return [line.split("\t")[1] for line in path.read_text().splitlines()[1:]]


def losses(seed_dir: Path) -> dict[int, float]:
    return read_metrics(seed_dir / "metrics.jsonl").series("train/loss")


@pytest.fixture(scope="module")
def runs(shared_data, tmp_path_factory) -> dict[str, dict]:
    """Each GLUE dataset trained by the GLUE task on its TSVs, and by the own-data task on each of the user's copies
    of it (in a folder named like it: --data, the files named train.EXT and validation.EXT or dev.EXT)."""
    root = tmp_path_factory.mktemp("own_data")
    tokenizer = ["--tokenizer", str(shared_data / "vocab/bert-base-uncased-vocab.txt")]
    glue = {}
    for name, (glue_options, _, steps, seeds) in GLUE.items():
        glue[name] = train_in_process("glue", [*glue_options, "--data", str(shared_data / "glue" / name), *tokenizer,
                                               *COMMON, "--max-steps", str(steps), "--seeds", str(seeds),
                                               "--output-dir", str(root / f"glue-{name}")])
    out = {}
    for case, (name, *files, seeds) in CASES.items():
        _, own_options, steps, _ = GLUE[name]
        mine = root / case / name  # the user's folder: --data names it
        for file, split in zip(files, ("train", "dev")):
            _, rows = glue_rows(shared_data / "glue" / name / f"{split}.tsv")
            numbers = {"score": float} if name == "STS-B" else {"label": int} if name == "SST-2" else {}
            write_rows(mine / file, typed(rows, **numbers) if not file.endswith(".csv") else rows)
        own_argv = ["--data", str(mine), *own_options, *tokenizer, *COMMON, "--max-steps", str(steps), "--seeds",
                    str(seeds), "--output-dir", str(root / f"own-{case}"), *(["--save-model"] if case == "RTE" else [])]
        out[case] = {"glue": glue[name], "own": train_in_process("text-classification", own_argv), "name": name,
                     "glue_dir": root / f"glue-{name}", "own_dir": root / f"own-{case}", "own_argv": own_argv,
                     "seeds": SEEDS[:seeds]}
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_users_files_train_to_the_glue_tasks_losses_predictions_and_median(runs, case):
    run = runs[case]
    name, steps = run["name"], GLUE[run["name"]][2]
    glue_seeds = [s.seed for s in run["glue"].per_seed]
    assert [s.seed for s in run["own"].per_seed] == glue_seeds[:len(run["seeds"])] == list(run["seeds"])
    predicted = []
    for seed in run["seeds"]:
        glue_dir, own_dir = run["glue_dir"] / f"seed{seed}", run["own_dir"] / f"seed{seed}"
        assert losses(own_dir) == losses(glue_dir) and len(losses(glue_dir)) == steps
        theirs = (glue_dir / f"{name}.dev.tsv").read_text()
        ours = (own_dir / f"{name}.validation.tsv").read_text()  # the predictions file, named after --data's folder
        assert ours == theirs and len(ours.splitlines()) == 1 + 200
        predicted.append(set(predictions(own_dir / f"{name}.validation.tsv")))
    if name != "RTE":  # (RTE's pairs, too hard for a few steps, get one class: its losses carry the comparison)
        assert max(map(len, predicted)) > 1, predicted  # both classes (SST-2), scores of their own (STS-B) in a seed
    for glue_seed, own_seed in zip(run["glue"].per_seed, run["own"].per_seed):
        glue_scores = glue_seed.metrics["dev"]
        assert {metric: own_seed.metrics["validation"][metric] for metric in glue_scores} == glue_scores
    if len(run["seeds"]) == len(glue_seeds):
        glue, own = run["glue"].median["dev"], run["own"].median["validation"]
        assert {metric: own[metric] for metric in glue} == glue  # the GLUE task's metrics and median, exactly
    assert run["own"].task == name and run["own"].primary_metric == ("pearson" if name == "STS-B" else "acc")


def test_classes_are_scored_with_accuracy_and_macro_f1_and_scores_with_pearson_and_spearman(runs, shared_data):
    from sklearn import metrics as skm

    classes = runs["RTE"]["own"]
    predicted = predictions(runs["RTE"]["own_dir"] / "seed1234" / "RTE.validation.tsv")
    truth = [row["label"] for row in glue_rows(shared_data / "glue/RTE/dev.tsv")[1][:200]]
    assert classes.median["validation"] == {"acc": skm.accuracy_score(truth, predicted),
                                            "macro_f1": pytest.approx(skm.f1_score(truth, predicted, average="macro"))}
    assert classes.baseline["validation"]["acc"] == runs["RTE"]["glue"].baseline["dev"]["acc"]  # the majority class
    scores = runs["STS-B"]["own"]
    assert set(scores.median["validation"]) == {"pearson", "spearmanr", "corr"}
    assert scores.baseline == {"validation": {"note": "constant prediction has no correlation"}}


def test_a_run_resumes_and_is_reported_as_every_finetuning_run(runs, tmp_path):
    """--resume with one more seed trains that seed only; a resume with other fields to read is refused, naming the
    setting; `widenet-ds report` shows the run's scores."""
    run = runs["RTE"]
    more = train_in_process("text-classification", [*run["own_argv"], "--resume", "--seeds", "2"])
    assert more.per_seed[0] == run["own"].per_seed[0] and [s.seed for s in more.per_seed] == [1234, 1235]
    with pytest.raises(ConfigError, match=r"text_fields: \['sentence1', 'sentence2'\] \(the run in the folder\) vs "
                                          r"\['sentence2', 'sentence1'\] \(now\)"):
        train_in_process("text-classification", [*run["own_argv"], "--resume", "--text-fields", "sentence2,sentence1"])
    assert widenet_ds(["report", str(run["own_dir"]), "--output", str(tmp_path / "report")]) == 0
    assert "macro_f1" in (tmp_path / "report" / "index.html").read_text()


def test_the_classes_names_go_into_the_hf_export_and_its_pipeline_prints_them(runs, shared_data, tmp_path):
    """RTE's classes, named by words in the user's files: `convert to-hf` writes them as id2label, and transformers'
    pipeline("text-classification") prints them, the class our run predicted for each pair (the same truncation)."""
    import transformers

    run = runs["RTE"]
    assert widenet_ds(["convert", "to-hf", str(run["own_dir"] / "seed1234" / "model"), str(tmp_path / "hf")]) == 0
    pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), trust_remote_code=True)
    assert pipe.model.config.id2label == {0: "entailment", 1: "not_entailment"}
    pairs = glue_rows(shared_data / "glue/RTE/dev.tsv")[1][:16]
    printed = [pipe({"text": row["sentence1"], "text_pair": row["sentence2"]}, truncation=True, max_length=48)["label"]
               for row in pairs]
    assert printed == predictions(run["own_dir"] / "seed1234" / "RTE.validation.tsv")[:16]

"""A GLUE task with two evaluation splits (MNLI matched / mismatched) through the real entrypoint on 2 CPU
ranks, initialised from an exported folder with expert parallelism 2: evaluation files, test-set submission
files, the load report, the tokenizer saved with the folder, and the finetuned model saved and scored again
with --eval-only."""

import json
import random
from pathlib import Path

import pytest

from tests.support.launching import REPO, run_train

CPU_CONFIG = str(REPO / "ds_configs/finetune_cpu_small.json")
HEADER = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t" \
         "sentence2_parse\tsentence1\tsentence2"
LABELS = ("contradiction", "entailment", "neutral")
WORDS = "the a cat dog man woman park house runs sleeps eats walks red big small old".split()


def _write_mnli(folder: Path, rows: dict[str, int]) -> None:
    """MNLI-layout TSVs (the GLUE download's columns; labelled files end with gold_label)."""
    rng = random.Random(0)
    folder.mkdir()
    for name, count in rows.items():
        labelled = not name.startswith("test")
        lines = [HEADER + ("\tlabel1\tgold_label" if labelled else "")]
        for i in range(count):
            a, b = " ".join(rng.choices(WORDS, k=6)), " ".join(rng.choices(WORDS, k=4))
            fields = [str(i), "0", f"{i}e", "fiction", "-", "-", "-", "-", a, b]
            if labelled:
                label = LABELS[i % 3]
                fields += [label, label]
            lines.append("\t".join(fields))
        (folder / name).write_text("\n".join(lines) + "\n")


@pytest.fixture
def exported_folder(shared_data, tmp_path):
    """A tiny pretraining model (the BERT vocabulary) exported as a checkpoint folder with its vocab.txt."""
    import torch

    from widenet_ds.data.tokenizer import TokenizerFiles
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    from widenet_ds.portable.format import PortableCheckpoint, save_folder

    vocab = tmp_path / "vocab.txt"  # the name the folder keeps it under
    vocab.write_bytes((shared_data / "vocab/bert-base-uncased-vocab.txt").read_bytes())
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=30522, max_position_embeddings=128)
    torch.manual_seed(0)
    state = WideNetForPreTraining(cfg).state_dict()
    # as `convert to-folder` writes it: the expert-parallel size it was trained with is recorded
    provenance = {"step": 7, "trained_with_ep_size": 1}
    return save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", state, provenance=provenance),
                       tmp_path / "exported", tokenizer=TokenizerFiles((vocab,)))


@pytest.mark.multirank
def test_mnli_two_eval_splits_test_files_and_load_report(exported_folder, tmp_path):
    data = tmp_path / "MNLI"
    _write_mnli(data, {"train.tsv": 96, "dev_matched.tsv": 45, "dev_mismatched.tsv": 37,
                       "test_matched.tsv": 21, "test_mismatched.tsv": 19})
    out = tmp_path / "out"
    proc = run_train("glue", [
        "--task", "MNLI", "--data", str(data), "--init-from", str(exported_folder), "--ep-size", "2",
        "--deepspeed_config", CPU_CONFIG, "--output-dir", str(out), "--max-steps", "3", "--max-seq-length", "32",
        "--predict-test", "--log-interval", "1", "--save-model", "--allow-recipe-mismatch"], timeout=600)

    # the load report: what came from the folder, what is new, which pretraining heads went unused
    log = proc.stdout
    assert f"from {exported_folder} (WideNetForPreTraining, step 7)" in log
    assert "newly initialised: classifier.bias, classifier.weight" in log
    assert "unused from the checkpoint: mlm_head.bias" in log and "sop_head.weight" in log
    assert "saved with ep_size 1, loaded with ep_size 2" in log

    results = json.loads((out / "results.json").read_text())
    assert set(results["median"]) == {"dev_matched", "dev_mismatched"}
    assert results["steps"] == 3 and results["primary_metric"] == "acc"
    # routing settings of the MNLI recipe (Table 7: C 1.2, lambda 0.01, dropout 0) reached the model config
    assert results["recipe"]["model_overrides"]["moe"] == {"capacity_factor": 1.2, "balance_loss_weight": 0.01}
    assert results["ep_size"] == 2 and len(results["recipe_mismatch"]) == 4
    seed = out / "seed1234"
    for name, count in (("MNLI.dev_matched.tsv", 45), ("MNLI.dev_mismatched.tsv", 37), ("MNLI-m.tsv", 21),
                        ("MNLI-mm.tsv", 19)):
        rows = (seed / name).read_text().splitlines()
        assert rows[0] == "index\tprediction" and len(rows) == count + 1, name
        assert [row.split("\t")[0] for row in rows[1:]] == [str(i) for i in range(count)], name
        assert {row.split("\t")[1] for row in rows[1:]} <= set(LABELS), name
    # accuracy in results.json is what the written dev predictions score
    dev = (seed / "MNLI.dev_matched.tsv").read_text().splitlines()[1:]
    correct = sum(row.split("\t")[1] == LABELS[i % 3] for i, row in enumerate(dev))
    assert results["per_seed"][0]["metrics"]["dev_matched"]["acc"] == pytest.approx(correct / 45)
    # one loss record per step and the final evaluation, in metrics.jsonl
    records = [json.loads(line) for line in (seed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
    assert any("eval/dev_mismatched/acc" in r for r in records)

    # the saved model (experts gathered from both expert-parallel ranks) scores the same with --eval-only
    rescored = tmp_path / "rescored"
    proc = run_train("glue", [
        "--task", "MNLI", "--data", str(data), "--init-from", str(seed / "model"), "--eval-only",
        "--deepspeed_config", CPU_CONFIG, "--output-dir", str(rescored), "--max-seq-length", "32"], timeout=600)
    assert f"from {seed / 'model'} (WideNetForSequenceClassification)" in proc.stdout
    assert "saved with ep_size 2, loaded with ep_size 1" in proc.stdout and "newly initialised" not in proc.stdout
    again = json.loads((rescored / "results.json").read_text())
    assert again["steps"] == 0 and again["median"] == results["median"]
    for name in ("MNLI.dev_matched.tsv", "MNLI.dev_mismatched.tsv"):
        assert (rescored / "seed1234" / name).read_text() == (seed / name).read_text(), name

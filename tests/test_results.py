"""The typed results.json of each task: written (with its format version) and read back unchanged, results.json
files written before the types (tests/assets/results_before/, version 1 without a version entry) read into them
and back to the same JSON, older layouts with fewer keys upgraded with what their readers assumed
(widenet_ds/formats.py), and a file of another shape is one RunFolderError naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from widenet_ds.errors import RunFolderError
from widenet_ds.formats import current
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import DeepSpeedUsed, FinetuneResults, SeedResults
from widenet_ds.tasks.pretrain.results import PretrainResults

BEFORE = Path(__file__).resolve().parent / "assets" / "results_before"
# each results class and the file of its shape written by the writers before the types
ASSETS = {PretrainResults: "pretrain.json", ClassifyResults: "classify.json", SeedResults: "seed.json",
          FinetuneResults: "finetune.json"}

SEED = SeedResults(7, {"dev": {"acc": 0.75, "f1": 0.5}}, 0.61)
EXAMPLES = [
    PretrainResults(12, {"valid/loss": 3.5, "valid/mlm_loss": 3.0, "valid_branches_1/mlm_loss": 3.25}),
    PretrainResults(4),  # no held-out data: the step alone
    ClassifyResults(20, "digits", "widenet-vit-digits", 2, 2, 123_456, {"test/accuracy": 0.5, "test/task_loss": 1.5}),
    ClassifyResults(20, "digits", "paraformer-tiny-3x4", 1, 1, 9, {"test/accuracy": 0.5}, "prefix", {1: 0.25, 2: 0.5}),
    SEED,
    SeedResults(8, {"dev": {"acc": 0.5}}),  # no train/loss logged
    FinetuneResults("SST-2", "preset:widenet-tiny-e4", 4, 2, {"dev": {"acc": 0.625}}, [SEED, SEED], seed=7,
                    primary_metric="acc", baseline={"dev": {"note": "constant prediction has no correlation"}},
                    load_report="random init", recipe={"source": "widenet-table7"}, recipe_mismatch=["batch"],
                    ep_size=2, deepspeed=DeepSpeedUsed("ds.json", 32, 1e-3), max_seq_length=64),
]


@pytest.mark.parametrize("results", EXAMPLES, ids=lambda r: type(r).__name__)
def test_each_results_type_is_written_and_read_back_unchanged(tmp_path, results):
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    folder.write_results(results)
    assert folder.read_results(type(results)) == results
    # JSON through and through: what the file holds is its format version, then what to_json gives
    assert json.loads(folder.results.read_text()) == {"format_version": current(results.FORMAT), **results.to_json()}
    assert next(iter(json.loads(folder.results.read_text()))) == "format_version"


@pytest.mark.parametrize("kind", ASSETS, ids=lambda k: k.__name__)
def test_a_results_json_from_before_the_types_reads_and_writes_back_the_same(tmp_path, kind):
    written = (BEFORE / ASSETS[kind]).read_text()
    results = kind.from_json(json.loads(written), ASSETS[kind])
    # key for key and in the same order: the file a writer of this version writes is the file it wrote before
    assert json.dumps(results.to_json(), indent=2) == json.dumps(json.loads(written), indent=2)


def test_the_old_files_fields_as_the_readers_see_them():
    pretrain = PretrainResults.from_json(json.loads((BEFORE / "pretrain.json").read_text()), "pretrain.json")
    assert pretrain.step == 4 and set(pretrain.held_out) >= {"valid/mlm_loss", "valid_branches_2/mlm_loss"}
    images = ClassifyResults.from_json(json.loads((BEFORE / "classify.json").read_text()), "classify.json")
    assert (images.dataset, images.parameters, images.branch_schedule) == ("digits", 135370, "prefix")
    assert sorted(images.accuracy_by_branches) == [1, 2] and images.accuracy_by_branches[2] == images.accuracy
    run = FinetuneResults.from_json(json.loads((BEFORE / "finetune.json").read_text()), "finetune.json")
    assert [s.seed for s in run.per_seed] == [1234, 1235] and run.primary_median() == ("dev/acc", 0.5)
    assert run.deepspeed.train_batch_size == 32 and run.baseline["dev"]["acc"] == 0.5625


@pytest.mark.parametrize("kind", ASSETS, ids=lambda k: k.__name__)
def test_a_results_json_from_before_the_types_reads_in_a_run_folder_as_before(tmp_path, kind):
    # the same file in a run folder (no format version: version 1), through RunFolder.read_results
    folder = RunFolder(tmp_path)
    folder.results.write_text((BEFORE / ASSETS[kind]).read_text())
    written = json.loads((BEFORE / ASSETS[kind]).read_text())
    assert folder.read_results(kind) == kind.from_json(written, "before") and "format_version" not in written
    assert folder.read_results(kind).to_json() == written


def test_older_layouts_read_with_defaults_for_the_fields_added_since():
    # image results before ParaFormer, of an ep-2 run of the first version (its parameters were not counted)
    images = ClassifyResults.from_json({"step": 5, "dataset": "digits", "model_config": None, "ep_size": 2,
                                        "world_size": 2, "parameters": None, "test/accuracy": 0.5}, "old.json")
    assert images.parameters is None and images.accuracy_by_branches == {} and images.branch_schedule is None
    # the first finetuning summary: no seed, primary_metric, recipe_mismatch, ep_size; the recipe by name
    run = FinetuneResults.from_json({"task": "SST-2", "init": "preset:widenet-tiny-e4", "steps": 3, "seeds": 1,
                                     "per_seed": [{"seed": 1, "metrics": {"dev": {"acc": 0.5}}}],
                                     "median": {"dev": {"acc": 0.5}}, "baseline": {"dev": {"acc": 0.5}},
                                     "load_report": "", "recipe": "widenet-table7"}, "old.json")
    assert (run.primary_metric, run.ep_size, run.deepspeed, run.recipe) == (None, None, None, "widenet-table7")
    assert run.per_seed == [SeedResults(1, {"dev": {"acc": 0.5}}, None)]


@pytest.mark.parametrize("kind, change, message", [
    (PretrainResults, lambda r: r.pop("step"), r"pretraining results: 'step' is missing"),
    (PretrainResults, lambda r: r.update({"valid/loss": "low"}), r"'valid/loss' is 'low', not a number"),
    (ClassifyResults, lambda r: r.pop("dataset"), r"image-classification results: 'dataset' is missing"),
    (ClassifyResults, lambda r: r.update({"parameters": True}), r"'parameters' is True, not an integer"),
    (ClassifyResults, lambda r: r.update({"accuracy_by_branches": {"all": 0.9}}), r"'accuracy_by_branches' is"),
    (SeedResults, lambda r: r.update({"metrics": [0.5]}), r"'metrics' is \[0.5\], not an object of splits"),
    (FinetuneResults, lambda r: r.pop("median"), r"finetuning results: 'median' is missing"),
    (FinetuneResults, lambda r: r["per_seed"][1].pop("seed"),
     r"results.json, per_seed\[1\]: a finetuning seed's results: 'seed' is missing"),
    (FinetuneResults, lambda r: r["deepspeed"].update({"train_batch_size": "32"}),
     r"results.json, deepspeed: .*'train_batch_size' is '32', not an integer"),
])
def test_a_file_of_another_shape_is_one_error_naming_the_file_and_the_key(tmp_path, kind, change, message):
    folder = RunFolder(tmp_path)
    data = json.loads((BEFORE / ASSETS[kind]).read_text())
    change(data)
    folder.results.write_text(json.dumps(data))
    with pytest.raises(RunFolderError, match=message) as raised:
        folder.read_results(kind)
    assert str(raised.value).startswith(str(folder.results)) and "restore it" in str(raised.value)


def test_a_results_json_that_is_no_object_or_no_json_names_the_file(tmp_path):
    folder = RunFolder(tmp_path)
    folder.results.write_text("[1, 2]")
    with pytest.raises(RunFolderError, match=rf"{folder.results}: finetuning results must be a JSON object, not list"):
        folder.read_results(FinetuneResults)
    folder.results.write_text('{"step": ')
    with pytest.raises(RunFolderError, match=r"results.json \(the run's results\) is not valid JSON"):
        folder.read_results(PretrainResults)

"""The finetuning settings in one process: flag validation (every problem reported at once), a used output
folder refused, task options checked up front, recipe vs DeepSpeed JSON, recipe overrides reaching the model
config, step count against the schedule, tokenizer resolution, batch shapes for expert parallelism, the
median, the resumable data order."""

import hashlib
import json

import pytest
import torch

from tests.support.launching import REPO
from tests.support.open_counts import counted_opens
from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.data.tokenizer import TokenizerFiles, load_tokenizer
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.errors import ConfigError
from widenet_ds.run.run_task import run_task
from widenet_ds.run.sweep import median_over_seeds
from widenet_ds.tasks.finetune.predict import Batching
from widenet_ds.tasks.finetune.results import SeedResults
from widenet_ds.tasks.finetune.task import (
    FinetuneInputs,
    recipe_mismatch,
    requested_steps,
)
from widenet_ds.tasks.finetune.weights import finetune_model_config, model_overrides
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.glue.finetuning import GlueFinetuning
from widenet_ds.tasks.glue.recipes import GLUE_RECIPES
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.tasks.squad.finetuning import SquadFinetuning
from widenet_ds.tasks.squad.recipes import SQUAD_RECIPES
from widenet_ds.training import plan as plan_module
from widenet_ds.training.environment import check_run
from widenet_ds.training.plan import (
    check_resume_changes,
    plan_layout,
    resolve_max_steps,
    resume_changes,
)
from widenet_ds.training.run_config import InvalidConfig

CPU_CONFIG = REPO / "ds_configs/finetune_cpu_small.json"
SST2_CONFIG = REPO / "ds_configs/finetune_sst2.json"


def checked(cls, **fields):
    """The configuration as a run starts it: its values and what it names on this machine, every problem at once."""
    try:
        cfg = cls(**fields)
    except InvalidConfig as err:
        cfg = err.config
    check_run(cfg)
    return cfg


def _cfg(tmp_path, cls=GlueConfig, **fields):
    task = {"glue_task": "sst2"} if cls is GlueConfig else {}
    return checked(cls, **{**task, "data": "hf", "deepspeed_config": CPU_CONFIG, "output_dir": tmp_path / "out",
                           "model_config": "widenet-tiny-e4", **fields})


@pytest.mark.parametrize("fields, message", [
    ({"init_from": "x"}, "--init-from x does not exist"),
    ({"model_config": None}, "no model: pass --model-config"),
    ({"seeds": 0}, "--seeds must be positive"),
    ({"max_steps": -3}, "--max-steps must be positive"),
    ({"save_interval": 0}, "--save-interval must be positive"),
    ({"ep_size": 0}, "--ep-size must be positive"),
    ({"eval_interval": -1}, "--eval-interval must be >= 0"),
    ({"eval_only": True}, "--eval-only scores trained weights"),
    ({"resume": "somewhere"}, "a finetuning run continues from its own output folder"),
    ({"deepspeed_config": "nowhere.json"}, "DeepSpeed config nowhere.json does not exist"),
])
def test_bad_flags_are_refused_with_the_fix(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, **fields)


def test_every_problem_is_reported_in_one_error(tmp_path):
    with pytest.raises(ConfigError) as caught:
        _cfg(tmp_path, glue_task="sst5", seeds=0, log_interval=0, eval_interval=-2, data=str(tmp_path / "nowhere"))
    text = str(caught.value)
    assert text.startswith("5 problems with the glue settings:")
    for part in ("--seeds must be positive", "--log-interval must be positive", "--eval-interval must be >= 0",
                 "--data", "nowhere does not exist", "--glue-task: unknown GLUE task 'sst5'"):
        assert part in text, part
    # the pretraining settings are collected the same way
    with pytest.raises(ConfigError) as caught:
        checked(PretrainConfig, model_config="widenet-tiny-e4", deepspeed_config=tmp_path / "none.json", data=tmp_path,
                output_dir=tmp_path / "o", log_interval=0, keep_last=0, resume=str(tmp_path), init_from=tmp_path)
    text = str(caught.value)
    assert text.startswith("4 problems with the pretrain settings:")
    assert "--log-interval must be positive" in text and "--keep-last must be positive" in text
    assert "pass only one of them" in text and "none.json does not exist" in text
    # a bare --resume with --init-from: continue the run in --output-dir, or start it from the weights
    assert _cfg(tmp_path, model_config=None, init_from=str(tmp_path), resume="latest").init_from == tmp_path


def test_missing_data_and_init_paths_are_named(tmp_path):
    with pytest.raises(ConfigError, match="--data .*nowhere does not exist"):
        _cfg(tmp_path, data=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="--init-from .*gone does not exist"):
        _cfg(tmp_path, model_config=None, init_from=str(tmp_path / "gone"))
    assert _cfg(tmp_path).data_path is None


def _checksums(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_used_output_dir_is_refused_unless_resumed(tmp_path):
    out = tmp_path / "out"
    (out / "seed1").mkdir(parents=True)
    (out / "results.json").write_text('{"median": {}}')
    (out / "seed1" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    before = _checksums(out)
    with pytest.raises(ConfigError, match=r"already holds a run \(results.json, seed1/\); pass --resume "
                                          r"to continue it, or choose another --output-dir"):
        _cfg(tmp_path)
    assert _checksums(out) == before
    assert _cfg(tmp_path, resume="latest").resume
    # a folder with other files, or an empty one, takes a new run
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    _cfg(tmp_path, output_dir=tmp_path / "other")
    with pytest.raises(ConfigError, match="notes.txt is a file; choose a folder path"):
        _cfg(tmp_path, output_dir=tmp_path / "other" / "notes.txt")


def test_task_options_are_checked_before_anything_is_loaded(shared_data, tmp_path):
    sst2 = str(shared_data / "glue/SST-2")  # train.tsv and dev.tsv, no test.tsv
    _cfg(tmp_path, data=sst2)
    with pytest.raises(ConfigError, match=r"--predict-test: no test.tsv in .*SST-2.*drop --predict-test"):
        _cfg(tmp_path, predict_test=True, data=sst2)
    with pytest.raises(ConfigError, match=r"--data: no dev.tsv in"):
        (tmp_path / "half").mkdir()
        (tmp_path / "half" / "train.tsv").write_text("sentence\tlabel\n")
        _cfg(tmp_path, data=str(tmp_path / "half"))
    with pytest.raises(ConfigError, match="AX has no labelled split"):
        _cfg(tmp_path, glue_task="ax")
    squad = shared_data / "squad"
    _cfg(tmp_path, SquadConfig, version="1.1", train_file=str(squad / "dev-v1.1.json"), data=str(squad))
    with pytest.raises(ConfigError) as caught:
        _cfg(tmp_path, SquadConfig, version="1.1", doc_stride=-1, data=str(squad))
    assert "--doc-stride must be >= 0" in str(caught.value)
    assert "--train-file: " in str(caught.value) and "train-v1.1.json does not exist" in str(caught.value)


def _run(cfg, world: int = 2) -> FinetuneInputs:
    """The run's shared inputs, its DeepSpeed settings checked as the planner checks them (training/plan.py)."""
    inputs = FinetuneInputs(cfg, GlueFinetuning(cfg), None)
    inputs.check_settings(plan_layout(cfg, inputs.model_config, world, 0)[1])
    return inputs


def _steps(cfg, inputs: FinetuneInputs, world: int = 2) -> int:
    ds = plan_layout(cfg, inputs.model_config, world, 0)[1]
    return resolve_max_steps(requested_steps(cfg, ds, inputs.recipe), ds)


def test_recipe_and_deepspeed_json_may_not_silently_disagree(shared_data, tmp_path):
    vocab = str(shared_data / "vocab/bert-base-uncased-vocab.txt")
    with pytest.raises(ConfigError) as caught:
        _run(_cfg(tmp_path, tokenizer=vocab))
    text = str(caught.value)
    assert "disagrees with the SST-2 recipe (widenet-table7)" in text and "--allow-recipe-mismatch" in text
    assert "batch size 128 in the recipe, 32 in the DeepSpeed JSON" in text
    assert "learning rate 4e-05 in the recipe, 0.001 in the DeepSpeed JSON" in text
    assert "schedule steps 5234 in the recipe, 200" in text
    cfg = _cfg(tmp_path, tokenizer=vocab, allow_recipe_mismatch=True)
    run = _run(cfg)
    assert len(run.mismatch) == 4 and _steps(cfg, run) == 200
    # the shipped Table-7 JSONs are the recipes
    assert _run(_cfg(tmp_path, tokenizer=vocab, deepspeed_config=SST2_CONFIG), world=8).mismatch == []
    for recipe, name in ((GLUE_RECIPES["MNLI"], "mnli"), (SQUAD_RECIPES["1.1"], "squad11"),
                         (SQUAD_RECIPES["2.0"], "squad20")):
        settings = validate_ds_config(load_ds_config(REPO / f"ds_configs/finetune_{name}.json"), world_size=1,
                                      has_moe=True, cuda_available=True)
        assert recipe_mismatch(recipe, settings) == [], name
    # another task's JSON is caught (RTE is batch 32, lr 3e-5, 800 steps)
    with pytest.raises(ConfigError, match="disagrees with the RTE recipe"):
        _run(_cfg(tmp_path, glue_task="rte", tokenizer=vocab, deepspeed_config=SST2_CONFIG), world=8)


def test_resume_refuses_changed_settings(tmp_path):
    cfg = _cfg(tmp_path, allow_recipe_mismatch=True, max_steps=50)
    settings = validate_ds_config(load_ds_config(CPU_CONFIG), world_size=2, has_moe=True, cuda_available=False)
    cfg.folder.write_run_config({**cfg.record(), "deepspeed_settings": settings.config})
    same = _cfg(tmp_path, allow_recipe_mismatch=True, max_steps=60, resume="latest", seeds=3, log_interval=1)
    assert resume_changes(same, same.folder, settings, None) == []
    ds = json.loads(CPU_CONFIG.read_text())
    ds["optimizer"]["params"]["lr"] = ds["scheduler"]["params"]["warmup_max_lr"] = 0.002
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    changed = _cfg(tmp_path, allow_recipe_mismatch=True, resume="latest", deepspeed_config=tmp_path / "ds.json",
                   seed=7)
    changed_settings = validate_ds_config(ds, world_size=2, has_moe=True, cuda_available=False)
    changes = resume_changes(changed, changed.folder, changed_settings, None)
    with pytest.raises(ConfigError) as caught:
        check_resume_changes(changed, changed.output_dir, changes)
    text = str(caught.value)
    assert "--resume of the run in" in text and "seed: 1234 (the run in the folder) vs 7 (now)" in text
    assert "optimizer.params.lr: 0.001 -> 0.002" in text and "--accept-changed-settings" in text
    accepted = _cfg(tmp_path, allow_recipe_mismatch=True, resume="latest", deepspeed_config=tmp_path / "ds.json",
                    seed=7, accept_changed_settings=True)
    check_resume_changes(accepted, accepted.output_dir, changes)


def test_recipe_settings_reach_the_model_config_and_set_wins(tmp_path):
    squad = SQUAD_RECIPES["1.1"]  # Table 7: C 2.0, lambda 0, dropout 0.1
    model = finetune_model_config(_cfg(tmp_path), squad, 30522, None)
    assert (model.moe.capacity_factor, model.moe.balance_loss_weight, model.hidden_dropout,
            model.attention_dropout, model.vocab_size) == (2.0, 0.0, 0.1, 0.1, 30522)
    changed = _cfg(tmp_path, overrides=["moe.capacity_factor=1.5", "moe.balance_loss_weight=0.02",
                                        "hidden_dropout=0.0", "attention_dropout=0.0"])
    assert model_overrides(changed, squad) == {
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "classifier_dropout": 0.1,
        "moe": {"capacity_factor": 1.5, "balance_loss_weight": 0.02}}


def test_steps_default_to_the_schedule_and_never_run_past_it(tmp_path):
    recipe = GLUE_RECIPES["SST-2"]
    with_schedule = validate_ds_config(load_ds_config(CPU_CONFIG), world_size=2, has_moe=True, cuda_available=False)
    without = validate_ds_config({**load_ds_config(CPU_CONFIG), "scheduler": None}, world_size=2, has_moe=True,
                                 cuda_available=False)

    def steps(settings, **fields):
        return resolve_max_steps(requested_steps(_cfg(tmp_path, **fields), settings, recipe), settings)

    assert steps(with_schedule) == 200
    assert steps(without) == recipe.steps == 5234
    assert steps(with_schedule, max_steps=150) == 150
    assert steps(with_schedule, eval_only=True, init_from=str(tmp_path), model_config=None) == 0
    with pytest.raises(ConfigError, match="runs past the schedule's total_num_steps 200"):
        steps(with_schedule, max_steps=250)


def test_tokenizer_comes_from_the_init_folder_or_must_be_given(shared_data, tmp_path, dist):
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    from widenet_ds.portable.format import PortableCheckpoint, save_folder

    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes((shared_data / "vocab/bert-base-uncased-vocab.txt").read_bytes())
    cfg = ModelConfig.from_preset("albert-tiny", vocab_size=30522)
    state = WideNetForPreTraining(cfg).state_dict()
    with_vocab = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", state), tmp_path / "a",
                             tokenizer=TokenizerFiles((vocab,)))
    without = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", state), tmp_path / "b")
    with_cfg = _cfg(tmp_path, model_config=None, init_from=str(with_vocab))
    tokenizer = FinetuneInputs(with_cfg, GlueFinetuning(with_cfg), CheckpointSource.open(with_vocab, "--init-from")).tokenizer
    assert tokenizer.get_vocab_size() == 30522 and tokenizer.token_to_id("[CLS]") == 101
    without_cfg = _cfg(tmp_path, model_config=None, init_from=str(without))
    with pytest.raises(ConfigError, match="pass --tokenizer"):
        FinetuneInputs(without_cfg, GlueFinetuning(without_cfg), CheckpointSource.open(without, "--init-from"))


def test_expert_parallel_batches_have_one_shape_on_every_rank():
    batch = {"input_ids": torch.tensor([[101, 7, 102]]), "token_type_ids": torch.zeros(1, 3, dtype=torch.long),
             "attention_mask": torch.ones(1, 3, dtype=torch.long), "labels": torch.tensor([1])}
    assert Batching(4).shape(batch, pad_id=0) is batch  # ep 1: padded to the longest member only
    fixed = Batching(4, pad_to=6).shape(batch, pad_id=0)
    assert fixed["input_ids"].tolist() == [[101, 7, 102, 0, 0, 0]]
    assert fixed["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0]] and fixed["labels"].tolist() == [1]


def test_the_median_is_taken_per_metric_over_seeds():
    runs = [SeedResults(seed, {"dev": {"acc": a, "f1": f}})
            for seed, (a, f) in enumerate(((0.7, 0.1), (0.9, 0.3), (0.8, 0.2)))]
    assert median_over_seeds(runs) == {"dev": {"acc": 0.8, "f1": 0.2}}


def test_resume_keeps_finished_seeds_and_leaves_a_complete_run_alone(shared_data, tmp_path, dist, capsys):
    """In this process (1 rank): a finished run resumed is reported complete and left as it is; resumed with
    one more seed, only that seed is trained and the first one's result is kept."""
    def cfg(**fields) -> GlueConfig:
        return _cfg(tmp_path, data=str(shared_data / "glue/SST-2"),
                    tokenizer=str(shared_data / "vocab/bert-base-uncased-vocab.txt"), max_steps=2,
                    max_train_examples=64, max_eval_examples=32, max_seq_length=32, allow_recipe_mismatch=True,
                    tensorboard=False, progress_bar=False, **fields)

    first = run_task(cfg())
    out = tmp_path / "out"
    seed1 = (out / "seed1234" / "metrics.jsonl").read_bytes()
    assert json.loads((out / "results.json").read_text()) == {"format_version": 2, **first.to_json()}
    assert not (out / "seed1234" / "checkpoints").exists()
    capsys.readouterr()
    assert run_task(cfg(resume="latest")) == first
    assert "is complete; results in" in capsys.readouterr().out
    more = run_task(cfg(resume="latest", seeds=2))
    assert more.per_seed[0] == first.per_seed[0] and more.per_seed[1].seed == 1235
    assert (out / "seed1234" / "metrics.jsonl").read_bytes() == seed1
    assert json.loads((out / "results.json").read_text())["seeds"] == 2


def test_squad_dev_scores_on_the_training_file_come_with_a_note(shared_data, tmp_path):

    one = tmp_path / "squad.json"
    one.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{
        "context": "The cat sat on the mat.", "qas": [{"id": "q1", "question": "Where did the cat sit?",
                                                      "answers": [{"text": "on the mat", "answer_start": 12}]}]}]}]}))
    tokenizer = load_tokenizer(shared_data / "vocab/bert-base-uncased-vocab.txt")
    same = SquadFinetuning(_cfg(tmp_path, SquadConfig, version="1.1", data=str(tmp_path), train_file=str(one),
                               dev_file=str(one))).prepare(tokenizer, 64)
    assert any("the file the model trains on" in note for note in same.notes), same.notes
    other = tmp_path / "dev.json"
    other.write_text(one.read_text())
    held_out = SquadFinetuning(_cfg(tmp_path, SquadConfig, version="1.1", data=str(tmp_path), train_file=str(one),
                                   dev_file=str(other))).prepare(tokenizer, 64)
    assert not any("the file the model trains on" in note for note in held_out.notes), held_out.notes


def test_a_finetuning_run_opens_its_init_from_checkpoint_once_and_plans_once(shared_data, tmp_path, dist, monkeypatch):
    """--init-from is resolved once (issue 40): the tokenizer, the model config, the tokenizer check and every
    seed's weights come from one CheckpointSource (before: config.json and the tokenizer opened 3 times each); and
    the seeds share one plan and one read of the data (issue 47)."""
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    from widenet_ds.portable.format import PortableCheckpoint, save_folder

    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes((shared_data / "vocab/bert-base-uncased-vocab.txt").read_bytes())
    model = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=30522)
    folder = save_folder(PortableCheckpoint(model, "WideNetForPreTraining", WideNetForPreTraining(model).state_dict()),
                         tmp_path / "pretrained", tokenizer=TokenizerFiles((vocab,)))
    cfg = _cfg(tmp_path, model_config=None, init_from=str(folder), data=str(shared_data / "glue/SST-2"), seeds=2,
               max_steps=1, max_train_examples=32, max_eval_examples=16, max_seq_length=32,
               allow_recipe_mismatch=True, tensorboard=False, progress_bar=False)
    calls = {"plan_layout": 0, "prepare": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(plan_module, "plan_layout", counted("plan_layout", plan_module.plan_layout))
    monkeypatch.setattr(GlueFinetuning, "prepare", counted("prepare", GlueFinetuning.prepare))
    with counted_opens(*sorted(folder.iterdir())) as opens:
        assert run_task(cfg).seeds == 2
    counts = {path.name: opens[str(path)] for path in folder.iterdir()}
    # each file: hashed against its record, then read once (the tokenizer: its hash is compared, then it is loaded)
    assert counts["config.json"] == 1 and all(n <= 2 for n in counts.values()), counts
    # the run is planned once and its data read once for both seeds (before: planned once, then again per seed)
    assert calls == {"plan_layout": 1, "prepare": 1}, calls


def test_the_console_shows_squad_scores_as_percentages_and_accuracies_as_fractions(tmp_path):
    """Item 6: `exact_match 0.3333` read as 33 %; it is 0.33 % on SQuAD's official 0-100 scale (each task says the
    scale of its scores: `score_scale`)."""
    squad = _cfg(tmp_path, SquadConfig, version="1.1")
    assert squad.scores_line({"dev": {"exact_match": 0.3333, "f1": 4.2706, "total": 10}}) == \
        "dev exact_match 0.3333%, f1 4.2706%, total 10.0000"
    assert _cfg(tmp_path).scores_line({"dev": {"acc": 0.5092, "f1": 0.6}}) == "dev acc 0.5092, f1 0.6000"


def test_a_long_evaluation_says_how_far_it_is_and_a_short_one_says_nothing():
    """Item 2: SQuAD's dev set took ~11 min on 2 cores with nothing on the console; a prediction estimated past
    `long_s` says its size and time, then how far every `every` seconds, then its end."""
    import time

    from widenet_ds.tasks.finetune.predict import Progress

    lines: list[str] = []
    progress = Progress(1000, 10, 2, long_s=0.2, every=0.1, say=lines.append)
    for done in range(1, 10):
        time.sleep(0.05)
        progress.step(done)
    progress.end()
    assert lines[0].startswith("evaluating 1,000 examples on 2 rank(s): about "), lines
    assert any(line.startswith("evaluating: ") and " of 1,000 examples (" in line and "left" in line
               for line in lines[1:-1]), lines
    assert lines[-1].startswith("evaluated 1,000 examples in "), lines
    quiet: list[str] = []
    short = Progress(100, 10, 2, long_s=60.0, say=quiet.append)
    for done in range(1, 10):
        short.step(done)
    short.end()
    assert quiet == []

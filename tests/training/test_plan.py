"""The planner (training/plan.py) with a fake task, in this process, without building anything: the hooks it calls
and in which order, the refusals (a length past the schedule, checkpoints without --resume, another model, changed
settings, another task's checkpoint), the resume points (nothing saved yet, the latest tag, a named tag) and a
resume on another shape. Checkpoints are tag folders with a real marker and no tensors: planning reads the
marker and checks the recorded files, it never loads a weight."""

from __future__ import annotations

import inspect
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.support.pretrain_support import CPU_CONFIG
from widenet_ds.checkpoint.marker import LATEST_FILE, CheckpointMeta
from widenet_ds.checkpoint.tags import MODEL_STATES
from widenet_ds.data.batch_order import GLOBAL_CHUNKS, RANK_STRIDED
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.errors import CheckpointError, ConfigError, DataError
from widenet_ds.model.config import ModelConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.training.command_line import parse
from widenet_ds.training.metrics import PretrainMetrics
from widenet_ds.training import task as task_module
from widenet_ds.training.plan import find_resume, plan_resume, plan_run, plan_task
from widenet_ds.training.task import Task


class PlanTask(Task):
    """Records the hooks the planner calls; builds nothing."""

    METRICS = PretrainMetrics
    RESULTS = PretrainResults

    def __init__(self, cfg, refuse_resume: str | None = None, model: ModelConfig | None = None,
                 refuse_settings: str | None = None) -> None:
        super().__init__(cfg, cfg.folder)
        self.calls: list[str] = []
        self.refuse_resume, self.refuse_settings = refuse_resume, refuse_settings
        self.model = model or ModelConfig.from_preset("widenet-tiny-e4", vocab_size=64, max_position_embeddings=16)

    def model_config(self) -> ModelConfig:
        self.calls.append("model_config")
        return self.model

    def check_settings(self, ds) -> None:
        self.calls.append("check_settings")
        if self.refuse_settings:
            raise ConfigError(self.refuse_settings)

    def load_data(self) -> None:
        self.calls.append("load_data")

    def batches_per_epoch(self, train_batch_size: int) -> int:
        self.calls.append("batches_per_epoch")
        return 100

    def requested_steps(self, ds) -> int | None:
        self.calls.append("requested_steps")
        return self.cfg.max_steps

    def check_resume(self, meta, source) -> None:
        self.calls.append("check_resume")
        if self.refuse_resume:
            raise DataError(self.refuse_resume)

    def prepare(self, plan) -> None:
        super().prepare(plan)
        self.calls.append("prepare")

    def train_loader(self):
        raise AssertionError("the planner builds no loader")

    build_model = micro_batch = train_line = finish = train_loader


def config(out: Path, *flags: str):
    return parse(PretrainConfig, ["--model-config", "widenet-tiny-e4", "--deepspeed_config", str(CPU_CONFIG), "--data",
                              str(out.parent / "no-data"), "--output-dir", str(out), "--max-steps", "10", *flags])


def save_tag(out: Path, step: int, model: ModelConfig, *, world_size: int = 1, ep_size: int = 1,
             data_order: str = GLOBAL_CHUNKS, **marker) -> Path:
    """A complete tag as far as planning reads one: its marker (written last), DeepSpeed's rank-0 file and our
    per-rank state file (empty: nothing is loaded), and `latest` naming it."""
    tag = out / "checkpoints" / f"step{step}"
    tag.mkdir(parents=True)
    (tag / MODEL_STATES).write_bytes(b"")
    for rank in range(world_size):
        (tag / f"rank_{rank:05d}_state.pt").write_bytes(b"")
    ds = marker.pop("deepspeed_config", None) or validate_ds_config(
        load_ds_config(CPU_CONFIG), world_size=world_size, has_moe=True, cuda_available=False).config
    CheckpointMeta(step=step, samples=16 * step, world_size=world_size, ep_size=ep_size, model_config=model.to_dict(),
                   deepspeed_config=ds, architecture="WideNetForPreTraining", task="pretrain",
                   data_order=data_order, **marker).write(tag)
    (out / "checkpoints" / LATEST_FILE).write_text(tag.name)
    return tag


def test_a_fresh_run_calls_the_hooks_in_order_and_hands_the_plan_in(tmp_path):
    cfg = config(tmp_path / "run")
    task = PlanTask(cfg)
    plan = plan_task(cfg, task, 1, 0)
    assert task.calls == ["model_config", "check_settings", "load_data", "batches_per_epoch", "requested_steps",
                          "prepare"]
    # the order training/task.py gives the tasks' authors
    documented = re.search(r"planner \(training/plan.py\)\s+(.*?)\n\s+loop", inspect.getdoc(task_module), re.S).group(1)
    assert re.findall(r"(\w+)(?:\(\w*(?:, \w+)*\))?", documented) == task.calls[:5] + ["check_resume", "prepare"]
    assert task.plan is plan and plan.resume is None and plan.max_steps == 10 and plan.changes == ()
    assert plan.ds.batch.train_batch_size == 16 and plan.parallel.world_size == 1
    assert any("before the DeepSpeed schedule's total_num_steps 300" in note for note in plan.notes)


def test_a_refusal_of_the_settings_comes_before_the_data_is_read(tmp_path):
    cfg = config(tmp_path / "run")
    task = PlanTask(cfg, refuse_settings="the DeepSpeed JSON disagrees with the recipe")
    with pytest.raises(ConfigError, match="disagrees with the recipe"):
        plan_run(cfg, task, 1, 0)
    assert task.calls == ["model_config", "check_settings"]  # no data read, no plan taken


def test_a_length_past_the_schedule_is_refused_before_the_data_is_planned(tmp_path):
    cfg = config(tmp_path / "run", "--max-steps", "500")
    task = PlanTask(cfg)
    with pytest.raises(ConfigError, match="--max-steps 500 runs past the schedule's total_num_steps 300"):
        plan_task(cfg, task, 1, 0)
    assert "prepare" not in task.calls


def test_checkpoints_are_continued_only_with_resume(tmp_path):
    out = tmp_path / "run"
    save_tag(out, 3, PlanTask(config(out)).model)
    with pytest.raises(CheckpointError, match=r"already holds checkpoints \(up to step3\); pass --resume"):
        plan_task(config(out), PlanTask(config(out)), 1, 0)


def test_resume_with_nothing_saved_starts_at_step_0(tmp_path):
    cfg = config(tmp_path / "run", "--resume")
    task = PlanTask(cfg)
    assert plan_task(cfg, task, 1, 0).resume is None and "check_resume" not in task.calls


def test_resume_continues_the_latest_tag_or_the_one_named_after_the_task_accepts_it(tmp_path):
    out = tmp_path / "run"
    model = PlanTask(config(out)).model
    older = save_tag(out, 2, model)
    latest = save_tag(out, 4, model)
    cfg = config(out, "--resume")
    task = PlanTask(cfg)
    plan = plan_task(cfg, task, 1, 0)
    assert plan.resume.tag_dir == latest and plan.resume.meta.step == 4 and plan.new_shape is None
    assert task.calls[-2:] == ["check_resume", "prepare"]
    assert plan_task(config(out, "--resume", str(older)), PlanTask(config(out)), 1, 0).resume.tag_dir == older
    with pytest.raises(DataError, match="other data"):
        plan_task(cfg, PlanTask(cfg, refuse_resume="other data"), 1, 0)


def test_a_checkpoint_of_another_model_is_refused_naming_the_fields(tmp_path):
    out = tmp_path / "run"
    save_tag(out, 2, ModelConfig.from_preset("widenet-tiny-e4", vocab_size=64, max_position_embeddings=16,
                                             hidden_dropout=0.3))
    with pytest.raises(CheckpointError, match=r"of another model config; differing fields:\n  hidden_dropout: 0.3"):
        plan_task(config(out, "--resume"), PlanTask(config(out)), 1, 0)


def test_a_damaged_or_model_states_only_checkpoint_is_refused_before_anything_loads(tmp_path):
    out = tmp_path / "run"
    tag = save_tag(out, 2, PlanTask(config(out)).model, optimizer_states=False)
    with pytest.raises(CheckpointError, match="holds model states only .* --init-from"):
        plan_task(config(out, "--resume"), PlanTask(config(out)), 1, 0)
    marker = json.loads((tag / "widenet_checkpoint.json").read_text())
    (tag / "widenet_checkpoint.json").write_text(json.dumps({**marker, "optimizer_states": True,
                                                             "files": {MODEL_STATES: {"size": 5, "sha256": "0" * 64}}}))
    with pytest.raises(CheckpointError, match=rf"checkpoint {tag} is damaged: 1 of its 1 files"):
        plan_task(config(out, "--resume"), PlanTask(config(out)), 1, 0)


def test_changed_settings_are_refused_on_resume_unless_accepted(tmp_path):
    out = tmp_path / "run"
    task = PlanTask(config(out))
    save_tag(out, 2, task.model)
    first = plan_run(config(out), task, 1, 0)
    out.joinpath("run_config.json").write_text(json.dumps({**config(out).record(),
                                                           "deepspeed_settings": first.ds.config}))
    same = plan_task(config(out, "--resume"), PlanTask(config(out)), 1, 0)
    assert same.changes == ()
    with pytest.raises(ConfigError, match=r"(?s)settings that change it:\n  seed: 1234 .* vs 7 .*--accept-changed"):
        plan_task(config(out, "--resume", "--seed", "7"), PlanTask(config(out)), 1, 0)
    accepted = plan_task(config(out, "--resume", "--seed", "7", "--accept-changed-settings"), PlanTask(config(out)),
                         1, 0)
    assert len(accepted.changes) == 1 and accepted.changes[0].startswith("seed: 1234")


def test_a_checkpoint_of_another_shape_is_planned_as_a_re_layout(tmp_path):
    out = tmp_path / "run"
    save_tag(out, 2, PlanTask(config(out)).model, world_size=2, ep_size=2)
    plan = plan_task(config(out, "--resume"), PlanTask(config(out)), 1, 0)
    assert str(plan.new_shape) == "2 ranks, ep 2, ZeRO 1 -> 1 rank, ep 1, ZeRO 1"
    # the preset's SOP dropout and routing noise draw from each rank's stream: not step for step, and said
    assert plan.new_shape.statistical == ("new random streams for classifier_dropout 0.1, moe.noise gaussian",)
    # a checkpoint whose micro-batches depended on the number of ranks continues on its own shape only
    older = tmp_path / "older"
    save_tag(older, 2, PlanTask(config(older)).model, world_size=2, ep_size=2, data_order=RANK_STRIDED)
    with pytest.raises(CheckpointError, match=r"rank-strided data order .* resume on its own shape \(2 ranks, ep 2"):
        plan_task(config(older, "--resume"), PlanTask(config(older)), 1, 0)


def test_one_plan_serves_every_folder_of_a_sweep(tmp_path):
    """A finetuning sweep plans once (`plan_run`) and finds each seed folder's checkpoint (`plan_resume`)."""
    cfg = config(tmp_path / "run", "--resume")
    task = PlanTask(cfg)
    plan = plan_run(cfg, task, 1, 0)
    trained = cfg.folder.seed(1)
    save_tag(trained.path, 5, task.model)
    assert plan_resume(cfg, task, plan, find_resume(cfg, cfg.folder.seed(0))) is plan
    resumed = plan_resume(cfg, task, plan, find_resume(cfg, trained))
    assert resumed.resume.meta.step == 5 and resumed.ds is plan.ds and resumed.max_steps == plan.max_steps
    assert task.calls.count("model_config") == 1 and task.calls.count("check_resume") == 1


def ds_json(tmp_path: Path, **changes) -> Path:
    """cpu_small.json with `changes` (top-level keys; a None value removes the key)."""
    config = {**load_ds_config(CPU_CONFIG), **changes}
    path = tmp_path / f"ds{len(list(tmp_path.glob('ds*.json')))}.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


QUIET = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=64, max_position_embeddings=16, classifier_dropout=0.0,
                                moe={"noise": "none"})  # no random draws: step for step where the shape allows


def test_a_precision_change_is_carried_over_as_a_change_to_accept_and_continues_statistically(tmp_path):
    """fp32 -> bf16 (a run begun on CPUs continued where bf16 is fast) and back: the fp32 master weights and moments
    carry over through the shape-free state; the arithmetic is other, so it is a setting to accept, and said."""
    out = tmp_path / "run"
    save_tag(out, 2, QUIET, world_size=2, ep_size=2)
    bf16 = ds_json(tmp_path, bf16={"enabled": True})
    with pytest.raises(ConfigError, match=r"(?s)settings that change it:\n  bf16\.enabled: '<absent>' -> True"):
        plan_task(config(out, "--resume", "--deepspeed_config", str(bf16)), PlanTask(config(out), model=QUIET), 1, 0)
    plan = plan_task(config(out, "--resume", "--deepspeed_config", str(bf16), "--accept-changed-settings"),
                     PlanTask(config(out), model=QUIET), 1, 0)
    assert str(plan.new_shape) == "2 ranks, ep 2, ZeRO 1, fp32 -> 1 rank, ep 1, ZeRO 1, bf16"
    assert plan.new_shape.statistical == ("the forward and backward compute in bf16 instead of fp32 (the fp32 master "
                                          "weights and optimizer state carry over)",)
    assert plan.changes == ("bf16.enabled: '<absent>' -> True",)
    # the same ranks in another precision are a re-layout too (DeepSpeed's own loader reads its own files only)
    same = plan_task(config(out, "--resume", "--deepspeed_config", str(bf16), "--accept-changed-settings",
                            "--ep-size", "2"), PlanTask(config(out), model=QUIET), 2, 0)
    assert str(same.new_shape) == "2 ranks, ep 2, ZeRO 1, fp32 -> 2 ranks, ep 2, ZeRO 1, bf16"


def test_fp16_on_either_side_is_refused_naming_what_continues_it(tmp_path):
    out = tmp_path / "run"
    save_tag(out, 2, QUIET, world_size=2, ep_size=2)
    marker = json.loads((out / "checkpoints/step2/widenet_checkpoint.json").read_text())
    marker["deepspeed_config"]["fp16"] = {"enabled": True}
    (out / "checkpoints/step2/widenet_checkpoint.json").write_text(json.dumps(marker))
    with pytest.raises(ConfigError, match=r"checkpoint .*step2 was trained in fp16: fp16's optimizer state includes "
                                          r"DeepSpeed's dynamic loss scaler.*resume on its own shape \(2 ranks, ep 2, "
                                          r"ZeRO 1, fp16\), or start a new run from its weights with --init-from"):
        plan_task(config(out, "--resume", "--accept-changed-settings"), PlanTask(config(out), model=QUIET), 1, 0)


def test_a_micro_batch_the_ranks_cannot_form_gives_way_to_one_they_can_with_the_same_global_batch(tmp_path):
    """train_batch_size 12 of micro 3 on 4 ranks; on 3 ranks the 4 micro-batches of a step cannot be split: the
    error names the micro batches that form 12 there, and with one of them the resume is planned (statistically,
    no --accept-changed-settings: the ranks need it); another global batch stays refused."""
    out = tmp_path / "run"
    twelve = ds_json(tmp_path, train_batch_size=12, train_micro_batch_size_per_gpu=3)
    (tmp_path / "no-data").mkdir()
    cfg = config(out, "--deepspeed_config", str(twelve))
    first = plan_run(cfg, PlanTask(cfg, model=QUIET), 4, 0)
    out.mkdir()
    out.joinpath("run_config.json").write_text(json.dumps({**cfg.record(), "deepspeed_settings": first.ds.config}))
    save_tag(out, 2, QUIET, world_size=4, ep_size=1, deepspeed_config=first.ds.config)
    resume = config(out, "--resume", "--deepspeed_config", str(twelve))
    with pytest.raises(ConfigError, match=r"trained 4 micro-batch\(es\) of 3 per step \(train_batch_size 12\); 3 "
                                          r"data-parallel rank\(s\) cannot split them\. Keep train_batch_size 12 and "
                                          r"set train_micro_batch_size_per_gpu to 1 or 2 or 4 in the DeepSpeed JSON"):
        plan_task(resume, PlanTask(resume, model=QUIET), 3, 0)
    for micro in (4, 2):
        other = ds_json(tmp_path, train_batch_size=12, train_micro_batch_size_per_gpu=micro)
        cfg = config(out, "--resume", "--deepspeed_config", str(other))
        plan = plan_task(cfg, PlanTask(cfg, model=QUIET), 3, 0)
        assert str(plan.new_shape) == (f"4 ranks, ep 1, ZeRO 1, micro batch 3 -> 3 ranks, ep 1, ZeRO 1, micro batch "
                                       f"{micro}")
        assert plan.changes == () and plan.loss_normalisation == "step-counts"
        assert plan.new_shape.statistical[0].startswith(f"micro-batches of {micro} samples instead of 3")
        assert plan.ds.batch.gradient_accumulation_steps == 4 // micro
    # where the ranks could form the old micro-batches, another one is a choice: a change to accept
    other = ds_json(tmp_path, train_batch_size=12, train_micro_batch_size_per_gpu=2)
    cfg = config(out, "--resume", "--deepspeed_config", str(other))
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu: 3 -> 2"):
        plan_task(cfg, PlanTask(cfg, model=QUIET), 2, 0)
    other = ds_json(tmp_path, train_batch_size=24, train_micro_batch_size_per_gpu=4)
    cfg = config(out, "--resume", "--deepspeed_config", str(other), "--accept-changed-settings")
    with pytest.raises(ConfigError, match=r"trained with train_batch_size 12; on 3 ranks, ep 1, ZeRO 1 this run has "
                                          r"24\..*set train_batch_size 12 .*with train_micro_batch_size_per_gpu 1 or 2 "
                                          r"or 4"):
        plan_task(cfg, PlanTask(cfg, model=QUIET), 3, 0)


def test_a_run_keeps_its_micro_batch_means_unless_a_resume_changes_the_micro_batch(tmp_path):
    out = tmp_path / "run"
    save_tag(out, 2, QUIET, world_size=2, ep_size=2, loss_normalisation="micro-batch-means")
    assert plan_task(config(out, "--resume"), PlanTask(config(out), model=QUIET), 2, 0).loss_normalisation == \
        "micro-batch-means"  # its own shape: exactly as it trained
    moved = plan_task(config(out, "--resume"), PlanTask(config(out), model=QUIET), 1, 0)
    assert moved.loss_normalisation == "micro-batch-means" and moved.new_shape.statistical == ()
    four = ds_json(tmp_path, train_micro_batch_size_per_gpu=4)
    cfg = config(out, "--resume", "--deepspeed_config", str(four), "--accept-changed-settings")
    changed = plan_task(cfg, PlanTask(cfg, model=QUIET), 1, 0)
    assert changed.loss_normalisation == "step-counts"
    assert "the MLM loss, each micro-batch's own mean until now, is the mean over the step's masked tokens from " \
           "here on" in changed.new_shape.statistical
    assert plan_task(config(tmp_path / "new"), PlanTask(config(tmp_path / "new")), 1, 0).loss_normalisation == \
        "micro-batch-means"  # a new run: its curve as before (the golden curves')


def test_branch_groups_are_a_layout_a_resume_re_lays_out(tmp_path):
    """A branch-parallel run (2 ranks in one branch group) continues on 1 rank, and a 1-rank run on a branch group
    of 2: its shape names the groups; --branch-parallel is a layout setting (no change to accept). Dropless
    routing without a balance loss: step for step (the preset's routing: the test after the next)."""
    branched = QUIET.replace(num_branches=2, moe={"balance_loss_weight": 0.0, "dispatch": "dropless"})
    zero0 = ds_json(tmp_path, zero_optimization={"stage": 0})
    out = tmp_path / "run"
    cfg = config(out, "--deepspeed_config", str(zero0), "--branch-parallel", "2")
    first = plan_run(cfg, PlanTask(cfg, model=branched), 2, 0)
    out.mkdir()
    out.joinpath("run_config.json").write_text(json.dumps({**cfg.record(), "deepspeed_settings": first.ds.config}))
    save_tag(out, 2, branched, world_size=2, deepspeed_config=first.ds.config, branch_parallel=2)
    cfg = config(out, "--resume", "--deepspeed_config", str(zero0))
    plan = plan_task(cfg, PlanTask(cfg, model=branched), 1, 0)
    assert str(plan.new_shape) == "2 ranks, ep 1, ZeRO 0, branch-parallel 2 -> 1 rank, ep 1, ZeRO 0, branch-parallel 1"
    assert plan.changes == () and plan.new_shape.statistical == ()
    cfg = config(out, "--resume", "--deepspeed_config", str(zero0), "--branch-parallel", "2")
    assert plan_task(cfg, PlanTask(cfg, model=branched), 4, 0).new_shape.new.data_parallel_size == 2


def test_an_older_run_copied_to_another_depth_resumes_with_its_own_settings(tmp_path, capsys):
    """An older version saved paths as typed (relative to where the run was started); the run folder copied to
    another depth: the start folder guessed from the saved output_dir's depth names paths that never existed
    (`bad/data`), which were reported as changes of the run. Now they are said to be unplaced and not compared;
    a real change still is one."""
    started = tmp_path / "A"
    (started / "data").mkdir(parents=True)
    original = started / "runs" / "x"
    task = PlanTask(config(original))
    save_tag(original, 2, task.model)
    ds = plan_run(config(original), task, 1, 0).ds.config
    record = {**config(original).record(), "output_dir": "runs/x", "data": "data",
              "deepspeed_settings": ds}
    (original / "run_config.json").write_text(json.dumps(record))
    copy = tmp_path / "B" / "bad" / "copy"  # runs/x at bad/copy: the guessed start is B/, which holds no data
    copy.parent.mkdir(parents=True)
    shutil.copytree(original, copy)
    capsys.readouterr()
    data = ["--data", str(started / "data")]  # the options the run was started with
    assert plan_task(config(copy, "--resume", *data), PlanTask(config(copy)), 1, 0).changes == ()
    said = capsys.readouterr().err
    assert (f"--resume: the saved data 'data' of {copy} are relative paths that cannot be placed from where the "
            f"folder is now" in said), said
    with pytest.raises(ConfigError, match=r"(?s)settings that change it:\n  seed: 1234 .* vs 7 [^\n]*\nThe resumed"):
        plan_task(config(copy, "--resume", *data, "--seed", "7"), PlanTask(config(copy)), 1, 0)
    # beside the original (runs/x2), where the start folder is the original's: placed and compared as before
    beside = shutil.copytree(original, started / "runs" / "x2")
    assert plan_task(config(beside, "--resume", *data), PlanTask(config(beside)), 1, 0).changes == ()
    with pytest.raises(ConfigError, match=r"data: .*A/data' \(the run in the folder\) vs .*elsewhere' \(now\)"):
        plan_task(config(beside, "--resume", "--data", str(tmp_path / "elsewhere")), PlanTask(config(beside)), 1, 0)


BRANCHES = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=64, max_position_embeddings=16, num_branches=2,
                                   classifier_dropout=0.0, moe={"noise": "none"})


def test_a_branch_parallel_resume_with_per_rank_routing_says_statistically_and_why(tmp_path):
    """A shared MoE routes each rank's branches in one call: the balance loss (the preset's 0.01) and the expert
    capacity (compact dispatch) are each rank's own in a branch group, so 2 ranks -> 1 is not step for step
    (measured: 0 to 353 float32 ulps over 4 steps); without the balance loss it is step for step while no route
    overflows a capacity (measured: 0 to 0.5 ulps), and dropless routing without a balance loss is."""
    cases = {"preset": (BRANCHES, ("branch groups of 1 instead of 2 rank(s): each rank routes its own branches' "
                                   "tokens in one call, so the balance loss (moe.balance_loss_weight 0.01) and the "
                                   "expert capacity (moe.dispatch compact) are computed over other groups of tokens",),
                        "statistically"),
             "capacity": (BRANCHES.replace(moe={"balance_loss_weight": 0.0}), (),
                          "step for step (the same micro-batches; sums in another order) while no route overflows an "
                          "expert's capacity (moe.dispatch compact: each rank of a branch group counts it over its own "
                          "branches' tokens; --set moe.dispatch=dropless drops none)"),
             "dropless": (BRANCHES.replace(moe={"balance_loss_weight": 0.0, "dispatch": "dropless"}), (),
                          "step for step (the same micro-batches; sums in another order)")}
    zero0 = tmp_path / "zero0.json"
    zero0.write_text(json.dumps({**load_ds_config(CPU_CONFIG), "zero_optimization": {"stage": 0}}))
    for name, (model, statistical, continuation) in cases.items():
        out = tmp_path / name
        # a branch group of 2 ranks: 1 data-parallel rank, fp32 ZeRO 0 (what branch parallelism runs with)
        ds = validate_ds_config(load_ds_config(zero0), world_size=1, has_moe=True, cuda_available=False).config
        save_tag(out, 2, model, world_size=2, branch_parallel=2, deepspeed_config=ds)
        plan = plan_task(config(out, "--resume", "--deepspeed_config", str(zero0)), PlanTask(config(out), model=model),
                         1, 0)
        assert plan.new_shape.statistical == statistical, name
        assert plan.new_shape.continuation().startswith(f"continues {continuation}"), plan.new_shape.continuation()
        assert plan.new_shape.continuation().endswith(continuation) or statistical


def test_an_ep_size_the_experts_refuse_is_said_before_a_resumes_micro_batches(tmp_path):
    """3 ranks and --ep-size 3 with 4 experts, resuming a step of 2 micro-batches: before, the micro-batch message
    came first, and its fix (1 or 2 ranks) left the ep size wrong."""
    out = tmp_path / "run"
    save_tag(out, 2, PlanTask(config(out)).model, world_size=1)
    with pytest.raises(ConfigError, match=r"--ep-size 3 does not divide the model's 4 experts"):
        plan_task(config(out, "--resume", "--ep-size", "3"), PlanTask(config(out)), 3, 0)

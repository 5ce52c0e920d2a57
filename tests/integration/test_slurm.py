"""slurm/train.sbatch, the one batch script of every task, on a real single-node Slurm (Debian's slurmctld +
slurmd + munge, 2 CPUs): 2 ranks train and checkpoint; a preempted job checkpoints, requeues itself and
resumes without repeating a step (pretraining; finetuning: and ends with the results of an uninterrupted run;
images: and writes its results); every task of the registry starts through it with its own options; a job
missing what it needs fails fast naming the fix.

CI installs the daemons with scripts/install_slurm.sh; elsewhere these tests skip when they are absent.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.support.golden_curves import ulps
from tests.support.launch_inputs import REPO, prepare_tiny_corpus
from tests.support.launching import run_train
from tests.support.shape_free_states import BF16_TOLERANCE, weights_apart
from tests.support.slurm_cluster import missing_tools, slurm_cluster
from widenet_ds.model.config import ModelConfig
from widenet_ds.tasks import TASKS
from widenet_ds.tasks.classify.results import ClassifyResults

if missing_tools():
    pytest.skip(f"Slurm/munge not installed (missing {', '.join(missing_tools())}); run scripts/install_slurm.sh "
                f"as root", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the test Slurm runs its daemons as root; run as root (CI does)", allow_module_level=True)

pytestmark = pytest.mark.slurm
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
# The test node has 2 CPUs: the scripts' GPU-node defaults are overridden on the command line.
TWO_RANKS = ["--ntasks-per-node=2", "--cpus-per-task=1", "--time=10"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        running.env.update(PATH=f"{Path(sys.executable).parent}:{running.env['PATH']}", OMP_NUM_THREADS="1",
                           WIDENET_HOME=str(REPO), PYTHON=sys.executable)
        yield running


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    return prepare_tiny_corpus(shared_data, tmp_path_factory.mktemp("corpus") / "alice")


def wait_for(predicate, timeout: float, what: str, cluster, job_id: int) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        state = cluster.job_field(job_id, "JobState")
        if state in ("FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            raise AssertionError(f"job {job_id} ended ({state}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout}s (job {job_id} {state})\n{cluster.logs()}")
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.multirank
def test_a_pretraining_job_preempted_on_two_ranks_continues_on_one_and_ends_as_the_uninterrupted_run(
        cluster, corpus, tmp_path):
    """A job gets what is free: its 2 tasks checkpoint when preempted and it requeues itself; the requeued job
    is cancelled and the run goes on in a job of 1 task with the same OUTPUT_DIR (Slurm keeps a requeued job's
    task count in its environment, measured: `scontrol update NumTasks=1` on the pending job still starts it
    with SLURM_NTASKS=2), which continues from the checkpoint (re-laid out: issues 38, 48) to the same last loss
    as an uninterrupted 2-rank run, within the bf16 tolerance of a continuation on another shape. The run is
    the README's recipe in its CPU-sized twin, cpu_small_bf16.json (bf16, ZeRO 1, LAMB): 2 ranks / ZeRO 1's
    bf16_zero_pp files re-laid out for 1 rank (the fp32 runs' moves are tests/integration/test_resume_new_shape.py's)."""
    max_steps = 16
    run = tmp_path / "run"
    log = tmp_path / "job.log"
    # Comparable shapes: no random draws in a step (routing noise, the SOP head's dropout).
    model = tmp_path / "tiny.json"
    ModelConfig.from_preset("widenet-tiny-e4", vocab_size=1000, moe={"noise": "none"},
                            classifier_dropout=0.0).to_json(model)
    extra = "--log-interval 1 --save-interval 5 --keep-last 10 --eval-interval 0 --no-tensorboard --seed 7"
    recipe = REPO / "ds_configs" / "cpu_small_bf16.json"
    options = ["pretrain", "--data", str(corpus), "--deepspeed_config", str(recipe), "--model-config", str(model),
               "--max-steps", str(max_steps), *extra.split()]
    env = dict(cluster.env, OUTPUT_DIR=str(run))
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(TRAIN_SBATCH), *options, env=env)
    metrics = run / "metrics.jsonl"

    def trained_two_steps() -> bool:
        return metrics.exists() and any('"train/loss"' in line and json.loads(line)["step"] >= 2
                                        for line in metrics.read_text().splitlines())

    wait_for(trained_two_steps, 300, "training steps", cluster, job)
    # Preempt by hand: TERM to the batch shell, which has the tasks checkpoint, then requeues the job.
    cluster.run("scancel", "--batch", "--signal=TERM", str(job))
    cluster.wait_state(job, {"PENDING"}, timeout=240)
    cluster.run("scancel", str(job))
    assert "requeueing job" in log.read_text()
    smaller = cluster.sbatch("--ntasks-per-node=1", "--cpus-per-task=1", "--time=10", f"--output={log}",
                             str(TRAIN_SBATCH), *options, env=env)
    assert cluster.wait_state(smaller, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240) == "COMPLETED", log.read_text()

    text = log.read_text()
    assert f"pretrain: job {job} run 1, 2 ranks" in text and f"pretrain: job {smaller} run 1, 1 ranks" in text
    assert "SIGTERM received, asking the tasks" in text
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    stopped = [e["step"] for e in events if "stopped by" in e.get("event", "")]
    resumed = [e for e in events if e.get("event", "").startswith("resumed from")]
    assert len(stopped) == 1 and 2 <= stopped[0] < max_steps, events
    assert len(resumed) == 1 and resumed[0]["step"] == stopped[0]
    assert f"step{stopped[0]} on another shape (2 ranks, ep 1, ZeRO 1, bf16 -> 1 rank, ep 1, ZeRO 1, bf16)" in \
        resumed[0]["event"] and "continues step for step" in resumed[0]["event"]
    # Steps are not repeated: across both runs' console lines every step was trained exactly once.
    trained = [int(step) for step in re.findall(r"^\[step (\d+)\] loss", text, flags=re.MULTILINE)]
    assert trained == list(range(1, max_steps + 1)), trained
    for step, ranks in ((stopped[0], 2), (max_steps, 1)):
        checkpoint = run / "checkpoints" / f"step{step}"
        assert json.loads((checkpoint / "widenet_checkpoint.json").read_text())["world_size"] == ranks
    uninterrupted = tmp_path / "uninterrupted"
    run_train("pretrain", ["--model-config", str(model), "--deepspeed_config", str(recipe), "--data", str(corpus),
                           "--output-dir", str(uninterrupted), "--max-steps", str(max_steps), *extra.split()])
    last = [[json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
             if '"train/loss"' in line][-1] for folder in (run, uninterrupted)]
    assert last[0]["step"] == last[1]["step"] == max_steps
    # bf16 losses are bf16 numbers (steps of 2^-5): the yardstick is the fp32 masters (BF16_TOLERANCE), against the
    # steps since the stop (the stopped tag is the uninterrupted run's own weights there: the same 2 ranks)
    apart = weights_apart(run / "checkpoints" / f"step{max_steps}", uninterrupted / "checkpoints" / f"step{max_steps}",
                          run / "checkpoints" / f"step{stopped[0]}")
    print(f"bf16 preempted on 2 tasks at step {stopped[0]}, continued on 1 to step {max_steps}: masters {apart:.4g} "
          f"of the steps since apart from the uninterrupted run's; last loss {last[0]['train/loss']} vs "
          f"{last[1]['train/loss']} ({ulps(last[1]['train/loss'], last[0]['train/loss'])} float32 ulps)")
    assert apart <= BF16_TOLERANCE, apart
    assert abs(last[0]["train/loss"] - last[1]["train/loss"]) <= 2 ** -5, last  # at most one bf16 step of the loss


@pytest.fixture(scope="module")
def pretrained(shared_data, tmp_path_factory):
    """What --init-from points at: a tiny WideNet exported as a checkpoint folder with the BERT vocabulary."""
    import torch

    from widenet_ds.data.tokenizer import TokenizerFiles
    from widenet_ds.model.config import ModelConfig
    from widenet_ds.model.widenet import WideNetForPreTraining
    from widenet_ds.portable.format import PortableCheckpoint, save_folder

    root = tmp_path_factory.mktemp("pretrained")
    vocab = root / "vocab.txt"
    vocab.write_bytes((shared_data / "vocab" / "bert-base-uncased-vocab.txt").read_bytes())
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=30522, max_position_embeddings=64)
    torch.manual_seed(0)
    return save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", WideNetForPreTraining(cfg).state_dict()),
                       root / "exported", tokenizer=TokenizerFiles((vocab,)))


def logged_numbers(seed_dir: Path) -> dict[tuple[int, str], float]:
    """(step, name) -> value of the seed's losses, learning rates and evaluations (timings left out)."""
    records = [json.loads(line) for line in (seed_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], k): v for r in records if "event" not in r for k, v in r.items()
            if k not in ("step", "time") and not k.startswith("perf/")}


@pytest.mark.slow
@pytest.mark.multirank
def test_a_glue_job_is_preempted_requeued_and_ends_as_an_uninterrupted_run(cluster, shared_data, pretrained,
                                                                                 tmp_path):
    max_steps = 16
    options = ["--max-steps", str(max_steps), "--seed", "7", "--max-train-examples", "512", "--max-eval-examples",
               "64", "--max-seq-length", "48", "--log-interval", "1", "--save-interval", "5", "--no-tensorboard",
               "--allow-recipe-mismatch"]
    data, ds_config = shared_data / "glue" / "SST-2", REPO / "ds_configs" / "finetune_cpu_small.json"
    run, log = tmp_path / "run", tmp_path / "job.log"
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(TRAIN_SBATCH), "glue", "--task", "SST-2", "--data",
                         str(data), "--init-from", str(pretrained), "--deepspeed_config", str(ds_config), *options,
                         env=dict(cluster.env, OUTPUT_DIR=str(run)))

    def trained_two_steps() -> bool:
        return (run / "seed7" / "metrics.jsonl").exists() and (2, "train/loss") in logged_numbers(run / "seed7")

    wait_for(trained_two_steps, 300, "finetuning steps", cluster, job)
    # The time limit's signal, by hand: USR1 to the batch shell, which has the tasks checkpoint, then requeues.
    cluster.run("scancel", "--batch", "--signal=USR1", str(job))
    assert cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400) == "COMPLETED", log.read_text()
    text = log.read_text()
    assert cluster.job_field(job, "Restarts") == "1" and cluster.job_field(job, "ExitCode") == "0:0", text
    assert "SIGUSR1 received, asking the tasks" in text and "requeueing job" in text
    events = [json.loads(line).get("event", "") for line in (run / "seed7" / "metrics.jsonl").read_text().splitlines()]
    stopped = [e for e in events if e.startswith("stopped by SIGUSR1")]
    assert len(stopped) == 1 and len([e for e in events if e.startswith("resumed from")]) == 1, events
    # Steps are not repeated: across both runs' console lines every step was trained exactly once.
    trained = [int(step) for step in re.findall(r"^\[seed 7 step (\d+)\] loss", text, flags=re.MULTILINE)]
    assert trained == list(range(1, max_steps + 1)), trained

    # The same run, uninterrupted, under the deepspeed launcher: the same numbers, the same results.
    reference = tmp_path / "reference"
    run_train("glue", [
        "--task", "SST-2", "--data", str(data), "--init-from", str(pretrained), "--deepspeed_config", str(ds_config),
        "--output-dir", str(reference), "--no-progress-bar", *options], timeout=600)
    assert logged_numbers(run / "seed7") == logged_numbers(reference / "seed7")
    got, want = (json.loads((folder / "results.json").read_text()) for folder in (run, reference))
    assert got["per_seed"] == want["per_seed"] and got["median"] == want["median"]
    assert (run / "seed7" / "SST-2.dev.tsv").read_text() == (reference / "seed7" / "SST-2.dev.tsv").read_text()


@pytest.mark.slow
@pytest.mark.multirank
def test_an_image_job_trains_on_two_ranks_and_resumes_after_preemption(cluster, tmp_path):
    from widenet_ds.run_folder import RunFolder

    max_steps = 16
    config = json.loads((REPO / "ds_configs" / "vision_cpu_small.json").read_text())
    config["scheduler"]["params"].update(total_num_steps=max_steps, warmup_num_steps=2)
    ds_config = tmp_path / "ds.json"
    ds_config.write_text(json.dumps(config))
    run, log = RunFolder(tmp_path / "run"), tmp_path / "job.log"
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(TRAIN_SBATCH), "classify", "--deepspeed_config",
                         str(ds_config), "--model-config", "widenet-vit-digits", "--dataset", "digits", "--ep-size",
                         "2", "--max-steps", str(max_steps), "--log-interval", "1", "--save-interval", "5",
                         "--keep-last", "10", "--eval-interval", "0", "--workers", "0", "--no-tensorboard", "--seed",
                         "7", env=dict(cluster.env, OUTPUT_DIR=str(run.path)))

    def trained_two_steps() -> bool:
        return run.metrics.exists() and max(run.read_metrics(live=True).series("train/loss"), default=0) >= 2

    wait_for(trained_two_steps, 300, "training steps", cluster, job)
    # The time limit's signal, by hand: USR1 to the batch shell, which has the tasks checkpoint, then requeues.
    cluster.run("scancel", "--batch", "--signal=USR1", str(job))
    assert cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400) == "COMPLETED", log.read_text()
    text = log.read_text()
    assert cluster.job_field(job, "Restarts") == "1" and cluster.job_field(job, "ExitCode") == "0:0", text
    assert "classify: job" in text and "run 1, 2 ranks" in text and "run 2, 2 ranks" in text
    assert "SIGUSR1 received, asking the tasks" in text and "requeueing job" in text
    events = [e["event"] for e in run.read_metrics().events]
    assert len([e for e in events if e.startswith("stopped by SIGUSR1")]) == 1, events
    assert len([e for e in events if e.startswith("resumed from")]) == 1, events
    # Steps are not repeated: across both runs' console lines every step was trained exactly once.
    trained = [int(step) for step in re.findall(r"^\[step (\d+)\] loss", text, flags=re.MULTILINE)]
    assert trained == list(range(1, max_steps + 1)), trained
    results = run.read_results(ClassifyResults)
    assert results.step == max_steps and 0.0 <= results.accuracy <= 1.0, results


def test_job_without_srun_fails_fast_naming_srun(cluster, tmp_path):
    script = tmp_path / "no_srun.sbatch"
    script.write_text("#!/bin/bash\n" + shlex.join(
        [sys.executable, "-c", "from widenet_ds.distributed.groups import init_distributed; init_distributed()"]) + "\n")
    log = tmp_path / "job.log"
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(script))
    assert cluster.wait_state(job, {"COMPLETED", "FAILED"}, timeout=120) == "FAILED"
    assert "2 tasks but this process was started without srun" in log.read_text()
    assert "srun python" in log.read_text()


def test_a_job_without_a_task_fails_fast_listing_the_tasks(cluster, tmp_path):
    log = tmp_path / "job.log"
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(TRAIN_SBATCH), "--data", "x")
    assert cluster.wait_state(job, {"COMPLETED", "FAILED"}, timeout=60) == "FAILED"
    text = log.read_text()
    assert "usage: sbatch [sbatch options] slurm/train.sbatch TASK [options of the task]" in text
    assert all(spec.description in text for spec in TASKS.values()), text


def test_output_dir_is_the_environment_s_not_an_option(cluster, tmp_path):
    log = tmp_path / "job.log"
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(TRAIN_SBATCH), "pretrain", "--output-dir", "x")
    assert cluster.wait_state(job, {"COMPLETED", "FAILED"}, timeout=60) == "FAILED"
    assert "set OUTPUT_DIR instead of passing --output-dir" in log.read_text()


@pytest.mark.parametrize("task", TASKS)
def test_every_task_starts_on_every_rank_with_its_own_options(cluster, tmp_path, task):
    """The one script, one vocabulary: the task and its options reach `python -m widenet_ds.train` on each rank
    (`--help`: each rank prints the task's usage and exits 0, before reading any data)."""
    log = tmp_path / "job.log"
    job = cluster.sbatch(*TWO_RANKS, f"--output={log}", str(TRAIN_SBATCH), task, "--help",
                         env=dict(cluster.env, OUTPUT_DIR=str(tmp_path / "run")))
    assert cluster.wait_state(job, {"COMPLETED", "FAILED"}, timeout=120) == "COMPLETED", log.read_text()
    text = log.read_text()
    assert f"{task}: job {job} run 1, 2 ranks" in text
    assert text.count(f"usage: python -m widenet_ds.train {task}") == 2, text

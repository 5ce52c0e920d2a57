"""`widenet-ds launch --dry-run` (launch/dry_run.py): the README's phase-1 recipe planned for 2 nodes x 8 GPUs on
this machine in one process, writing nothing; a job whose data is here; what a resume onto another shape would do.
Its refusals are rows of tests/integration/test_bad_inputs.py; its bytes held to real engines in
tests/engine/test_memory.py, tests/engine/test_activation_memory.py and tests/integration/test_dry_run_memory.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.launching import REPO, child_env
from tests.support.pretrain_support import (
    BOOKS,
    CPU_CONFIG,
    prepare_data,
    train_in_process,
    write_ds_config,
)
from widenet_ds.cli import main as widenet_ds
from widenet_ds.launch.dry_run import Target, job_shape
from widenet_ds.launch.options import LaunchOptions

RECIPE = REPO / "ds_configs" / "pretrain_phase1_seq128_lamb_zero1_bf16.json"
PHASE_1 = ["--model-config", "widenet-base-e8", "--ep-size", "8", "--deepspeed_config",
           "ds_configs/pretrain_phase1_seq128_lamb_zero1_bf16.json", "--data", "data/phase1", "--output-dir", "runs/e8"]


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def test_the_phase_1_recipe_on_two_nodes_of_eight_gpus_is_planned_here_without_starting_or_writing(tmp_path):
    (tmp_path / "ds_configs").mkdir()
    shutil.copy(RECIPE, tmp_path / "ds_configs")
    before = tree(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "widenet_ds.cli", "launch", "--dry-run", "--num-nodes", "2",
                             "--gpus-per-node", "8", "--gpu", "H100", "--seq-length", "128", "pretrain", "--",
                             *PHASE_1],
                            cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = set()
    while proc.poll() is None:  # no rank, no runner (a rank lives for seconds: polled, it would be seen)
        try:
            started |= {" ".join(child.cmdline()[:3]) for child in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.Error:  # a child that ended meanwhile
            pass
        time.sleep(0.1)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert not [command for command in started if "python" in command or "deepspeed" in command], started
    assert tree(tmp_path) == before
    for line in ("pretrain on 2 nodes x 8 ranks = 16 ranks, H100s of 80 GiB",
                 "data: --data data/phase1 is not on this machine",
                 "ranks: node 1: ranks 0-7; node 2: ranks 8-15",
                 "--ep-size 8: groups of 8 ranks share one copy, each rank holds 1",
                 "expert-parallel ranks 8-15 (node 2): rank 8: 0, rank 9: 1, rank 10: 2",
                 "[0, 8] [1, 9] [2, 10]",
                 "train_batch_size 4096 = micro batch 64 x gradient accumulation 4 x 16 data-parallel ranks; 524,288 "
                 "tokens per step (128 per sequence)",
                 "run: 112500 steps, ZeRO stage 1, bf16"):
        assert line in out, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    for row in ("weights", "gradients", "fp32", "optimizer", "activations", "reduce", "step", "peak"):
        assert row in rows and ("MiB" in rows[row] or "GiB" in rows[row]), out
    assert "with --activation-checkpointing:" in rows["activations"] and "fits" in rows["peak"], out
    page = (REPO / "docs" / "cluster.md").read_text()
    shown = [line for line in out.splitlines() if f"\n{line}\n" not in page]
    assert not shown, f"docs/cluster.md shows another plan than this run prints; lines not there: {shown}"


@pytest.mark.slow  # three dry runs of the recipe, one sizing smaller micro batches (about 25 s of CPU)
def test_the_recipe_on_a_shape_it_cannot_take_is_refused_with_the_fix(tmp_path):
    (tmp_path / "ds_configs").mkdir()
    shutil.copy(RECIPE, tmp_path / "ds_configs")
    shapes = {"ep 3": ["--num-nodes", "2", "--gpus-per-node", "8", "pretrain", "--", *PHASE_1, "--ep-size", "3"],
              "24 GPUs": ["--num-nodes", "3", "--gpus-per-node", "8", "pretrain", "--", *PHASE_1],
              "6 GiB": ["--num-nodes", "2", "--gpus-per-node", "8", "--device-memory", "6", "--seq-length", "128",
                        "pretrain", "--", *PHASE_1]}
    runs = {name: subprocess.Popen([sys.executable, "-m", "widenet_ds.cli", "launch", "--dry-run", *argv], cwd=tmp_path,
                                   env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, argv in shapes.items()}
    errors = {}
    for name, proc in runs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (name, err[-2000:])
        errors[name] = err
    assert "--ep-size 3 does not divide the 16 rank(s); use one of [1, 2, 4, 8]" in errors["ep 3"]
    assert ("train_batch_size 4096 is not a multiple of train_micro_batch_size_per_gpu 64 x 24 data-parallel rank(s)"
            in errors["24 GPUs"] and "does not split over 24 ranks" in errors["24 GPUs"])
    assert re.search(r"the job needs [\d.]+ GiB on the device of rank \d+ \(node \d\), more than its 6 GiB\. "
                     r"It fits with --activation-checkpointing \(peak [\d.]+ GiB\); or "
                     r"train_micro_batch_size_per_gpu 32 ",
                     errors["6 GiB"]), errors["6 GiB"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_data, dist):
    """A 2-step run of 1 rank (widenet-tiny-e4 without random draws, cpu_small.json: 2 micro-batches of 8 a step)."""
    root = tmp_path_factory.mktemp("dry_run")
    data = prepare_data(root / "data", [shared_data / BOOKS[0]])
    settings = ["--model-config", "widenet-tiny-e4", "--set", "moe.noise=none", "--set", "classifier_dropout=0",
                "--data", str(data), "--output-dir", str(root / "run"), "--max-steps", "2", "--eval-interval", "0",
                "--no-progress-bar", "--no-tensorboard"]
    assert train_in_process("pretrain", [*settings, "--deepspeed_config", str(CPU_CONFIG)]) is not None
    return {"root": root, "settings": settings}


def dry_run(capsys, *argv: str) -> str:
    capsys.readouterr()
    code = widenet_ds(["launch", "--dry-run", *argv])
    output = capsys.readouterr()
    assert code == 0, output.err[-3000:]
    return output.out


def resumed(trained, ds: Path = CPU_CONFIG) -> list[str]:
    return [*trained["settings"], "--deepspeed_config", str(ds), "--resume"]


@pytest.mark.slow  # a 2-step training run (about 12 s)
def test_a_resume_is_planned_as_the_real_resume_would_continue(trained, capsys, tmp_path):
    own = dry_run(capsys, "--num-ranks", "1", "pretrain", "--", *resumed(trained))
    assert "resume: " in own and "(step 2) on its own shape: continues step for step" in own, own
    assert "data: --data" in own and "checked (64-token sequences" in own, own
    other = dry_run(capsys, "--num-ranks", "2", "pretrain", "--", *resumed(trained))
    assert "on another shape (1 rank, ep 1, ZeRO 1 -> 2 ranks, ep 1, ZeRO 1): continues step for step" in other, other
    micro_4 = write_ds_config(tmp_path / "micro4.json", train_micro_batch_size_per_gpu=4)
    with pytest.raises(AssertionError, match="--resume of the run in .* with settings that change it"):
        dry_run(capsys, "--num-ranks", "2", "pretrain", "--", *resumed(trained, micro_4))  # as the start-up refuses it
    statistically = dry_run(capsys, "--num-ranks", "2", "pretrain", "--", *resumed(trained, micro_4),
                            "--accept-changed-settings")
    assert "continues statistically, not step for step: micro-batches of 4 samples instead of 8" in statistically
    assert "changed since the checkpoint (--accept-changed-settings): train_micro_batch_size_per_gpu: 8 -> 4" \
        in statistically, statistically


def test_a_hostfile_of_the_clusters_hosts_is_read_without_resolving_them(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu-node-a.cluster.invalid slots=8\ngpu-node-b.cluster.invalid slots=4\n")
    assert job_shape(LaunchOptions("pretrain", hostfile=hosts), Target(gpus=True)) == (
        ("gpu-node-a.cluster.invalid", 8), ("gpu-node-b.cluster.invalid", 4))
    assert job_shape(LaunchOptions("pretrain", hostfile=hosts, num_nodes=2, ranks_per_node=2), Target(gpus=True)) == (
        ("gpu-node-a.cluster.invalid", 2), ("gpu-node-b.cluster.invalid", 2))


def test_the_help_lists_the_dry_runs_own_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        widenet_ds(["launch", "--dry-run", "--help"])
    shown = capsys.readouterr().out
    assert exit_.value.code == 0
    assert all(option in shown for option in ("--gpus-per-node", "--gpu NAME", "--device-memory", "--seq-length"))

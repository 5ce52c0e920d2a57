"""TrainingLog: its TensorBoard and metrics.jsonl read back, a resume rewriting later steps, silent other ranks."""

from __future__ import annotations

from widenet_ds.run_folder import RunFolder, read_metrics
from widenet_ds.training.log import TrainingLog


def test_log_writes_tensorboard_and_jsonl_and_a_resume_rewrites_later_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=True, progress_bar=False, start_step=0, max_steps=4)
    for step in range(1, 5):
        log.record(step, {"optim/lr": 0.1 * step, "x/y": 1.0 / 3.0 + step})
    log.event(4, "checkpoint saved")
    log.close()
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in metrics.records] == [1, 2, 3, 4] and [e["step"] for e in metrics.events] == [4]
    assert metrics.records[0]["x/y"] == 1.0 / 3.0 + 1  # full float repr, bit for bit

    # Resume from step 2: records of steps 3-4 of the interrupted run go, the new ones come after.
    log = TrainingLog(RunFolder(tmp_path), enabled=True, tensorboard=True, progress_bar=False, start_step=2, max_steps=4)
    log.record(3, {"optim/lr": 0.33, "x/y": 7.0})
    log.close()
    assert [(r["step"], r.get("optim/lr")) for r in read_metrics(tmp_path / "metrics.jsonl").records] == \
        [(1, 0.1), (2, 0.2), (3, 0.33)]
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [(e.step, round(e.value, 6)) for e in accumulator.Scalars("optim/lr")] == [(1, 0.1), (2, 0.2), (3, 0.33)]


def test_disabled_log_on_other_ranks_writes_nothing(tmp_path):
    log = TrainingLog(RunFolder(tmp_path / "out"), enabled=False, tensorboard=True, progress_bar=True, start_step=0,
                      max_steps=1)
    log.record(1, {"optim/lr": 1.0})
    log.event(1, "x")
    log.close()
    assert not (tmp_path / "out").exists()

"""`widenet-ds verify` and the checks trainers and `convert` make with it: a real engine's checkpoint records
every file's size and SHA-256 in its marker (written under a temporary tag name, renamed when complete), an
exported folder in its config.json; a truncated, replaced or missing file is named, with the fix."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.scripts.convert_make_checkpoint import MICRO_BATCH, FixedBatchLoader, build, fixed_batch, model_config
from widenet_ds.checkpoint.manager import CheckpointManager, TrainingState, estimate_checkpoint_bytes
from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.checkpoint.tags import check_checkpoint_files
from widenet_ds.commands.convert import cli as convert
from widenet_ds.commands.verify import cli as verify_cli
from widenet_ds.errors import CheckpointError
from widenet_ds.fs.checksums import total_size
from widenet_ds.fs.disk_space import DiskFullError

pytestmark = pytest.mark.usefixtures("dist")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 1-rank engine trained 2 steps, saved at steps 1 and 2 by the CheckpointManager the trainers use."""
    root = tmp_path_factory.mktemp("verify")
    engine, settings = build(ep_size=1, zero_stage=1, world=1)
    manager = CheckpointManager(root / "checkpoints", keep_last=3, rank=0, world_size=1)
    meta = CheckpointMeta(step=0, samples=0, world_size=1, ep_size=1, model_config=model_config().to_dict(),
                          deepspeed_config=settings.config, architecture="WideNetForPreTraining", task="pretrain")
    for step in (1, 2):
        out = engine(**fixed_batch(0, seed=500 + step))
        engine.backward(out.loss)
        engine.step()
        manager.save(engine, TrainingState(step=step, samples=step * MICRO_BATCH), FixedBatchLoader(), meta)
    return root, estimate_checkpoint_bytes(engine.module, ep_size=1), engine, manager, meta


def test_a_checkpoint_records_every_file_and_is_renamed_into_place_when_complete(run, capsys):
    root, estimate, *_ = run
    tags = sorted(p.name for p in (root / "checkpoints").iterdir() if p.is_dir())
    assert tags == ["step1", "step2"] and (root / "checkpoints" / "latest").read_text() == "step2"
    meta = CheckpointMeta.read(root / "checkpoints" / "step2")
    on_disk = sorted(p.name for p in (root / "checkpoints" / "step2").iterdir() if p.name != META_FILE)
    assert sorted(meta.files) == on_disk and "zero_pp_rank_0_mp_rank_00_optim_states.pt" in on_disk
    # the estimate made before the first save (weights + fp32 master + two moments) is close to the real size
    assert 0.9 < estimate / total_size(meta.files) < 1.2, (estimate, total_size(meta.files))
    assert verify_cli([str(root)]) == 0
    assert f"step2: {len(meta.files)} files" in capsys.readouterr().out


def test_a_truncated_file_is_named_with_the_other_checkpoints_as_each_command_takes_them(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run[0], copy)
    damaged = copy / "checkpoints/step2/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    size = damaged.stat().st_size
    damaged.write_bytes(damaged.read_bytes()[: size // 2])
    with pytest.raises(CheckpointError, match=rf"(?s)checkpoint {copy}/checkpoints/step2 is damaged: 1 of its \d+ files.*"
                                              rf"zero_pp_rank_0_mp_rank_00_optim_states.pt: {size // 2:,} bytes, "
                                              rf"written with {size:,} \(truncated\).*use another checkpoint of the run "
                                              rf"\(--tag step1; complete tags: step1\)"):
        CheckpointSource.open(copy, "checkpoint", purpose=CONVERT).verified
    CheckpointSource.open(copy, "checkpoint", tag="step1", purpose=CONVERT).verified  # the other tag is whole
    # convert checks its source before writing anything, and takes another tag with --tag
    with pytest.raises(CheckpointError, match=r"(?s)zero_pp_rank_0_mp_rank_00_optim_states.pt: .*truncated.*\(--tag step1;"):
        convert(["to-folder", str(copy), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    # a resumed run (training/plan.py) takes it with --resume
    tag_dir = copy / "checkpoints/step2"
    with pytest.raises(CheckpointError, match=rf"\(--resume {copy}/checkpoints/step1; complete tags: step1\)"):
        check_checkpoint_files(tag_dir, CheckpointMeta.read(tag_dir))


def test_an_exported_folder_records_its_files_and_a_changed_byte_is_named(run, tmp_path):
    folder = tmp_path / "export"
    assert convert(["to-folder", str(run[0]), str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert sorted(config["files"]) == ["README.md", "model.safetensors"]
    assert CheckpointSource.open(folder, "checkpoint", purpose=CONVERT).verified.files == 2
    weights = bytearray((folder / "model.safetensors").read_bytes())
    weights[-5] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(CheckpointError, match=r"(?s)export is damaged: 1 of its 2 files.*model\.safetensors: content "
                                              r"differs from what was written \(SHA-256\).*Restore it"):
        CheckpointSource.open(folder, "checkpoint", purpose=CONVERT).verified


def test_checkpoints_of_older_versions_have_nothing_recorded_and_pass(run, tmp_path, capsys):
    old = tmp_path / "step2"
    shutil.copytree(run[0] / "checkpoints" / "step2", old)
    marker = json.loads((old / META_FILE).read_text())
    del marker["files"]  # as markers of version 1 before the checksums
    marker["format_version"] = 1
    (old / META_FILE).write_text(json.dumps(marker))
    assert CheckpointSource.open(old, "checkpoint", purpose=CONVERT).verified.files == 0
    assert verify_cli([str(old)]) == 0 and "no checksums recorded" in capsys.readouterr().out


def test_a_tag_left_half_written_is_no_checkpoint(run, tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(run[0] / "checkpoints", copy)
    (copy / "step2").rename(copy / "step3.partial")  # as a save killed before its rename
    (copy / "latest").write_text("step1")
    with pytest.raises(CheckpointError, match=r"tag 'step3' does not exist .*available tags: step1\.$"):
        CheckpointSource.open(copy, "checkpoint", tag="step3", purpose=CONVERT).verified
    CheckpointManager(copy, keep_last=3, rank=0, world_size=1)._prune(current_step=1)
    assert sorted(p.name for p in copy.iterdir() if p.is_dir()) == ["step1"]


def test_a_checkpoint_that_cannot_fit_names_the_older_tags_to_delete_not_a_lower_keep_last(run, small_disk):
    """--keep-last prunes only after a new checkpoint is complete: lowering it frees nothing for this one."""
    root, _, engine, _, meta = run
    size = sum(p.stat().st_size for p in (root / "checkpoints").rglob("*") if p.is_file())
    disk = small_disk(f"{size // 1024 + 512}k")
    shutil.copytree(root / "checkpoints", disk / "checkpoints")
    small_disk.fill(disk)
    manager = CheckpointManager(disk / "checkpoints", keep_last=1, rank=0, world_size=1)
    manager.expect(engine, 1, CheckpointMeta.read(disk / "checkpoints" / "step2"))
    with pytest.raises(DiskFullError, match=rf"The last complete checkpoint is {disk}/checkpoints/step2: free at least "
                                            rf"[\d.]+ MiB in {disk}/checkpoints \(deleting the older checkpoints step1 "
                                            rf"frees some; --keep-last removes them only after a new checkpoint is "
                                            rf"complete\), then continue with --resume\.$"):
        manager.save(engine, TrainingState(step=3, samples=3 * MICRO_BATCH), FixedBatchLoader(), meta)
    assert sorted(p.name for p in (disk / "checkpoints").iterdir() if p.is_dir()) == ["step1", "step2"]


def test_a_disk_filling_up_while_deepspeed_writes_is_one_error_and_no_partial_tag(run, monkeypatch):
    """Simulated ENOSPC in DeepSpeed's writer (tests/integration/test_world_failures.py fills a real tmpfs
    under a 2-rank run): the partial tag is removed, the last complete checkpoint stays the latest."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    root, _, engine, manager, meta = run

    def full(self, state_dict, path):
        Path(path).write_bytes(b"\0" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(TorchCheckpointEngine, "save", full)
    with pytest.raises(DiskFullError, match=rf"the checkpoint of step 3 could not be saved: there is not enough space "
                                            rf"in {root}/checkpoints .*rank 0: the disk is full.*partial files were "
                                            rf"removed.*last complete checkpoint is {root}/checkpoints/step2.*--resume"):
        manager.save(engine, TrainingState(step=3, samples=3 * MICRO_BATCH), FixedBatchLoader(), meta)
    assert sorted(p.name for p in (root / "checkpoints").iterdir() if p.is_dir()) == ["step1", "step2"]
    assert (root / "checkpoints" / "latest").read_text() == "step2"

"""The preflight's ranks (launch/preflight_rank.py) as `widenet-ds launch --preflight` starts them: the README's bf16
recipe in its CPU twin (ds_configs/cpu_small_bf16.json, widenet-tiny-e4, --ep-size 2) on 2 local ranks passes every
check, prints one table, and leaves the run folder it was given as it was and nothing of its own behind. A table's
failures (another DeepSpeed on a node, node-local folders, an all-to-all whose peers swap what they send) across the
2-node test cluster: tests/integration/test_two_nodes.py."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launching import REPO, child_env, clear_stale_build_locks
from tests.support.preflight_output import ROWS, read_table
from tests.support.pretrain_support import BOOKS, prepare_data

pytestmark = pytest.mark.multirank


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
            for p in sorted(folder.rglob("*"))}


def test_the_readme_recipes_cpu_twin_on_two_ranks_passes_every_check_and_leaves_the_run_folder_as_it_was(
        tmp_path, shared_data):
    data = prepare_data(tmp_path / "data", [shared_data / BOOKS[0]])
    run = tmp_path / "runs" / "e4"
    (run / "notes").mkdir(parents=True)
    (run / "notes" / "plan.txt").write_text("phase 1 on the cluster\n")  # the user's own files in the run folder
    before, around = hashes(run), sorted(p.name for p in (tmp_path / "runs").iterdir())
    clear_stale_build_locks()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "widenet_ds.cli", "launch", "--preflight", "pretrain", "--num-ranks",
                           "2", "--", "--model-config", "widenet-tiny-e4", "--ep-size", "2", "--deepspeed_config",
                           str(REPO / "ds_configs" / "cpu_small_bf16.json"), "--data", str(data), "--output-dir",
                           str(run), "--resume"], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    print(f"the preflight of 2 local ranks took {time.monotonic() - start:.1f} s")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    rows, verdict = read_table(proc.stdout)  # one table, from rank 0
    assert tuple(rows) == ROWS and all(row.result == "ok" for row in rows.values()), proc.stdout[-6000:]
    assert verdict.startswith(f"preflight: all {len(ROWS)} checks passed in ") and "Traceback" not in output
    assert "every loss within 8 ulps of a one-rank run's" in rows["expert routing"].found
    assert "every value right" in rows["all-to-all"].found
    assert rows["checkpoint"].found.endswith("loaded back: every rank's weights and the step restored")
    assert hashes(run) == before and sorted(p.name for p in (tmp_path / "runs").iterdir()) == around
    assert not list(tmp_path.rglob(".widenet-preflight-*"))

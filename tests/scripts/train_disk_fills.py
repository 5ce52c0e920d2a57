"""`python -m widenet_ds.train TASK ...` whose disk fills up while one rank writes a checkpoint (run by the
deepspeed launcher for tests/integration/test_world_failures.py).

    WIDENET_TEST_FULL_RANK   the rank that meets the full disk
    WIDENET_TEST_FULL_TAG    the checkpoint it meets it in (e.g. step2)
    WIDENET_TEST_FULL_MODE   fill: before that rank's first write into the tag, a file fills every free byte
                             of the output's file system (another program at work; on a small tmpfs the
                             writes then fail as a full disk fails them: real ENOSPC from torch's writer);
                             raise: the write leaves 1,000 bytes and raises ENOSPC (simulated, any disk)
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from widenet_ds.train import main

FILLER = "filler.bin"  # in the run folder, beside checkpoints/
real_save = TorchCheckpointEngine.save


def save(self, state_dict, path: str):
    if os.environ.get("RANK") == os.environ["WIDENET_TEST_FULL_RANK"] and \
            f"/{os.environ['WIDENET_TEST_FULL_TAG']}." in path:
        if os.environ["WIDENET_TEST_FULL_MODE"] == "raise":
            Path(path).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        filler = Path(path).parents[2] / FILLER
        if not filler.exists():
            with open(filler, "wb", buffering=0) as handle:
                try:
                    while True:
                        handle.write(b"\0" * (1 << 16))
                except OSError:
                    pass  # every byte taken
    return real_save(self, state_dict, path)


TorchCheckpointEngine.save = save

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

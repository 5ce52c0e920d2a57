"""The one place that silences third-party output a user cannot act on.

On a CPU machine DeepSpeed warns "Setting accelerator to CPU" in every process that imports it, prints
"... built successfully" for its shared-memory op on every rank, and logs its launcher's bookkeeping;
on a 2-rank run that was a third of the console. Call `quiet_third_party()` first thing in an
entrypoint, before DeepSpeed is imported. Anything DeepSpeed logs at WARNING or above that is not
listed here still reaches the console.

torch's C++ warnings (c10d's logging, not Python warnings) are off unless TORCH_CPP_LOG_LEVEL is set: a rank whose
peer has ended gets its rendezvous store's "recvValue failed ... Connection was likely closed" with a 20-frame C++
stack from each later store call (the heartbeat's, a group's teardown), after its own line has said what happened.
"""

from __future__ import annotations

import logging
import os
import warnings

# DeepSpeed messages that describe its own set-up, not a problem of the run.
NOT_ACTIONABLE = (
    "Setting accelerator to CPU",          # the CPU accelerator is what a CPU run uses
    "Setting ds_accelerator to",
    "Unable to find hostfile",             # one node needs none
    "built successfully",
    "ZeRO with an untested optimizer",     # our LAMB under ZeRO 1/2 is tested here (docs/optimizer.md)
    "get learning rate from scheduler before it has started",  # read before step 1 by design
)


class _DropNotActionable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return record.levelno >= logging.WARNING and not any(text in message for text in NOT_ACTIONABLE)


def quiet_third_party() -> None:
    """Idempotent; must run before `import deepspeed` to catch its import-time messages (and before `import torch`
    for its C++ log level, read once when torch loads)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if "DS_ACCELERATOR" not in os.environ and not _has_cuda():
        os.environ["DS_ACCELERATOR"] = "cpu"  # chosen explicitly: no "unable to detect" warning per process
    deepspeed_logger = logging.getLogger("DeepSpeed")  # DeepSpeed's logger; filters survive its set-up
    if not any(isinstance(f, _DropNotActionable) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropNotActionable())
    # Deprecations inside DeepSpeed/torch internals (torch.jit, pkg_resources, ...) are for their authors.
    for module in ("deepspeed", "torch", "pydantic"):
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()

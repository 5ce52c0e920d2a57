"""Reading DeepSpeed's `.pt` files without executing pickled code.

DeepSpeed saves checkpoints with `torch.save`, i.e. as pickles. We read them with
`torch.load(weights_only=True)`: only tensors, containers and primitive types are rebuilt, plus the few
DeepSpeed classes below that its ZeRO optimizer files hold. None of these classes runs code when
rebuilt (a named tuple, an enum, and a plain object whose attributes are restored). Anything else in a
file -- e.g. a `__reduce__` that would call `os.system` -- is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from widenet_ds.errors import CheckpointError


def deepspeed_safe_globals() -> list[Any]:
    """The DeepSpeed classes allowed in addition to torch's weights-only set (listed in docs/checkpoints.md)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [fragment_address, ZeroStageEnum, LossScaler]


def load_torch_file(path: Path) -> Any:
    """A DeepSpeed/PyTorch checkpoint file, rebuilt without running any code from it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist; the checkpoint is incomplete (copy every "
                              f"file of the tag folder) or another program's.")
    try:
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError or EOFError depending on the damage
        raise CheckpointError(
            f"refused to read {path}: it is not a weights-only PyTorch file ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:300]}). widenet-ds never unpickles arbitrary objects (that can run code); "
            f"if the file is truncated, copy it again; if it holds custom classes, re-save its tensors.") from None

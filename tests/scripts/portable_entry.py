"""`portable_entry.py SCRIPT ARGS` or `portable_entry.py -m MODULE ARGS`: run a training entry with oneDNN
off, for the runs of tests/portable_arithmetic.py. oneDNN's JIT kernels differ per instruction set (the
fp32 GELU and convolutions change with ONEDNN_MAX_CPU_ISA) and torch has no environment switch for it;
off, torch runs ATen's GELU and im2col + MKL convolutions, which PORTABLE_ENV pins to one code path.

Under the `deepspeed` launcher the rank's command is `portable_entry.py --local_rank=N SCRIPT ARGS`; the
flag is handed on to the entry, after its own arguments.
"""

import runpy
import sys
from pathlib import Path

import torch


def main(argv: list[str]) -> None:
    launcher = [arg for arg in argv[:1] if arg.startswith("--local_rank")]
    argv = argv[len(launcher):]
    if not argv:
        sys.exit(__doc__)
    torch.backends.mkldnn.enabled = False
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args, *launcher]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args, *launcher]
        sys.path[0] = str(Path(script).resolve().parent)  # as `python SCRIPT` would have it
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])

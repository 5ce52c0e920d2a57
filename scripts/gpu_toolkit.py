"""Can this node build DeepSpeed's CUDA ops, at install (`./launcher.sh setup --gpu --prebuild-ops`) or at a job's
start (a JIT build)? The toolkit torch finds (its CUDA_HOME: $CUDA_HOME, else the folder above the `nvcc` on PATH,
else /usr/local/cuda), checked by DeepSpeed's own rule (nvcc's CUDA major.minor = torch's, or one of the minor
versions DeepSpeed accepts: `assert_no_cuda_mismatch`), and the headers and library the build compiles and links
with, which DeepSpeed does not check: a toolkit of NVIDIA's pip packages (nvcc, the runtime) lacks the math
libraries' headers that torch's own CUDA headers include, and an `nvcc` wrapper on PATH makes torch guess a
CUDA_HOME without any (docs/gpu.md, "If the op build fails").

    .venv/bin/python scripts/gpu_toolkit.py    # exit 0, one line: it can; exit 1: a line per problem with its fix
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

# what torch's ATen/cuda/CUDAContextLight.h includes, which every CUDA op of DeepSpeed's includes in turn
HEADERS = ("cuda_runtime_api.h", "cusparse.h", "cublas_v2.h", "cublasLt.h", "cusolverDn.h")


def _dirs(variable: str) -> list[Path]:
    return [Path(part) for part in os.environ.get(variable, "").split(os.pathsep) if part]


def check() -> tuple[list[str], str]:
    """(problems, each with its fix; the line that says what was found)."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None:
        return [f"torch {torch.__version__} is a CPU build: install a CUDA build (./launcher.sh setup --gpu)"], ""
    if CUDA_HOME is None:
        return ["no CUDA toolkit found (no CUDA_HOME, no nvcc on PATH, no /usr/local/cuda): load one (e.g. `module "
                "load cuda`) or set CUDA_HOME, here and on the compute nodes"], ""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed says its accelerator on import
        from deepspeed.ops.op_builder.builder import (
            assert_no_cuda_mismatch,
            installed_cuda_version,
        )
    home, problems = Path(CUDA_HOME), []
    try:
        major, minor = installed_cuda_version()
        assert_no_cuda_mismatch("widenet-ds")
    except Exception as err:  # DeepSpeed's MissingCUDAException / CUDAMismatchException, in its own words
        return [f"CUDA toolkit at {home}: {str(err).lstrip('>- ')}. Use a toolkit of torch's CUDA {torch.version.cuda}"
                f" (or a torch build of the toolkit's CUDA: WIDENET_TORCH_INDEX, docs/gpu.md); DeepSpeed's override "
                f"DS_SKIP_CUDA_CHECK=1 builds anyway, at your own risk"], ""
    where = f"CUDA_HOME={home}" + ("" if os.environ.get("CUDA_HOME") else " (torch's guess)")
    if not any((home / lib / "libcudart.so").exists() for lib in ("lib64", "lib")):
        problems.append(f"{where} has no lib64/libcudart.so to link the ops with: set CUDA_HOME to the toolkit's own "
                        f"folder" + (" (e.g. /usr/local/cuda)" if Path("/usr/local/cuda/lib64").is_dir() else ""))
    searched = [home / "include", *sorted(home.glob("targets/*/include")), *_dirs("CPATH"),
                *_dirs("CPLUS_INCLUDE_PATH")]
    missing = [h for h in HEADERS if not any((d / h).is_file() for d in searched)]
    if missing:
        # torch's own CUDA packages (nvidia-cublas, nvidia-cusparse, ... beside it in site-packages) carry them
        bundled = [d for d in sorted(Path(torch.__file__).parent.parent.glob("nvidia/cu*/include"))
                   if all((d / h).is_file() for h in missing)]
        fix = "use a full CUDA toolkit"
        if bundled:
            cpath = f"{bundled[0]}{os.pathsep}$CPATH" if os.environ.get("CPATH") else str(bundled[0])
            fix = f"export CPATH={cpath} (the headers of torch's own CUDA packages), here and in the jobs' environment"
        problems.append(f"{', '.join(missing)} (included by torch's CUDA headers) are in none of "
                        f"{', '.join(map(str, searched))}: {fix}")
    return problems, (f"CUDA toolkit {major}.{minor} at {home} (nvcc, headers, libcudart): matches torch's CUDA "
                      f"{torch.version.cuda}, so DeepSpeed can build its CUDA ops with it")


def main() -> int:
    problems, found = check()
    for line in problems or [found]:
        print(f"[gpu toolkit] {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

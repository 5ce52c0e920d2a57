"""Shared pieces of the benchmarks: device, timing (warm-up, then the median of repeats), GEMM peak, machine."""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from collections.abc import Callable

import torch


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median wall time of `fn` (device synchronised before and after each call) after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_peak_flops(dtype: torch.dtype, size: int | None = None, repeats: int = 10) -> float:
    """Measured FLOP/s of one large square matmul on random data: the physical limit MFU is taken against."""
    dev = device()
    size = size or (8192 if dev.type == "cuda" else 2048)
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    seconds = median_seconds(lambda: a @ b, warmup=3, repeats=repeats)
    return 2 * size ** 3 / seconds


def machine() -> str:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return (f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB; "
                f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads of {os.cpu_count()} cores; torch {torch.__version__}"


def init_single_rank() -> None:
    """A 1-rank process group: DeepSpeed's MoE all-to-all and engine need one."""
    from widenet_ds.distributed.groups import init_distributed
    if "MASTER_PORT" not in os.environ:  # a free port: several benchmark workers may start at once
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    init_distributed()

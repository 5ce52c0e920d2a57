"""LAMB: the update rule against a written-out reference, and per-tensor trust ratios under real
ZeRO 1/2 on 2 ranks (DeepSpeed launcher, gloo) against an unpartitioned reference.

Run as a script (`deepspeed --num_gpus 2 tests/engine/test_lamb.py --out DIR`) this file is the worker of
the multi-rank test: it trains a few steps through DeepSpeed engines and saves, per rank, the
engine's parameters next to those of a plain per-tensor `Lamb` fed the same averaged gradients.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from widenet_ds.engine.lamb import (
    Lamb,
    PartitionLayout,
    TensorSegment,
    build_param_groups,
    enable_per_tensor_trust_ratio,
    zero_partition_layouts,
)
from widenet_ds.errors import ConfigError

# fp32 everywhere; differences come from summation order (norms, gradient all-reduce).
ATOL, RTOL = 2e-6, 1e-5


def reference_lamb_step(w, g, m, v, t, lr, b1, b2, eps, wd, max_coeff, min_coeff,
                        eps_inside_sqrt=False, bias_correction=True):
    """DeepSpeed's fused_lamb_cuda_kernel.cu, written out for one tensor. Returns new (w, m, v)."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = torch.sqrt(v + eps) if eps_inside_sqrt else torch.sqrt(v) + eps
    u = m / denom + wd * w
    w_norm, u_norm = torch.sqrt((w * w).sum()), torch.sqrt((u * u).sum())
    r = 1.0 if w_norm == 0 or u_norm == 0 else min(max((w_norm / u_norm).item(), min_coeff), max_coeff)
    step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t) if bias_correction else lr
    return w - step_size * r * u, m, v


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(weight_decay=0.01),
        dict(eps_inside_sqrt=True, weight_decay=0.1),
        dict(bias_correction=False, betas=(0.8, 0.99), eps=1e-6),
    ],
    ids=["defaults", "weight-decay", "eps-inside-sqrt", "no-bias-correction"],
)
def test_update_rule_matches_written_out_reference(options):
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (11,), (3, 4, 2), (6,)]
    inits = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    inits[1] *= 1e3  # ||w|| / ||u|| > max_coeff: clamped to 10
    inits[2] *= 1e-5  # below min_coeff: clamped to 0.01
    inits[3].zero_()  # ||w|| = 0: ratio 1 (DeepSpeed's rule)
    params = [nn.Parameter(x.clone()) for x in inits]
    hp = dict(lr=0.05, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_coeff=10.0, min_coeff=0.01)
    hp.update(options)
    eps_inside_sqrt = hp.pop("eps_inside_sqrt", False)
    bias_correction = hp.pop("bias_correction", True)
    opt = Lamb(params, eps_inside_sqrt=eps_inside_sqrt, bias_correction=bias_correction, **hp)

    ref = [(x.clone(), torch.zeros_like(x), torch.zeros_like(x)) for x in inits]
    for t in range(1, 5):
        for p, (w, m, v) in zip(params, ref):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        ref = [
            reference_lamb_step(w, p.grad, m, v, t, hp["lr"], *hp["betas"], hp["eps"], hp["weight_decay"],
                                hp["max_coeff"], hp["min_coeff"], eps_inside_sqrt, bias_correction)
            for p, (w, m, v) in zip(params, ref)
        ]
        opt.step()
        for p, (w, _, _) in zip(params, ref):
            torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)
    # Every branch of the trust ratio was taken: clamped high, clamped low, and the zero norm.
    assert not torch.equal(params[3].detach(), inits[3]), "a zero tensor with a gradient must still move"


def test_flat_partition_layout_equals_per_tensor_lamb():
    """The ZeRO code path on one rank: tensors packed into one flat vector with padding between."""
    gen = torch.Generator().manual_seed(1)
    shapes = [(5, 3), (4,), (2, 2, 2)]
    tensors = [torch.randn(s, generator=gen) for s in shapes]
    pad = 3
    starts, flat_parts, offset = [], [], 0
    for t in tensors:
        starts.append(offset)
        flat_parts += [t.reshape(-1), torch.zeros(pad)]
        offset += t.numel() + pad
    flat = nn.Parameter(torch.cat(flat_parts))
    per_tensor = [nn.Parameter(t.clone()) for t in tensors]

    hp = dict(lr=0.02, weight_decay=0.01)
    flat_opt, ref_opt = Lamb([flat], **hp), Lamb(per_tensor, **hp)
    segments = tuple(TensorSegment(i, s, t.numel()) for i, (s, t) in enumerate(zip(starts, tensors)))
    flat_opt.set_partition_layouts([PartitionLayout(flat, segments, len(tensors), None)])
    for _ in range(3):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for p, g in zip(per_tensor, grads):
            p.grad = g
        flat.grad = torch.cat([x for g in grads for x in (g.reshape(-1), torch.zeros(pad))])
        flat_opt.step()
        ref_opt.step()
    for p, s in zip(per_tensor, starts):
        torch.testing.assert_close(flat.detach()[s : s + p.numel()], p.detach().reshape(-1), atol=ATOL, rtol=RTOL)
    padding = torch.cat([flat.detach()[s + p.numel() : s + p.numel() + pad] for p, s in zip(per_tensor, starts)])
    assert torch.count_nonzero(padding) == 0


@pytest.mark.parametrize("options", [dict(weight_decay=0.01), dict(eps_inside_sqrt=True, bias_correction=False)],
                         ids=["weight-decay", "eps-inside-sqrt-no-bias-correction"])
def test_multi_tensor_step_equals_the_per_tensor_loop(options):
    """foreach=True (the GPU default) against foreach=False (the CPU default), fp32: whole tensors (one of them
    skipping a step, so two step counts in one group; one zero tensor) and a flat ZeRO-style partition with
    gaps. On CPU both run the same kernels: the same bits."""
    gen = torch.Generator().manual_seed(7)
    shapes = [(33, 17), (5,), (8, 3, 2), (64,), (1,)]
    inits = [torch.randn(s, generator=gen) for s in shapes]
    inits[1] *= 1e3
    inits[4].zero_()
    segments = (TensorSegment(0, 3, 20), TensorSegment(2, 30, 40), TensorSegment(1, 80, 7))
    flat_init = torch.randn(100, generator=gen)
    runs = []
    for foreach in (False, True):
        params = [nn.Parameter(x.clone()) for x in inits]
        flat = nn.Parameter(flat_init.clone())
        opt = Lamb([{"params": params[:3]}, {"params": params[3:], "weight_decay": 0.0}, {"params": [flat]}],
                   lr=0.02, foreach=foreach, **options)
        opt.set_partition_layouts([PartitionLayout(flat, segments, 3, None)])
        step_gen = torch.Generator().manual_seed(8)
        for step in range(4):
            for i, p in enumerate(params):
                p.grad = None if (i == 2 and step == 1) else torch.randn(p.shape, generator=step_gen)
            flat.grad = torch.randn(100, generator=step_gen)
            opt.step()
        runs.append([p.detach() for p in params] + [flat.detach()])
    for i, (loop, multi) in enumerate(zip(*runs)):
        assert torch.equal(multi, loop), f"tensor {i}: {(multi - loop).abs().max()}"
    assert torch.equal(runs[1][-1][:3], flat_init[:3]) and torch.equal(runs[1][-1][87:], flat_init[87:]), \
        "padding outside the segments is never touched"
    assert not torch.equal(runs[1][4], inits[4]), "a zero tensor moves (trust ratio 1)"


def test_cpu_tensors_are_updated_one_after_the_other_by_default(monkeypatch):
    """On CPU `_foreach_*` is a per-tensor loop: the default step takes the per-tensor path, which frees each
    tensor's temporaries before the next tensor's (the multi-tensor path holds them all)."""
    params = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(5))]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = Lamb(params, lr=0.01)
    monkeypatch.setattr(Lamb, "_update_tensors", lambda *args: pytest.fail("multi-tensor step on CPU"))
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(params, before))


def test_bad_hyper_parameters_and_unknown_tensors_are_refused():
    p = nn.Parameter(torch.ones(3))
    with pytest.raises(ConfigError, match="gradient_clipping"):
        Lamb([p], max_grad_norm=1.0)
    with pytest.raises(ConfigError, match="AMSGrad"):
        Lamb([p], amsgrad=True)
    with pytest.raises(ConfigError, match="min_coeff"):
        Lamb([p], min_coeff=2.0, max_coeff=1.0)
    opt = Lamb([p, nn.Parameter(torch.ones(2, 2))])
    # What ZeRO does to a client optimizer: swap the parameters for a flat partition.
    flat = nn.Parameter(torch.ones(7))
    flat.grad = torch.ones(7)
    opt.param_groups[0]["params"] = [flat]
    with pytest.raises(ConfigError, match="enable_per_tensor_trust_ratio"):
        opt.step()
    # What DeepSpeed's fp16/bf16 optimizer without ZeRO does: one fp32 copy per tensor, whole tensors.
    copies = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2, 2))]
    for copy in copies:
        copy.grad = torch.ones_like(copy)
    opt.param_groups[0]["params"] = copies
    opt.step()
    assert all(opt.state[copy]["step"] == 1 for copy in copies)


class TinyMoENet(nn.Module):
    """Linear -> LayerNorm -> (DeepSpeed MoE) -> head: tensors sized so ZeRO splits some of them."""

    def __init__(self, ep_size: int | None):
        super().__init__()
        self.inp = nn.Linear(6, 10)
        self.norm = nn.LayerNorm(10)
        self.moe = None
        if ep_size is not None:
            from deepspeed.moe.layer import MoE

            expert = nn.Sequential(nn.Linear(10, 12), nn.GELU(), nn.Linear(12, 10))
            # k=1, no random token selection, room for every token: a deterministic forward.
            self.moe = MoE(10, expert, num_experts=2, ep_size=ep_size, k=1, capacity_factor=4.0,
                           use_rts=False)
        self.head = nn.Linear(10, 3)

    def forward(self, x, y):
        h = self.norm(torch.tanh(self.inp(x)))
        aux = h.new_zeros(())
        if self.moe is not None:
            out, aux, _ = self.moe(h)
            h = h + out
        return nn.functional.cross_entropy(self.head(h), y) + 0.01 * aux


def test_build_param_groups_splits_decay_and_experts():
    from deepspeed.moe.utils import is_moe_param

    from widenet_ds.distributed.groups import init_distributed

    init_distributed()
    torch.manual_seed(0)
    model = TinyMoENet(ep_size=1)
    groups = build_param_groups(model, weight_decay=0.01)
    named = {id(p): n for n, p in model.named_parameters()}
    seen = [named[id(p)] for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(named.values()), "every trainable parameter exactly once"
    for g in groups:
        names = [named[id(p)] for p in g["params"]]
        experts = [is_moe_param(p) for p in g["params"]]
        if g.get("moe"):
            assert all(experts) and g["name"] == "ep_size_1", names
        else:
            assert not any(experts), names
        no_decay = [n.endswith("bias") or n.startswith("norm.") for n in names]
        assert all(no_decay) if g["weight_decay"] == 0.0 else not any(no_decay), (g["weight_decay"], names)
    assert {(bool(g.get("moe")), g["weight_decay"]) for g in groups} == {
        (False, 0.01), (False, 0.0), (True, 0.01), (True, 0.0)}


# ---- multi-rank: real DeepSpeed engines under ZeRO 1/2 on 2 CPU ranks -------------------------

# (name, ZeRO stage, MoE ep_size or None, extra zero_optimization keys, per-partition (naive) LAMB)
CASES = [
    ("stage0", 0, None, {}, False),
    ("stage1", 1, None, {}, False),
    ("stage2", 2, None, {}, False),
    ("stage2_round_robin", 2, None, {"round_robin_gradients": True}, False),
    ("stage0_moe_ep2", 0, 2, {}, False),
    ("stage1_moe_ep1", 1, 1, {}, False),
    ("stage2_moe_ep2", 2, 2, {}, False),
    ("stage1_naive", 1, None, {}, True),
    ("stage2_naive", 2, None, {}, True),
]
STEPS = 3
LAMB_HP = dict(lr=0.02, weight_decay=0.01)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def zero_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lamb_zero")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
           str(_free_port()), str(Path(__file__).resolve()), "--out", str(out)]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"deepspeed launcher failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    print(f"2-rank DeepSpeed run: {time.monotonic() - start:.1f} s")
    return {
        (name, rank): torch.load(out / f"{name}_rank{rank}.pt", weights_only=True)
        for name, *_ in CASES
        for rank in (0, 1)
    }


def _max_diff(saved: dict) -> float:
    names = [k.removeprefix("ref.") for k in saved if k.startswith("ref.")]
    return max((saved[n] - saved["ref." + n]).abs().max().item() for n in names)


@pytest.mark.multirank
@pytest.mark.parametrize("case", [c[0] for c in CASES if not c[4]])
def test_zero_per_tensor_lamb_matches_unpartitioned_reference(zero_runs, case):
    for rank in (0, 1):
        saved = zero_runs[(case, rank)]
        names = [k.removeprefix("ref.") for k in saved if k.startswith("ref.")]
        assert names, "no parameters saved"
        for n in names:
            moved = (saved[n] - saved["init." + n]).abs().max().item()
            assert moved > 1e-3, f"{case} rank {rank}: {n} did not train"
            torch.testing.assert_close(saved[n], saved["ref." + n], atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"{case} rank {rank} {n}: {m}")
        if not case.startswith("stage0"):
            # The point of the test: some tensor lies across the two ranks' partitions.
            assert saved["meta.straddling_tensors"].item() > 0, f"{case}: no tensor straddles a partition boundary"


@pytest.mark.multirank
@pytest.mark.parametrize("stage", [1, 2])
def test_per_partition_trust_ratio_differs_from_reference(zero_runs, stage):
    """What DeepSpeed's fused Lamb computes under ZeRO; the test above would catch a fall back to it."""
    diff = max(_max_diff(zero_runs[(f"stage{stage}_naive", rank)]) for rank in (0, 1))
    assert diff > 100 * ATOL, f"per-partition LAMB came within {diff:.2e} of per-tensor LAMB"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="DeepSpeed's FusedLamb is a CUDA kernel; no CUDA device")
def test_matches_deepspeed_fused_lamb_on_cuda():
    from deepspeed.ops.lamb import FusedLamb

    gen = torch.Generator().manual_seed(0)
    inits = [torch.randn(s, generator=gen) for s in [(64, 33), (1000,), (7,)]]
    ours = [nn.Parameter(x.cuda()) for x in inits]
    theirs = [nn.Parameter(x.cuda()) for x in inits]
    hp = dict(lr=0.01, weight_decay=0.01)
    opt_ours, opt_theirs = Lamb(ours, **hp), FusedLamb(theirs, **hp)
    for _ in range(5):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=gen).cuda()
            b.grad = a.grad.clone()
        opt_ours.step()
        opt_theirs.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def _zero_worker(out: Path) -> None:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.moe.utils import is_moe_param
    from deepspeed.utils import groups as ds_groups

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, stage, ep_size, zero_extra, naive in CASES:
        torch.manual_seed(0)
        model = TinyMoENet(ep_size)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        config = {
            "train_micro_batch_size_per_gpu": 8,
            "gradient_accumulation_steps": 1,
            "steps_per_print": 10**6,
            "zero_optimization": {"stage": stage, **zero_extra},
            "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 unless told; the reference does not clip
        }
        lamb = Lamb(build_param_groups(model, LAMB_HP["weight_decay"]), lr=LAMB_HP["lr"])
        engine, *_ = deepspeed.initialize(model=model, optimizer=lamb, config=config)
        enable_per_tensor_trust_ratio(engine)
        straddling = 0
        if stage > 0:
            zero = engine.optimizer
            for i, layout in enumerate(zero_partition_layouts(zero)):
                whole = zero.round_robin_bit16_groups[i]
                straddling += sum(s.numel < whole[s.tensor_index].numel() for s in layout.segments)
        if naive:  # one "tensor" per partition: what DeepSpeed's fused Lamb computes under ZeRO
            lamb.set_partition_layouts(
                PartitionLayout(f, (TensorSegment(0, 0, f.numel()),), 1, None)
                for f in engine.optimizer.single_partition_of_fp32_groups
            )

        # The reference: the same model, unpartitioned, gradients averaged by hand as DeepSpeed
        # does (dense over all ranks; experts summed over their expert-data-parallel group / world).
        torch.manual_seed(0)
        ref = TinyMoENet(ep_size)
        if ref.moe is not None:
            ref.moe.set_deepspeed_parallelism()
        ref_lamb = Lamb(build_param_groups(ref, LAMB_HP["weight_decay"]), lr=LAMB_HP["lr"])
        for step in range(STEPS):
            gen = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            ref(x, y).backward()
            for p in ref.parameters():
                group = (ds_groups._get_expert_data_parallel_group(p.group_name) if is_moe_param(p)
                         else dist.group.WORLD)
                dist.all_reduce(p.grad, group=group)
                p.grad /= world
            ref_lamb.step()
            ref_lamb.zero_grad()
        saved = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        saved.update({"ref." + n: p.detach().clone() for n, p in ref.named_parameters()})
        saved.update({"init." + n: t for n, t in init.items()})
        saved["meta.straddling_tensors"] = torch.tensor(straddling)
        torch.save(saved, out / f"{name}_rank{rank}.pt")
        dist.barrier()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    _zero_worker(parser.parse_args().out)

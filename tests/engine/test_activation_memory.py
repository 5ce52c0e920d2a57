"""The activations counted on fake tensors (engine/activation_memory.py, as the dry run counts them:
launch/dry_run.py `pretraining_activations`) against the peak torch's profiler measures in a real engine's training
micro-batch (`profile_memory`: every allocation and free of torch's CPU allocator, in order; the peak of their running
sum over the micro-batch's forward and backward, the gradients already held): within BAND, at two micro batches, with
and without activation checkpointing."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

from tests.support.engine_bytes import pretraining_batch
from widenet_ds.engine.activation_memory import LiveBytes, step_activation_bytes
from widenet_ds.engine.build import build_engine
from widenet_ds.engine.ds_config import validate_ds_config
from widenet_ds.launch.job_memory import pretraining_activations
from widenet_ds.launch.job_shape import JobShape
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining

pytestmark = pytest.mark.usefixtures("dist")

BAND = 0.10  # |estimate / measured - 1| (these runs measured 0.991-1.000)
VOCAB, SEQ = 300, 64


def allocator_peak(step) -> int:
    """The peak of the bytes torch's CPU allocator handed out during `step()`, above those held before it."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    for event in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_live_bytes_counts_what_the_allocator_hands_out():
    layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    for p in layer.parameters():
        p.grad = torch.zeros_like(p)

    def step():  # its input made inside and its output held through the backward, as the dry run counts them
        output = layer(torch.randn(32, 64))
        output.square().mean().backward()
        del output

    counted = LiveBytes([t for p in layer.parameters() for t in (p, p.grad)])
    with counted:
        step()
    assert counted.peak == allocator_peak(step) > 32 * 256 * 4
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    assert step_activation_bytes(fake, lambda m: m(torch.randn(32, 64)), lambda y: y.square().mean(),
                                 mode) == counted.peak


def measured_peak(model_config, ds, micro: int, checkpointing: bool) -> int:
    """A real engine's second micro-batch of a step of three (its gradients held since the first), the output kept
    through the backward as the trainer keeps it."""
    torch.manual_seed(0)
    model = WideNetForPreTraining(model_config)
    model.set_activation_checkpointing(checkpointing)
    engine, _ = build_engine(model, ds)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        output = engine(**pretraining_batch(generator, micro, SEQ, VOCAB))
        engine.backward(output.loss)
        engine.step()
    batch = pretraining_batch(generator, micro, SEQ, VOCAB)

    def step():
        output = engine(**batch)
        engine.backward(output.loss)
        del output

    return allocator_peak(step)


@pytest.mark.slow  # twelve real engines' micro-batches, profiled
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_dry_runs_activations_are_within_the_band_of_the_measured_peak(precision):
    model_config = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=VOCAB)
    for micro in (4, 8):
        config = {"train_batch_size": 3 * micro, "train_micro_batch_size_per_gpu": micro, "steps_per_print": 10**6,
                  "optimizer": {"type": "Lamb", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 0},
                  **({"bf16": {"enabled": True}} if precision == "bf16" else {})}
        ds = validate_ds_config(config, world_size=1, has_moe=True, cuda_available=False)
        for checkpointing in (False, True):
            estimate = pretraining_activations(model_config, ds, JobShape.even(1, 1, num_experts=4), micro, SEQ,
                                               checkpointing, gpus=False)
            measured = measured_peak(model_config, ds, micro, checkpointing)
            assert abs(estimate / measured - 1) <= BAND, (precision, micro, checkpointing, estimate, measured)

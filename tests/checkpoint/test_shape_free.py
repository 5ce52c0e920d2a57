"""The shape-free training state: a real 2-rank, ep 2, ZeRO 1 checkpoint re-laid-out to 1 rank, ep 1, ZeRO 0 and
back by real engines keeps every master weight and every optimizer state tensor bit for bit (and so does 2 ranks,
ep 1, ZeRO 2, where the expert groups are partitioned too); so do real bf16 checkpoints of ZeRO 1 and ZeRO 2 (their
fp32 masters, not the bf16 weights), also through an fp32 engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.launching import REPO, run_deepspeed
from tests.support.shape_free_states import RELAYOUT, assert_identical, shape_free_of, spec
from tests.support.shape_free_states import relayout as relayout_with
from widenet_ds.checkpoint.deepspeed import load_torch_file
from widenet_ds.checkpoint.shape_free import global_expert_name, load_shape_free, save_shape_free
from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.commands.convert import cli as convert
from widenet_ds.errors import CheckpointError
from widenet_ds.fs.checksums import record_files

pytestmark = [pytest.mark.multirank, pytest.mark.slow]  # slow: its fixture's launcher runs
MAKE = REPO / "tests/scripts/convert_make_checkpoint.py"
EXPERT = "widenet.encoder.ffn.0.moe.deepspeed_moe.experts.deepspeed_experts"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-rank, ep_size 2, ZeRO 1 run of the tiny WideNet (4 experts), saved at step 2."""
    folder = tmp_path_factory.mktemp("shape_free") / "zero1"
    run_deepspeed(MAKE, ["save", str(folder), "2", "1"], num_ranks=2)
    return folder


def relayout(state_folder: Path, out: Path, ranks: int, ep_size: int, stage: int) -> Path:
    relayout_with(ranks, spec(state_folder, out, ep_size, stage))
    return out / "checkpoints" / "step2"


def test_zero1_ep2_to_one_rank_zero0_and_back_keeps_every_weight_and_optimizer_tensor(run, tmp_path):
    source = run / "checkpoints" / "step2"
    original = shape_free_of(run)
    assert original.scalars["source"] == {"tag_dir": str(source.resolve()), "world_size": 2, "ep_size": 2,
                                          "zero_stage": 1, "precision": "fp32"}
    # every weight, experts by global index; the fp32 partitions are the weights the engine saved
    weights = CheckpointSource.open(run, "source", purpose=CONVERT).read_weights().state
    assert set(original.master) == set(weights) and {f"{EXPERT}.{g}.fc_in.weight" for g in range(4)} <= set(weights)
    assert all(torch.equal(original.master[k], weights[k]) for k in weights)
    assert all(state == {"step": 2} for state in original.param_state.values())
    assert all(original.optimizer["exp_avg_sq"][k].abs().sum() > 0 for k in weights)  # trained, not zeros
    assert original.scalars["global_steps"] == 2 and original.scalars["lr_scheduler"] == {"last_batch_iteration": 1}
    assert original.scalars["loaders"] == [{}, {}]

    save_shape_free(original, tmp_path / "state0")
    assert_identical(load_shape_free(tmp_path / "state0"), original)
    one = relayout(tmp_path / "state0", tmp_path / "one", ranks=1, ep_size=1, stage=0)
    assert (one / "expp_rank_0_mp_rank_00_optim_states.pt").is_file() and not list(one.glob("zero_pp_rank_*"))
    on_one = shape_free_of(one)
    assert on_one.scalars["source"]["world_size"] == 1 and on_one.scalars["source"]["ep_size"] == 1
    assert_identical(on_one, original)
    marker = json.loads((one / "widenet_checkpoint.json").read_text())
    assert marker["world_size"] == 1 and marker["ep_size"] == 1 and marker["optimizer_states"] is True
    assert marker["relaid_out_from"]["zero_stage"] == 1 and marker["step"] == 2

    save_shape_free(on_one, tmp_path / "state1")
    # back to 2 ranks: ep 2, ZeRO 1 (the original's layout) and ep 1, ZeRO 2 (one launch)
    relayout_with(2, spec(tmp_path / "state1", tmp_path / "back", 2, 1),
                  spec(tmp_path / "state1", tmp_path / "zero2", 1, 2))
    back, zero2 = (tmp_path / name / "checkpoints" / "step2" for name in ("back", "zero2"))
    assert_identical(shape_free_of(back), original)
    # DeepSpeed's own files are those of the original, padding and all
    for rank in (0, 1):
        name = f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        want, got = (load_torch_file(tag / name)["optimizer_state_dict"] for tag in (source, back))
        assert got["param_slice_mappings"] == want["param_slice_mappings"]
        for a, b in zip(got["single_partition_of_fp32_groups"], want["single_partition_of_fp32_groups"], strict=True):
            assert torch.equal(a, b)
        for index, state in want["base_optimizer_state"]["state"].items():
            assert got["base_optimizer_state"]["state"][index]["step"] == state["step"]
            assert torch.equal(got["base_optimizer_state"]["state"][index]["exp_avg"], state["exp_avg"])
            assert torch.equal(got["base_optimizer_state"]["state"][index]["exp_avg_sq"], state["exp_avg_sq"])
        assert got["base_optimizer_state"]["param_groups"] == want["base_optimizer_state"]["param_groups"]

    # ep 1 on 2 ranks, ZeRO 2: every expert group is partitioned over both ranks (expert data parallelism)
    on_zero2 = shape_free_of(zero2)
    assert {k: on_zero2.scalars["source"][k] for k in ("world_size", "ep_size", "zero_stage")} == \
        {"world_size": 2, "ep_size": 1, "zero_stage": 2}
    partitions = load_torch_file(zero2 / "zero_pp_rank_1_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
    assert partitions["partition_count"] == [2, 2, 2, 2]
    assert_identical(on_zero2, original)

    # --resume loads it, and the next step is the original's next step
    run_deepspeed(RELAYOUT, ["resume", str(tmp_path / "next"), str(source), str(back)], num_ranks=2)
    for rank in (0, 1):
        from_source, from_back = (load_file(tmp_path / f"next.{i}.rank{rank}.safetensors") for i in (0, 1))
        for name, tensor in from_source.items():
            assert torch.equal(from_back[name], tensor), (rank, name)
            assert not torch.equal(tensor, load_file(run / f"logits.rank{rank}.safetensors")[name])  # it stepped


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory) -> Path:
    """2-rank, ep_size 2 bf16 runs of the same model with ZeRO 1 and with ZeRO 2 (one launch), saved at step 3 (the
    first with a learning rate above 0: the masters part from the bf16 weights)."""
    folder = tmp_path_factory.mktemp("shape_free_bf16")
    run_deepspeed(MAKE, ["save", str(folder), "2", "1,2", "bf16", "3"], num_ranks=2)
    return folder


def test_bf16_zero1_and_zero2_to_one_rank_zero0_and_back_keep_every_fp32_master_and_optimizer_tensor(bf16_runs,
                                                                                                   tmp_path):
    """DeepSpeed's bf16 ZeRO 1/2 files (`bf16_zero_pp_rank_*`) hold the fp32 masters and moments; on 1 rank without
    ZeRO its FP16_UnfusedOptimizer keeps them as per-tensor fp32 copies. 2 ranks / ep 2 -> 1 rank / ep 1 / ZeRO 0
    -> back: every tensor to the bit, and DeepSpeed's files as the original's; an fp32 engine takes them too."""
    stages = (1, 2)
    originals = {stage: shape_free_of(bf16_runs / f"zero{stage}") for stage in stages}
    for stage, original in originals.items():
        assert {k: original.scalars["source"][k] for k in ("world_size", "ep_size", "zero_stage", "precision")} == \
            {"world_size": 2, "ep_size": 2, "zero_stage": stage, "precision": "bf16"}
        weights = CheckpointSource.open(bf16_runs / f"zero{stage}", "source", purpose=CONVERT).read_weights().state
        # the masters, not the bf16 weights the module holds: those are the masters rounded to bf16
        assert set(original.master) == set(weights) and all(original.master[k].dtype == torch.float32 for k in weights)
        assert all(torch.equal(original.master[k].to(torch.bfloat16).float(), weights[k]) for k in weights)
        assert sum(not torch.equal(original.master[k], weights[k]) for k in weights) > len(weights) // 2
        save_shape_free(original, tmp_path / f"state{stage}")
    relayout_with(1, *(spec(tmp_path / f"state{s}", tmp_path / f"one{s}", 1, 0, "bf16") for s in stages),
                  spec(tmp_path / "state1", tmp_path / "fp32", 1, 0))
    for stage, original in originals.items():
        one = tmp_path / f"one{stage}" / "checkpoints" / "step3"
        assert (one / "expp_rank_0_mp_rank_00_optim_states.pt").is_file() and not list(one.glob("*zero_pp_rank_*"))
        on_one = shape_free_of(one)
        assert {k: on_one.scalars["source"][k] for k in ("world_size", "zero_stage", "precision")} == \
            {"world_size": 1, "zero_stage": 0, "precision": "bf16"}
        assert_identical(on_one, original)
        save_shape_free(on_one, tmp_path / f"back_state{stage}")
    in_fp32 = shape_free_of(tmp_path / "fp32" / "checkpoints" / "step3")
    assert in_fp32.scalars["source"]["precision"] == "fp32"
    assert_identical(in_fp32, originals[1])  # bf16 -> fp32: the masters become the module's weights
    relayout_with(2, *(spec(tmp_path / f"back_state{s}", tmp_path / f"back{s}", 2, s, "bf16") for s in stages))
    for stage, original in originals.items():
        source, back = bf16_runs / f"zero{stage}" / "checkpoints" / "step3", tmp_path / f"back{stage}/checkpoints/step3"
        assert_identical(shape_free_of(back), original)
        for rank in (0, 1):
            name = f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
            want, got = (load_torch_file(tag / name)["optimizer_state_dict"] for tag in (source, back))
            assert got["param_slice_mappings"] == want["param_slice_mappings"]
            for a, b in zip(got["single_partition_of_fp32_groups"], want["single_partition_of_fp32_groups"],
                            strict=True):
                assert torch.equal(a, b)
            for index, state in want["base_optimizer_state"]["state"].items():
                for what in ("exp_avg", "exp_avg_sq"):
                    assert torch.equal(got["base_optimizer_state"]["state"][index][what], state[what])
        # and the bf16 weights of the model-states files
        for name in [p.name for p in source.glob("*model_states.pt")]:
            want, got = (load_torch_file(tag / name) for tag in (source, back))
            module = want["module"] if "module" in want else want
            for key, tensor in module.items():
                assert torch.equal((got["module"] if "module" in got else got)[key], tensor), (name, key)
    # `convert reshard` carries the same state, the source untouched
    source = bf16_runs / "zero1" / "checkpoints" / "step3"
    before = record_files(source)
    assert convert(["reshard", str(source), str(tmp_path / "resharded"), "--ep-size", "1", "--world-size", "1"]) == 0
    assert record_files(source) == before
    assert_identical(shape_free_of(tmp_path / "resharded"), originals[1])


def test_convert_to_shape_free_writes_the_state_and_leaves_the_source_as_it_was(run, tmp_path, capsys):
    source = run / "checkpoints" / "step2"
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    assert convert(["to-shape-free", str(run), str(tmp_path / "state")]) == 0
    assert "57 weights with their optimizer states (exp_avg, exp_avg_sq), step 2, from 2 rank(s), ep_size 2, ZeRO 1" \
        in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["state.json", "tensors.safetensors"]
    assert_identical(load_shape_free(tmp_path / "state"), shape_free_of(run))
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    with pytest.raises(CheckpointError, match="already exists"):
        convert(["to-shape-free", str(run), str(tmp_path / "state")])


def test_a_resharded_checkpoint_keeps_the_state_and_a_model_states_only_one_is_refused(run, tmp_path):
    assert convert(["reshard", str(run), str(tmp_path / "ep1"), "--ep-size", "1", "--world-size", "1"]) == 0
    original, kept = shape_free_of(run), shape_free_of(tmp_path / "ep1")
    for name, tensor in original.master.items():
        assert torch.equal(kept.master[name], tensor), name
    assert kept.scalars == original.scalars and kept.param_state == original.param_state
    assert convert(["reshard", str(run), str(tmp_path / "bare"), "--ep-size", "1", "--world-size", "1",
                    "--model-states-only"]) == 0
    with pytest.raises(CheckpointError, match="model states only .* no optimizer state to carry"):
        shape_free_of(tmp_path / "bare")


def test_expert_names_go_from_local_to_global_index():
    assert global_expert_name(f"{EXPERT}.1.fc_in.weight", ep_rank=1, local_experts=2) == f"{EXPERT}.3.fc_in.weight"
    assert global_expert_name(f"{EXPERT}.1.fc_in.weight", ep_rank=0, local_experts=4) == f"{EXPERT}.1.fc_in.weight"
    assert global_expert_name(f"{EXPERT}.3.fc_in.weight", 1, 2, local=True) == f"{EXPERT}.1.fc_in.weight"
    dense = "widenet.encoder.attention.0.key.weight"
    assert global_expert_name(dense, 1, 2) == dense

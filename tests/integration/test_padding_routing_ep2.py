"""Padding stays out of the experts with expert parallelism: ep_size 2 over 2 launcher ranks, both dispatches,
other ids in the padding positions change nothing (logits, balance loss, routing statistics, the router's and
the experts' gradients), and the ranks' real-token routing equals ep_size 1 in one process."""

import pytest
import torch
from safetensors.torch import load_file

from tests.support.launching import REPO, run_deepspeed

pytestmark = [pytest.mark.multirank, pytest.mark.usefixtures("dist")]


def test_padding_changes_nothing_for_the_real_tokens_with_ep2(tmp_path):
    from tests.scripts import padding_expert_parallel as script

    run_deepspeed(REPO / "tests/scripts/padding_expert_parallel.py", [str(tmp_path / "ep2"), "2"], num_ranks=2)
    for rank in (0, 1):
        got = load_file(tmp_path / f"ep2.rank{rank}.safetensors")
        want = script.run(ep_size=1, rank=rank)
        mask = script.padded_batch(rank)[2]
        for dispatch in script.DISPATCHES:
            a = {k[len(dispatch) + 3:]: v for k, v in got.items() if k.startswith(f"{dispatch}.a.")}
            b = {k[len(dispatch) + 3:]: v for k, v in got.items() if k.startswith(f"{dispatch}.b.")}
            assert a.keys() == b.keys() and any(k.startswith("grad.") and "expert" in k for k in a)
            for name in a:  # the same machine, the same arithmetic: exactly equal
                assert torch.equal(a[name], b[name]), f"rank {rank} {dispatch} {name}"
            # real routes only, on this rank (capacity and counts are per rank, as DeepSpeed's)
            assert int(a["expert_counts"][0].sum()) == 2 * int(mask.sum())
            reference = {k[len(dispatch) + 3:]: v for k, v in want.items() if k.startswith(f"{dispatch}.a.")}
            for name in ("logits", "balance_loss", "dropped_fraction"):
                torch.testing.assert_close(a[name], reference[name], atol=1e-5, rtol=1e-5, msg=f"{dispatch} {name}")
            assert torch.equal(a["expert_counts"], reference["expert_counts"])
            if dispatch == "deepspeed":
                assert float(a["dropped_fraction"].max()) > 0, "capacity factor 0.5 drops real routes: capacity is exercised"

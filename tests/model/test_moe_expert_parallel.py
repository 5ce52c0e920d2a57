"""Expert parallelism is real: ep_size 2 over 2 launcher ranks equals ep_size 1 in one process."""

import pytest
import torch
from safetensors.torch import load_file

from tests.support.launching import REPO, run_deepspeed

pytestmark = [pytest.mark.multirank, pytest.mark.usefixtures("dist")]


def test_ep2_over_two_ranks_matches_ep1_in_one_process(tmp_path):
    from tests.scripts.expert_parallel_forward import build, fixed_batch

    run_deepspeed(REPO / "tests/scripts/expert_parallel_forward.py", [str(tmp_path / "ep2"), "2"], num_ranks=2)
    reference = build(ep_size=1)
    reference.ensure_process_groups()
    reference.eval()
    for rank in (0, 1):
        got = load_file(tmp_path / f"ep2.rank{rank}.safetensors")
        ids, mask, labels, sop = fixed_batch(rank)
        with torch.no_grad():
            want = reference(ids, None, mask, labels, sop)
        # Same weights (experts initialised by global index) and the same per-rank capacity: only float
        # summation order may differ, so a tight tolerance.
        torch.testing.assert_close(got["mlm_logits"], want.mlm_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["sop_logits"], want.sop_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["loss"][0], want.loss, atol=1e-5, rtol=1e-5)
        assert torch.equal(got["expert_counts"], want.routing.expert_counts)

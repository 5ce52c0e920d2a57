"""The collectives' value checks (launch/preflight_collectives.py): what a receiver makes of a peer's chunk sent to the
wrong rank, of values changed on the way, and of the right ones; both collectives on this process's 1-rank group.
Ranks whose peers swap what they send, for real: tests/launch/test_preflight_rank.py's hook run is not in the fast
lane; across two nodes, tests/integration/test_two_nodes.py."""

from __future__ import annotations

import pytest
import torch

from widenet_ds.launch.job_shape import JobShape
from widenet_ds.launch.preflight_collectives import (
    collective_rows,
    culprits,
    job_groups,
    rank_device,
    received_problems,
    sent_chunk,
)

WORLD, CHUNK = 4, 8


def received_by(me: int, peers: list[int], senders: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:
    """What `me` receives from `peers`; `senders`: position -> (src, dst) of the chunk that arrived instead."""
    senders = senders or {}
    return torch.cat([sent_chunk(*senders.get(p, (peer, me)), WORLD, CHUNK, "cpu") for p, peer in enumerate(peers)])


def test_the_right_values_pass_and_a_swapped_peer_is_named_as_the_sender():
    peers = [2, 3]
    assert received_problems(received_by(2, peers), peers, 2, WORLD, CHUNK) == []
    # rank 3 swapped its two chunks: rank 2 got what rank 3 meant for itself, and rank 3 what it meant for rank 2
    assert received_problems(received_by(2, peers, {1: (3, 3)}), peers, 2, WORLD, CHUNK) == [
        "rank 3 sent rank 2 the data meant for rank 3 (itself)"]
    assert received_problems(received_by(3, peers, {1: (3, 2)}), peers, 3, WORLD, CHUNK) == [
        "rank 3 sent rank 3 the data meant for rank 2"]
    # a chunk that took another sender's place: the receiver is named (no sender sent it wrong)
    assert received_problems(received_by(2, peers, {0: (3, 2)}), peers, 2, WORLD, CHUNK) == [
        "rank 2 got from rank 2 what rank 3 sent rank 2"]
    damaged = received_by(2, peers)
    damaged[CHUNK + 3] += 1
    assert received_problems(damaged, peers, 2, WORLD, CHUNK) == ["rank 2 got other values than rank 3 sent it"]
    assert culprits(["rank 3 sent rank 2 the data", "rank 3 sent rank 3 the data", "rank 0 got other values"],
                    ["node1", "node1", "node2", "node2"]) == ["node2", "node1"]


@pytest.mark.usefixtures("dist")
def test_on_one_rank_both_collectives_run_on_deepspeeds_groups_and_pass():
    name = job_groups(1, False)
    rows = collective_rows(JobShape((("node1", 1),), num_experts=4), ["node1"], name)
    assert [row.check for row in rows] == ["all-reduce", "all-to-all"] and all(row.passed for row in rows), rows
    assert rows[0].found.startswith("data-parallel rank 0 on node1: every sum right, ")
    assert rows[1].found == "--ep-size 1: no expert-parallel all-to-all between ranks"


def test_a_rank_takes_the_gpu_of_its_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    if torch.cuda.is_available():
        assert rank_device() == torch.device("cuda", 1)
    else:
        assert rank_device() == torch.device("cpu")

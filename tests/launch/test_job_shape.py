"""A job's shape (launch/job_shape.py): where its ranks sit, and DeepSpeed's groups over them."""

from __future__ import annotations

from widenet_ds.launch.job_shape import JobShape


def test_sixteen_ranks_on_two_nodes_with_eight_experts_in_groups_of_eight():
    shape = JobShape.even(2, 8, ep_size=8, num_experts=8)
    assert shape.world_size == 16 and shape.nodes == (("node 1", 8), ("node 2", 8))
    assert [shape.node_of(r) for r in (0, 7, 8, 15)] == ["node 1", "node 1", "node 2", "node 2"]
    assert shape.ranks_of(1) == range(8, 16)
    assert shape.expert_parallel_groups == [list(range(8)), list(range(8, 16))]
    assert shape.expert_data_parallel_groups == [[r, r + 8] for r in range(8)]
    assert [shape.experts_of(r) for r in (0, 3, 8, 11)] == [range(0, 1), range(3, 4), range(0, 1), range(3, 4)]
    assert shape.expert_data_parallel_place(11) == (2, 1)


def test_groups_of_two_spread_four_experts_and_a_dense_model_places_none():
    shape = JobShape.even(1, 4, ep_size=2, num_experts=4)
    assert shape.expert_parallel_groups == [[0, 1], [2, 3]]
    assert [shape.experts_of(r) for r in range(4)] == [range(0, 2), range(2, 4)] * 2
    assert shape.expert_data_parallel_groups == [[0, 2], [1, 3]]
    assert JobShape.even(1, 2).experts_of(1) == range(0)


def test_a_hostfile_of_uneven_nodes_numbers_the_ranks_in_node_order():
    shape = JobShape((("a", 2), ("b", 4)), branch_parallel=2)
    assert shape.world_size == 6 and (shape.node_of(1), shape.node_of(2)) == ("a", "b")
    assert shape.ranks_of(1) == range(2, 6)
    assert shape.branch_groups == [range(0, 2), range(2, 4), range(4, 6)]
    plan = shape.parallel_plan(5)
    assert (plan.rank, plan.data_parallel_size, plan.data_parallel_rank) == (5, 3, 2)

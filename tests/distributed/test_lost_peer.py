"""The one line of a rank whose peer died (distributed/lost_peer.py; the real case: tests/integration/test_two_nodes.py)."""

from __future__ import annotations

import pytest

from widenet_ds.distributed.lost_peer import lost_peer_message

# gloo's messages as torch 2.x raised them on the 2-node test cluster
RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.77.0.2]:4312: "
         "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.")
CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
          "[10.77.0.2]:5826. This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize("text", [RESET, CLOSED])
def test_a_lost_gloo_peer_is_named_with_the_checkpoint_to_resume_from(text, tmp_path):
    (tmp_path / "latest").write_text("step3")
    message = lost_peer_message(RuntimeError(text), 0, tmp_path)
    assert "rank 0 on " in message and "another rank at 10.77.0.2 " in message
    assert f"{tmp_path / 'step3'}, is kept: run the same command with --resume" in message


def test_without_a_checkpoint_it_says_to_start_again_and_other_errors_are_left_alone(tmp_path):
    assert "no checkpoint had been saved yet" in lost_peer_message(RuntimeError(RESET), 1, tmp_path)
    assert lost_peer_message(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), 0, tmp_path) is None


TIMED_OUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
             "300000ms for recv operation to complete")


def test_a_collective_that_timed_out_is_one_line_with_the_bound_and_the_checkpoint(tmp_path):
    """The peer is named where the rank's watch saw its heartbeat stand still (tests/distributed/test_peer_watch.py); here
    no watch runs: `another rank`."""
    (tmp_path / "latest").write_text("step6")
    message = lost_peer_message(RuntimeError(TIMED_OUT), 1, tmp_path)
    assert message.startswith("rank 1 on ") and "waited in a collective for its whole timeout, " in message
    assert "for another rank: its process or node has ended, hangs or is cut off" in message
    assert f"{tmp_path / 'step6'}, is kept: run the same command with --resume" in message


def test_a_user_error_that_mentions_a_timeout_is_left_to_say_itself(tmp_path):
    from widenet_ds.errors import (
        LaunchError,  # a RuntimeError as well, caught beside the transport's errors
    )

    assert lost_peer_message(LaunchError("the rendezvous timed out: set MASTER_ADDR"), 0, tmp_path) is None

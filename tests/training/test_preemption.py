"""The stop request (training/preemption.py): the preemption signals it catches, and TERM only once asked."""

from __future__ import annotations

import os
import signal

import pytest

from widenet_ds.training.preemption import StopRequest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_stop_request_catches_preemption_signals(sig):
    before = signal.getsignal(sig)
    stop = StopRequest()
    stop.install()
    try:
        assert not stop.agreed()
        os.kill(os.getpid(), sig)
        assert stop.agreed() and stop.signal_name == signal.Signals(sig).name
    finally:
        stop.uninstall()
    assert signal.getsignal(sig) == before


def test_stop_request_takes_term_only_once_asked_and_restores_both():
    """run_task catches USR1 from the start and TERM only after the rendezvous (widenet_ds/run/run_task.py)."""
    before = {sig: signal.getsignal(sig) for sig in StopRequest.SIGNALS}
    stop = StopRequest()
    stop.install(signal.SIGUSR1)
    try:
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
        stop.install(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed() and stop.signal_name == "SIGTERM"
    finally:
        stop.uninstall()
    assert {sig: signal.getsignal(sig) for sig in StopRequest.SIGNALS} == before

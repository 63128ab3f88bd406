"""The leader's pod dispatcher, by concern: ``pending`` (the pending table and the unschedulable verdict),
``choice`` (what is known of each worker and which one a pod goes to), ``links`` (one worker's dispatch
stream: connect, HELLO, read loop, heartbeat), ``lane`` (the topology lane: when a pod with inter-pod rules
may go out, and each DISPATCH's ``min_rv``), ``dispatcher`` (the ``Dispatcher`` that wires them)."""

from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.dispatch.pending import UNSCHEDULABLE_RETRY

__all__ = ["UNSCHEDULABLE_RETRY", "Dispatcher"]

"""The ways starting or stopping a local cluster fails, each a class that says when it is raised.

Every message is written for the person at the terminal: what went wrong, where the logs are, what to run next.
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """Base class: a local cluster could not be started, found or stopped."""


class ToolMissing(ClusterError):
    """A binary (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) is not in the bin directory;
    run ``make tools``."""


class DirectoryInUse(ClusterError):
    """The cluster directory holds a running cluster, a crashed run's leftovers, or files that are not ours.

    ``running`` is True when a recorded process still runs.
    """

    def __init__(self, message: str, *, running: bool) -> None:
        super().__init__(message)
        self.running = running


class NoCluster(ClusterError):
    """There is no cluster state (``state.json``) in the directory."""


class ComponentFailed(ClusterError):
    """A component exited, or was not ready in time. ``log_tail`` holds the last lines of its log."""

    def __init__(self, name: str, reason: str, *, log_path: str, log_tail: str) -> None:
        super().__init__(
            f"{name} {reason}.\n--- last lines of {log_path} ---\n{log_tail or '(log is empty)'}\n--- end of log ---"
        )
        self.name = name
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail

"""Free TCP ports on the loopback interface, so several clusters can run side by side.

``free_ports(n)`` binds ``n`` sockets to port 0 *at the same time* (so the kernel hands out ``n`` distinct
ports), reads the ports and closes the sockets. Between that and the component binding the port another process
may take it; the lifecycle detects a component that exits with "address already in use" and starts it again on
fresh ports (see ``lifecycle``). Nothing here reserves a port.
"""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that were free on ``host`` a moment ago."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports

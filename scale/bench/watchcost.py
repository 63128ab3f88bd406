"""What reading the pod watch costs a Python process, by way of reading it: the floor under every worker's CPU.

Every worker reads every pod event (its topology counts are cluster-wide), and so does a standalone worker; the
leader reads every pending pod. This measures what that reading alone costs, with nothing done with the events,
beside a scheduler placing a burst, so that a design of the sharded path can be judged before it is built:

- ``cluster``: the cluster-wide watch of ``/api/v1/pods`` as the workers open it (JSON), split into lines, not
  decoded: the transport (TLS, HTTP chunks, the event loop's wake-ups);
- ``cluster-decoded``: the same, each line decoded whole (``common.kube._event``: orjson), as the workers'
  reflector did before it cut ``metadata.managedFields`` from the bytes;
- ``cluster-stripped``: the same, each line decoded as the workers' reflector decodes it: without
  ``metadata.managedFields`` (``common.kube.without_managed_fields``, then ``_event``);
- ``cluster-thread``: ``cluster-decoded`` read by a blocking thread from its own TLS socket, with no event loop
  and no aiohttp (``Dechunker`` takes the chunked coding apart): whether the asyncio stack is what a read costs;
- ``cluster-thread-paced``: the same thread sleeping ``--pace-ms`` after each read, so the events that arrive
  meanwhile wait in the kernel's socket buffer and are taken in one wake-up: whether waking less often makes a
  read cheaper when the socket itself is not read meanwhile (``cluster-paused`` pauses only the TLS layer's
  delivery);
- ``cluster-paced`` and ``cluster-paused``: ``cluster-decoded`` read at most once per ``--pace-ms`` (after
  each read of what is buffered the reader sleeps, so the events that arrived meanwhile are taken in one
  wake-up of the reading task); ``cluster-paused`` also pauses the TLS transport's delivery while it sleeps
  (``pause_reading``: the bytes still leave the socket as they arrive, into the TLS layer's buffer). Whether
  reading in batches, at a few ms of delay, makes the read cheaper;
- ``cluster-protobuf``: the same watch in Kubernetes' protobuf encoding (``stream=watch``, length-prefixed
  frames), frames counted, not decoded: what the transport would cost in the encoding kube-scheduler uses;
- ``pending``: the leader's watch (``coordinator.dispatch.dispatcher.pending_selector``: the pods of ours in
  phase Pending), each line decoded as ``cluster-decoded`` does: what the coordinator's read costs apart from
  its dispatch work;
- ``pending-unbound``: the same with the leader's former selector, exactly the unbound pods of ours
  (``spec.nodeName=``): one event fewer per pod, and a 10-event buffer in the API server's watch cache (below);
- ``bound``: the watch of every bound pod (``spec.nodeName!=``), decoded: what a worker would read if it no
  longer saw pending pods (option O2 of ``docs/design/worker-pod-reads.md``);
- ``per-node``: one watch per node (``fieldSelector=spec.nodeName=NODE``, as each kubelet watches its pods) on
  every ``--share``-th node (2: half of them, one of two workers' shards), lines counted: what a worker would
  read if it watched the bound pods of its own nodes only;
- ``relay`` and ``relay-sink``: the fan-out of option O4 in ``docs/design/worker-pod-reads.md``, without a
  scheduler. The relay reads the cluster-wide watch as ``cluster-decoded`` does, derives from each event a
  *rule record* (``rule_record``: what a worker reads of another node's pod, plus the requests, ports and
  claims it reads of its own), drops the records that did not change (a pending pod not nominated, a status
  update) and sends what is left, batched per chunk of the watch, to ``--share`` sinks (one per worker) over
  local TCP in the dispatch link's framing (a 4-byte length, an HMAC-SHA256 of the frame's sequence and body,
  a msgpack body; ``common.protocol``). Each sink verifies and unpacks every frame and keeps the records by
  uid. For the relay, events and bytes are the watch's; for a sink, the records and frame bytes it received.
  Every sink gets every record: a real leader would send a node's full record to its owner only (a little
  less to read than measured here);
- ``relay-raw`` and ``relay-raw-sink``: the same fan-out with the watch's own lines in place of records: the
  relay decodes only the events of pending pods of ours (what a leader dispatching them reads), and sends every
  line as the API server wrote it, within ``--relay-flush-ms`` in one frame as ``relay`` batches (each line in a
  frame of its own when 0: ``relay`` sends a chunk's); each sink verifies every frame and decodes
  every line as ``cluster-decoded`` does. Whether a worker's read gets cheaper when the bytes come from a
  leader in batches instead of from its own watch.

``python -m scale.bench.watchcost [--nodes N] [--pods N] [--rounds N] [--scheduler NAME] [--share N] [--out DIR]``:
one local cluster (as ``bench paired`` builds it); a warm-up trial, not counted, then ``rounds`` trials. Each
trial starts the scheduler and one reader process per mode (``python -m scale.bench.watchcost read ...``),
waits until the scheduler is ready and the readers have settled, runs a burst (``bench cluster``'s
``run_workload``), and takes each reader's CPU (user + system, from psutil) over the burst per 1,000 pods, with
the events and bytes it read. The window is ``run_workload``'s: the burst and the deletion of its pods (each
pod's ADDED, binding, Running, deletionTimestamp and DELETED), so CPU per event is the figure to carry over to
another event mix. A reader whose stream ended before the burst did is reported as such and its trial not
averaged, except the ``pending``, ``pending-unbound`` and ``bound`` readers: they resume an ended stream from
the last resourceVersion they decoded, as the scheduler's reflector does (``common.watching``; after its
backoff, ``common.backoff.api_retry``, if the stream delivered nothing), and count it in ``resumed``. The API server can end a
``pending-unbound`` watch under a burst: a field selector that requires ``spec.nodeName`` to equal a value
(here "") gets a watcher buffer of 10 events (kube-apiserver's watch cache, ``suggestedWatchChannelSize``), and
a watcher whose buffer stays full is closed. The pod readers watch the pods of ``agent-scheduler``
(``DEFAULT_SCHEDULER_NAME``), whatever ``--scheduler`` runs. ``watchcost.json`` and ``summary.md`` go to
``--out``.

``--modes`` picks some of the readers (default: all; a sink runs only with its relay).

Nothing is asserted; the numbers are reported. They are a floor: a real worker does more per event, and a busy
one may read several events per wake-up where an idle reader wakes once per event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import msgpack
import psutil

from common.backoff import api_retry
from common.kube import (
    MAX_WATCH_EVENT,
    Credentials,
    KubeClient,
    _event,
    _lines,
    load_credentials,
    tls_context,
    without_managed_fields,
)
from common.protocol import MAC_SIZE, read_frame
from common.wellknown import DEFAULT_SCHEDULER_NAME
from coordinator.dispatch.dispatcher import pending_selector
from scale.bench import stages
from scale.bench.cluster import (
    BenchConfig,
    fresh_cluster,
    measured_kubeconfig,
    run_workload,
    until_ready,
    wait_quiet,
)
from scale.bench.schedulers import SCHEDULERS, grant_agent_rbac, launch
from scale.bench.workloads import BURST, default_workloads, scaled
from scale.cluster import ClusterOptions, generate_nodes
from scale.cluster.nodes import PREPULLED_FRACTION

log = logging.getLogger(__name__)

MODES = (
    "cluster",
    "cluster-decoded",
    "cluster-paced",
    "cluster-paused",
    "cluster-protobuf",
    "cluster-thread",
    "cluster-thread-paced",
    "cluster-stripped",
    "pending",
    "pending-unbound",
    "bound",
    "per-node",
    "relay",
    "relay-sink",
    "relay-raw",
    "relay-raw-sink",
)
PACED = ("cluster-paced", "cluster-paused", "cluster-thread-paced")
# the JSON readers that decode each event (the others count lines)
DECODED = ("cluster-decoded", "cluster-stripped", *PACED, "pending", "pending-unbound", "bound")
# the readers that open an ended stream again from the last resourceVersion they decoded, as the reflector does
RESUMING = ("pending", "pending-unbound", "bound")
# the field selector of a reader of one cluster-wide watch
SELECTORS = {
    "pending": pending_selector(DEFAULT_SCHEDULER_NAME),
    "pending-unbound": f"spec.schedulerName={DEFAULT_SCHEDULER_NAME},spec.nodeName=",
    "bound": "spec.nodeName!=",
}
RELAY, SINK = "relay", "relay-sink"
RAW_RELAY, RAW_SINK = "relay-raw", "relay-raw-sink"
RELAY_OF = {SINK: RELAY, RAW_SINK: RAW_RELAY}  # each sink's relay
# what the raw relay decodes (as the leader decodes the pending pods of ours): the events that contain both,
# in the API server's JSON (Go's encoder writes no blanks; a name it would escape is not ours)
OURS = f'"schedulerName":"{DEFAULT_SCHEDULER_NAME}"'.encode()
PENDING = b'"phase":"Pending"'
THREADS = ("cluster-thread", "cluster-thread-paced")
THREAD_FAILURES: list[str] = []  # the cluster-thread reader's, if it failed
RELAY_KEY = (
    b"watchcost-relay"  # the frames' MAC key: a fixed key, since the cost, not the secrecy, is measured
)
SINK_CONNECT_S = 30.0  # a sink retries its connection this long while its relay starts
MODULE = "scale.bench.watchcost"  # what the readers run (``__name__`` is "__main__" under ``-m``)
PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;stream=watch"
SETTLE_S = 20.0  # after the readers start: 500 per-node watches take seconds to open on a 2-core host
READER_STOP_S = 10.0


@dataclass(slots=True)
class Reading:
    """What one reader read, written when it stops."""

    mode: str
    watches: int = 0
    events: int = 0
    bytes: int = 0
    ended: int = 0  # streams that ended before the reader was stopped (their events stopped counting)
    resumed: int = 0  # streams that ended and were opened again from the last resourceVersion (``RESUMING``)
    records: int = 0  # relay: the records sent to each sink


class FrameCounter:
    """Counts the frames of a protobuf watch stream (each a 4-byte big-endian length, then that many bytes)
    across the chunks they arrive in."""

    def __init__(self) -> None:
        self.frames = 0
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        start = 0
        while len(self._buf) - start >= 4:
            size = int.from_bytes(self._buf[start : start + 4], "big")
            if len(self._buf) - start - 4 < size:
                break
            start += 4 + size
            self.frames += 1
        del self._buf[:start]


def every_nth(names: Sequence[str], share: int) -> list[str]:
    """The nodes one of ``share`` workers would own: every ``share``-th of the sorted names."""
    if share < 1:
        raise ValueError(f"share must be at least 1, got {share}")
    return sorted(names)[::share]


def field_selectors(mode: str, nodes: Sequence[str], share: int) -> list[str]:
    """The field selector of each watch a ``mode`` reader opens ("": every pod)."""
    if mode == "per-node":
        return [f"spec.nodeName={node}" for node in every_nth(nodes, share)]
    return [SELECTORS.get(mode, "")]


async def _watch(
    session: aiohttp.ClientSession,
    server: str,
    reading: Reading,
    *,
    resource_version: str,
    mode: str,
    field_selector: str = "",
    pace_s: float = 0.0,
) -> None:
    rv = resource_version
    first = True
    backoff = api_retry()
    while True:
        events = reading.events
        rv = await _stream(
            session,
            server,
            reading,
            resource_version=rv,
            mode=mode,
            field_selector=field_selector,
            pace_s=pace_s,
            first=first,
        )
        first = False
        if mode not in RESUMING:
            reading.ended += 1
            return
        reading.resumed += 1
        if reading.events == events:
            await backoff.sleep()  # no spinning on a server that ends every stream at once
        else:
            backoff.reset()


async def _stream(
    session: aiohttp.ClientSession,
    server: str,
    reading: Reading,
    *,
    resource_version: str,
    mode: str,
    field_selector: str,
    pace_s: float,
    first: bool,
) -> str:
    """Read one watch stream from ``resource_version`` until the API server ends it (counted in ``watches``
    if it is the ``first`` of its reader); the last resourceVersion decoded by a resuming reader
    (``resource_version`` if none)."""
    rv = resource_version
    query = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "3600"}
    if field_selector:
        query["fieldSelector"] = field_selector
    headers = {"Accept": PROTOBUF_WATCH} if mode == "cluster-protobuf" else None
    timeout = aiohttp.ClientTimeout(total=None)
    async with session.get(server + "/api/v1/pods", params=query, headers=headers, timeout=timeout) as resp:
        if resp.status != 200:
            raise RuntimeError(f"watch answered {resp.status}: {(await resp.read())[:200]!r}")
        if first:
            reading.watches += 1
        if mode == "cluster-protobuf":
            frames = FrameCounter()
            async for chunk in resp.content.iter_any():
                reading.bytes += len(chunk)
                frames.feed(chunk)
                reading.events = frames.frames
        else:
            content: Any = resp.content
            if mode in PACED:
                transport = (
                    resp.connection.transport if mode == "cluster-paused" and resp.connection else None
                )
                content = _Paced(resp.content, pace_s, transport)
            async for line in _lines(content, MAX_WATCH_EVENT, "/api/v1/pods"):
                reading.bytes += len(line) + 1
                if line.strip():
                    reading.events += 1
                    if mode in DECODED:
                        decoded = without_managed_fields(line) if mode == "cluster-stripped" else line
                        _, obj = _event(decoded, "/api/v1/pods")
                        if mode in RESUMING:
                            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
    return rv


class Dechunker:
    """HTTP/1.1 chunked transfer coding taken apart, and the body split into lines: ``feed`` takes the bytes
    as they arrive, in pieces of any size, and returns the complete lines they finish; ``ended`` is set by the
    last (zero-size) chunk."""

    def __init__(self) -> None:
        self._framing = bytearray()  # bytes not yet taken apart
        self._body = bytearray()  # body bytes after the last newline
        # bytes left of the current chunk's data; -1: a size line next; -2: the data's CRLF next
        self._need = -1
        self.ended = False

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        framing = self._framing
        framing += data
        pos = 0
        while not self.ended:
            if self._need > 0:
                take = min(self._need, len(framing) - pos)
                self._body += framing[pos : pos + take]
                pos += take
                self._need -= take
                if self._need:
                    break
                self._need = -2
            if self._need == -2:
                if len(framing) - pos < 2:
                    break
                pos += 2
                self._need = -1
            eol = framing.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(framing[pos:eol]).split(b";")[0], 16)
            pos = eol + 2
            if size == 0:
                self.ended = True
            self._need = size
        del framing[:pos]
        if b"\n" not in self._body:
            return []
        *lines, tail = bytes(self._body).split(b"\n")
        self._body = bytearray(tail)
        return lines


def _thread_watch(
    creds: Credentials, rv: str, reading: Reading, halt: threading.Event, pace_s: float
) -> None:
    """The cluster-wide watch read by a blocking thread from its own TLS socket (no event loop, no aiohttp),
    de-chunked and decoded here: each ``recv_into`` takes whatever the kernel buffered. A failure is kept in
    ``THREAD_FAILURES``."""
    try:
        url = urlsplit(creds.server)
        raw = socket.create_connection((url.hostname or "", url.port or 443))
        sock = tls_context(creds).wrap_socket(raw, server_hostname=url.hostname)
        sock.settimeout(0.5)  # to look at ``halt``
        auth = f"Authorization: Bearer {creds.token}\r\n" if creds.token else ""
        request = (
            f"GET /api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=3600 HTTP/1.1\r\n"
            f"Host: {url.netloc}\r\nAccept: application/json\r\n{auth}\r\n"
        )
        sock.sendall(request.encode())
        head = bytearray()
        while b"\r\n\r\n" not in head:
            part = sock.recv(65536)
            if not part:
                raise RuntimeError(f"watch closed before its headers ended: {bytes(head[:200])!r}")
            head += part
        status, _, rest = bytes(head).partition(b"\r\n\r\n")
        if not status.startswith(b"HTTP/1.1 200") or b"chunked" not in status.lower():
            raise RuntimeError(f"watch answered {status[:200]!r}")
        reading.watches += 1
        stream = Dechunker()
        into = bytearray(1 << 20)
        view = memoryview(into)

        def take(data: bytes | memoryview) -> None:
            for line in stream.feed(data):
                if line.strip():
                    reading.events += 1
                    reading.bytes += len(line) + 1
                    _event(line, "/api/v1/pods")

        take(rest)
        while not stream.ended and not halt.is_set():
            try:
                got = sock.recv_into(into)
            except TimeoutError:
                continue
            if not got:
                break
            take(view[:got])
            if pace_s <= 0:
                continue
            # take what else is buffered (each TLS record is a read of its own), then sleep: what arrives
            # meanwhile waits in the kernel's socket buffer
            sock.settimeout(0.0)
            try:
                while (got := sock.recv_into(into)) and not stream.ended:
                    take(view[:got])
            except (ssl.SSLWantReadError, BlockingIOError):
                pass
            finally:
                sock.settimeout(0.5)
            halt.wait(pace_s)
        if not halt.is_set():
            reading.ended += 1
    except Exception as e:  # the trial's failure, reported
        THREAD_FAILURES.append(repr(e))


class _Paced:
    """A stream read at most once per ``pace_s``: after each read of what is buffered, the reader sleeps, so
    the events that arrive meanwhile are taken in one wake-up (``cluster-paused`` also pauses the transport's
    reading while it sleeps)."""

    def __init__(
        self,
        content: aiohttp.StreamReader,
        pace_s: float,
        transport: Any,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._content = content
        self._pace_s = pace_s
        self._transport = transport
        self._sleep = sleep

    async def iter_any(self) -> AsyncIterator[bytes]:
        async for chunk in self._content.iter_any():
            yield chunk
            if self._transport is not None:
                self._transport.pause_reading()
            await self._sleep(self._pace_s)
            if self._transport is not None:
                self._transport.resume_reading()


def rule_record(event_type: str, obj: dict[str, Any]) -> list[Any] | None:
    """What the relay sends for one watch event: a deletion's key and uid, or a placed or nominated pod's
    namespace, name, uid, labels, node, whether it is terminating, nominated node, priority, its required
    anti-affinity terms, claims, host ports and container requests; None for a pod a worker does not read
    (pending and not nominated)."""
    meta = obj.get("metadata") or {}
    key = [meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")]
    if event_type == "DELETED":
        return ["D", *key]
    spec = obj.get("spec") or {}
    node = spec.get("nodeName") or ""
    nominated = (obj.get("status") or {}).get("nominatedNodeName") or ""
    if not node and not nominated:
        return None
    anti = ((spec.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []
    claims = [
        v["persistentVolumeClaim"].get("claimName", "")
        for v in spec.get("volumes") or ()
        if isinstance(v, dict) and isinstance(v.get("persistentVolumeClaim"), dict)
    ]
    containers = spec.get("containers") or ()
    requests = [(c.get("resources") or {}).get("requests") or {} for c in containers]
    ports = [p.get("hostPort") for c in containers for p in c.get("ports") or () if p.get("hostPort")]
    return [
        "P",
        *key,
        meta.get("labels") or {},
        node,
        bool(meta.get("deletionTimestamp")),
        nominated,
        spec.get("priority") or 0,
        anti,
        claims,
        ports,
        requests,
    ]


class Sealer:
    """One direction of one stream: frames sealed as ``common.protocol.Session`` seals them (HMAC-SHA256 of
    a sequence number and the body under a key hashed once)."""

    def __init__(self) -> None:
        self._keyed = hmac.new(RELAY_KEY, digestmod=hashlib.sha256)
        self.seq = 0

    def mac(self, body: bytes) -> bytes:
        h = self._keyed.copy()
        h.update(self.seq.to_bytes(8, "big"))
        h.update(body)
        self.seq += 1
        return h.digest()


class Fanout:
    """A relay's sinks, and what it has not sent them yet: ``add`` queues items, sent at once (``flush_s`` 0)
    or within ``flush_s`` of the first one not sent yet, in one frame per sink (``pack`` makes its body),
    sealed as the dispatch link seals its frames."""

    def __init__(self, reading: Reading, pack: Callable[[list[Any]], bytes], flush_s: float) -> None:
        self._reading = reading
        self._pack = pack
        self._flush_s = flush_s
        self._sinks: list[tuple[asyncio.StreamWriter, Sealer]] = []
        self._pending: list[Any] = []
        self._timer: asyncio.TimerHandle | None = None
        self._listener: asyncio.Server | None = None

    async def listen(self, port: int) -> None:
        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._sinks.append((writer, Sealer()))

        self._listener = await asyncio.start_server(accept, "127.0.0.1", port)

    def add(self, items: list[Any]) -> None:
        if not items:
            return
        self._pending += items
        if self._flush_s <= 0:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self.flush)

    def flush(self) -> None:
        self._timer = None
        if not self._pending:
            return
        self._reading.records += len(self._pending)
        body = self._pack(self._pending)
        self._pending = []
        for writer, sealer in self._sinks:
            writer.write((MAC_SIZE + len(body)).to_bytes(4, "big") + sealer.mac(body) + body)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._listener is not None:
            self._listener.close()
        for writer, _ in self._sinks:
            writer.close()


@contextlib.asynccontextmanager
async def _pod_watch(
    session: aiohttp.ClientSession, server: str, reading: Reading, rv: str
) -> AsyncIterator[aiohttp.ClientResponse]:
    """The cluster-wide pod watch from ``rv``, counted in ``reading.watches`` once it is answered."""
    query = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "3600"}
    timeout = aiohttp.ClientTimeout(total=None)
    async with session.get(server + "/api/v1/pods", params=query, timeout=timeout) as resp:
        if resp.status != 200:
            raise RuntimeError(f"watch answered {resp.status}: {(await resp.read())[:200]!r}")
        reading.watches += 1
        yield resp


def _packed(records: list[Any]) -> bytes:
    return cast(bytes, msgpack.packb(records, use_bin_type=True))


async def relay(
    session: aiohttp.ClientSession, server: str, reading: Reading, rv: str, port: int, *, flush_s: float = 0.0
) -> None:
    """Read the cluster-wide watch; send the changed rule records to every connected sink: each watch
    chunk's at once, or (``flush_s`` > 0) those of every chunk read within ``flush_s`` of the first one not
    sent yet, in one frame (fewer frames, each record later by up to ``flush_s``)."""
    fanout = Fanout(reading, _packed, flush_s)
    await fanout.listen(port)
    last: dict[str, list[Any]] = {}
    try:
        async with _pod_watch(session, server, reading, rv) as resp:
            buf = b""
            async for chunk in resp.content.iter_any():
                reading.bytes += len(chunk)
                *lines, buf = (buf + chunk).split(b"\n")
                changed = []
                for line in lines:
                    if not line.strip():
                        continue
                    reading.events += 1
                    kind, obj = _event(line, "/api/v1/pods")
                    record = rule_record(kind, obj)
                    uid = str((obj.get("metadata") or {}).get("uid", ""))
                    if record is None or (kind != "DELETED" and last.get(uid) == record):
                        continue
                    if kind == "DELETED":
                        last.pop(uid, None)
                    else:
                        last[uid] = record
                    changed.append(record)
                fanout.add(changed)
        reading.ended += 1
    finally:
        fanout.close()


async def raw_relay(
    session: aiohttp.ClientSession, server: str, reading: Reading, rv: str, port: int, *, flush_s: float = 0.0
) -> None:
    """Read the cluster-wide watch; decode only the events of pending pods of ours (``OURS`` and ``PENDING``
    in the line: what a leader dispatching them reads of them); send every event's line as the API server
    wrote it to every connected sink: each line at once, or (``flush_s`` > 0) those read within ``flush_s``
    of the first one not sent yet, in one frame."""
    fanout = Fanout(reading, b"\n".join, flush_s)
    await fanout.listen(port)
    try:
        async with _pod_watch(session, server, reading, rv) as resp:
            async for line in _lines(resp.content, MAX_WATCH_EVENT, "/api/v1/pods"):
                reading.bytes += len(line) + 1
                if not line.strip():
                    continue
                reading.events += 1
                if OURS in line and PENDING in line:
                    _event(line, "/api/v1/pods")
                fanout.add([line])
        reading.ended += 1
    finally:
        fanout.close()


async def sink(reading: Reading, port: int, *, raw: bool = False) -> None:
    """Read the relay's frames: verify each, unpack it, keep its records by uid."""
    deadline = time.monotonic() + SINK_CONNECT_S
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    reading.watches += 1
    opener = Sealer()
    pods: dict[str, list[Any]] = {}
    objects: dict[str, dict[str, Any]] = {}
    try:
        while True:
            try:
                mac, body = await read_frame(reader)
            except asyncio.IncompleteReadError:
                break
            if not hmac.compare_digest(mac, opener.mac(body)):
                raise RuntimeError(f"frame {opener.seq - 1} not authenticated")
            reading.bytes += 4 + MAC_SIZE + len(body)
            if raw:  # the watch's lines: decoded and kept as the workers' reflector keeps them
                for line in body.split(b"\n"):
                    reading.events += 1
                    kind, obj = _event(line, "/api/v1/pods")
                    uid = str((obj.get("metadata") or {}).get("uid", ""))
                    if kind == "DELETED":
                        objects.pop(uid, None)
                    else:
                        objects[uid] = obj
                continue
            for record in msgpack.unpackb(body):
                reading.events += 1
                if record[0] == "D":
                    pods.pop(record[3], None)
                else:
                    pods[record[3]] = record
        reading.ended += 1
    finally:
        writer.close()


async def read(mode: str, kubeconfig: str, share: int, port: int = 0, flush_s: float = 0.0) -> dict[str, Any]:
    """Read the pod watch the ``mode`` way until SIGTERM; what was read (a ``Reading``, and why watches
    failed)."""
    reading = Reading(mode)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if mode in RELAY_OF:
        task = asyncio.create_task(sink(reading, port, raw=mode == RAW_SINK))
        await stop.wait()
        return asdict(reading) | {"failed": await _stopped(task)}
    creds = load_credentials(kubeconfig)
    async with KubeClient(creds) as lister:
        rv = str((await lister.get("/api/v1/pods", {"limit": "1"}))["metadata"]["resourceVersion"])
        nodes = [str(n["metadata"]["name"]) for n in (await lister.get("/api/v1/nodes"))["items"]]
    if mode in THREADS:
        halt = threading.Event()
        pace_s = flush_s if mode == "cluster-thread-paced" else 0.0
        worker = threading.Thread(target=_thread_watch, args=(creds, rv, reading, halt, pace_s), daemon=True)
        worker.start()
        await stop.wait()
        halt.set()
        await asyncio.to_thread(worker.join, READER_STOP_S)
        return asdict(reading) | {"failed": list(THREAD_FAILURES)}
    selectors = field_selectors(mode, nodes, share)
    # One connection per watch (HTTP/1.1). The raw stream is read beneath ``KubeClient.watch`` (its session,
    # ``common.kube``'s line splitter and event decoder): what is measured is the transport and, by mode, the
    # decoding, with the client's TLS and authentication.
    async with KubeClient(creds, max_connections=len(selectors) + 4) as client:
        if mode in (RELAY, RAW_RELAY):
            relaying = relay if mode == RELAY else raw_relay
            task = asyncio.create_task(
                relaying(client._session, client.creds.server, reading, rv, port, flush_s=flush_s)
            )
            await stop.wait()
            return asdict(reading) | {"failed": await _stopped(task)}
        tasks = [
            asyncio.create_task(
                _watch(
                    client._session,
                    client.creds.server,
                    reading,
                    resource_version=rv,
                    mode=mode,
                    field_selector=selector,
                    pace_s=flush_s,
                )
            )
            for selector in selectors
        ]
        await stop.wait()
        failed = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return asdict(reading) | {"failed": [str(e) for e in failed]}


async def _stopped(task: asyncio.Task[None]) -> list[str]:
    """Cancel ``task``; why it failed before, if it did."""
    failed = [str(task.exception())] if task.done() and not task.cancelled() and task.exception() else []
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return failed


@dataclass(slots=True)
class ReaderResult:
    mode: str
    trial: int
    cpu_s_per_1k_pods: float
    events_per_pod: float
    bytes_per_pod: float
    watches: int
    ended: int
    failed: list[str] = field(default_factory=list)
    resumed: int = 0

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s_per_1k_pods * 1000 / self.events_per_pod if self.events_per_pod else 0.0

    @property
    def valid(self) -> bool:
        return not self.ended and not self.failed and self.watches > 0


def summary(results: Sequence[ReaderResult], scheduler_cpu: Sequence[float], share: int) -> str:
    """A Markdown table: each mode's mean (min-max) CPU-s per 1,000 pods over its valid trials, events and
    bytes per pod; then the scheduler's own CPU per 1,000 pods in the same trials, for scale."""

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        return f"{statistics.fmean(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    lines = [
        "| reader | trials | CPU-s/1k pods | µs CPU/event | events/pod | KB/pod | watches | resumed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        mine = [r for r in results if r.mode == mode]
        ok = [r for r in mine if r.valid]
        if not mine:
            continue
        name = {
            "per-node": f"per-node (1 of {share} shards)",
            SINK: f"relay-sink (each of {share})",
            RAW_SINK: f"relay-raw-sink (each of {share})",
        }.get(mode, mode)
        trials = f"{len(ok)}" + (f" (+{len(mine) - len(ok)} invalid)" if len(ok) < len(mine) else "")
        lines.append(
            f"| {name} | {trials} | {spread([r.cpu_s_per_1k_pods for r in ok], '.3f')} "
            f"| {spread([r.cpu_us_per_event for r in ok], '.0f')} "
            f"| {spread([r.events_per_pod for r in ok], '.2f')} "
            f"| {spread([r.bytes_per_pod / 1000 for r in ok], '.1f')} | {max((r.watches for r in ok), default=0)} "
            f"| {spread([float(r.resumed) for r in ok], '.1f') if mode in RESUMING else '-'} |"
        )
    if scheduler_cpu:
        lines.append(f"\nThe scheduler itself: {spread(list(scheduler_cpu), '.3f')} CPU-s/1k pods.")
    return "\n".join(lines)


async def _stop_readers(procs: Sequence[asyncio.subprocess.Process]) -> None:
    """SIGTERM each reader still running (it writes its reading), then wait for it; kill it (our own child, by
    its PID) if it does not end in ``READER_STOP_S``."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), READER_STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"failed": [f"no reading: {e}"]}
    return data if isinstance(data, dict) else {"failed": ["no reading"]}


@dataclass(kw_only=True, slots=True)
class WatchCostConfig:
    nodes: int = 1000
    pods: int = 2000
    rounds: int = 3
    scheduler: str = "agent-standalone"
    share: int = 2
    modes: tuple[str, ...] = MODES
    relay_flush_ms: float = 0.0
    pace_ms: float = 5.0
    out: Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reader_labels(modes: Sequence[str], share: int) -> list[tuple[str, str]]:
    """(label, mode) of every reader process a trial starts: one per mode, the relay's sinks one per share,
    after their relay (a sink without its relay is not started)."""
    labels: list[tuple[str, str]] = []
    for mode in MODES:
        if mode not in modes or (mode in RELAY_OF and RELAY_OF[mode] not in modes):
            continue
        if mode in RELAY_OF:
            labels += [(f"{mode}-{i}", mode) for i in range(1, share + 1)]
        else:
            labels.append((mode, mode))
    return labels


async def run(config: WatchCostConfig) -> tuple[list[ReaderResult], list[float]]:
    config.out.mkdir(parents=True, exist_ok=True)
    workload = scaled(
        default_workloads(config.nodes, burst=config.pods, pods=config.pods, rate=None)[BURST],
        pull_delay_s=0.0,
    )
    fleet = generate_nodes(config.nodes, prepulled=PREPULLED_FRACTION)
    bench = BenchConfig(nodes=[config.nodes], schedulers=[config.scheduler], out=config.out, pull_delay_s=0.0)
    spec = SCHEDULERS[config.scheduler]
    results: list[ReaderResult] = []
    scheduler_cpu: list[float] = []
    cluster = await fresh_cluster(
        Path(tempfile.mkdtemp(prefix=f"bench-watchcost-{config.nodes}-")),
        config.nodes,
        ClusterOptions(),
    )
    try:
        await asyncio.to_thread(stages.install, cluster)
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, _ = measured_kubeconfig(cluster, await grant_agent_rbac(client))
            for trial in range(config.rounds + 1):  # trial 0: the warm-up
                running = launch(spec, cluster, config.out / "logs", kubeconfig=kubeconfig, tag=f"w{trial}")
                readers: dict[str, tuple[str, asyncio.subprocess.Process, Path]] = {}
                try:
                    why = await until_ready(client, spec, running, nodes=config.nodes, fleet=fleet, notes=[])
                    if why:
                        raise RuntimeError(f"{config.scheduler} did not get ready: {why}")
                    ports = {RELAY: _free_port(), RAW_RELAY: _free_port()}
                    for label, mode in reader_labels(config.modes, config.share):
                        out = config.out / f"reader-{trial}-{label}.json"
                        argv = [sys.executable, "-m", MODULE, "read", mode, str(kubeconfig), str(out)]
                        port = ports.get(RELAY_OF.get(mode, mode), 0)
                        argv += ["--share", str(config.share), "--port", str(port)]
                        flush_ms = config.pace_ms if mode in PACED else config.relay_flush_ms
                        argv += ["--flush-ms", str(flush_ms)]
                        readers[label] = (mode, await asyncio.create_subprocess_exec(*argv), out)
                    await asyncio.sleep(SETTLE_S)
                    await wait_quiet(cluster, running, cores=bench.quiet_cores, max_wait=30.0)
                    procs = {label: psutil.Process(p.pid) for label, (_, p, _) in readers.items()}
                    before = {m: sum(p.cpu_times()[:2]) for m, p in procs.items()}
                    result = await run_workload(
                        client,
                        cluster,
                        running,
                        workload,
                        nodes=config.nodes,
                        fleet=fleet,
                        config=bench,
                        notes=[],
                    )
                    after = {m: sum(p.cpu_times()[:2]) for m, p in procs.items()}
                finally:
                    running.stop()
                    # sinks first: a relay stopped before them would end their streams, which reads as a failure
                    await _stop_readers([proc for mode, proc, _ in readers.values() if mode in RELAY_OF])
                    await _stop_readers([proc for mode, proc, _ in readers.values() if mode not in RELAY_OF])
                if trial == 0:
                    continue
                scheduler_cpu.append(result.cpu_s_per_1k_pods)
                pods = max(result.pods, 1)
                for label, (mode, _, out) in readers.items():
                    data: dict[str, Any] = _load(out)
                    results.append(
                        ReaderResult(
                            mode=mode,
                            trial=trial,
                            cpu_s_per_1k_pods=(after[label] - before[label]) / pods * 1000,
                            events_per_pod=int(data.get("events", 0)) / pods,
                            bytes_per_pod=int(data.get("bytes", 0)) / pods,
                            watches=int(data.get("watches", 0)),
                            ended=int(data.get("ended", 0)),
                            resumed=int(data.get("resumed", 0)),
                            failed=list(data.get("failed", [])),
                        )
                    )
                log.info(
                    "trial %d: %s", trial, summary(results[-len(readers) :], scheduler_cpu[-1:], config.share)
                )
    finally:
        await asyncio.to_thread(cluster.stop)
    return results, scheduler_cpu


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scale.bench.watchcost", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="action")
    reader = sub.add_parser("read", help="one reader (started by the run)")
    reader.add_argument("mode", choices=MODES)
    reader.add_argument("kubeconfig")
    reader.add_argument("out", type=Path)
    reader.add_argument("--share", type=int, default=2)
    reader.add_argument("--port", type=int, default=0, help="the relay's, for relay and relay-sink")
    reader.add_argument("--flush-ms", type=float, default=0.0)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scheduler", default="agent-standalone")
    parser.add_argument("--share", type=int, default=2, help="per-node reads every SHARE-th node")
    parser.add_argument("--modes", default=",".join(MODES), help="the readers, comma-separated")
    parser.add_argument(
        "--relay-flush-ms",
        type=float,
        default=0.0,
        help="the relay sends its records at most this often (0: each watch chunk's at once)",
    )
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=5.0,
        help="cluster-paced, cluster-paused and cluster-thread-paced read the watch at most this often",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.share < 1 or args.nodes < 1 or args.pods < 1 or args.rounds < 1:
        parser.error("--share, --nodes, --pods and --rounds must be positive")
    if args.relay_flush_ms < 0 or args.pace_ms < 0:
        parser.error("--relay-flush-ms and --pace-ms must not be negative")
    if args.action == "read":
        import uvloop

        args.out.write_text(
            json.dumps(
                uvloop.run(read(args.mode, args.kubeconfig, args.share, args.port, args.flush_ms / 1000))
            )
        )
        return 0
    if args.scheduler not in SCHEDULERS:
        parser.error(f"--scheduler: one of {', '.join(sorted(SCHEDULERS))}")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or (unknown := set(modes) - set(MODES)):
        parser.error(f"--modes: some of {', '.join(MODES)} (not {', '.join(sorted(unknown)) or 'none'})")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    out = (args.out or Path("results") / f"bench-watchcost-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    config = WatchCostConfig(
        nodes=args.nodes,
        pods=args.pods,
        rounds=args.rounds,
        scheduler=args.scheduler,
        share=args.share,
        modes=modes,
        relay_flush_ms=args.relay_flush_ms,
        pace_ms=args.pace_ms,
        out=out,
    )
    results, scheduler_cpu = asyncio.run(run(config))
    text = summary(results, scheduler_cpu, config.share)
    (out / "watchcost.json").write_text(
        json.dumps(
            {
                "config": {k: str(v) for k, v in asdict(config).items()},
                "readers": [asdict(r) for r in results],
                "scheduler_cpu_s_per_1k_pods": scheduler_cpu,
            },
            indent=1,
        )
    )
    (out / "summary.md").write_text(
        f"Readers of the pod watch beside {config.scheduler}, bursts of {config.pods} pods on {config.nodes} "
        f"nodes, {config.rounds} trials after a warm-up; mean (min-max)\n\n{text}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One worker link: the leader's end of one worker's dispatch stream (``common.protocol``).

Lifecycle: connect to the worker's address (again every ``CONNECT_RETRY`` while it is unreachable), run the
protocol's handshake under the current dispatch key (HELLO with this term, the worker's WELCOME within
``HELLO_TIMEOUT``, then a PING at once as the first session frame: the worker takes the stream only after it),
then read frames until the stream breaks, a frame is malformed or fails its MAC, the worker sends ERROR, or
nothing arrives for ``DEAD_AFTER`` (declared at most ``DEADLINE_SLACK`` later); then close, tell the owner,
and connect again, until ``stop``. While connected the link sends PING every ``HEARTBEAT_INTERVAL`` (checked as
frames arrive; the worker's CAPACITY, sent when it changes and at least every ``HEARTBEAT_INTERVAL``, keeps them
coming, and its PONG keeps an idle stream alive). Every frame it writes
is sealed by the stream's ``protocol.Session``.

Writes: through the stream's ``protocol.Outbox``: frames are written together at most ``protocol.COALESCE``
after the first of them was sent (or at ``flush`` or ``drain``: the dispatch loop flushes after each pass; the
first PING is written at once), in the order they were sent; a broken stream's unwritten frames are dropped.
Backpressure: ``flush`` says whether the write buffer is above its high-water mark, and ``drain`` then waits for
it to flush, but at most ``DRAIN_WAIT``, so a worker that has stopped reading (paused, partitioned) slows the
dispatch loop by at most that per pass until its stream is declared dead; a dead stream is aborted, its unsent
buffer discarded (its pods are re-dispatched).

A link knows nothing of pods. It tells its ``LinkEvents`` (given at construction) three things, always with
itself as the first argument so the owner can tell a current link from one it has already replaced:
``link_up`` once the worker has welcomed the stream, ``received`` for every CAPACITY, ACK and RESULT,
and ``link_down`` after the stream closed (whatever in flight over it is then the owner's to re-dispatch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from common import protocol
from common.keyring import Keys, NoSecret

log = logging.getLogger(__name__)

CONNECT_RETRY = 0.5
DRAIN_WAIT = 0.25  # longest a drain waits for one worker to read
DEADLINE_SLACK = 0.5  # a silent stream is declared dead up to this long after DEAD_AFTER (see ``_read``)

Inbound = protocol.Capacity | protocol.Ack | protocol.Result


class Transport(Protocol):
    """What the dispatcher needs of a link: whose it is, whether it is connected, and a way to send."""

    @property
    def worker_id(self) -> str: ...

    @property
    def connected(self) -> bool: ...

    def send(self, message: protocol.Message) -> None:
        """Queue one message on the stream; dropped if the stream is not connected (its ``link_down``
        follows, or has already been told)."""

    def flush(self) -> bool:
        """Write what was sent so far (without waiting); True if ``drain`` would wait: the stream's write
        buffer is above its high-water mark (the worker reads slower than we write)."""

    async def drain(self) -> None:
        """Wait until the stream's write buffer is flushed, or a bounded while (never raises)."""

    def stop(self) -> None:
        """Close the stream for good (the worker left, or the term ended)."""


class LinkEvents(Protocol):
    def link_up(self, link: Transport) -> None: ...

    def received(self, link: Transport, message: Inbound) -> None: ...

    def link_down(self, link: Transport) -> None: ...


LinkFactory = Callable[[str, str, LinkEvents], Transport]
"""Builds and starts the link to one worker: ``(worker_id, address, events) -> link``."""


class Link:
    def __init__(
        self,
        worker_id: str,
        address: str,
        events: LinkEvents,
        *,
        leader_id: str,
        term: int,
        keys: Keys | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.address = address
        self.events = events
        self.leader_id = leader_id
        self.term = term
        self.keys: Keys = keys or NoSecret()
        self.clock = clock
        self._outbox: protocol.Outbox | None = None  # the current stream's sending half, while up
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Link:
        self._task = asyncio.create_task(self._run(), name=f"link-{self.worker_id}")
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @property
    def connected(self) -> bool:
        return self._outbox is not None and not self._outbox.writer.is_closing()

    def send(self, message: protocol.Message) -> None:
        if self._outbox is not None:
            self._outbox.send(message)

    def flush(self) -> bool:
        return self._outbox is not None and self._outbox.above_high_water()

    async def drain(self) -> None:
        outbox = self._outbox
        if outbox is not None and not outbox.writer.is_closing():
            with contextlib.suppress(ConnectionError, TimeoutError):
                await outbox.drain(DRAIN_WAIT)

    async def _run(self) -> None:
        host, _, port = self.address.rpartition(":")
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError as e:
                log.debug("worker %s at %s not reachable: %s", self.worker_id, self.address, e)
                await asyncio.sleep(CONNECT_RETRY)
                continue
            up = False
            try:
                async with asyncio.timeout(protocol.HELLO_TIMEOUT):
                    session = await self._handshake(reader, writer)
                outbox = self._outbox = protocol.Outbox(writer, session)
                outbox.send(protocol.Ping(ts=time.time()))  # the first session frame: the worker takes us now
                outbox.flush()
                up = True
                self.events.link_up(self)
                await self._read(reader, outbox.session)
            except (asyncio.IncompleteReadError, ConnectionError, protocol.ProtocolError, TimeoutError) as e:
                log.warning("stream to worker %s broke: %s", self.worker_id, e)
            finally:
                writer.transport.abort()  # not close(): that would wait to flush to a worker that may not read
                if self._outbox is not None:
                    self._outbox.discard()
                    self._outbox = None
                if up:
                    self.events.link_down(self)
            await asyncio.sleep(CONNECT_RETRY)

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> protocol.Session:
        key, nonce = self.keys.current(), protocol.new_nonce()
        writer.write(protocol.seal_hello(key, protocol.Hello(self.leader_id, self.term, nonce)))
        welcome = await protocol.read_reply(reader, key, nonce)
        return protocol.Session(key, hello_nonce=nonce, welcome_nonce=welcome.nonce, leader=True)

    async def _read(self, reader: asyncio.StreamReader, session: protocol.Session) -> None:
        last_ping = self.clock()
        loop = asyncio.get_running_loop()
        # Liveness: one deadline for the whole stream, pushed back as frames arrive, but only once it is
        # nearer than DEAD_AFTER (at most every DEADLINE_SLACK): a stream is declared dead after DEAD_AFTER to
        # DEAD_AFTER + DEADLINE_SLACK without a frame. (A ``wait_for`` per frame cost a task per frame, the
        # larger part of reading one.)
        dead_after = protocol.DEAD_AFTER
        async with asyncio.timeout_at(loop.time() + dead_after + DEADLINE_SLACK) as deadline:
            while True:
                msg = await session.read(reader)
                arrived = loop.time()
                if (deadline.when() or 0.0) < arrived + dead_after:
                    deadline.reschedule(arrived + dead_after + DEADLINE_SLACK)
                now = self.clock()
                self._received(msg)
                if now - last_ping >= protocol.HEARTBEAT_INTERVAL:
                    self.send(protocol.Ping(ts=time.time()))
                    last_ping = now

    def _received(self, msg: protocol.Message) -> None:
        match msg:
            case protocol.Capacity() | protocol.Ack() | protocol.Result():
                self.events.received(self, msg)
            case protocol.Error(message):
                raise protocol.ProtocolError(f"worker says: {message}")
            case _:
                # WELCOME and PONG only prove the worker alive (the deadline in ``_read`` is the liveness
                # check); leader-to-worker messages coming back are ignored
                log.debug("ignoring %s from worker %s", type(msg).__name__, self.worker_id)

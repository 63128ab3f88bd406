"""The parts of ``scale.bench.watchcost`` that need no cluster: frame counting, the per-node share, the summary,
the relay's records, its fan-out and its sinks' reading of them, the thread reader's de-chunking."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket

import msgpack
import pytest

from common.protocol import MAC_SIZE, read_frame
from scale.bench import watchcost
from scale.bench.watchcost import (
    Dechunker,
    Fanout,
    FrameCounter,
    ReaderResult,
    Reading,
    Sealer,
    _Paced,
    _watch,
    every_nth,
    field_selectors,
    main,
    reader_labels,
    rule_record,
    sink,
    summary,
)


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_frames_are_counted_across_the_chunks_they_arrive_in() -> None:
    stream = _frame(b"a" * 300) + _frame(b"") + _frame(b"b" * 5)
    counter = FrameCounter()
    start = 0
    for end in (1, 3, 150, 304, 306, 309):  # inside a length, inside a payload, on a frame's end
        counter.feed(stream[start:end])
        start = end
    assert counter.frames == 2  # the last frame is not complete yet
    counter.feed(stream[start:])
    assert counter.frames == 3


def test_per_node_reads_every_nth_sorted_node() -> None:
    assert every_nth(["n3", "n1", "n2", "n4"], 2) == ["n1", "n3"]
    assert every_nth(["n1", "n2"], 1) == ["n1", "n2"]
    with pytest.raises(ValueError, match="at least 1"):
        every_nth(["n1"], 0)


def test_each_reader_watches_what_its_mode_says() -> None:
    nodes = ["n2", "n1", "n3"]
    assert field_selectors("cluster-decoded", nodes, 2) == [""]
    # the leader's watch: the pods of ours in phase Pending; its former one, the unbound pods of ours
    assert field_selectors("pending", nodes, 2) == ["spec.schedulerName=agent-scheduler,status.phase=Pending"]
    assert field_selectors("pending-unbound", nodes, 2) == [
        "spec.schedulerName=agent-scheduler,spec.nodeName="
    ]
    assert field_selectors("bound", nodes, 2) == ["spec.nodeName!="]
    assert field_selectors("per-node", nodes, 2) == ["spec.nodeName=n1", "spec.nodeName=n3"]


@pytest.mark.parametrize(
    ("mode", "resumes"),
    [("pending", True), ("pending-unbound", True), ("bound", True), ("cluster-decoded", False)],
)
async def test_the_leaders_and_the_bound_reader_resume_an_ended_stream_from_the_last_version(
    mode: str, resumes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []

    firsts: list[bool] = []

    async def stream(
        _session: object, _server: str, reading: Reading, *, resource_version: str, first: bool, **__: object
    ) -> str:
        opened.append(resource_version)
        firsts.append(first)
        if len(opened) == 3:
            raise RuntimeError("watch answered 500")  # how a reader's reading ends (or its cancellation)
        reading.events += 10
        return str(int(resource_version) + 10)  # the API server ended the stream after some events

    monkeypatch.setattr(watchcost, "_stream", stream)
    reading = Reading(mode)
    if resumes:
        with pytest.raises(RuntimeError):
            await _watch(None, "", reading, resource_version="5", mode=mode)  # type: ignore[arg-type]
        assert opened == ["5", "15", "25"]
        assert firsts == [True, False, False]  # one watch, resumed twice
        assert (reading.resumed, reading.ended) == (2, 0)
    else:
        await _watch(None, "", reading, resource_version="5", mode=mode)  # type: ignore[arg-type]
        assert opened == ["5"]
        assert (reading.resumed, reading.ended) == (0, 1)


def _result(mode: str, cpu: float, *, ended: int = 0, failed: list[str] | None = None) -> ReaderResult:
    return ReaderResult(
        mode=mode,
        trial=1,
        cpu_s_per_1k_pods=cpu,
        events_per_pod=5.0,
        bytes_per_pod=12_000.0,
        watches=500 if mode == "per-node" else 1,
        ended=ended,
        failed=failed or [],
    )


def test_the_summary_averages_valid_trials_and_counts_the_others() -> None:
    results = [
        _result("cluster", 0.3),
        _result("cluster", 0.5),
        _result("cluster", 9.0, ended=1),  # its stream ended early: what it read is not the whole burst
        _result("per-node", 0.2),
        _result("cluster-decoded", 0.4, failed=["watch answered 403"]),
    ]
    text = summary(results, [1.0, 1.2], share=2)
    assert (
        "| cluster | 2 (+1 invalid) | 0.400 (0.300-0.500) | 80 (60-100) | 5.00 (5.00-5.00) | 12.0 (12.0-12.0) | 1 |"
        in text
    )
    assert "| per-node (1 of 2 shards) | 1 | 0.200 (0.200-0.200) | 40 (40-40) |" in text
    assert "| cluster-decoded | 0 (+1 invalid) | - | - |" in text
    assert "cluster-protobuf" not in text  # not run
    assert "The scheduler itself: 1.100 (1.000-1.200) CPU-s/1k pods." in text


def test_a_bad_share_is_refused_before_any_cluster_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--share", "0"])
    assert exit_info.value.code == 2
    assert "must be positive" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--pace-ms", "--relay-flush-ms"])
def test_a_negative_delay_is_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([flag, "-1"])
    assert exit_info.value.code == 2
    assert "must not be negative" in capsys.readouterr().err


class _Chunks:
    """A stream's ``iter_any``: the chunks given, each read logged."""

    def __init__(self, chunks: list[bytes], log: list[str]) -> None:
        self.chunks = chunks
        self.log = log

    async def iter_any(self):  # type: ignore[no-untyped-def]
        for chunk in self.chunks:
            self.log.append(f"read {chunk.decode()}")
            yield chunk


class _Transport:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def pause_reading(self) -> None:
        self.log.append("pause")

    def resume_reading(self) -> None:
        self.log.append("resume")


@pytest.mark.parametrize("paused", [False, True])
async def test_a_paced_read_passes_every_chunk_and_sleeps_between_reads(paused: bool) -> None:
    log: list[str] = []

    async def sleep(seconds: float) -> None:
        log.append(f"sleep {seconds}")

    transport = _Transport(log) if paused else None
    paced = _Paced(_Chunks([b"a", b"b"], log), 0.005, transport, sleep)  # type: ignore[arg-type]
    async for chunk in paced.iter_any():
        log.append(f"got {chunk.decode()}")
    between = ["pause", "sleep 0.005", "resume"] if paused else ["sleep 0.005"]
    assert log == ["read a", "got a", *between, "read b", "got b", *between]


def test_a_bad_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--modes", "relay,cluster-json"])
    assert "not cluster-json" in capsys.readouterr().err


def test_a_trial_starts_one_sink_per_share_and_only_with_its_relay() -> None:
    assert reader_labels(("relay", "relay-sink", "cluster"), 2) == [
        ("cluster", "cluster"),
        ("relay", "relay"),
        ("relay-sink-1", "relay-sink"),
        ("relay-sink-2", "relay-sink"),
    ]
    assert reader_labels(("relay-sink", "per-node"), 2) == [("per-node", "per-node")]
    assert reader_labels(("relay-raw-sink", "relay-raw", "relay-sink"), 2) == [
        ("relay-raw", "relay-raw"),
        ("relay-raw-sink-1", "relay-raw-sink"),
        ("relay-raw-sink-2", "relay-raw-sink"),
    ]


def _pod(*, node: str = "", nominated: str = "", **spec: object) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u1", "labels": {"app": "a"}},
        "spec": {"nodeName": node, **spec} if node else dict(spec),
        "status": {"nominatedNodeName": nominated} if nominated else {},
    }


def test_the_relay_sends_what_a_worker_reads_of_a_placed_or_nominated_pod_and_nothing_of_a_pending_one() -> (
    None
):
    assert rule_record("ADDED", _pod()) is None  # pending, not nominated: only its dispatch matters
    assert rule_record("DELETED", _pod()) == ["D", "ns", "p", "u1"]
    anti = [{"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a"}}}]
    placed = rule_record(
        "MODIFIED",
        _pod(
            node="n1",
            priority=5,
            affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": anti}},
            volumes=[
                {"name": "v", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "e", "emptyDir": {}},
            ],
            containers=[
                {"resources": {"requests": {"cpu": "1"}}, "ports": [{"hostPort": 80}, {"containerPort": 8}]}
            ],
        ),
    )
    assert placed == [
        "P",
        "ns",
        "p",
        "u1",
        {"app": "a"},
        "n1",
        False,
        "",
        5,
        anti,
        ["data"],
        [80],
        [{"cpu": "1"}],
    ]
    nominated = rule_record("MODIFIED", _pod(nominated="n2"))
    assert nominated is not None and nominated[5:8] == ["", False, "n2"]


async def test_a_sink_keeps_the_records_of_authentic_frames_and_stops_at_a_forged_one() -> None:
    def frame(sealer: Sealer, records: list[list[object]], *, forge: bool = False) -> bytes:
        body: bytes = msgpack.packb(records, use_bin_type=True)
        mac = sealer.mac(body)
        if forge:
            mac = bytes([mac[0] ^ 1]) + mac[1:]
        return (MAC_SIZE + len(body)).to_bytes(4, "big") + mac + body

    async def serve(frames: list[bytes]) -> tuple[asyncio.Server, int]:
        async def send(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for f in frames:
                writer.write(f)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(send, "127.0.0.1", 0)
        sock: socket.socket = server.sockets[0]
        return server, int(sock.getsockname()[1])

    sealer = Sealer()
    placed = ["P", "ns", "p", "u1", {}, "n1", False, "", 0, [], [], [], []]
    server, port = await serve(
        [frame(sealer, [placed, ["P", "ns", "q", "u2"]]), frame(sealer, [["D", "ns", "q", "u2"]])]
    )
    async with server:
        reading = Reading("relay-sink")
        await sink(reading, port)
        assert (reading.watches, reading.events, reading.ended) == (1, 3, 1)

    forger = Sealer()
    server, port = await serve([frame(forger, [placed]), frame(forger, [placed], forge=True)])
    async with server:
        reading = Reading("relay-sink")
        with pytest.raises(RuntimeError, match="frame 1 not authenticated"):
            await sink(reading, port)
        assert reading.events == 1


@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_the_dechunker_gives_every_line_whatever_pieces_the_bytes_come_in(piece: int) -> None:
    lines = [b'{"type":"ADDED","object":{"n":' + str(i).encode() + b"}}" for i in range(5)]
    body = b"".join(line + b"\n" for line in lines)
    # chunks that do not follow the lines: one splits a line, one holds two and a half
    cuts = [0, 10, 40, 41, 130, len(body)]
    chunked = b"".join(
        f"{b - a:x}".encode() + (b";ext=1" if i == 1 else b"") + b"\r\n" + body[a:b] + b"\r\n"
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
        if b > a
    )
    last = len(chunked)  # where the last chunk's size line begins
    chunked += b"0\r\n\r\n"
    stream = Dechunker()
    got: list[bytes] = []
    for i in range(0, len(chunked), piece):
        assert stream.ended == (i >= last + 3)
        got += stream.feed(chunked[i : i + piece])
    assert got == lines
    assert stream.ended


async def test_a_raw_sink_decodes_every_line_of_authentic_frames() -> None:
    sealer = Sealer()
    lines = [b'{"type":"ADDED","object":{"metadata":{"uid":"u' + str(i).encode() + b'"}}}' for i in range(3)]
    deleted = b'{"type":"DELETED","object":{"metadata":{"uid":"u1"}}}'
    frames = [b"\n".join(lines), deleted]

    async def send(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for body in frames:
            writer.write((MAC_SIZE + len(body)).to_bytes(4, "big") + sealer.mac(body) + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(send, "127.0.0.1", 0)
    sock: socket.socket = server.sockets[0]
    async with server:
        reading = Reading("relay-raw-sink")
        await sink(reading, int(sock.getsockname()[1]), raw=True)
    assert (reading.watches, reading.events, reading.ended) == (1, 4, 1)


async def test_the_fanout_sends_at_once_or_batches_within_the_flush_interval() -> None:
    async def frames_received(flush_s: float, batches: list[list[bytes]]) -> tuple[list[bytes], int]:
        reading = Reading("relay-raw")
        fanout = Fanout(reading, b"|".join, flush_s)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        await fanout.listen(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0.05)  # the sink is accepted
        for items in batches:
            fanout.add(items)
        await asyncio.sleep(flush_s + 0.05)
        fanout.close()
        opener, bodies = Sealer(), []
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                mac, body = await read_frame(reader)
                assert mac == opener.mac(body)
                bodies.append(body)
        writer.close()
        return bodies, reading.records

    assert await frames_received(0.0, [[b"a", b"b"], [], [b"c"]]) == ([b"a|b", b"c"], 3)
    assert await frames_received(0.05, [[b"a", b"b"], [b"c"]]) == ([b"a|b|c"], 3)

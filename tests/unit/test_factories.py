"""The builders in factories.py produce events that decode back to their inputs."""

from inferprobe.collector.model.events import EventType, HttpFlag, HttpKind

from tests.factories import conn_open, decoded, request, sse_chunk


def test_request_builder_round_trips():
    (r,) = decoded(request(7, "/v1/chat/completions", ts=5000))
    assert r.type == EventType.SOCK_READ and r.kind == HttpKind.REQUEST
    assert (r.conn_id, r.method, r.path) == (7, "POST", "/v1/chat/completions")
    assert (r.ts_ns, r.exit_ns) == (5000, 5010)
    assert r.content_length == 50


def test_chunk_and_open_builders_round_trip():
    chunk, opened = decoded(sse_chunk(3, events=2, done=True), conn_open(3, port=4321))
    assert chunk.sse_events == 2 and HttpFlag.SSE_DONE in chunk.flags
    assert opened.type == EventType.CONN_OPEN and opened.peer_port == 4321


def test_usdt_builder_round_trips():
    from inferprobe.collector.model.events import UsdtProbe

    from tests.factories import usdt

    (u,) = decoded(usdt(UsdtProbe.REQUEST_END, 9, 16, 1, pid=5, tid=6, ts=777))
    assert (u.probe, u.args, u.pid, u.tid, u.ts_ns) == (UsdtProbe.REQUEST_END, (9, 16, 1), 5, 6, 777)


def test_an_sse_exchange_in_a_recording_is_one_complete_request_with_its_tokens():
    from inferprobe.collector.ingest.pipeline import ingest

    from tests.factories import MS, recording, sse_exchange

    t0 = 5_000 * MS
    rec = recording(sse_exchange(4, t0, [10, 12, 15], headers_ms=2), duration_s=3)
    assert rec.complete and rec.final["duration_s"] == 3
    assert list(rec.meta["probe_sets"]["active"]) == ["sockets"]
    (r,) = ingest(rec.events).requests
    assert (r.conn, r.path, r.status, r.outcome.value) == (4, "/v1/completions", 200, "complete")
    # a request starts when its read returns (io() makes each syscall last 10 ns); writes count at entry
    assert r.t_ingress_ns == t0 + 10 and r.t_response_start_ns == t0 + 2 * MS
    assert r.token_ns == [t0 + 10 * MS, t0 + 12 * MS, t0 + 15 * MS]
    assert r.ttft_ns == 10 * MS - 10

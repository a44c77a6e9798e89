"""The serve front door (experiments.serve.front_door) on loopback, before real roles, driven by raw sockets and the
`openai` client: a client gone mid-stream ends the router's call and is recorded failed, not as a short success;
clients that reset before the first write are each recorded; past the router's bound on calls
(maximum_concurrent_rpcs = grpc_threads) a streamed request gets HTTP 429, not a 200 stream with nothing in it;
SIGTERM lets a request in flight finish, records it, and the door exits 0. (The front door in the topology:
tests/emulation/test_serve.py.)"""

import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager

import openai
import pytest

from pdd_harness import REPO, free_port, running
from test_roles import wait_for

ROUTER_CALLS = 12  # the deployment's grpc_threads: the router takes this many calls at once


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    d = tmp_path_factory.mktemp("front-door")
    # few decode sessions, so few server threads: the router's bound on calls is in reach of a test
    with running(d, grpc_threads=ROUTER_CALLS, decode={"max_sessions": 4}) as deployment:
        yield deployment


@contextmanager
def front_door(dep, tmp_path, *options):
    """A front door process in front of dep's router: (port, its client.jsonl, the process, its output so far)."""
    port, log = free_port(), tmp_path / "client.jsonl"
    argv = [
        sys.executable,
        "-m",
        "experiments.serve.front_door",
        "--router",
        dep.cfg.router.grpc_address,
        "--tokenizer",
        str(REPO / "experiments" / "tokenizers" / "tiny"),
        "--model",
        "pddlab-tiny",
        "--context",
        "128",
        "--log",
        str(log),
        f"--listen=127.0.0.1:{port}",
        *options,
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    try:
        assert "front door ready" in proc.stdout.readline()
        threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True).start()
        yield port, log, proc, output
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _records(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _n_records(log, n: int) -> list[dict] | None:
    recs = _records(log)
    return recs if len(recs) >= n else None


def _raw_post(port: int, body: dict) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return s


def _client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=60)


def test_a_client_gone_mid_stream_is_recorded_failed_and_its_call_ends(dep, tmp_path):
    with front_door(dep, tmp_path) as (port, log, _, _):
        body = {"model": "pddlab-tiny", "prompt": "go away", "max_tokens": 120, "stream": True}
        with _raw_post(port, body) as s:
            got = b""
            while b"data: " not in got:  # the headers, then the stream has begun ...
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
        # ... and the client is gone: the door notices at its next write, ends the router's call, records it
        (rec,) = wait_for(lambda: _records(log), timeout_s=30, what="the request's record")
        assert rec["error"] == "CANCELLED: the client closed the connection" and len(rec["tokens"]) < 120, rec
        rid = rec["router_id"]
        wait_for(
            lambda: [e for e in dep.events("router") if e.request_id == rid and e.event != "arrival"][-1:],
            what="the router to see the request end",
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'pddlab:requests_failed_total{code="CANCELLED"} 1.0' in text
        assert "vllm:request_success_total{" not in text  # not counted a success
        # the door keeps serving
        assert (
            _client(port)
            .completions.create(model="pddlab-tiny", prompt="still here", max_tokens=4)
            .usage.completion_tokens
            == 4
        )


def test_clients_that_reset_before_the_first_write_are_each_recorded_without_a_traceback(dep, tmp_path):
    with front_door(dep, tmp_path) as (port, log, _, output):
        for i in range(10):
            s = _raw_post(port, {"model": "pddlab-tiny", "prompt": f"bye {i}", "max_tokens": 60, "stream": True})
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST, at once
            s.close()
        recs = wait_for(lambda: _n_records(log, 10), timeout_s=60, what="10 records")
        # each one failed (none was read to its end): the client gone, or refused under the burst (4 decode sessions)
        errors = [r["error"] for r in recs]
        assert all(e == "CANCELLED: the client closed the connection" or "RESOURCE_EXHAUSTED" in e for e in errors), (
            errors
        )
        assert _client(port).completions.create(model="pddlab-tiny", prompt="next", max_tokens=2).usage
    assert not [line for line in output if "Traceback" in line or "Error handling request" in line], output


def test_past_the_routers_bound_on_calls_a_streamed_request_gets_429_not_an_empty_200(dep, tmp_path):
    n = ROUTER_CALLS + 6
    outcomes: list = [None] * n
    start = threading.Barrier(n)

    def one(i: int) -> None:
        client = _client(port)
        start.wait()
        try:
            stream = client.completions.create(model="pddlab-tiny", prompt=f"load {i}", max_tokens=80, stream=True)
            outcomes[i] = "".join(c.choices[0].text for c in stream if c.choices)
        except openai.APIStatusError as err:
            outcomes[i] = err

    with front_door(dep, tmp_path) as (port, log, _, _):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
        assert refused, outcomes  # the router refused those past its bound: RESOURCE_EXHAUSTED -> 429
        assert all(int(o.response.headers["Retry-After"]) >= 1 for o in refused)
        assert all(isinstance(o, (str, openai.RateLimitError)) for o in outcomes), outcomes
        assert all(o for o in outcomes if isinstance(o, str)), outcomes  # every 200 carried text
        recs = wait_for(lambda: _n_records(log, n), timeout_s=30, what="every record")
        assert sum((r["error"] or "").startswith("RESOURCE_EXHAUSTED") for r in recs) == len(refused), recs


def test_sigterm_lets_a_request_in_flight_finish_records_it_and_the_door_exits_0(dep, tmp_path):
    with front_door(dep, tmp_path, "--drain-s=30") as (port, log, proc, _):
        stream = _client(port).completions.create(model="pddlab-tiny", prompt="last one", max_tokens=100, stream=True)
        chunks = iter(stream)
        first = next(chunks)
        proc.send_signal(signal.SIGTERM)
        rest = list(chunks)
        assert proc.wait(30) == 0
        with pytest.raises(OSError):  # it stopped listening
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    (rec,) = _records(log)
    assert rec["error"] is None and len(rec["tokens"]) == 100, rec
    assert first.choices and rest[-1].choices[0].finish_reason == "length"

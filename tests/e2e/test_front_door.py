"""The serve front door (experiments.serve.front_door) on loopback, before the roles: a streaming client that goes
away mid-stream ends the router's call and is recorded as failed, not as a short success; the door keeps
serving. (The front door in the topology, driven by the openai package: tests/emulation/test_serve.py.)"""

import json
import socket
import subprocess
import sys
import urllib.request

import pytest

from pdd_harness import REPO, free_port, running
from test_roles import wait_for


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    d = tmp_path_factory.mktemp("front-door")
    with running(d) as dep:
        port = free_port()
        log = d / "client.jsonl"
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
        ]
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert "front door ready" in proc.stdout.readline()
            yield port, log, dep
        finally:
            proc.kill()
            proc.wait(10)


def _records(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_client_gone_mid_stream_is_recorded_failed_and_its_call_ends(door):
    port, log, dep = door
    body = json.dumps({"model": "pddlab-tiny", "prompt": "go away", "max_tokens": 120, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
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
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"model": "pddlab-tiny", "prompt": "still here", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] == 4

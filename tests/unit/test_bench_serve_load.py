"""The load benchmark's accounting (benchmarks/bench_serve_load.py), without the topology: each way a request can end,
as the `openai` client meets it from a real HTTP server on loopback, classified; the step's counts, percentiles
of the admitted only, goodput under the SLO, the table; the session's processes and their RSS; a serve stand-in
stopped by SIGTERM, or SIGKILL past the grace period."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from aiohttp import web

from benchmarks import bench_serve_load as bench
from benchmarks.bench_serve_load import ADMITTED, FAILED, REFUSED, Outcome, Step
from experiments.spec.experiment import SLO

MAX_TOKENS = 4


def _chunk(content=None, role=False, finish=None, usage=None) -> bytes:
    delta = {"role": "assistant", "content": ""} if role else ({} if content is None else {"content": content})
    body = {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": usage,
    }
    return f"data: {json.dumps(body)}\n\n".encode()


USAGE = {"prompt_tokens": 9, "completion_tokens": MAX_TOKENS, "total_tokens": 9 + MAX_TOKENS}


async def _chat(request: web.Request) -> web.StreamResponse:
    """What the stand-in answers depends on the model asked for."""
    how = (await request.json())["model"]
    if how in ("429", "503", "500", "504"):
        return web.json_response({"error": {"message": "busy", "type": "x", "code": how}}, status=int(how))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk(role=True))
    n = {"ok": MAX_TOKENS, "short": 2, "error-mid": 1, "empty": 0, "cut": 1}[how]
    for i in range(n):
        await asyncio.sleep(0.01)
        await resp.write(_chunk(f"t{i}"))
    if how == "cut":  # the connection dropped mid-stream
        request.transport.close()
        return resp
    if how == "error-mid":
        await resp.write(b'data: {"error": {"message": "CANCELLED: gone", "type": "server_error", "code": null}}\n\n')
    else:
        await resp.write(_chunk(finish="length"))
        usage = dict(USAGE, completion_tokens=n)
        await resp.write(_chunk(usage=usage))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _outcomes(kinds: list[str]) -> list[Outcome]:
    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=10)
        try:
            return [await bench.one_request(client, k, "hello", MAX_TOKENS) for k in kinds]
        finally:
            await client.close()
            await runner.cleanup()

    return asyncio.run(go())


def test_each_way_a_request_ends_is_classified_as_the_client_meets_it():
    kinds = ["ok", "429", "503", "500", "504", "empty", "short", "error-mid", "cut"]
    got = dict(zip(kinds, _outcomes(kinds)))
    assert got["ok"].kind == ADMITTED and got["ok"].output_tokens == MAX_TOKENS and got["ok"].prompt_tokens == 9
    assert got["ok"].ttft_ms > 0 and got["ok"].tpot_ms > 0 and got["ok"].e2e_ms >= got["ok"].ttft_ms
    assert [got[k].kind for k in ("429", "503")] == [REFUSED, REFUSED]
    assert [(got[k].kind, got[k].status) for k in ("500", "504")] == [(FAILED, 500), (FAILED, 504)]
    assert got["empty"].kind == FAILED and "no content" in got["empty"].reason
    assert got["short"].kind == FAILED and got["short"].reason == f"short: 2 of {MAX_TOKENS} tokens"
    assert got["error-mid"].kind == FAILED and "CANCELLED: gone" in got["error-mid"].reason
    assert got["cut"].kind == FAILED


def test_ttft_and_tpot_from_the_content_times_and_the_servers_token_count():
    out = bench.stream_outcome(10.0, [10.5, 10.6, 10.9], 11.0, completion_tokens=4, max_tokens=4)
    assert out.kind == ADMITTED
    assert out.ttft_ms == pytest.approx(500) and out.e2e_ms == pytest.approx(1000)
    assert out.tpot_ms == pytest.approx(400 / 3)  # 4 tokens in 3 chunks (a UTF-8 character held back)
    assert bench.stream_outcome(10.0, [10.5], 11.0, None, 1).tpot_ms is None


def _ok(ttft: float, tpot: float) -> Outcome:
    return Outcome(ADMITTED, status=200, ttft_ms=ttft, tpot_ms=tpot, e2e_ms=ttft + 10 * tpot, output_tokens=24)


def test_a_steps_counts_percentiles_of_the_admitted_and_goodput_under_the_slo():
    outcomes = [_ok(100.0 * i, 10.0) for i in range(1, 11)]  # TTFT 100..1000 ms: all within 1000 ms
    outcomes[-1].tpot_ms = 200.0  # over the TPOT SLO
    outcomes += [bench.refused_or_failed(429, "busy"), bench.refused_or_failed(503), bench.refused_or_failed(500)]
    outcomes.append(Outcome(FAILED, "a 200 stream with no content", 200, ttft_ms=1.0, tpot_ms=1.0))
    row = bench.summarize(Step(8, sent=15, outcomes=outcomes, duration_s=3.0), SLO(ttft_ms=1000, tpot_ms=150))
    assert (row["admitted"], row["refused"], row["failed"], row["unaccounted"]) == (10, 2, 2, 1)
    assert row["ttft_ms"]["p50"] == pytest.approx(550) and row["ttft_ms"]["p99"] == pytest.approx(991)
    assert row["tpot_ms"]["p50"] == pytest.approx(10)
    assert row["meeting_slo"] == 9 and row["goodput_rps"] == pytest.approx(3.0)
    assert row["reasons"] == {"HTTP 429": 1, "HTTP 503": 1, "HTTP 500": 1, "a 200 stream with no content": 1}


def test_a_step_with_nothing_admitted_has_no_percentiles_and_zero_goodput():
    row = bench.summarize(Step(4, 2, [bench.refused_or_failed(429)] * 2, 1.0), SLO())
    assert row["ttft_ms"] == {"p50": None, "p99": None} and row["goodput_rps"] == 0 and row["unaccounted"] == 0


def test_the_table_has_a_line_per_step_and_a_dash_for_what_was_not_measured():
    rss = {"front-door": 120.4, "p1": 500.0, "md1": 600.0, "router": 100.0, "serve": 300.0, "other": 5.0}
    rows = [
        bench.summarize(Step(1, 2, [_ok(100, 10), _ok(200, 20)], 1.0, rss), SLO()),
        bench.summarize(Step(48, 1, [bench.refused_or_failed(429)], 1.0), SLO()),
    ]
    lines = bench.table(rows).splitlines()
    assert len(lines) == 4 and lines[1].count("---") == lines[0].count("|") - 1
    assert lines[2] == "| 1 | 2 | 2 | 0 | 0 | 0 | 150 / 199 | 15.0 / 19.9 | 2.00 (2) | 120 | 1200 |"
    assert lines[3] == "| 48 | 1 | 0 | 1 | 0 | 0 | - / - | - / - | 0.00 (0) | - | - |"


def test_processes_are_named_front_door_worker_serve_or_other():
    door = [sys.executable, "-m", "experiments.serve.front_door", "--worker=p1=10.0.0.1:1"]
    role = ["taskset", "-c", "0", sys.executable, "-m", "workers.roles.prefill", "--config", "c", "--worker", "p1"]
    assert bench.process_name(door, 5, 1) == "front-door"
    assert bench.process_name(role[3:], 5, 1) == "p1" and bench.process_name(role, 5, 1) == "p1"
    assert bench.process_name(["bash", "--worker", "x"], 5, 1) == "other"
    assert bench.process_name(door, 1, 1) == "serve"


def test_rss_of_the_session_tree_and_the_recorded_pids(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        time.sleep(1.0)
        assert child.pid in bench.descendants(os.getpid())
        assert bench.rss_kib(child.pid) > 60 * 1024
        (tmp_path / "testbed-77.json").write_text(json.dumps({"owner": 77, "procs": [{"pid": child.pid}]}))
        assert bench.recorded_pids(77, tmp_path) == [child.pid] and bench.recorded_pids(78, tmp_path) == []
        by_name = bench.rss_by_name(os.getpid(), tmp_path)
        assert by_name["serve"] > 10 and by_name["other"] > 60
    finally:
        child.kill()
        child.wait()
    assert bench.rss_kib(child.pid) is None


# A stand-in for `pddlab serve`: /v1/models on PORT; exits 0 on SIGTERM, or ignores it (IGNORE).
STAND_IN = """
import json, signal, sys, http.server
port, ignore = int(sys.argv[1]), sys.argv[2] == "ignore"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "pddlab-x"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", port), H)
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else lambda *a: sys.exit(0))
print("serving ...; session /nonexistent/s1; Ctrl-C stops", flush=True)
s.serve_forever()
"""


@pytest.mark.parametrize("on_term, code", [("exit", 0), ("ignore", -9)])
def test_serve_is_waited_for_then_stopped_by_sigterm_and_killed_only_past_the_grace(tmp_path, on_term, code):
    port = bench.free_port()
    argv = [sys.executable, "-c", STAND_IN, str(port), on_term]
    serve = bench.Serve(argv, port, tmp_path / "serve.log", tmp_path, ready_s=30, grace_s=1.0)
    try:
        assert serve.start() == "pddlab-x"
        assert serve.session_dir() == Path("/nonexistent/s1")
    finally:
        t0 = time.monotonic()
        try:
            serve.stop()
        finally:
            if serve.proc.poll() is None:  # stop() failed to end it: not left running past the test
                serve.proc.kill()
                serve.proc.wait()
    assert serve.exit_code == code and serve.leftovers == []
    assert time.monotonic() - t0 < 5 and bench.served_model(port) is None


def test_a_serve_that_exits_before_it_answers_is_an_error_with_its_log(tmp_path):
    argv = [sys.executable, "-c", "print('no tokenizer for model x'); raise SystemExit(2)"]
    serve = bench.Serve(argv, bench.free_port(), tmp_path / "serve.log", tmp_path, ready_s=30, grace_s=1.0)
    with pytest.raises(RuntimeError, match="(?s)exit 2.*no tokenizer for model x"):
        serve.start()


def test_steps_and_requests_per_step():
    assert bench.parse_steps("1,4,16") == [1, 4, 16]
    for bad in ("", "0,4", "a,b"):
        with pytest.raises(Exception, match="--steps"):
            bench.parse_steps(bad)
    assert [bench.requests_for(c, None) for c in bench.DEFAULT_STEPS] == [4, 16, 64, 192, 192]
    assert bench.requests_for(128, 8) == 8

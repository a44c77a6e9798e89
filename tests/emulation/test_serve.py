"""`pddlab serve` as a user drives it: the tiny model's roles in the topology behind the OpenAI-compatible
API on 127.0.0.1, driven with the `openai` package (a real client), then Ctrl-C.

- a streamed chat completion across the emulated WAN (pdd) returns text and a usage block whose counts
  equal the session's requests.jsonl; a whole completion too, and a per-request mode;
- bad input gets OpenAI-style errors with the right status (unknown model, max_tokens beyond the
  context, a prompt over it, malformed JSON, an unsupported parameter), and the server keeps serving;
- /metrics parses with prometheus_client's parser, its TTFT histogram counts every completed request;
- Ctrl-C ends the session (exit 0), its directory is analysed like a run's, nothing is left (the tier's
  autouse fixture).
"""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from experiments.analysis import records
from experiments.rundir.files import REPO

pytestmark = [pytest.mark.emulation]
MODEL = "pddlab-tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job may inherit SIGINT ignored


@contextmanager
def serving(tmp_path):
    """`pddlab serve` up; torn down with Ctrl-C (SIGKILL only if that fails) whatever the test did."""
    port = _free_port()
    log = tmp_path / "serve.log"
    out = open(log, "w")
    argv = [
        sys.executable,
        "-m",
        "experiments.cli",
        "serve",
        "pdd-smoke",
        "--port",
        str(port),
        "--set",
        "runtime=process",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_interruptible)
    try:
        deadline = time.monotonic() + 180
        while "Ctrl-C stops" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        yield {"proc": proc, "port": port, "log": log, "client": client, "completed": []}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        out.close()


def _post(port: int, path: str, raw: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=raw, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def check_a_streamed_chat_completion_across_the_wan(session):
    client = session["client"]
    assert [m.id for m in client.models.list().data] == [MODEL]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What does a WAN do to latency?"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text and finish == "length" and usage.completion_tokens == 12, (text, usage)
    session["completed"].append(("chat", usage.prompt_tokens, usage.completion_tokens))
    whole = client.completions.create(
        model=MODEL, prompt="The relay decodes", max_tokens=6, extra_body={"mode": "pd-cross"}
    )
    assert whole.choices[0].text and whole.usage.completion_tokens == 6
    session["completed"].append(("completion", whole.usage.prompt_tokens, 6))


BAD_INPUT = (
    (
        lambda c: c.completions.create(model="gpt-9", prompt="x", max_tokens=2),
        openai.NotFoundError,
        "does not exist",
    ),
    (
        lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=500),
        openai.BadRequestError,
        "maximum context length is 128",
    ),
    (
        lambda c: c.completions.create(model=MODEL, prompt="x" * 200, max_tokens=2),
        openai.BadRequestError,
        "the prompt has 200",
    ),
    (
        lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=2, n=2),
        openai.BadRequestError,
        "n=2 is not supported",
    ),
    (
        lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"tools": []}),
        openai.BadRequestError,
        "unsupported parameter: 'tools'",
    ),
)


def check_bad_input(session, call, exc, needle):
    with pytest.raises(exc) as info:
        call(session["client"])
    assert needle in str(info.value), info.value
    status, body = _post(session["port"], "/v1/completions", b"{not json")
    assert (
        status == 400
        and body["error"]["type"] == "invalid_request_error"
        and "not valid JSON" in body["error"]["message"]
    )
    ok = session["client"].completions.create(model=MODEL, prompt="still here", max_tokens=3)
    assert ok.usage.completion_tokens == 3
    session["completed"].append(("after-error", ok.usage.prompt_tokens, 3))


def check_metrics(session):
    with urllib.request.urlopen(f"http://127.0.0.1:{session['port']}/metrics", timeout=30) as r:
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ttft = families["vllm:time_to_first_token_seconds"]
    [count] = [s.value for s in ttft.samples if s.name.endswith("_count")]
    assert count == len(session["completed"]), (count, session["completed"])
    assert {s.labels["worker"] for s in families["vllm:kv_cache_usage_perc"].samples} == {"p1", "rld1", "md1"}
    assert any(s.labels.get("route") for s in families["pddlab:requests_by_route"].samples)


def check_ctrl_c_ends_the_session_and_its_directory_is_analysed(session):
    proc = session["proc"]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0, session["log"].read_text()[-3000:]
    text = session["log"].read_text()
    out = REPO / text.split("session directory: ")[-1].strip().splitlines()[0]
    recs = [r for r in records.read(out) if r.ok]
    got = sorted((r.prompt_tokens, r.output_tokens) for r in recs)
    assert got == sorted((p, n) for _, p, n in session["completed"]), (got, session["completed"])
    assert {r.mode for r in recs} == {"pdd", "pd-cross"} and json.loads((out / "summary.json").read_text())


def test_a_serve_session_driven_by_the_openai_client(tmp_path):
    with serving(tmp_path) as session:
        check_a_streamed_chat_completion_across_the_wan(session)
        for call, exc, needle in BAD_INPUT:
            check_bad_input(session, call, exc, needle)
        check_metrics(session)
        check_ctrl_c_ends_the_session_and_its_directory_is_analysed(session)

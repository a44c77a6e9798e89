"""The front door of `pddlab serve` killed and hung under load, driven with the `openai` package (a real client):

- killed (SIGKILL) with streams in flight: every client's call ends (completed, or a connection error) within
  seconds, none hangs; the session notices, tears everything down and exits 1 naming the front door; nothing is
  left (the tier's autouse fixture);
- hung (SIGSTOP for HANG_S, then SIGCONT) with streams in flight: every request it admitted completes once it
  resumes (the rest were refused with 429 before their stream), the next one too, and the session's client.jsonl
  has one record per request (none lost).
"""

import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

import observe
from experiments.rundir import clientlog
from experiments.rundir.files import REPO

pytestmark = [pytest.mark.emulation, pytest.mark.slow]
MODEL = "pddlab-tiny"
CLIENTS = 6
MAX_TOKENS = 48  # the tiny model's streams last a few seconds: the fault lands while they run
FAULT_AT_S = 1.5
HANG_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _interruptible() -> None:
    # A background job of a script (`make test &`, setsid) inherits SIGINT ignored and Python then installs no
    # KeyboardInterrupt handler: the session ignored the SIGINT below and was SIGKILLed with its topology up.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def serving(tmp_path: Path):
    """`pddlab serve pdd-smoke` up (process runtime); whatever the test did, SIGINT at the end (SIGKILL past
    120 s). Yields the process, its port and its log."""
    port, log = _free_port(), tmp_path / "serve.log"
    out = open(log, "w")
    argv = [sys.executable, "-m", "experiments.cli", "serve", "pdd-smoke", "--port", str(port)]
    proc = subprocess.Popen(
        [*argv, "--set", "runtime=process"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_interruptible
    )
    try:
        deadline = time.monotonic() + 180
        while "Ctrl-C stops" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield proc, port, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        out.close()


def _front_door(proc: subprocess.Popen) -> int:
    """The front door's PID, among the session's own descendants."""
    for pid in observe.process_tree(proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"experiments.serve.front_door" in cmdline:
            return pid
    raise AssertionError("no front door among the session's processes")


def _ask(port: int, i: int, timeout_s: float) -> str:
    """One streamed chat request: 'completed', or what the client saw instead (its exception's class)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=timeout_s)
    try:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=MAX_TOKENS, stream=True
        )
        text = "".join(c.delta.content or "" for chunk in stream for c in chunk.choices)
        return "completed" if text else "empty"
    except openai.APIStatusError as err:
        return f"HTTP {err.status_code}"
    except Exception as err:  # a connection reset mid-stream surfaces as httpx's own error
        return type(err).__name__


def _session_dir(log: Path) -> Path:
    return Path(re.search(r"; session (\S+);", log.read_text()).group(1))


def test_the_front_door_killed_under_load_ends_every_call_and_the_session_with_exit_1(tmp_path):
    with serving(tmp_path) as (proc, port, log), ThreadPoolExecutor(CLIENTS) as pool:
        calls = [pool.submit(_ask, port, i, 60) for i in range(CLIENTS)]
        time.sleep(FAULT_AT_S)
        door = _front_door(proc)
        done_before = [c.done() for c in calls]
        subprocess.run(["kill", "-KILL", str(door)], check=True)
        t0 = time.monotonic()
        outcomes = [c.result(timeout=30) for c in calls]  # none hangs: lost would time out here
        print(f"before the kill done: {done_before}; outcomes {outcomes} in {time.monotonic() - t0:.1f} s")
        assert "empty" not in outcomes, outcomes
        assert proc.wait(90) == 1, log.read_text()[-3000:]  # the session noticed and failed
    text = log.read_text()
    assert "front door exited" in text and "Traceback" not in text, text[-3000:]


def test_the_front_door_hung_under_load_loses_nothing_once_it_resumes(tmp_path):
    with serving(tmp_path) as (proc, port, log):
        with ThreadPoolExecutor(CLIENTS) as pool:
            calls = [pool.submit(_ask, port, i, 120) for i in range(CLIENTS)]
            time.sleep(FAULT_AT_S)
            door = _front_door(proc)
            subprocess.run(["kill", "-STOP", str(door)], check=True)
            time.sleep(HANG_S)
            subprocess.run(["kill", "-CONT", str(door)], check=True)
            outcomes = [c.result(timeout=120) for c in calls]
        # past the door's limit (it follows the roles' TTFT) a request is refused before its stream: not lost
        assert set(outcomes) <= {"completed", "HTTP 429"} and "completed" in outcomes, outcomes
        assert _ask(port, CLIENTS, 60) == "completed"
        session = _session_dir(log)
    assert proc.returncode == 0, log.read_text()[-3000:]
    recs = list(clientlog.read(session / "variants" / "pdd" / "client.jsonl"))
    assert len(recs) == CLIENTS + 1, recs  # one record per request, whatever became of it
    done = [r for r in recs if r.error is None and r.tokens]
    assert len(done) == outcomes.count("completed") + 1, recs
    assert all(r.error.startswith("REFUSED") for r in recs if r not in done), recs

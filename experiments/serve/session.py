"""`pddlab serve`: the topology and the roles kept up, behind an OpenAI-compatible HTTP API, until Ctrl-C.

Responsible for: a serve session's directory (`results/<time>-serve-<spec>/`, laid out like a run's, so
`pddlab analyze` reads it: variants/<mode>/client.jsonl, events/, logs/, pcap/), the topology and one
variant's roles as the spec says (runtime, model, profile, deployment), its metadata.json (the layout of a
run's, experiments.rundir.metadata; a failed step of the link's schedule ends the session incomplete), the front door
(experiments.serve.front_door) in the client host — on the client's address and its loopback, and on a UNIX
socket — and a forwarder from 127.0.0.1:PORT of this machine to that socket (the client host's network
is a namespace of its own; a socket file crosses namespaces); teardown of all of it on Ctrl-C, SIGTERM
or SIGHUP, then the analysis.
Not responsible for: HTTP or the API (experiments.serve.front_door), the roles, the network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from experiments.run import deploy, runner
from experiments.spec import deployment
from experiments.rundir import metadata, files as rundir
from experiments.serve import front_door
from experiments.spec import experiment as specmod
from experiments.rundir.metadata import RunMetadata, VariantRecord
from topology import naming
from workers.model import get_config, precision_base

log = logging.getLogger(__name__)
TOKENIZERS = Path(__file__).resolve().parents[1] / "tokenizers"
READY_S = 60.0  # the front door's start (imports, tokenizer)
# The front door's limit follows the roles' TTFT (experiments.serve.admission.Gate): it aims at half the spec's
# slo.ttft_ms and a request past the limit waits at most as long again, so one admitted meets the SLO; it starts
# at two requests per prefill worker (one prefilling, one waiting behind it), the knee measured with
# benchmarks/bench_serve_load.py on this machine (docs/serve.md).
TTFT_TARGET_SHARE = 0.5
START_PER_P = 2
FRONT_STOP_S = front_door.DRAIN_S + 10.0  # at teardown: its drain time, then the cancelled requests' records


class ServeError(RuntimeError):
    """The session could not start; the message says what and where its logs are."""


class SessionFailed(ServeError):
    """The session started and then failed (its front door exited); the message says how and where its logs
    are. The session's directory is analysed all the same."""


def served_name(spec) -> str:
    return f"pddlab-{spec.model}"


class _Forwarder:
    """127.0.0.1:port (this machine) -> a UNIX socket, byte for byte, both ways, on an asyncio thread."""

    def __init__(self, port: int, path: str):
        self.port, self.path = port, path
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="serve-forwarder", daemon=True)

    def start(self) -> _Forwarder:
        self.thread.start()
        self.ready.wait(10)
        if self.error is not None:
            raise ServeError(f"cannot listen on 127.0.0.1:{self.port}: {self.error}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.server = self.loop.run_until_complete(asyncio.start_server(self._pipe, "127.0.0.1", self.port))
        except OSError as err:
            self.error = err
            self.ready.set()
            return
        self.ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader, writer) -> None:
        try:
            ur, uw = await asyncio.open_unix_connection(self.path)
        except OSError:
            writer.close()
            return

        async def copy(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, uw), copy(ur, writer))

    def stop(self) -> None:
        if self.error is None and self.ready.is_set():
            self.loop.call_soon_threadsafe(self.server.close)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def tokenizer_dir(model: str) -> Path:
    """A model config's tokenizer: its own vocabulary's (a half-precision variant shares its base's)."""
    return TOKENIZERS / precision_base(model)


def _front_door_argv(spec, mode: str, vdir: Path, port: int, sock: str, max_in_flight: int) -> list[str]:
    names = deploy.worker_names(deployment.pool_sizes(spec))
    workers = [f"--worker={w}={deploy.grpc_address(w)}" for r in ("p", "rld", "md") for w in names[r]]
    return [
        sys.executable,
        "-m",
        "experiments.serve.front_door",
        "--router",
        deploy.grpc_address("router"),
        "--tokenizer",
        str(tokenizer_dir(spec.model)),
        "--model",
        served_name(spec),
        "--context",
        str(get_config(spec.model).max_seq_len),
        "--mode",
        mode,
        "--variant",
        mode,
        "--log",
        str(vdir / "client.jsonl"),
        f"--listen=127.0.0.1:{port}",
        f"--listen={naming.host_ip('client')}:{port}",
        "--unix",
        sock,
        f"--max-in-flight={max_in_flight}",
        f"--ttft-target-ms={spec.slo.ttft_ms * TTFT_TARGET_SHARE:g}",
        f"--start-in-flight={START_PER_P * deployment.pool_sizes(spec)['p']}",
        *workers,
    ]


def _wait_line(proc: subprocess.Popen, line: str, log_path: Path, timeout_s: float) -> None:
    """Copy proc's output to log_path; return once `line` was printed (ServeError if it exits first)."""
    seen = threading.Event()

    def pump() -> None:
        with open(log_path, "a") as out:
            for text in proc.stdout:
                out.write(text)
                out.flush()
                if line in text:
                    seen.set()

    threading.Thread(target=pump, name="serve-front-log", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not seen.wait(0.1):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ServeError(f"the front door did not start (exit {proc.poll()}); its log: {log_path}")


def run(spec, mode: str = "pdd", port: int = 8000, until=None, max_in_flight: int = front_door.MAX_IN_FLIGHT) -> Path:
    """Serve until Ctrl-C/SIGTERM/SIGHUP (or until `until()` returns True, for tests); the session dir.
    max_in_flight: requests the front door serves at once (past it: HTTP 429)."""
    from topology.net import Testbed, preflight

    if mode not in specmod.VARIANTS:
        raise ServeError(f"mode {mode!r} not in {list(specmod.VARIANTS)}")
    if not (tokenizer_dir(spec.model) / "tokenizer.json").exists():
        raise ServeError(f"no tokenizer for model {spec.model!r} in {TOKENIZERS} (scripts/make_tokenizers.py)")
    preflight()
    out = rundir.new_run_dir(f"serve-{spec.name}")
    spec = dataclasses.replace(spec, variants=(mode,))
    meta = runner.new_metadata(spec, f"serve-{spec.name}", serve=True)
    metadata.write(out, meta)
    profile = specmod.parse_profile(spec)  # as a run applies it: rates / compute.kv_scale
    cfg = runner.topology_config(spec, profile, out, play_schedule=True)  # no variant windows: the link's clock
    sockdir = Path(tempfile.mkdtemp(prefix="pddlab-serve-"))
    try:
        with metadata.recording(out, meta):
            try:
                with Testbed(cfg) as tb:
                    meta.topology = metadata.topology_of(tb)
                    try:
                        sock = str(sockdir / "http.sock")
                        _serve_in(tb, spec, mode, out, port, sock, meta, until, max_in_flight)
                    finally:
                        meta.topology = metadata.topology_of(tb)  # with the link's changes
            except KeyboardInterrupt:
                pass  # Ctrl-C is how a session ends
            meta.complete = True
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)
        runner.analyze_safely(out)
    return out


def _serve_in(
    tb, spec, mode: str, out: Path, port: int, sock: str, meta: RunMetadata, until, max_in_flight: int
) -> None:
    """The roles and the front door up, served until until() (or Ctrl-C); raises ServeError when the front
    door exits, and the link's TestbedError when a step of its schedule failed (the session is incomplete)."""
    vdir = out / "variants" / mode
    (vdir / "events").mkdir(parents=True, exist_ok=True)
    config = deploy.write_deployment(spec, vdir / "deployment.yaml", vdir / "events", mode, wan=tb.config.wan_profile)
    runtime = deploy.make_runtime(
        tb, spec, config, vdir / "logs", deployment.pool_sizes(spec), deployment.pool_cpusets(spec)
    )
    window = meta.variants[mode] = VariantRecord(status="starting", t_start_ns=time.monotonic_ns())
    runtime.start()
    front = forwarder = None
    try:
        runner.wait_ready(tb, spec, runtime)
        front = tb.popen(
            "client",
            _front_door_argv(spec, mode, vdir, port, sock, max_in_flight),
            cwd=deploy.REPO,
            env=deploy.worker_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        _wait_line(front, "front door ready", vdir / "logs" / "front-door.log", READY_S)
        forwarder = _Forwarder(port, sock).start()
        window.status, window.t_ready_ns = "serving", time.monotonic_ns()
        metadata.write(out, meta)
        print(
            f"serving {served_name(spec)} ({mode}, {spec.runtime} runtime, profile {spec.profile}) at "
            f"http://127.0.0.1:{port}/v1 and, in the client host, http://{naming.host_ip('client')}:{port}/v1; "
            f"tokenizer {tokenizer_dir(spec.model)}; session {out}; Ctrl-C stops",
            flush=True,
        )
        while not (until and until()):
            if front.poll() is not None:
                raise SessionFailed(f"the front door exited ({front.returncode}); log: {vdir / 'logs'}")
            tb.check()  # the link's schedule plays on: a failed change ends the session, recorded incomplete
            time.sleep(0.2)
        tb.check()
    finally:
        window.status = "stopped"
        if forwarder is not None:
            forwarder.stop()
        if front is not None:
            _stop_front_door(tb, front)
        window.exit_codes = runtime.stop()
        window.t_end_ns = time.monotonic_ns()


def _stop_front_door(tb, front: subprocess.Popen) -> None:
    """SIGTERM: the door stops listening, lets its requests in flight end (or cancels them) and writes every one's
    record; SIGKILL only if it has not exited FRONT_STOP_S later (tb.kill also ends what a runtime still runs)."""
    if front.poll() is None:
        front.send_signal(signal.SIGTERM)
        try:
            front.wait(FRONT_STOP_S)
        except subprocess.TimeoutExpired:
            log.warning("the front door did not exit %g s after SIGTERM: SIGKILL", FRONT_STOP_S)
    tb.kill("client", front)

"""pddlab's exit status: 0 done as asked, 1 a variant, run or sweep point failed, 2 bad input, 3 the environment,
130 interrupted (experiments/cli.py EXIT_CODES).

Each case through the real command line: a subprocess, run as an unprivileged user where this machine's root
would let a run start (so nothing here ever builds a topology), or main() where the input fails at load. A run's
and a sweep's own outcome are judged from run directories as the runner writes them (fake_run, analysed for
real); only the step that would need root and a topology, runner.run, hands one over.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fake_run
from experiments import cli
from experiments.analysis import analyze
from experiments.run import runner, sweep

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["--set", "variants=[pd-cross, pdd]"]


def as_nobody(*argv: str) -> list[str]:
    """argv in a user namespace that maps us to nobody (as tests/emulation/test_topology.py does): the CLI sees
    euid 65534, so preflight's root check refuses any run, while files are reached as the caller."""
    return ["unshare", "--map-user=65534", "--map-group=65534", sys.executable, "-m", "experiments.cli", *argv]


def pddlab(*argv: str, env: dict | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, as nobody."""
    return subprocess.run(
        as_nobody(*argv), cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})}
    )


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pddlab: error:"), err
    return lines[0]


@pytest.fixture
def nothing_starts(monkeypatch):
    """Were bad input taken (as before these checks), nothing starts: the topology's preflight and the runner
    refuse (main() runs in this process, which may be root)."""
    import topology.net

    def refuse(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(topology.net, "preflight", refuse)
    monkeypatch.setattr(runner, "run", refuse)
    monkeypatch.setattr(sweep, "run", refuse)


# ---- 2: bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["run", "pdd-smoke", "--set", "deployment.pools.md=2"], "deployment: config: unknown key(s) ['pools']"),
        (["run", "pdd-smoke", "--set", "workload.seed=["], "--set 'workload.seed=['"),
        (["run", "pdd-smoke", "--set", "variant_defs={'../../..': {mode: pdd}}"], "variant_defs: key '../../..'"),
        (["sweep", "pdd-smoke", "--over", "no_such_key=1,2"], "--over no_such_key: unknown key"),
        (["sweep", "pdd-smoke", "--over", "variant_defs={'../x': {mode: pdd}},{}"], "variant_defs: key '../x'"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_it(capsys, tmp_path, nothing_starts, argv, needle):
    assert cli.main([*argv, "--results", str(tmp_path)]) == cli.BAD_INPUT
    assert needle in one_error_line(capsys.readouterr().err)
    assert not list(tmp_path.iterdir())  # nothing was started


HOSTS_JOINED = """
from mininet.topo import Topo

class Joined(Topo):
    def build(self):
        self.addLink(self.addHost("h1"), self.addHost("h2"))

topos = {"joined": Joined}
"""


def test_net_refuses_a_bad_mininet_topology_class_with_exit_2_before_it_needs_root(tmp_path):
    pytest.importorskip("mininet.topo", reason="Mininet's Python library (make setup)")
    bad = tmp_path / "mine.py"
    bad.write_text(HOSTS_JOINED)
    proc = pddlab("net", "--custom", str(bad), "--topo", "joined", "--exec", "nodes")  # as nobody: root would be 3
    assert proc.returncode == cli.BAD_INPUT, proc.stderr
    assert f"{bad} --topo joined: link h1-h2: joins two hosts" in one_error_line(proc.stderr)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--topo", "ring"], "no topo 'ring'; its topos: joined"),
        ([], "--custom FILE needs --topo NAME[,ARG,...]"),
    ],
)
def test_net_refuses_a_custom_file_without_a_name_it_defines(capsys, tmp_path, nothing_starts, argv, needle):
    pytest.importorskip("mininet.topo", reason="Mininet's Python library (make setup)")
    bad = tmp_path / "mine.py"
    bad.write_text(HOSTS_JOINED)
    assert cli.main(["net", "--custom", str(bad), *argv]) == cli.BAD_INPUT
    assert needle in one_error_line(capsys.readouterr().err)


# ---- 3: the environment -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["run", "pdd-smoke"], ["sweep", "pdd-smoke", "--over", "workload.seed=1,2"]])
def test_not_root_exits_3_not_2(tmp_path, argv):
    proc = pddlab(*argv, "--results", str(tmp_path))
    assert proc.returncode == cli.ENVIRONMENT, proc.stderr
    assert "needs root" in one_error_line(proc.stderr)
    assert not list(tmp_path.iterdir())  # refused before a run or sweep directory exists


def test_docker_unavailable_exits_3_with_one_line_saying_what_to_do():
    proc = pddlab("image", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == cli.ENVIRONMENT, proc.stderr
    line = one_error_line(proc.stderr)
    assert "Docker" in line or "docker" in line


def test_a_ray_cluster_that_does_not_answer_exits_3():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = pddlab("run", "pdd-smoke", "--cluster", f"127.0.0.1:{port}")
    assert proc.returncode == cli.ENVIRONMENT, proc.stderr
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in one_error_line(proc.stderr)


# ---- 130: interrupted ---------------------------------------------------------------------------------------
def wait_for_pipe_read(pid: int, deadline: float) -> None:
    """Until pid's main thread sleeps in a pipe's read (its wchan: pipe_read, anon_pipe_read on newer kernels)."""
    while "pipe_read" not in Path(f"/proc/{pid}/wchan").read_text():
        assert time.monotonic() < deadline, (
            f"the CLI never blocked reading its trace (wchan {Path(f'/proc/{pid}/wchan').read_text()})"
        )
        time.sleep(0.01)


def test_ctrl_c_exits_130(tmp_path):
    """SIGINT while the CLI reads its trace (a FIFO: it blocks there, inside the command, until we write)."""
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    argv = ["run", "pdd-smoke", "--set", "workload.source=trace", "--set", f"workload.trace={fifo}"]
    # SIGINT's default restored in the child: a shell's background job (`make test &`, nohup) passes SIGINT on
    # ignored, and Python then keeps ignoring it (the CLI would read on, as it should there)
    proc = subprocess.Popen(
        as_nobody(*argv),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while True:  # opening the write end succeeds once the CLI opened the read end
        try:
            # held open until the CLI ended: closed now, it would give the CLI an EOF, an empty trace (exit 2),
            # whenever the CLI reads before the SIGINT lands
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the CLI never read its trace: {proc.communicate()[1]}") from None
            assert err.errno == errno.ENXIO
            time.sleep(0.05)
    try:
        # the SIGINT lands once the CLI sleeps in the read: between the open's return and the read's start it
        # would run Python's handler and leave the read it then starts uninterrupted (a hang, seen in make test)
        wait_for_pipe_read(proc.pid, deadline)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == cli.INTERRUPTED, err
    assert "interrupted" in err and "Traceback" not in err


# ---- 0 and 1: what the run did ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory) -> Path:
    """A run directory of pd-cross and pdd as the runner leaves it: every variant ok, analysed."""
    run = fake_run.make_run(tmp_path_factory.mktemp("fake"), variants=("pd-cross", "pdd"))
    analyze.analyze(run)
    return run


def a_run(template: Path, out: Path, pdd: str | None = "ok", analysed: bool = True) -> Path:
    """A copy of template at out where pdd's status is `pdd` (None: it never ran)."""
    shutil.copytree(template, out)
    meta = json.loads((out / "metadata.json").read_text())
    if pdd is None:
        del meta["variants"]["pdd"]
        meta["complete"] = False
    else:
        meta["variants"]["pdd"]["status"] = pdd
        meta["complete"] = pdd == "ok"
        if pdd == "failed":
            meta["variants"]["pdd"]["error"] = "roles not ready: md1 exited 1\n(logs in variants/pdd/logs)"
    (out / "metadata.json").write_text(json.dumps(meta))
    if not analysed:
        (out / "summary.json").unlink()
    if analysed == "json only":  # summary.md failed after summary.json was written (a TypeError did, once)
        (out / "summary.md").unlink()
    return out


@pytest.fixture
def no_topology(monkeypatch):
    """This machine's preflight passes (the environment is not what these tests judge)."""
    import topology.net

    monkeypatch.setattr(topology.net, "preflight", lambda: None)


@pytest.mark.parametrize(
    "pdd, analysed, status, says",
    [
        ("ok", True, cli.OK, None),
        ("failed_requests", True, cli.OK, None),  # requests failing under impairment are data
        ("failed", True, cli.FAILED, "variant pdd failed: roles not ready: md1 exited 1 (logs in variants/pdd/logs)"),
        ("timeout", True, cli.FAILED, "variant pdd timeout: its workload did not finish within timeouts.variant_s"),
        (None, True, cli.FAILED, "variant pdd never ran"),
        ("ok", False, cli.FAILED, "no analysis (rerun: pddlab analyze"),
        ("ok", "json only", cli.FAILED, "no analysis (rerun: pddlab analyze"),
    ],
)
def test_run_exits_0_when_every_variant_ran_and_was_analysed_else_1(
    capsys, monkeypatch, tmp_path, analysed_run, no_topology, pdd, analysed, status, says
):
    runs = []

    def run(plan, results):
        runs.append(a_run(analysed_run, results / "run", pdd, analysed))
        return runs[-1]

    monkeypatch.setattr(runner, "run", run)
    assert cli.main(["run", "pdd-smoke", *VARIANTS, "--results", str(tmp_path)]) == status
    captured = capsys.readouterr()
    assert f"run directory: {runs[0]}" in captured.out
    if says is None:
        assert captured.err == ""
    else:
        assert any(line.startswith(f"pddlab: failed: {says}") for line in captured.err.splitlines()), captured.err
        assert "Traceback" not in captured.err


def test_a_run_whose_topology_failed_exits_1(capsys, monkeypatch, tmp_path, no_topology):
    from topology.net import TestbedError

    def run(plan, results):
        raise TestbedError("tcpdump on pdd-sa-eth1 exited 1")

    monkeypatch.setattr(runner, "run", run)
    assert cli.main(["run", "pdd-smoke", *VARIANTS, "--results", str(tmp_path)]) == cli.FAILED
    assert "tcpdump on pdd-sa-eth1 exited 1" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "second, status, says",
    [
        ("failed_requests", cli.OK, None),
        ("failed", cli.FAILED, "variant pdd failed: roles not ready"),
        ("raise", cli.FAILED, "RuntimeError: the shared topology broke"),
    ],
)
def test_sweep_exits_1_when_a_point_failed(
    capsys, monkeypatch, tmp_path, analysed_run, no_topology, second, status, says
):
    def run(spec, results, out, shared):
        if spec.workload.seed == 2 and second == "raise":
            raise RuntimeError("the shared topology broke")
        return a_run(analysed_run, out, second if spec.workload.seed == 2 else "ok")

    monkeypatch.setattr(runner, "run", run)
    argv = ["sweep", "pdd-smoke", *VARIANTS, "--over", "workload.seed=1,2", "--no-share-topology"]
    assert cli.main([*argv, "--results", str(tmp_path)]) == status
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if line.startswith("pddlab: failed:")]
    if says is None:
        assert failed == []
    else:
        assert len(failed) == 1 and "point p01-r0-2" in failed[0] and says in failed[0], err


def test_sweep_points_never_run_or_interrupted_are_failures(tmp_path):
    base = sweep.Point(0, {"workload.seed": 1}, 0, 1, "p00-r0-1")
    points = [
        dataclasses.replace(base, status="pending"),
        dataclasses.replace(base, name="p01-r0-2", status="interrupted"),
    ]
    assert sweep.failed_points(tmp_path, points) == ["point p00-r0-1 pending", "point p01-r0-2 interrupted"]


def test_help_documents_the_exit_codes():
    for argv in (["--help"], ["run", "--help"], ["sweep", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "experiments.cli", *argv], cwd=REPO, capture_output=True, text=True
        ).stdout
        for code in ("0 ", "1 ", "2 ", "3 ", "130"):
            assert f"\n  {code}" in out, (argv, out)

"""Docker hosts in the live topology: isolation, reachability, crashes, teardown, parity with plain processes."""

import json
import re
import signal
import subprocess
import sys

import observe
import pytest

from docker_rt import LABEL_RUN
from docker_rt.engine import docker
from docker_rt.host import DockerOptions, WorkerCrashed, runtime_for
from topology import naming
from topology.cleanup import STATE_DIR
from topology.net import Testbed, TopologyConfig
from topology.profiles import load_profile

PROFILE = "wan-regional"  # 5 ms each way: pings answer fast, and nothing is lost that a test counts on
# Greedy tokens from the tiny model; the same code must print the same list in both runtimes.
ENGINE_CODE = (
    "import json, torch; torch.set_num_threads(1); "
    "from workers.engine import Engine, GenerationRequest; "
    "e = Engine('tiny', seed=0, capacity_tokens=512, block_size=16, device='cpu', prefix_cache=False); "
    "r = e.generate(GenerationRequest('r', tuple(range(3, 43)), 16)); "
    "print(json.dumps(list(r.output_tokens)))"
)


def config(image: str, tmp_path, runtime: str = "docker") -> TopologyConfig:
    opts = DockerOptions(image=image, mounts=(tmp_path,), log_dir=tmp_path / "containers")
    return TopologyConfig(wan_profile=load_profile(PROFILE), runtime=runtime_for(runtime, opts))


def output(tb: Testbed, host: str, argv: list[str], timeout_s: float = 120) -> str:
    proc = tb.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"{argv} on {host} failed ({proc.returncode}): {err}"
    return out


def run_containers(run_id: str) -> list[str]:
    return docker(["ps", "-aq", "--filter", f"label={LABEL_RUN}={run_id}"], quiet=True).stdout.split()


def test_container_sees_only_its_interfaces_and_reaches_across_the_wan(
    worker_image, tiny_weights, tmp_path, nothing_left_behind
):
    with Testbed(config(worker_image.ref, tmp_path)) as tb:
        addrs = output(tb, "md1", ["ip", "-o", "-4", "addr"])
        links = output(tb, "md1", ["ip", "-o", "link"])
        assert re.findall(r"^\d+: (\S+?)(?:@\S+)?:", links, re.M) == ["lo", "md1-eth0"]
        found = set(re.findall(r"^\d+: (\S+)\s+inet (\S+)", addrs, re.M))
        assert found == {("lo", "127.0.0.1/8"), ("md1-eth0", f"{naming.host_ip('md', 1)}/24")}
        # across the WAN, to a plain (non-container) host in cluster A
        ping = output(tb, "md1", ["ping", "-n", "-c", "3", "-i", "0.2", "-W", "2", naming.host_ip("client")])
        assert " 0% packet loss" in ping
        # the holder really is a container of this run, with the role's limits on the process containers
        run_id = tb.metadata()["runtime_metadata"]["run_id"]
        assert len(run_containers(run_id)) == 4 + 3  # 4 holders + 3 process containers so far
    assert run_containers(run_id) == []


def test_crashed_container_names_the_role_and_its_last_lines(worker_image, tiny_weights, tmp_path, nothing_left_behind):
    crash = (
        "import sys, time; print('md1: loading', flush=True); time.sleep(0.3); "
        "print('md1: fatal: simulated crash', file=sys.stderr, flush=True); sys.exit(3)"
    )
    with pytest.raises(WorkerCrashed) as err:
        with Testbed(config(worker_image.ref, tmp_path)) as tb:
            run_id = tb.metadata()["runtime_metadata"]["run_id"]
            proc = tb.popen("md1", [sys.executable, "-c", crash], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert proc.wait(60) == 3  # the docker client exits with the container's code
            tb.check_workers()
    message = str(err.value)
    assert "role md on host md1" in message and "exited with code 3" in message
    assert "md1: fatal: simulated crash" in message and "md1: loading" in message
    assert run_containers(run_id) == []
    logs = list((tmp_path / "containers").glob("*-md1-1.log"))
    assert logs and "simulated crash" in logs[0].read_text()


def test_teardown_after_exception_removes_every_container(worker_image, tiny_weights, tmp_path, nothing_left_behind):
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed(config(worker_image.ref, tmp_path)) as tb:
            run_id = tb.metadata()["runtime_metadata"]["run_id"]
            tb.popen("p1", ["sleep", "300"])
            raise RuntimeError("boom")
    assert run_containers(run_id) == []


def test_same_tokens_in_process_and_docker_runtime(worker_image, tiny_weights, tmp_path, nothing_left_behind):
    tokens = {}
    for runtime in ("process", "docker"):
        with Testbed(config(worker_image.ref, tmp_path, runtime)) as tb:
            tokens[runtime] = json.loads(output(tb, "md1", [sys.executable, "-c", ENGINE_CODE]))
    assert len(tokens["process"]) == 16
    assert tokens["docker"] == tokens["process"]


KILLED_SCRIPT = """
import sys, time
from docker_rt.host import DockerOptions, DockerRuntime
from topology.net import Testbed, TopologyConfig
from topology.profiles import load_profile
cfg = TopologyConfig(wan_profile=load_profile("wan-regional"), runtime=DockerRuntime(DockerOptions(image=sys.argv[1])))
with Testbed(cfg) as tb:
    tb.popen("md1", ["sleep", "300"])
    while not [c for c in cfg.runtime.containers() if c.kind == "proc"]:  # its docker client has made it
        time.sleep(0.05)
    print(tb.metadata()["runtime_metadata"]["run_id"], flush=True)
    time.sleep(300)
"""


IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
)


def test_a_container_that_ignores_sigterm_is_gone_once_its_client_is_killed(
    worker_image, tiny_weights, tmp_path, nothing_left_behind
):
    """SIGKILL reaches only the docker client: the container kept running, holding its ports for the next
    variant's role. Testbed.kill removes it through the runtime."""
    with Testbed(config(worker_image.ref, tmp_path)) as tb:
        run_id = tb.metadata()["runtime_metadata"]["run_id"]
        proc = tb.popen("md1", [sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "up"
        proc.terminate()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(2)  # the signal reached the container, which ignores it
        tb.kill("md1", proc)
        left = docker(["ps", "-q", "--filter", f"label={LABEL_RUN}={run_id}", "--filter", "label=pddlab.kind=proc"])
        assert left.stdout.split() == [], "the container outlived its killed client"
        assert len(run_containers(run_id)) == 4  # the holders stay until teardown


def test_make_clean_removes_containers_of_a_killed_run(worker_image, tiny_weights, nothing_left_behind):
    """A testbed killed with SIGKILL (no teardown at all): `make clean` removes its containers by label, and
    nothing of the run is left, observed with docker, ps, ip and iptables themselves (tests/observe.py)."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, worker_image.ref], stdout=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()
    tree = observe.process_tree(proc.pid)  # docker clients, host shells, the emulator, tcpdump
    workdir = json.loads((STATE_DIR / f"testbed-{proc.pid}.json").read_text())["workdir"]
    proc.kill()
    proc.wait()
    assert len(run_containers(run_id)) == 4 + 1
    assert observe.left_behind(tree, workdir)["links"]
    out = subprocess.run([sys.executable, "-m", "docker_rt.host", "clean"], capture_output=True, text=True)
    assert out.returncode == 0 and f"pddlab-{run_id}-md1" in out.stdout
    assert run_containers(run_id) == []
    clean = subprocess.run([sys.executable, "-m", "experiments.cli", "clean"], capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr
    assert observe.left_behind(tree, workdir) == observe.NOTHING_LEFT, clean.stdout


def test_sigterm_tears_down_every_container(worker_image, tiny_weights, nothing_left_behind):
    script = (
        "import sys\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in KILLED_SCRIPT.strip().splitlines())
        + "except KeyboardInterrupt:\n"
        "    sys.exit(42)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, worker_image.ref], stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
        assert len(run_containers(run_id)) == 4 + 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 42
        assert run_containers(run_id) == []
    finally:
        if proc.poll() is None:  # a failed check above: the testbed still tears itself down
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)

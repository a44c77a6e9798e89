"""`pddlab run --cluster` torn down on SIGTERM and SIGHUP, and `pddlab clean --cluster` after a run that was not.

On the tier's two-node loopback Ray cluster (conftest), pddlab as a separate process, its ledgers
(ray_rt.ledger) in the test's own directory (PDDLAB_CLUSTER_STATE):

- SIGTERM or SIGHUP mid-variant: exit 130, the variant "interrupted", the load generator and the capture's
  tcpdump gone, the work directory removed from the nodes, nothing left in the ledger; while it ran its work
  directory was 0700 at a random name, and directories made beforehand where the old code put it
  (/tmp/pddlab-cluster-<run name>) were not touched;
- `pddlab clean --cluster ADDRESS` removes what a dead run's ledger records — a qdisc on an interface of a node
  (a veth pair this test makes: this machine has no sch_netem, so the recorded qdisc is a tbf), its work
  directory — one line per thing, and leaves a live run's ledger alone.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from experiments.run.deploy import REPO
from ray_rt.ledger import STATE_ENV, Ledger, ledgers

pytestmark = pytest.mark.slow
RUN_S = 420


def holders(path: str) -> list[int]:
    """PIDs of processes whose command line names path (the capture's tcpdump writes there)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and path.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


def wait_for(what, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    return None


def running_variant(results: Path):
    """The run directory once a variant is running and its load generator has answers, else None."""
    for out in results.glob("*pdd-smoke*"):
        try:
            meta = json.loads((out / "metadata.json").read_text())
        except (OSError, ValueError):
            continue
        for name, v in meta.get("variants", {}).items():
            client = out / "variants" / name / "client.jsonl"
            if v.get("status") == "running" and client.exists() and client.stat().st_size > 0:
                return out
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_mid_variant_tears_the_run_down_on_the_nodes_and_exits_130(cluster, tmp_path, sig):
    state, results = tmp_path / "state", tmp_path / "results"
    stamp = time.time()
    decoys = [Path(f"/tmp/pddlab-cluster-{time.strftime('%Y%m%d-%H%M%S', time.localtime(stamp + i))}-pdd-smoke")
              for i in range(60)]  # fmt: skip
    decoys = [d for d in decoys if not d.exists()]  # where the old code put the run's directory: someone
    for d in decoys:  # else's, made first
        d.mkdir(mode=0o777)
        (d / "theirs").write_text("x")
    argv = [sys.executable, "-m", "experiments.cli", "run", "pdd-smoke", "--results", str(results)]
    argv += ["--cluster", cluster.address, "--set", "variants=[pdd]"]
    argv += ["--set", "cluster.capture=[{site: a, interface: lo}]"]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, STATE_ENV: str(state)}, stderr=err)
    try:
        out = wait_for(lambda: running_variant(results), RUN_S)
        assert out is not None, (proc.poll(), (tmp_path / "stderr").read_text()[-3000:])
        (ledger,) = ledgers(state)
        work_dirs = {w["path"] for w in ledger.work_dirs}
        assert len(work_dirs) == 1 and len(ledger.work_dirs) == 2  # one path, made on both nodes
        (work_dir,) = work_dirs
        assert os.stat(work_dir).st_mode & 0o777 == 0o700 and out.name not in work_dir
        assert holders(work_dir), "the capture's tcpdump is not running"
        assert holders(str(out)), "the load generator is not running"
        proc.send_signal(sig)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        used = {d.name: sorted(p.name for p in d.iterdir()) for d in decoys if list(d.iterdir()) != [d / "theirs"]}
        for d in decoys:
            shutil.rmtree(d)
        assert used == {}, f"the run wrote in a directory made before it: {used}"
    stderr = (tmp_path / "stderr").read_text()
    assert rc == 130, stderr[-3000:]
    assert "interrupted" in stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is False and meta["variants"]["pdd"]["status"] == "interrupted"
    assert ledgers(state) == [], "something recorded was not undone"
    assert not Path(work_dir).exists()
    assert wait_for(lambda: not holders(work_dir), 10), holders(work_dir)
    assert not holders(str(out)), holders(str(out))  # the load generator (and anything else of the run's here)


@pytest.fixture
def veth():
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a veth pair")
    name = f"pddcl{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


def root_qdisc(interface: str) -> list[str]:
    argv = ["tc", "qdisc", "show", "dev", interface, "root"]
    return subprocess.run(argv, capture_output=True, text=True).stdout.split()


def test_clean_cluster_undoes_what_a_dead_run_recorded_and_leaves_a_live_one(cluster, tmp_path, veth):
    from ray_rt.nodes import MARKER, make_work_dir

    state = tmp_path / "state"
    subprocess.run(["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", "1mbit", "burst", "32kbit",
                    "latency", "400ms"], check=True)  # fmt: skip
    kind, handle = root_qdisc(veth)[1:3]
    assert kind == "tbf"
    node = next(n for n in ray.nodes() if n["Alive"] and n["Labels"].get("pddlab/cluster") == "b")
    dead = Ledger.create(cluster.address, state)
    dead.pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True).stdout)  # fmt: skip
    work_dir = str(tmp_path / "pddlab-cluster-dead")
    make_work_dir(work_dir, dead.token)
    (Path(work_dir) / "logs").mkdir()
    dead.add("work_dirs", {"node_id": node["NodeID"], "node": "127.0.0.1", "path": work_dir})
    shape = {"node_id": node["NodeID"], "node": "127.0.0.1/b", "interface": veth, "handle": handle, "qdisc": kind}
    dead.add("shapes", shape)
    live = Ledger.create(cluster.address, state)  # this process's: a run still going
    live.add("shapes", {**shape, "interface": "pddnone0"})
    other = Ledger.create("127.0.0.1:1", state)  # another cluster's
    other.pid = dead.pid
    other.write()

    argv = [sys.executable, "-m", "experiments.cli", "clean", "--cluster", cluster.address]
    proc = subprocess.run(argv, cwd=REPO, env={**os.environ, STATE_ENV: str(state)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert f"removed tbf {handle} on {veth} of node 127.0.0.1/b" in lines, lines
    assert f"removed work directory {work_dir} on node 127.0.0.1" in lines, lines
    assert f"removed cluster ledger {dead.path}" in lines, lines
    assert f"{live.path.name}: run {os.getpid()} is still running: left as it is" in lines, lines
    assert len(lines) == 4, lines
    assert root_qdisc(veth)[1:2] != ["tbf"], root_qdisc(veth)
    assert not Path(work_dir).exists() and not dead.path.exists()
    assert live.path.exists() and other.path.exists()
    assert not (Path(work_dir) / MARKER).exists()

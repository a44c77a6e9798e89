"""A `--cluster` run's node-side work directory and its ledger (ray_rt.nodes, ray_rt.ledger), without Ray.

- the work directory is made 0700 with the run's token in it; a directory someone made first at that path, or
  a link there, is refused and left alone; a second node of the same machine takes the run's own;
- it is removed only when it holds the run's token;
- the ledger is this user's alone, records and drops entries as the run makes and undoes them, and tells a
  live run's ledger from a dead one's; the work directory's name is drawn at random, not the run's name.
"""

import json
import os
import stat
import subprocess
import sys

import pytest

from ray_rt.ledger import Ledger, ledgers
from ray_rt.nodes import MARKER, NodeToolError, make_work_dir, remove_work_dir


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_work_directory_is_new_0700_and_holds_the_run_token(tmp_path):
    path = tmp_path / "pddlab-cluster-x"
    make_work_dir(str(path), "tok1")
    assert mode(path) == 0o700 and (path / MARKER).read_text() == "tok1"
    make_work_dir(str(path), "tok1")  # the same run on a second node of this machine: its own directory
    assert mode(path) == 0o700


def test_a_directory_someone_made_first_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "pddlab-cluster-x"
    path.mkdir(mode=0o777)
    (path / "configs").mkdir()  # what its maker would have the roles read
    with pytest.raises(NodeToolError, match="this run did not make it"):
        make_work_dir(str(path), "tok1")
    assert sorted(p.name for p in path.iterdir()) == ["configs"]
    other = tmp_path / "other"
    make_work_dir(str(other), "tok2")
    with pytest.raises(NodeToolError):  # another run's, even 0700 and ours by uid
        make_work_dir(str(other), "tok1")


def test_a_link_at_the_path_is_refused(tmp_path):
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(NodeToolError):
        make_work_dir(str(tmp_path / "link"), "tok1")
    assert not (target / MARKER).exists()


def test_a_work_directory_is_removed_only_with_its_run_token(tmp_path):
    path = tmp_path / "wd"
    make_work_dir(str(path), "tok1")
    (path / "logs").mkdir()
    (path / "logs" / "p1.log").write_text("x")
    assert remove_work_dir(str(path), "tok2") is False and path.exists()
    assert remove_work_dir(str(path), "tok1") is True and not path.exists()
    assert remove_work_dir(str(path), "tok1") is False  # gone already


def test_the_ledger_records_and_drops_and_is_this_users_alone(tmp_path):
    state = tmp_path / "state"
    ledger = Ledger.create("10.0.0.1:6379", state)
    assert mode(state) == 0o700 and mode(ledger.path) == 0o600
    entry = ledger.add("shapes", {"node_id": "n1", "node": "10.0.0.2/n1", "interface": "eth1", "handle": "8001:"})
    ledger.add("work_dirs", {"node_id": "n1", "node": "10.0.0.2", "path": "/tmp/pddlab-cluster-ab"})
    (back,) = ledgers(state)
    assert back.shapes == [entry] and back.token == ledger.token and back.address == "10.0.0.1:6379"
    assert back.alive()  # this process keeps it
    ledger.drop("shapes", entry)
    assert json.loads(ledger.path.read_text())["shapes"] == []
    ledger.work_dirs.clear()
    assert ledger.empty()
    ledger.forget()
    assert ledgers(state) == []


def test_a_dead_runs_ledger_is_not_alive(tmp_path):
    ledger = Ledger.create("10.0.0.1:6379", tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ledger.pid = int(gone.stdout)
    assert not ledger.alive()


def test_a_cluster_beds_work_directory_is_not_predictable_from_the_run(tmp_path):
    from experiments.run.clusterbed import ClusterBed
    from experiments.spec.experiment import load_spec

    spec = load_spec("pdd-smoke", overrides=["cluster.address=127.0.0.1:6379", "runtime=ray"])
    out = tmp_path / "20260101-000000-pdd-smoke"
    a, b = ClusterBed(spec, None, out), ClusterBed(spec, None, out)
    assert a.work_dir != b.work_dir
    assert out.name not in a.work_dir and a.work_dir != f"/tmp/pddlab-cluster-{out.name}"

"""The spec's `faults:` (experiments.spec.faults): validation, which variant plays what, and the player's timing
and records, with stand-in kill callables (the real kills are exercised in tests/faults); stop faults against a
real child process, hostile_kv's peer against a real KV receiver on loopback."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from experiments.run import hostile_peer
from experiments.run.faults import FaultPlayer
from experiments.spec.faults import Fault, for_variant, validate
from experiments.spec.experiment import SpecError, load_spec
from tests.roles.test_kvwire_hostile import SETTINGS, errors, wait_until
from tests.roles.test_kvwire_resilience import FP, Recorder, transfer
from workers.kvwire import Inbox, KVReceiver


@pytest.mark.parametrize(
    "faults,needle",
    [
        ((Fault("md", 130.0),), "faults[0].at_s=130.0: must lie in the variant's window [0, 120"),
        ((Fault("md", -1.0),), "faults[0].at_s=-1.0"),
        ((Fault("md", 5.0, ("pdx",)),), "faults[0].variants: ['pdx'] not among"),
        ((Fault("p", 5.0), Fault("p", 9.0, ("pdd",))), "faults[1]: p is killed twice in variant pdd"),
        ((Fault("emulator", 5.0),), "faults[0]: the emulator stays dead once killed"),
        ((Fault("emulator", 5.0, ("pd-cross",)),), "kill it only in the spec's last variant, variants: [pdd]"),
        ((Fault("md", 5.0, after="handoff end"),), "faults[0].after='handoff end': an event name"),
    ],
)
def test_bad_faults_are_refused_naming_the_entry(faults, needle):
    with pytest.raises(ValueError) as info:
        validate(faults, ("pd-cross", "pdd"), 120.0)
    assert needle in str(info.value)


def test_a_spec_with_a_bad_fault_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        load_spec("pdd-smoke", ["faults=[{kill: gpu, at_s: 3}]"])
    allowed = "['p', 'rld', 'md', 'router', 'loadgen', 'emulator', 'p1', 'rld1', 'md1']"
    assert f"faults[0].kill='gpu'; allowed: {allowed}" in str(info.value)
    spec = load_spec("pdd-smoke", ["faults=[{kill: md, at_s: 3, variants: [pdd]}]"])
    assert spec.faults == (Fault("md", 3.0, ("pdd",)),)


def test_each_variant_plays_its_faults_in_time_order():
    faults = (Fault("md", 9.0), Fault("p", 2.0, ("pdd",)), Fault("rld", 1.0, ("pd-cross",)))
    assert for_variant(faults, "pdd") == (Fault("p", 2.0, ("pdd",)), Fault("md", 9.0))
    assert for_variant(faults, "colocated") == (Fault("md", 9.0),)


def test_the_player_kills_on_cue_records_what_it_did_and_what_it_never_played():
    killed = []

    def kill_md():
        killed.append(time.monotonic_ns())
        return 4242

    def kill_p():
        raise OSError("no such process")

    t0 = time.monotonic_ns()
    player = FaultPlayer((Fault("md", 0.2), Fault("p", 0.3), Fault("rld", 30.0)), t0, {"md": kill_md, "p": kill_p})
    player.start()
    time.sleep(0.6)
    records = player.stop()
    assert len(killed) == 1 and 0.2 <= (killed[0] - t0) / 1e9 < 0.5
    md, p, rld = records
    assert md["played"] and md["pid"] == 4242 and md["offset_s"] >= 0.2
    assert p["played"] and p["error"] == "OSError: no such process"
    assert rld == {"kill": "rld", "at_s": 30.0, "played": False}  # the variant ended first


def _emit(path, **event) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(event) + "\n")


def test_a_fault_with_a_cue_waits_for_its_event_from_at_s_on(tmp_path):
    """A cue: the first event of its name (final, where it says) logged at or after at_s, by any role; an
    earlier one, a non-final one or a line still being written does not count."""
    killed = threading.Event()

    def kill_md():
        killed.set()
        return 7

    t0 = time.monotonic_ns()
    rld, md = tmp_path / "rld1.jsonl", tmp_path / "md1.jsonl"
    _emit(rld, t_ns=t0, event="handoff_end", worker="rld1", request_id="early", final=True)  # before at_s
    player = FaultPlayer((Fault("md", 0.1, after="handoff_end"),), t0, {"md": kill_md}, tmp_path).start()
    time.sleep(0.2)
    _emit(rld, t_ns=time.monotonic_ns(), event="handoff_end", worker="rld1", request_id="chunk", final=False)
    _emit(md, t_ns=time.monotonic_ns(), event="handoff_recv_end", worker="md1", request_id="r1")
    with open(md, "a") as fh:  # half a line: not an event yet
        fh.write('{"t_ns": 1, "event": "handoff_e')
    assert not killed.wait(0.2), "killed on an early, a non-final or a half-written event"
    with open(md, "a") as fh:
        fh.write('nd"}\n')
    _emit(rld, t_ns=time.monotonic_ns(), event="handoff_end", worker="rld1", request_id="r1", final=True)
    assert killed.wait(2.0), "not killed on its cue"
    [record] = player.stop()
    assert record["played"] and record["pid"] == 7
    assert record["after"]["request_id"] == "r1" and record["after"]["worker"] == "rld1"


def test_a_cue_that_never_comes_leaves_the_fault_unplayed(tmp_path):
    player = FaultPlayer((Fault("md", 0.0, after="handoff_end"),), time.monotonic_ns(), {}, tmp_path).start()
    time.sleep(0.1)
    assert player.stop() == [{"kill": "md", "at_s": 0.0, "played": False}]


# ---- stop (SIGSTOP, then SIGCONT) and hostile_kv faults (issue 28)


@pytest.mark.parametrize(
    "fault,runtime,needle",
    [
        (Fault("md", 5.0, stop="p"), "process", "faults[0]: one of ['kill', 'stop', 'hostile_kv'] per entry"),
        (Fault(at_s=5.0), "process", "naming its target; it has none"),
        (Fault(stop="p"), "process", "faults[0].at_s: required"),
        (Fault(stop="loadgen", at_s=5.0, duration_s=2), "process", "faults[0].stop='loadgen'; allowed: ['p', 'rld'"),
        (Fault(stop="emulator", at_s=5.0, duration_s=2), "process", "faults[0].stop='emulator'; allowed"),
        (Fault(hostile_kv="p", at_s=5.0, duration_s=2), "process", "hostile_kv='p'; allowed: ['rld', 'md', 'rld1'"),
        (Fault(stop="p", at_s=5.0), "process", "faults[0].duration_s=0.0: must be above 0"),
        (Fault(stop="p", at_s=100.0, duration_s=30), "process", "at_s + duration_s <= 120.0 s"),
        (Fault(hostile_kv="md", at_s=0.0, duration_s=121), "process", "faults[0].duration_s=121.0"),
        (Fault("p", 5.0, duration_s=3), "process", "faults[0].duration_s=3.0: only for stop and hostile_kv"),
        (Fault(stop="md", at_s=5.0, duration_s=2), "docker", "faults[0].stop: not under runtime docker"),
        (Fault(hostile_kv="md", at_s=5.0, duration_s=2), "ray", "faults[0].hostile_kv: not under runtime ray"),
    ],
)
def test_bad_stop_and_hostile_faults_are_refused_naming_the_entry_and_field(fault, runtime, needle):
    with pytest.raises(ValueError) as info:
        validate((fault,), ("pd-cross", "pdd"), 120.0, ("p1", "rld1", "md1"), runtime)
    assert needle in str(info.value)


def test_stop_and_hostile_faults_load_from_a_spec_and_kill_entries_stay_as_they_were():
    spec = load_spec(
        "pdd-smoke",
        [
            "runtime=process",
            "faults=[{stop: rld, at_s: 3, duration_s: 5, variants: [pdd]}, {hostile_kv: md, at_s: 2, duration_s: 10},"
            " {kill: md, at_s: 9}]",
        ],
    )
    stop, hostile, kill = spec.faults
    assert (stop.kind, stop.target, stop.duration_s, stop.variants) == ("stop", "rld", 5.0, ("pdd",))
    assert (hostile.kind, hostile.target) == ("hostile_kv", "md")
    assert kill == Fault("md", 9.0) and kill.kind == "kill"
    with pytest.raises(SpecError) as info:
        load_spec("pdd-smoke", ["faults=[{kill: md, stop: md, at_s: 3, duration_s: 2}]"])
    assert "faults[0]: one of ['kill', 'stop', 'hostile_kv'] per entry, naming its target; it has kill and stop" in str(
        info.value
    )
    with pytest.raises(SpecError) as info:  # pdd-smoke's own runtime: docker
        load_spec("pdd-smoke", ["faults=[{stop: md, at_s: 3, duration_s: 2}]"])
    assert "faults[0].stop: not under runtime docker" in str(info.value)
    assert load_spec("pdd-smoke", ["faults=[{hostile_kv: md, at_s: 3, duration_s: 2}]"]).runtime == "docker"


def _state(pid: int) -> str:
    """The process's state letter in /proc/<pid>/stat (T: stopped; R, S: running or sleeping)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    yield proc
    proc.kill()
    proc.wait(5)


def _signaller(proc):
    sent = []

    def signal_role(target: str, signum: int) -> int:
        assert target == "rld"
        sent.append(signum)
        os.kill(proc.pid, signum)
        return proc.pid

    return signal_role, sent


def test_a_stop_fault_stops_a_real_process_then_resumes_it_and_records_both(child):
    signal_role, sent = _signaller(child)
    t0 = time.monotonic_ns()
    player = FaultPlayer((Fault(stop="rld", at_s=0.2, duration_s=0.6),), t0, {}, signal=signal_role).start()
    time.sleep(0.5)
    assert _state(child.pid) == "T", "not stopped during its window"
    time.sleep(0.6)
    assert _state(child.pid) in "RS", "not resumed after duration_s"
    [record] = player.stop()
    assert sent == [signal.SIGSTOP, signal.SIGCONT]
    assert record["stop"] == "rld" and record["played"] and record["pid"] == child.pid and record["resumed"]
    assert 0.2 <= record["offset_s"] < 0.4 and 0.8 <= record["resumed_offset_s"] < 1.0, record
    assert record["resumed_t_ns"] - record["t_ns"] >= 0.6e9 and record["duration_s"] == 0.6


def test_a_stopped_role_is_resumed_when_the_window_ends_first(child):
    signal_role, sent = _signaller(child)
    faults = (Fault(stop="rld", at_s=0.1, duration_s=60.0), Fault("md", 30.0))
    player = FaultPlayer(faults, time.monotonic_ns(), {}, signal=signal_role).start()
    time.sleep(0.4)
    assert _state(child.pid) == "T"
    stopped, unplayed = player.stop()
    assert _state(child.pid) in "RS", "left stopped when the player was stopped"
    assert stopped["resumed"] and stopped["resumed_offset_s"] < 1.0, stopped
    assert unplayed == {"kill": "md", "at_s": 30.0, "played": False}


def test_a_stop_the_runtime_cannot_play_is_recorded_not_raised():
    player = FaultPlayer((Fault(stop="p", at_s=0.0, duration_s=1.0),), time.monotonic_ns(), {}).start()
    time.sleep(0.1)
    [record] = player.stop()
    assert record["error"] == "RuntimeError: this runtime cannot signal a role's process", record
    assert "resumed" not in record


def test_the_hostile_peer_refuses_an_address_outside_the_namespaces(capsys):
    with pytest.raises(SystemExit) as info:
        hostile_peer.main(["192.0.2.7", "50063", "1"])
    assert info.value.code == 2
    assert "address '192.0.2.7': only an IP in 127.0.0.0/8, 10.1.0.0/24, 10.2.0.0/24" in capsys.readouterr().err


def test_a_hostile_peer_for_2_s_leaves_a_real_receiver_serving_and_is_ended_by_pid():
    """The peer module run as the fault player runs it, against a KVReceiver on loopback: legitimate
    transfers complete while it is at it, and the player ends it and records what it did."""
    inbox, events = Inbox(), Recorder()
    started = []

    def hostile(target: str, duration_s: float) -> subprocess.Popen:
        argv = [sys.executable, "-m", "experiments.run.hostile_peer", "127.0.0.1", str(receiver.port), str(duration_s)]
        started.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        return started[-1]

    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        player = FaultPlayer(
            (Fault(hostile_kv="md", at_s=0.0, duration_s=2.0),), time.monotonic_ns(), {}, None, None, hostile
        )
        player.start()
        deadline = time.monotonic() + 1.8
        time.sleep(0.5)  # the abuse under way
        served = 0
        while time.monotonic() < deadline:
            result, same = transfer(f"127.0.0.1:{receiver.port}", f"legit-{served}", 64, SETTINGS, inbox, Recorder())
            assert result.ok and same, result
            served += 1
        assert started[0].poll() is None, "the peer ended before its duration"
        assert wait_until(lambda: player.records and "exit" in player.records[0], 10), "the player did not end the peer"
        [record] = player.stop()
    assert served >= 1
    assert record["hostile_kv"] == "md" and record["pid"] == started[0].pid and record["exit"] == 0, record
    peer = record["peer"]
    print("hostile peer:", peer, "transfers served meanwhile:", served)
    assert peer["connections"] >= hostile_peer.IDLE_CONNECTIONS + 3 and peer["closed_by_peer"] >= 2, peer
    assert peer["empty_frames"] >= hostile_peer.EMPTY_FRAMES or peer.get("empty_frames_cut"), peer
    assert any("before BEGIN" in r for r in errors(events)), errors(events)  # the receiver saw the abuse


def test_the_process_runtime_signals_a_role_s_process_and_docker_s_refuses(child, tmp_path):
    """deploy.Runtime.signal, what the runner gives the player: the role's first worker's process gets the
    signal; under Docker (the process is the container's docker client) it is refused."""
    from types import SimpleNamespace

    from experiments.run.deploy import Runtime
    from topology.runtime import ProcessRuntime

    runtime = Runtime(SimpleNamespace(config=SimpleNamespace(runtime=ProcessRuntime())), tmp_path, tmp_path)
    runtime.procs["rld1"] = child
    assert runtime.signal("rld", signal.SIGSTOP) == child.pid
    time.sleep(0.1)
    assert _state(child.pid) == "T"
    assert runtime.signal("rld1", signal.SIGCONT) == child.pid
    time.sleep(0.1)
    assert _state(child.pid) in "RS"
    assert runtime.signal("md", signal.SIGSTOP) is None  # not running
    docker = Runtime(
        SimpleNamespace(config=SimpleNamespace(runtime=SimpleNamespace(name="docker"))), tmp_path, tmp_path
    )
    with pytest.raises(RuntimeError, match="runtime docker cannot signal a role's process"):
        docker.signal("rld", signal.SIGSTOP)


def test_stop_and_hostile_records_are_kept_in_metadata():
    """The runner assigns the player's records to metadata.json's FaultRecord (validated on assignment): a
    stop's and a hostile_kv's records must be taken whole, a kill's as before."""
    from experiments.rundir.metadata import FaultRecord

    kill = {"kill": "md", "at_s": 4.0, "played": True, "pid": 42, "t_ns": 9, "offset_s": 4.0}
    stop = {
        **{"stop": "rld", "at_s": 4.0, "played": True, "duration_s": 5.0, "pid": 43, "t_ns": 10, "offset_s": 4.0},
        **{"resumed": True, "resumed_t_ns": 11, "resumed_offset_s": 9.0},
    }
    hostile = {
        **{"hostile_kv": "md", "at_s": 4.0, "played": True, "duration_s": 10.0, "pid": 44, "t_ns": 12},
        **{"offset_s": 4.0, "exit": 0, "ended_t_ns": 13, "ended_offset_s": 14.1, "peer": {"connections": 40}},
    }
    for record in (kill, stop, hostile, {"stop": "p", "at_s": 30.0, "played": False}):
        assert FaultRecord.model_validate(record).model_dump(mode="json") == record


def test_a_hostile_peer_is_ended_at_once_when_the_window_ends_first():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:

        def hostile(target: str, duration_s: float) -> subprocess.Popen:
            argv = [sys.executable, "-m", "experiments.run.hostile_peer", "127.0.0.1", str(receiver.port)]
            return subprocess.Popen([*argv, str(duration_s)], stdout=subprocess.PIPE, text=True)

        fault = Fault(hostile_kv="rld", at_s=0.0, duration_s=60.0)
        player = FaultPlayer((fault,), time.monotonic_ns(), {}, hostile=hostile).start()
        assert wait_until(lambda: len(receiver._conns) >= hostile_peer.IDLE_CONNECTIONS, 15), "the peer never came"
        t = time.monotonic()
        [record] = player.stop()
    assert time.monotonic() - t < 5, "the peer outlived the window"
    assert record["exit"] == 0 and record["ended_offset_s"] < 30, record  # SIGTERM: it prints its counts
    assert record["peer"]["connections"] >= hostile_peer.IDLE_CONNECTIONS and record["peer"]["s"] < 30, record

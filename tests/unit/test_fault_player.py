"""The spec's `faults:` (experiments.spec.faults): validation, which variant plays what, and the player's timing
and records, with stand-in kill callables (the real kills are exercised in tests/faults)."""

import json
import threading
import time

import pytest

from experiments.run.faults import FaultPlayer
from experiments.spec.faults import Fault, for_variant, validate
from experiments.spec.experiment import SpecError, load_spec


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

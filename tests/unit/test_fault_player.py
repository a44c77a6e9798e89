"""The spec's `faults:` (experiments.faults): validation, which variant plays what, and the player's timing
and records, with stand-in kill callables (the real kills are exercised in tests/faults)."""

import time

import pytest

from experiments.faults import Fault, FaultPlayer, for_variant, validate
from experiments.spec import SpecError, load_spec


@pytest.mark.parametrize(
    "faults,needle",
    [
        ((Fault("md", 130.0),), "faults[0].at_s=130.0: must lie in the variant's window [0, 120"),
        ((Fault("md", -1.0),), "faults[0].at_s=-1.0"),
        ((Fault("md", 5.0, ("pdx",)),), "faults[0].variants: ['pdx'] not among"),
        ((Fault("p", 5.0), Fault("p", 9.0, ("pdd",))), "faults[1]: p is killed twice in variant pdd"),
        ((Fault("emulator", 5.0),), "faults[0]: the emulator stays dead once killed"),
        ((Fault("emulator", 5.0, ("pd-cross",)),), "kill it only in the spec's last variant, variants: [pdd]"),
    ],
)
def test_bad_faults_are_refused_naming_the_entry(faults, needle):
    with pytest.raises(ValueError) as info:
        validate(faults, ("pd-cross", "pdd"), 120.0)
    assert needle in str(info.value)


def test_a_spec_with_a_bad_fault_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        load_spec("pdd-smoke", ["faults=[{kill: gpu, at_s: 3}]"])
    assert "faults[0].kill='gpu'; allowed: ['p', 'rld', 'md', 'router', 'loadgen', 'emulator']" in str(info.value)
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

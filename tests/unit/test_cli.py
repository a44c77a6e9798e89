"""The pddlab command line: bad input fails before anything starts, with one clear line."""

import pytest

from experiments.cli import main


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "no-such-experiment"], "unknown experiment 'no-such-experiment'; available: link-calibration"),
        (["run", "--profile", "no-such-profile"], "unknown profile 'no-such-profile'; available:"),
        (["check-profile", "/nonexistent/x.yaml"], "no such profile file"),
    ],
)
def test_bad_input_is_one_clear_error(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pddlab: error:") and needle in err
    assert "Traceback" not in err


def test_bad_backend_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--backend", "magic"])
    assert exc.value.code == 2
    assert "invalid choice: 'magic'" in capsys.readouterr().err


def test_profiles_lists_every_profile(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in ("lan", "wan-cross-country", "wan-lossy", "wan-congested", "wan-flaky", "wan-regional"):
        assert name in out


def test_check_profile_prints_each_directions_netem_line(capsys):
    from topology.netem_grammar import parse_netem

    assert main(["check-profile", "netem_profiles/wan-lossy.yaml"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = {ln.split(":")[0].strip(): ln.split("netem ", 1)[1] for ln in out if ln.startswith("  ")}
    assert set(lines) == {"a_to_b", "b_to_a"}
    assert "loss gemodel 1% 25% 50% 0%" in lines["a_to_b"]
    parse_netem(lines["a_to_b"])  # what it prints is a netem line the grammar reads back


@pytest.mark.parametrize("value", ["0", "-3"])
def test_serve_refuses_a_max_in_flight_below_one(capsys, value):
    assert main(["serve", "pdd-smoke", "--max-in-flight", value]) == 2
    assert "--max-in-flight" in capsys.readouterr().err


def test_check_profile_names_a_trace_directions_trace_and_tcs_approximation(capsys):
    # a trace's rate is in no netem line: without this the profile read as an unlimited line
    assert main(["check-profile", "netem_profiles/wan-cellular-trace.yaml"]) == 0
    out = [ln for ln in capsys.readouterr().out.splitlines() if "rate_trace" in ln]
    assert len(out) == 2 and all("cellular-steps.trace: mean 27.88 Mbit/s" in ln for ln in out), out
    assert all("one rate per 100 ms window" in ln for ln in out)

"""netem's options added to the grammar: slot, 4-state loss, duplicate/corrupt/reorder correlation, rate overhead and
cells, distribution tables (shipped and a user's .dist): meaning as in tc-netem(8), string -> LinkParams -> string round
trips, refusals naming the token, and the tc backend's argv carrying the same line."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.netem_grammar import NetemSyntaxError, parse_netem
from topology.netem_options import FourStateLoss, Slot
from topology.profiles import LinkParams, ProfileError, link_params_from_dict, load_profile, profile_from_dict
from topology.tc import netem_cmd

from test_netem_grammar import assert_round_trip, line_of, params  # the grammar tests' round trip, shared


@pytest.mark.parametrize(
    "line, expected, rendered",
    [
        ("slot 10ms", {"slot": Slot(delay_ms=10)}, "slot 10000us"),
        ("slot 1ms 5ms", {"slot": Slot(delay_ms=1, max_delay_ms=5)}, "slot 1000us 5000us"),
        ("slot 1ms 5ms packets 10 bytes 64kb", {"slot": Slot(delay_ms=1, max_delay_ms=5, packets=10, bytes=65536)},
         "slot 1000us 5000us packets 10 bytes 65536"),
        ("slot 2ms pack 4", {"slot": Slot(delay_ms=2, packets=4)}, "slot 2000us packets 4"),  # tc's prefixes
        ("slot 2ms bytes 3000", {"slot": Slot(delay_ms=2, bytes=3000)}, "slot 2000us bytes 3000"),
        ("slot distribution pareto 5ms 1ms", {"slot": Slot(delay_ms=5, distribution="pareto", jitter_ms=1)},
         "slot distribution pareto 5000us 1000us"),
        ("slot distribution normal 800us 100us packets 2",
         {"slot": Slot(delay_ms=0.8, distribution="normal", jitter_ms=0.1, packets=2)},
         "slot distribution normal 800us 100us packets 2"),
        # iproute2's defaults after p13: p31 = 100% - p13, p32 = 0, p23 = 100%, p14 = 0.
        ("loss state 1%", {"loss_state": FourStateLoss(p13_pct=1, p31_pct=99, p32_pct=0, p23_pct=100, p14_pct=0)},
         "loss state 1% 99% 0% 100% 0%"),
        ("loss state 1% 30%", {"loss_state": FourStateLoss(p13_pct=1, p31_pct=30)}, "loss state 1% 30% 0% 100% 0%"),
        ("loss state 1% 30% 10% 60% 2%",
         {"loss_state": FourStateLoss(p13_pct=1, p31_pct=30, p32_pct=10, p23_pct=60, p14_pct=2)},
         "loss state 1% 30% 10% 60% 2%"),
        ("drop state 0.5 20", {"loss_state": FourStateLoss(p13_pct=0.5, p31_pct=20)}, "loss state 0.5% 20% 0% 100% 0%"),
        ("duplicate 1% 25%", {"duplicate_pct": 1, "duplicate_correlation_pct": 25}, "duplicate 1% 25%"),
        ("corrupt 0.1% 50", {"corrupt_pct": 0.1, "corrupt_correlation_pct": 50}, "corrupt 0.1% 50%"),
        ("delay 10ms reorder 25% 50% gap 3", {"reorder_pct": 25, "reorder_correlation_pct": 50, "reorder_gap": 3},
         "delay 10000us reorder 25% 50% gap 3"),
        ("rate 100mbit 20", {"rate_packet_overhead_bytes": 20}, "rate 100000000bit 20"),
        ("rate 100mbit -4", {"rate_packet_overhead_bytes": -4}, "rate 100000000bit -4"),
        ("rate 8mbit 0 48 5", {"rate_cell_bytes": 48, "rate_cell_overhead_bytes": 5}, "rate 8000000bit 0 48 5"),
        ("rate 8mbit 0 53", {"rate_cell_bytes": 53}, "rate 8000000bit 0 53"),
        ("rate 8mbit 0 0 0", {"rate_mbit": 8}, "rate 8000000bit"),  # netem's defaults, not dropped
        ("delay 10ms 2ms distribution normal", {"delay_distribution": "normal"},
         "delay 10000us 2000us distribution normal"),
    ],
)  # fmt: skip
def test_each_new_option_means_what_tc_means_and_round_trips(line, expected, rendered):
    p = assert_round_trip(line)
    for field, value in expected.items():
        assert getattr(p, field) == value, (field, getattr(p, field))
    assert line_of(p) == rendered


def test_every_new_option_together_round_trips_and_is_the_tc_argv():
    line = (
        "limit 5000 delay 10ms 2ms 5% distribution paretonormal loss state 1% 30% 10% 60% 2% duplicate 1% 25% "
        "corrupt 0.1% 50% reorder 25% 50% gap 3 rate 100mbit 20 53 5 slot 1ms 5ms packets 10 bytes 3000"
    )
    p = assert_round_trip(line)
    assert p.netem_line() == (
        "limit 5000 delay 10000us 2000us 5% distribution paretonormal loss state 1% 30% 10% 60% 2% duplicate 1% 25% "
        "corrupt 0.1% 50% reorder 25% 50% gap 3 rate 100000000bit 20 53 5 slot 1000us 5000us packets 10 bytes 3000"
    )
    assert netem_cmd("eth9", p) == ["tc", "qdisc", "replace", "dev", "eth9", "root", "netem", *p.netem_line().split()]


@pytest.mark.parametrize(
    "line, needle",
    [
        ("slot", "end of line after 'slot': expected slot's MIN_DELAY or `distribution`"),
        ("slot 5ms 1ms", "token 3 '1ms': expected a MAX_DELAY no smaller than slot's MIN_DELAY"),
        ("slot 5", "token 2 '5': expected slot's MIN_DELAY: a time"),
        ("slot foo 1ms", "token 2 'foo': expected slot's MIN_DELAY (a time) or `distribution NAME DELAY JITTER`"),
        ("slot distribution uniform 1ms 1ms", "token 3 'uniform': expected a table (uniform slots are"),
        ("slot distribution cauchy 1ms 1ms", "token 3 'cauchy': expected a distribution"),
        ("slot distribution normal 5ms 0ms", "token 5 '0ms': expected a positive slot JITTER"),
        ("slot distribution normal 5ms", "end of line after '5ms': expected slot's JITTER"),
        ("slot 1ms packets -1", "token 4 '-1': expected slot's packets"),
        ("slot 1ms bytes 1x", "token 4 '1x': expected slot's bytes"),
        ("loss state", "end of line after 'state': expected 4-state loss's p13"),
        ("loss state 101%", "token 3 '101%': expected 4-state loss's p13"),
        ("loss state 1% 30% 200%", "token 5 '200%': expected 4-state loss's p32"),
        ("duplicate 0% 25%", "token 3 '25%': expected no correlation with a zero duplicate"),
        ("corrupt 0 1", "token 3 '1': expected no correlation with a zero corrupt"),
        ("rate 100mbit 1.5", "token 3 '1.5': expected the rate's packet overhead in bytes"),
        ("rate 100mbit 0 -53", "token 4 '-53': expected the rate's cell size in bytes"),
        ("rate 100mbit 0 0 5", "token 5 '5': expected a cell size > 0 before a cell overhead"),
        ("rate 0bit 20", "token 3 '20': expected a rate > 0 with an overhead or a cell size"),
        ("delay 10ms 2ms distribution cauchy", "token 5 'cauchy': expected a distribution: uniform, normal"),
    ],
)
def test_bad_new_options_name_the_token(line, needle):
    with pytest.raises(NetemSyntaxError) as err:
        parse_netem(line)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"loss_pct": 1, "loss_state": {"p13_pct": 1}}, "loss_pct, loss_ge and loss_state are exclusive"),
        ({"duplicate_correlation_pct": 5}, "duplicate_correlation_pct: needs duplicate_pct > 0"),
        ({"rate_cell_bytes": 53}, "need rate_mbit > 0"),
        ({"rate_mbit": 1, "rate_cell_overhead_bytes": 5}, "rate_cell_overhead_bytes: needs rate_cell_bytes > 0"),
        ({"slot": {"delay_ms": 5, "max_delay_ms": 1}}, "slot: max_delay_ms 1.0 < delay_ms 5.0"),
        ({"slot": {"delay_ms": 5, "jitter_ms": 1}}, "slot: jitter_ms needs a distribution"),
        ({"delay_ms": 5, "jitter_ms": 1, "delay_distribution": "/nonexistent/x.dist"}, "x.dist: no such file"),
        ({"rate_trace": "/nonexistent.trace"}, "rate_trace: rate_trace /nonexistent.trace"),
    ],
)
def test_link_params_refuse_what_tc_refuses(fields, needle):
    with pytest.raises(ProfileError) as err:
        link_params_from_dict(fields, "x")
    assert needle in str(err.value)


def _write_table(path: Path, values: list[int]) -> Path:
    rows = (" ".join(map(str, values[i : i + 8])) for i in range(0, len(values), 8))
    path.write_text("# a user's table, iproute2's format\n" + "\n".join(rows) + "\n")
    return path


def test_a_users_dist_file_in_a_profile_is_relative_to_it_and_tc_reads_it_from_its_folder(tmp_path):
    _write_table(tmp_path / "mine.dist", [8192] * 16)
    (tmp_path / "p.yaml").write_text('name: p\nlink: {netem: "delay 10ms 2ms distribution mine.dist"}\n')
    p = load_profile(tmp_path / "p.yaml").a_to_b
    assert p.delay_distribution == str(tmp_path / "mine.dist")
    assert p.netem_line() == f"limit 1000 delay 10000us 2000us distribution {tmp_path}/mine.dist"
    tc_line = ["netem", "limit", "1000", "delay", "10000us", "2000us", "distribution", "mine"]
    assert netem_cmd("eth0", p) == ["env", f"TC_LIB_DIR={tmp_path}", "tc", "qdisc", "replace", "dev", "eth0", "root",
                                    *tc_line]  # fmt: skip
    assert assert_round_trip(p.netem_line()) == p.replace(limit_pkts=1000)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("1 2 x\n", "bad.dist:2: 'x' is not an integer"),
        ("40000\n", "bad.dist:2: 40000 does not fit netem's 16-bit table entries"),
        ("", "bad.dist: empty distribution table"),
        ("1 " * 16385, "16385 entries, netem takes at most 16384"),
    ],
)
def test_a_bad_dist_file_is_refused_naming_file_and_line(tmp_path, body, needle):
    (tmp_path / "bad.dist").write_text("# comment\n" + body)
    with pytest.raises(ProfileError) as err:
        link_params_from_dict({"delay_ms": 5, "jitter_ms": 1, "delay_distribution": str(tmp_path / "bad.dist")}, "x")
    assert needle in str(err.value)


def test_tc_cannot_mix_a_users_table_with_a_shipped_one(tmp_path):
    _write_table(tmp_path / "mine.dist", [0, 1])
    p = params(f"delay 10ms 2ms distribution {tmp_path}/mine.dist slot distribution normal 5ms 1ms")
    with pytest.raises(ValueError, match="one TC_LIB_DIR"):
        netem_cmd("eth0", p)


def test_four_state_stationary_loss_is_the_chains():
    # Balance equations by hand for p13 1%, p31 30%, p32 10%, p23 60%, p14 2%:
    # pi3 = pi1/30, pi2 = pi1/180, pi4 = pi1/50.
    st = FourStateLoss(p13_pct=1, p31_pct=30, p32_pct=10, p23_pct=60, p14_pct=2)
    expected = (1 / 30 + 1 / 50) / (1 + 1 / 180 + 1 / 30 + 1 / 50) * 100
    assert st.mean_loss_pct() == pytest.approx(expected, rel=1e-6)
    assert LinkParams(loss_state=st).expected_loss_pct == pytest.approx(expected, rel=1e-6)
    # A chain that never leaves state 1 loses nothing; one that alternates 1 -> 4 -> 1 loses every other packet.
    assert FourStateLoss(p13_pct=0, p31_pct=0).mean_loss_pct() == 0
    assert FourStateLoss(p13_pct=0, p14_pct=100).mean_loss_pct() == pytest.approx(50)


def test_a_profile_may_give_the_new_options_as_fields():
    fields = {"delay_ms": 10, "loss_state": {"p13_pct": 1}, "slot": {"delay_ms": 2, "packets": 4},
              "rate_mbit": 8, "rate_cell_bytes": 48, "rate_cell_overhead_bytes": 5}  # fmt: skip
    p = profile_from_dict({"name": "x", "link": fields}, "x.yaml").a_to_b
    assert p.netem_line() == ("limit 1000 delay 10000us loss state 1% 99% 0% 100% 0% rate 8000000bit 0 48 5 "
                              "slot 2000us packets 4")  # fmt: skip


# ---- property-based: lines with the new options in any order ----


@st.composite
def new_option_lines(draw):
    pct = st.integers(0, 10000).map(lambda v: f"{v / 100:g}%")
    nonzero = st.integers(1, 10000).map(lambda v: f"{v / 100:g}%")
    us = st.integers(0, 60_000_000)
    parts = ["delay 10ms"]
    if draw(st.booleans()):
        lo = draw(us)
        kind = draw(st.sampled_from(["fixed", "range", "dist"]))
        if kind == "dist":
            table = draw(st.sampled_from(["normal", "pareto", "paretonormal"]))
            slot = f"slot distribution {table} {lo}us {draw(st.integers(1, 60_000_000))}us"
        else:
            slot = f"slot {lo}us" + (f" {draw(st.integers(lo, 60_000_000))}us" if kind == "range" else "")
        for word in ("packets", "bytes"):
            if draw(st.booleans()):
                slot += f" {word} {draw(st.integers(0, 2**31 - 1))}"
        parts.append(slot)
    if draw(st.booleans()):
        parts.append(" ".join(["loss state", *draw(st.lists(pct, min_size=1, max_size=5))]))
    for option in ("duplicate", "corrupt", "reorder"):
        if draw(st.booleans()):
            parts.append(f"{option} {draw(nonzero)}" + (f" {draw(pct)}" if draw(st.booleans()) else ""))
    if draw(st.booleans()):
        extra = draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3))
        if len(extra) >= 2:
            extra[1] = abs(extra[1]) or 1  # a cell size is unsigned; a cell overhead needs one
        parts.append(" ".join(["rate", f"{draw(st.integers(1, 10**11))}bit", *map(str, extra)]))
    return " ".join(draw(st.permutations(parts)))


@settings(max_examples=300, deadline=None)
@given(new_option_lines())
def test_any_line_with_the_new_options_round_trips(line):
    p = assert_round_trip(line)
    applied = netem_cmd("d", p)[7:]
    # tc applies the printed line; a duplicate correlation no other correlation carries rides on a zero delay one
    same = params(" ".join(applied)).netem_line() == p.netem_line()
    assert applied == p.netem_line().split() or (p.duplicate_correlation_pct and same)

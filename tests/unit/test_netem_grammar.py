"""netem's grammar in and out: a netem line read with tc-netem(8)'s units and rules, refused with the token named,
and every LinkParams rendered as the line the tc backend applies; string -> LinkParams -> string round trips."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.netem_grammar import DISTRIBUTIONS, NetemSyntaxError, parse_netem, render_netem
from topology.profiles import DISTRIBUTIONS as PROFILE_DISTRIBUTIONS
from topology.tc import netem_cmd
from topology.profiles import GilbertElliott, LinkParams, ProfileError, link_params_from_dict, profile_from_dict


def params(line: str) -> LinkParams:
    return link_params_from_dict(parse_netem(line), "<line>")


def line_of(p: LinkParams) -> str:
    return " ".join(render_netem(p))


def assert_round_trip(line: str) -> LinkParams:
    """string -> LinkParams -> string -> LinkParams gives the same LinkParams, and the rendered line is a fixpoint."""
    first = params(line)
    again = params(line_of(first))
    assert again == first, (line, line_of(first))
    assert line_of(again) == line_of(first)
    return first


# ---- every supported option: its meaning, and the round trip ----


@pytest.mark.parametrize(
    "line, expected",
    [
        ("limit 3000", {"limit_pkts": 3000}),
        ("delay 40ms", {"delay_ms": 40}),
        ("delay 1s 250usec", {"delay_ms": 1000, "jitter_ms": 0.25}),
        ("delay 0.5sec 1500us 25%", {"delay_ms": 500, "jitter_ms": 1.5, "delay_correlation_pct": 25}),
        ("latency 10msec 2msecs", {"delay_ms": 10, "jitter_ms": 2}),  # latency is delay's alias
        ("delay 2000ns", {"delay_ms": 0.002}),
        ("delay 40ms 8ms distribution pareto", {"delay_ms": 40, "jitter_ms": 8, "delay_distribution": "pareto"}),
        ("delay 40ms 8ms distribution uniform", {"delay_ms": 40, "jitter_ms": 8}),
        ("delay 40ms 8ms distribution paretonormal", {"delay_distribution": "paretonormal"}),
        ("delay 40ms 8ms 10% distribution normal", {"delay_distribution": "normal", "delay_correlation_pct": 10}),
        ("loss 1%", {"loss_pct": 1}),
        ("loss 0.5", {"loss_pct": 0.5}),  # a bare number is a percentage, as in tc
        ("loss random 2% 25%", {"loss_pct": 2, "loss_correlation_pct": 25}),
        ("drop 3%", {"loss_pct": 3}),  # drop is loss's alias
        ("loss gemodel 1%", {"loss_ge": GilbertElliott(p_pct=1, r_pct=100, bad_loss_pct=100, good_loss_pct=0)}),
        ("loss gemodel 1% 25% 50% 0%", {"loss_ge": GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=50)}),
        ("loss gemodel 1% 30%", {"loss_ge": GilbertElliott(p_pct=1, r_pct=30)}),
        ("loss gemodel 1 25 80 2", {"loss_ge": GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=80, good_loss_pct=2)}),
        ("duplicate 1%", {"duplicate_pct": 1}),
        ("duplicate 1% 0%", {"duplicate_pct": 1}),  # a zero correlation is netem's default, not dropped
        ("corrupt 0.1%", {"corrupt_pct": 0.1}),
        ("delay 10ms reorder 25%", {"delay_ms": 10, "reorder_pct": 25, "reorder_gap": 0}),
        ("delay 10ms reorder 25% gap 5", {"reorder_pct": 25, "reorder_gap": 5}),
        ("gap 5 reorder 25% delay 10ms", {"reorder_pct": 25, "reorder_gap": 5}),  # gap is its own option in tc
        ("rate 100mbit", {"rate_mbit": 100}),
        ("rate 1gbit", {"rate_mbit": 1000}),
        ("rate 1500kbit", {"rate_mbit": 1.5}),
        ("rate 2Mbit", {"rate_mbit": 2}),  # units are case-insensitive
        ("rate 1mbps", {"rate_mbit": 8}),  # tc: mbps is megaBYTES per second
        ("rate 1kibit", {"rate_mbit": 0.001024}),
        ("rate 100bit", {"rate_mbit": 0.0001}),
        ("rate 100mbit 0", {"rate_mbit": 100}),  # a zero packet overhead is netem's default
        ("del 10ms du 1%", {"delay_ms": 10, "duplicate_pct": 1}),  # tc takes any prefix of a keyword
        ("netem delay 10ms", {"delay_ms": 10}),
        ("tc qdisc add dev eth0 root netem delay 100ms loss 1%", {"delay_ms": 100, "loss_pct": 1}),
        ("", {}),
    ],
)
def test_each_option_means_what_tc_means_and_round_trips(line, expected):
    p = assert_round_trip(line)
    for field, value in expected.items():
        wanted = pytest.approx(value) if isinstance(value, float | int) else value
        assert getattr(p, field) == wanted, field


def test_the_issue_example_round_trips():
    line = "delay 40ms 8ms 25% distribution pareto loss gemodel 1% 25% 50% 0% rate 100mbit"
    p = assert_round_trip(line)
    assert (p.delay_ms, p.jitter_ms, p.delay_correlation_pct, p.delay_distribution) == (40, 8, 25, "pareto")
    assert p.loss_ge == GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=50, good_loss_pct=0)
    assert p.rate_mbit == 100
    assert line_of(p) == "delay 40000us 8000us 25% distribution pareto loss gemodel 1% 25% 50% 0% rate 100000000bit"


# ---- refusals: the offending token, its position and what was expected ----


@pytest.mark.parametrize(
    "line, needle",
    [
        ("delay", "end of line after 'delay': expected a time"),
        ("delay 40", "token 2 '40': expected a time"),  # a time needs its unit
        ("delay 40 ms", "token 2 '40': expected a time"),
        ("delay 1.5us", "token 2 '1.5us': expected a time in whole microseconds"),
        ("delay 61s", "token 2 '61s': expected a time in whole microseconds up to 60s"),
        ("delay 10ms 2xs", "token 3 '2xs': expected a jitter"),
        ("delay 10ms 0ms 25%", "token 4 '25%': expected no correlation with a zero jitter"),
        ("delay 10ms 2ms 101%", "token 4 '101%': expected the delay's correlation"),
        ("loss 150%", "token 2 '150%': expected the loss: a percentage in [0, 100]"),
        ("loss 1.1234567%", "at most 6 significant digits"),
        ("loss 0% 25%", "token 3 '25%': expected no correlation with a zero loss"),
        ("loss bursty 1%", "token 2 'bursty': expected a loss model (random, state, gemodel)"),
        ("loss", "end of line after 'loss': expected a loss model"),
        ("loss gemodel x", "token 3 'x': expected gemodel's p"),
        ("loss 1% drop 2%", "token 3 'drop': expected each option once (loss was already given as token 1)"),
        ("delay 1ms latency 2ms", "token 3 'latency': expected each option once"),
        ("rate 100", "token 2 '100': expected a rate"),  # a rate needs its unit
        ("rate 100mbits", "token 2 '100mbits': expected a rate"),
        ("rate 1.5bit", "token 2 '1.5bit': expected a rate in whole bit/s"),
        ("rate 101gbit", "token 2 '101gbit': expected a rate in whole bit/s up to 100gbit"),
        ("limit 0", "token 2 '0': expected a queue limit in packets, 1 to"),
        ("limit many", "token 2 'many': expected a queue limit"),
        ("delay 10ms reorder 5% gap -1", "token 6 '-1': expected a reorder gap"),
        ("reorder 5%", "token 1 'reorder': expected a delay: reordering is not possible without some delay"),
        ("delay 10ms gap 5", "token 3 'gap': expected a reorder PERCENT > 0"),
        ("distribution normal", "token 1 'distribution': expected a delay and a jitter, both > 0"),
        ("delay 0ms 5ms distribution normal", "token 4 'distribution': expected a delay and a jitter, both > 0"),
        ("delay 10ms bogus", "token 3 'bogus': expected an option: limit, latency, delay"),
        ("tc qdisc add dev eth0 root htb", "a tc command without 'netem'"),
    ],
)
def test_bad_lines_name_the_token_and_what_was_expected(line, needle):
    with pytest.raises(NetemSyntaxError) as err:
        parse_netem(line)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "line, token, option",
    [
        ("loss 1% ecn", "token 3 'ecn'", "ecn"),
        ("rate 50%", "token 2 '50%'", "a rate as a share of the device's speed"),
    ],
)
def test_options_linkparams_cannot_hold_are_refused_not_dropped(line, token, option):
    with pytest.raises(NetemSyntaxError) as err:
        parse_netem(line)
    assert f"{token}: not supported yet: {option}" in str(err.value)


def test_the_grammar_and_the_profiles_know_the_same_distributions():
    assert DISTRIBUTIONS == PROFILE_DISTRIBUTIONS


# ---- property-based: lines generated from the supported grammar ----

_TIME_UNITS = {"s": 1_000_000, "sec": 1_000_000, "ms": 1000, "msec": 1000, "us": 1, "usec": 1}
_RATE_UNITS = {"bit": 1, "kbit": 1000, "mbit": 10**6, "gbit": 10**9, "bps": 8, "kbps": 8000, "mbps": 8 * 10**6}


@st.composite
def times(draw, lo_us=0, hi_us=60_000_000):
    us = draw(st.integers(lo_us, hi_us))
    fitting = [u for u, f in _TIME_UNITS.items() if us % f == 0]
    unit = draw(st.sampled_from(fitting))
    return f"{us // _TIME_UNITS[unit]}{unit}"


@st.composite
def pcts(draw, nonzero=False):
    value = draw(
        st.decimals(min_value=0, max_value=100, places=draw(st.integers(0, 4))).filter(lambda v: v or not nonzero)
    )
    return f"{value}{draw(st.sampled_from(['%', '']))}"


@st.composite
def rates(draw):
    unit = draw(st.sampled_from(sorted(_RATE_UNITS)))
    return f"{draw(st.integers(0, 100_000_000_000 // _RATE_UNITS[unit]))}{unit}"


@st.composite
def netem_lines(draw):
    """A line of supported options in any order; reorder and distribution only where tc accepts them."""
    parts: list[str] = []
    delay_us = draw(st.integers(0, 60_000_000))
    jitter = draw(st.one_of(st.none(), times(1, 60_000_000)))
    if draw(st.booleans()):
        parts.append(
            " ".join([draw(st.sampled_from(["delay", "latency"])), f"{delay_us}us", *(jitter and [jitter] or [])])
        )
        if jitter and draw(st.booleans()):
            parts[-1] += f" {draw(pcts())}"
        if jitter and delay_us and draw(st.booleans()):
            parts.append(f"distribution {draw(st.sampled_from(DISTRIBUTIONS))}")
    else:
        delay_us = 0
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["random", "bare", "gemodel"]))
        if kind == "gemodel":
            parts.append(" ".join(["loss gemodel", *draw(st.lists(pcts(), min_size=1, max_size=4))]))
        else:
            loss = draw(pcts(nonzero=True))
            corr = draw(st.one_of(st.none(), pcts()))
            parts.append(" ".join(["loss", *(["random"] if kind == "random" else []), loss, *([corr] if corr else [])]))
    for option in ("duplicate", "corrupt"):
        if draw(st.booleans()):
            parts.append(f"{option} {draw(pcts())}")
    if delay_us and draw(st.booleans()):
        parts.append(f"reorder {draw(pcts(nonzero=True))}")
        if draw(st.booleans()):
            parts.append(f"gap {draw(st.integers(0, 1_000_000))}")
    if draw(st.booleans()):
        parts.append(f"rate {draw(rates())}")
    if draw(st.booleans()):
        parts.append(f"limit {draw(st.integers(1, 10_000_000))}")
    return " ".join(draw(st.permutations(parts)))


@settings(max_examples=300, deadline=None)
@given(netem_lines())
def test_any_supported_line_round_trips(line):
    assert_round_trip(line)


@st.composite
def any_link_params(draw):
    """LinkParams from their own fields (the YAML form), times in whole microseconds and rates in whole bit/s
    (what a netem line carries: the tc backend rounds finer values, and the grammar refuses them)."""
    pct, us = st.floats(0, 100), st.integers(0, 60_000_000).map(lambda n: n / 1000)
    fields = {
        "rate_mbit": draw(st.integers(0, 10**11)) / 1e6,
        "limit_pkts": draw(st.integers(0, 10_000_000)),
        "delay_ms": draw(us.filter(bool)),
        "jitter_ms": draw(us),
        "delay_distribution": draw(st.sampled_from(DISTRIBUTIONS)),
        "delay_correlation_pct": draw(pct),
        "duplicate_pct": draw(pct),
        "corrupt_pct": draw(pct),
        "reorder_pct": draw(pct),
    }
    if draw(st.booleans()):
        fields["loss_ge"] = {"p_pct": draw(pct), "r_pct": draw(pct), "bad_loss_pct": draw(pct)}
    else:
        fields |= {"loss_pct": draw(pct), "loss_correlation_pct": draw(pct)}
    if fields["reorder_pct"]:
        fields["reorder_gap"] = draw(st.integers(0, 1_000_000))
    return link_params_from_dict(fields, "<generated>")


@settings(max_examples=300, deadline=None)
@given(any_link_params())
def test_every_link_params_renders_a_line_that_reads_back_to_the_same_line(p):
    line = line_of(p)
    assert line_of(params(line)) == line


# ---- profiles written as netem lines ----


def test_a_profile_direction_as_a_netem_line_equals_the_same_fields():
    line = "delay 40ms 8ms distribution paretonormal loss gemodel 1% 25% 50% 0% duplicate 0.1% rate 100mbit"
    as_line = profile_from_dict({"name": "x", "link": {"netem": line}, "b_to_a": {"rate_mbit": 50}}, "x.yaml")
    ge = {"p_pct": 1, "r_pct": 25, "bad_loss_pct": 50, "good_loss_pct": 0}
    fields = {"delay_ms": 40, "jitter_ms": 8, "delay_distribution": "paretonormal", "duplicate_pct": 0.1,
              "loss_ge": ge, "rate_mbit": 100}  # fmt: skip
    as_fields = profile_from_dict({"name": "x", "link": fields, "b_to_a": {"rate_mbit": 50}}, "x.yaml")
    assert (as_line.a_to_b, as_line.b_to_a) == (as_fields.a_to_b, as_fields.b_to_a)
    assert as_line.b_to_a.rate_mbit == 50 and as_line.b_to_a.delay_ms == 40


def test_netem_lines_per_direction_are_what_tc_applies():
    p = profile_from_dict({"name": "x", "a_to_b": {"netem": "delay 30ms rate 200mbit"}}, "x.yaml")
    # 200 Mbit/s = 16,512 frames/s: 495.4 inside the 30 ms, plus 2 BDPs over 60 ms (1981.4): 2477.
    assert p.netem_lines() == {"a_to_b": "limit 2477 delay 30000us rate 200000000bit", "b_to_a": "limit 1000"}
    for direction, line in p.netem_lines().items():
        assert netem_cmd("dev0", p.direction(direction)) == ["tc", "qdisc", "replace", "dev", "dev0", "root", "netem",
                                                             *line.split()]  # fmt: skip


@pytest.mark.parametrize(
    "direction, body, needle",
    [
        ("a_to_b", {"netem": "delay 40ms ecn"}, "x.yaml: a_to_b.netem 'delay 40ms ecn': token 3 'ecn': "
         "not supported yet: ecn"),
        ("link", {"netem": "delay 40"}, "x.yaml: link.netem 'delay 40': token 2 '40': expected a time"),
        ("b_to_a", {"netem": "delay 1ms", "rate_mbit": 5}, "x.yaml: b_to_a: give a netem line or LinkParams fields, "
         "not both (also found ['rate_mbit'])"),
        ("link", {"netem": 40}, "x.yaml: link.netem: expected a netem line (a string), got 40"),
    ],
)  # fmt: skip
def test_a_bad_netem_line_in_a_profile_names_file_direction_and_token(direction, body, needle):
    with pytest.raises(ProfileError) as err:
        profile_from_dict({"name": "x", direction: body}, "x.yaml")
    assert needle in str(err.value)


def test_a_distribution_without_a_delay_is_refused_as_tc_refuses_it():
    with pytest.raises(ProfileError, match="delay_distribution: normal needs delay_ms > 0"):
        link_params_from_dict({"jitter_ms": 5, "delay_distribution": "normal"}, "x")
    assert LinkParams(jitter_ms=5).jitter_ms == 5  # uniform jitter around no delay is fine in tc


_VOCABULARY = ["limit", "delay", "latency", "loss", "drop", "random", "gemodel", "state", "ecn", "reorder", "corrupt",
               "gap", "duplicate", "distribution", "normal", "rate", "slot", "de", "l", "1e999999999ms", "-1", "0",
               "1e-9999%", "5", "40ms", "8ms", "25%", "100mbit", "1.5", "nan", "inf", "²", "100%", "101%"]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(st.sampled_from(_VOCABULARY), max_size=12).map(" ".join)))
def test_any_text_is_read_or_refused_with_netems_error_only(line):
    try:
        fields = parse_netem(line)
    except NetemSyntaxError as err:
        assert "expected" in str(err) or "not supported yet" in str(err)
        return
    assert_round_trip(line) if fields else None

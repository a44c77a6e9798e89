"""Profile loading and validation: every shipped profile loads; bad input names file, field and allowed values."""

import textwrap

import pytest

from topology.profiles import (
    PACKET_IMPAIRMENTS,
    TIMING,
    GilbertElliott,
    LinkParams,
    ProfileError,
    available_profiles,
    link_params_from_dict,
    load_profile,
    profile_from_dict,
)

WAN_PROFILES = ["wan-congested", "wan-cross-country", "wan-flaky", "wan-lossy", "wan-regional"]


def test_shipped_profiles_present_and_valid():
    assert set(WAN_PROFILES) | {"lan"} <= set(available_profiles())
    for name in available_profiles():
        assert load_profile(name).name == name


def test_default_profile_matches_the_issue():
    p = load_profile("wan-cross-country").a_to_b
    assert (p.rate_mbit, p.delay_ms, p.jitter_ms, p.loss_pct) == (200, 30, 5, 0.1)


def test_queue_limit_covers_a_bdp():
    for name in WAN_PROFILES:
        for d in ("a_to_b", "b_to_a"):
            p = load_profile(name).direction(d)
            bdp_pkts = p.rate_mbit * 1e6 * 2 * p.delay_ms / 1000 / 8 / 1514
            assert p.effective_limit_pkts >= bdp_pkts, (name, d)


def test_derived_limit_adds_the_frames_inside_the_delay():
    # 200 Mbit/s = 16,512 frames/s; one way 40 ms (30 + 2 x 5) holds 660.5; 2 BDPs over 80 ms = 2642.
    p = LinkParams(rate_mbit=200, delay_ms=30, jitter_ms=5)
    assert p.effective_limit_pkts == 3303
    assert LinkParams(rate_mbit=1, delay_ms=1).effective_limit_pkts == 1000
    assert LinkParams(rate_mbit=200, delay_ms=30, limit_pkts=77).effective_limit_pkts == 77


def test_direction_override():
    p = load_profile("wan-congested")
    assert p.a_to_b.rate_mbit == 20 and p.b_to_a.rate_mbit == 50
    assert p.a_to_b.delay_ms == p.b_to_a.delay_ms == 60


def test_flaky_schedule_parsed():
    steps = load_profile("wan-flaky").schedule
    assert [s.at_s for s in steps] == [10, 25, 40]
    assert steps[1].direction == "a_to_b" and steps[0].duration_s == 5


def _write(tmp_path, text, name="bad"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    "body, needle",
    [
        ("link: {delay_ms: -1}", "link.delay_ms=-1 out of range [0, 60000]"),
        ("link: {loss_pct: 150}", "link.loss_pct=150 out of range [0, 100]"),
        (
            "link: {delay_ms: 5, jitter_ms: 1, delay_distribution: cauchy}",
            "delay_distribution: distribution 'cauchy': expected uniform, normal, pareto, paretonormal or a .dist file",
        ),
        ("link: {dealy_ms: 5}", "unknown key(s) ['dealy_ms']"),
        ("link: {rate_mbit: fast}", "rate_mbit: expected float, got 'fast'"),
        ("link: {reorder_pct: 5}", "needs delay_ms"),
        ("link: {delay_ms: 5, reorder_gap: 3}", "reorder_gap: needs reorder_pct"),
        ("link: {loss_pct: 1, loss_ge: {p_pct: 1}}", "a_to_b: loss_pct, loss_ge and loss_state are exclusive"),
        ("link: {loss_pct: 1, loss_state: {p13_pct: 1}}", "a_to_b: loss_pct, loss_ge and loss_state are exclusive"),
        ("schedule: [{at_s: 10, set: {loss_pct: 1}}, {at_s: 5, set: {loss_pct: 2}}]", "goes back in time"),
        (
            "schedule: [{at_s: 1, direction: up, set: {loss_pct: 1}}]",
            "direction='up'; allowed: ['both', 'a_to_b', 'b_to_a']",
        ),
        ("schedule: [{at_s: 1, set: {loss_pct: 101}}]", "schedule[0].set.loss_pct"),
        ("bogus: 1", "unknown key(s) ['bogus']"),
    ],
)
def test_bad_profiles_name_file_field_and_allowed(tmp_path, body, needle):
    path = _write(tmp_path, f"name: bad\n{body}\n")
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_unknown_profile_lists_available():
    with pytest.raises(ProfileError, match="available: .*wan-cross-country"):
        load_profile("no-such-profile")


def test_name_must_match_file(tmp_path):
    with pytest.raises(ProfileError, match="must equal the file name"):
        load_profile(_write(tmp_path, "name: other\n", name="mine"))


def test_invalid_yaml(tmp_path):
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(_write(tmp_path, "name: [unclosed\n"))


def test_replace_validates():
    with pytest.raises(ProfileError):
        LinkParams(delay_ms=5).replace(loss_pct=-3)
    assert LinkParams(delay_ms=5).replace(loss_pct=3).loss_pct == 3


def test_gilbert_elliott_mean_loss():
    p = profile_from_dict({"name": "x", "link": {"loss_ge": {"p_pct": 1, "r_pct": 25, "bad_loss_pct": 50}}}, "x")
    assert p.a_to_b.expected_loss_pct == pytest.approx(100 * (0.01 / 0.26) * 0.5)


def test_four_state_mean_loss():
    p = profile_from_dict({"name": "x", "link": {"loss_state": {"p13_pct": 1, "p31_pct": 25}}}, "x")
    assert p.a_to_b.expected_loss_pct == pytest.approx(100 * 0.01 / 0.26)  # states 1 and 3 only: GE's chain


@pytest.mark.parametrize("model", [{"loss_ge": {"p_pct": 1}}, {"loss_state": {"p13_pct": 1}}])
def test_a_direction_may_drop_the_links_loss_model(model):
    """The link's fields hold both directions' loss models; each direction keeps one (netem takes one)."""
    (name,) = model
    link = {"delay_ms": 5, "loss_pct": 1, **model}
    p = profile_from_dict({"name": "x", "link": link, "a_to_b": {name: None}, "b_to_a": {"loss_pct": 0}}, "x")
    assert p.a_to_b.loss_pct == 1 and getattr(p.a_to_b, name) is None
    assert p.b_to_a.loss_pct == 0 and getattr(p.b_to_a, name) == getattr(link_params_from_dict(model, "x"), name)


def test_every_link_field_is_a_packet_impairment_or_timing():
    fields = set(LinkParams.__dataclass_fields__)
    assert set(PACKET_IMPAIRMENTS) | set(TIMING) == fields
    assert not set(PACKET_IMPAIRMENTS) & set(TIMING)


def test_lossless_keeps_the_timing_and_clears_every_packet_impairment():
    p = LinkParams(rate_mbit=100, delay_ms=30, jitter_ms=4, loss_pct=2, loss_correlation_pct=25, duplicate_pct=1,
                   corrupt_pct=0.1, reorder_pct=5, reorder_gap=3)  # fmt: skip
    q = p.lossless()
    assert all(getattr(q, f) == getattr(p, f) for f in TIMING)
    assert all(getattr(q, f) == getattr(LinkParams(), f) for f in PACKET_IMPAIRMENTS)
    ge = LinkParams(delay_ms=10, loss_ge=GilbertElliott(p_pct=1, r_pct=30)).lossless()
    assert ge.loss_ge is None and ge.delay_ms == 10


def test_every_shipped_profiles_netem_line_reads_back_to_its_parameters():
    for name in available_profiles():
        profile = load_profile(name)
        for direction, line in profile.netem_lines().items():
            p = profile.direction(direction)
            back = profile_from_dict({"name": name, "link": {"netem": line}}, name).direction(direction)
            # A rate trace is no netem option: the tc backend plays it as rates per window (topology.trace_player).
            assert back == p.replace(limit_pkts=p.effective_limit_pkts, rate_trace=""), (name, direction, line)


def test_a_profile_file_may_give_a_direction_as_a_netem_line(tmp_path):
    path = _write(tmp_path, 'name: mine\nlink: {netem: "delay 40ms 8ms distribution normal loss 0.1% rate 100mbit"}\n'
                  "b_to_a: {rate_mbit: 50}\n", name="mine")  # fmt: skip
    p = load_profile(path)
    assert (p.a_to_b.delay_ms, p.a_to_b.jitter_ms, p.a_to_b.loss_pct, p.a_to_b.rate_mbit) == (40, 8, 0.1, 100)
    assert (p.b_to_a.rate_mbit, p.b_to_a.delay_distribution) == (50, "normal")


def test_a_bad_netem_line_names_file_direction_token_and_expectation(tmp_path):
    path = _write(tmp_path, 'name: bad\na_to_b: {netem: "delay 40ms loss state 1% ecn"}\n')
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert f"{path}: a_to_b.netem 'delay 40ms loss state 1% ecn': token 6 'ecn': not supported yet: ecn" in str(
        err.value
    )

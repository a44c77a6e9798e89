"""The router's per-request line choice (policy.pick_md: line_measured) through real role processes on loopback.

Two MDs, each behind a line of its own (md[i].line), each MD's KV behind its own WAN proxy
(tests/e2e/pdd_harness.py). Both lines are loopback here: what tells them apart is first their static figures
(policy.lines), then what P measures of each (its TCP_INFO per line, PrefillReply.lines), which a WAN proxy's
rate limit changes. Requests are sequential pd-cross ones, so both MDs are idle at each pick: a router that
ignored the lines (least_load, cache_aware) would send every one to md1.
The pure choice and its bookkeeping: tests/unit/test_linechoice.py.
"""

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the deployment harness

from pdd_harness import Deployment  # noqa: E402
from test_roles import check_stream, events_of, fresh_prompt  # noqa: E402
from workers.roles.client import generate  # noqa: E402
from workers.roles.config import load_config  # noqa: E402

PROMPT, OUT = 100, 4  # 100 tokens x 512 B = 51,200 B of KV per request
# The throttled line's proxy: 1 Mbit/s per connection (the WAN path uses 2), read through a small receive
# buffer so P's window follows the limit (not application-limited): P measures ~2 Mbit/s, and 51,200 B take
# ~200 ms on it, long enough for TCP_INFO samples mid-transfer (one per 100 ms).
THROTTLE_MBIT, PROXY_RCVBUF = 1.0, 4096
MEASURED_SLOW_MBIT = 50  # what P must measure of the throttled line at most (loopback alone: Gbit/s)


def _deployment(run_dir: Path, lines: dict, md_lines: tuple[str, str]) -> Deployment:
    d = Deployment(run_dir, {"md": 2}, policy={"mode": "pd-cross"})
    data = yaml.safe_load(d.config_path.read_text())
    for md, line in zip(data["md"], md_lines):
        md["line"] = line
    # line_explore_s 0: no exploring request, so every pick shows the estimates alone
    data["policy"].update(pick_md="line_measured", lines=lines, line_explore_s=0.0)
    d.config_path.write_text(yaml.safe_dump(data))
    d.cfg = load_config(d.config_path)
    return d


@pytest.fixture
def deploy(tmp_path):
    started = []

    def make(lines: dict, md_lines: tuple[str, str], throttle_md1: bool = False) -> Deployment:
        d = _deployment(tmp_path, lines, md_lines)
        started.append(d)
        d.start()
        if throttle_md1:
            d.proxies[0].set_receive_buffer(PROXY_RCVBUF)  # before P's first connection to it
            d.proxies[0].faults.rate_mbit = THROTTLE_MBIT
        return d

    yield make
    for d in started:
        codes = d.stop()
        assert all(c == 0 for c in codes.values()), f"exit codes {codes}; logs in {d.run_dir}"


def _route(dep: Deployment, rid: str) -> dict:
    [route] = events_of(dep, "router", rid, "route")
    return route.fields


def _serve(dep: Deployment, rid: str) -> dict:
    gen = generate(dep.channel, fresh_prompt(PROMPT), OUT, request_id=rid)
    check_stream(gen, OUT)
    return _route(dep, rid)


@pytest.mark.slow
def test_the_static_figures_send_a_big_prompt_over_the_faster_line(deploy):
    # md1 behind a 10 Mbit/s line: 41 + 10 ms for the prompt's KV; md2 behind 1 Gbit/s: 0.4 + 10 ms
    lines = {"cheap": {"rate_mbit": 10, "delay_ms": 10}, "fast": {"rate_mbit": 1000, "delay_ms": 10}}
    dep = deploy(lines, ("cheap", "fast"))
    routes = [_serve(dep, f"static-{i}") for i in range(3)]
    first = routes[0]
    assert first["lines"]["cheap"]["source"] == first["lines"]["fast"]["source"] == "static", first
    costs = first["picks"]["md"]["costs_ms"]
    assert costs["md1"] == pytest.approx(51_200 * 8 / 1e4 + 10, rel=1e-3), costs
    assert costs["md2"] == pytest.approx(51_200 * 8 / 1e6 + 10, rel=1e-3), costs
    for r in routes:
        assert (r["workers"]["md"], r["line"], r["picks"]["md"]["reason"]) == ("md2", "fast", "line"), r
    # No transfer crossed the cheap line, so P has nothing to report of it. (Nor of the fast one: on an
    # unthrottled loopback every TCP_INFO sample is application-limited, which wanestimate.py counts as a
    # lower bound only.)
    assert all(r["lines"]["cheap"]["source"] == "static" and r["lines"]["cheap"]["samples"] == 0 for r in routes)


@pytest.mark.slow
def test_a_measurement_overturns_the_static_guess(deploy):
    # static: md1's line is the better (0.4 + 5 ms against 4.1 + 10 ms); measured, md1's is throttled
    lines = {"fast": {"rate_mbit": 1000, "delay_ms": 5}, "cheap": {"rate_mbit": 100, "delay_ms": 10}}
    dep = deploy(lines, ("fast", "cheap"), throttle_md1=True)
    routes = []
    for i in range(8):
        routes.append(_serve(dep, f"measured-{i}"))
        if routes[-1]["workers"]["md"] == "md2":
            break
    first, last = routes[0], routes[-1]
    assert (first["workers"]["md"], first["line"], first["lines"]["fast"]["source"]) == ("md1", "fast", "static")
    assert (last["workers"]["md"], last["line"], last["picks"]["md"]["reason"]) == ("md2", "cheap", "line"), [
        (r["workers"]["md"], r["lines"]) for r in routes
    ]
    fast = last["lines"]["fast"]
    assert fast["source"] == "measured" and fast["rate_mbit"] < MEASURED_SLOW_MBIT, fast
    # and it stays there (the cheap line's transfers, application-limited on loopback, leave it static)
    again = _serve(dep, "measured-after")
    assert (again["workers"]["md"], again["lines"]["fast"]["source"]) == ("md2", "measured"), again
    # P keys its estimates by line: the transfers to md2 add no sample to md1's line
    later = _serve(dep, "measured-later")
    assert later["workers"]["md"] == "md2" and later["lines"]["fast"] == {
        **again["lines"]["fast"],
        "idle_s": later["lines"]["fast"]["idle_s"],
    }, (again["lines"], later["lines"])

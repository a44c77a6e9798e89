"""The fault suite's row for the Ray runtime: pdd-smoke with `runtime: ray` in the emulated topology (a Ray node
in every host, each role a Ray actor running its process), the MD SIGKILLed KILL_AT_S into pdd's window. The RLD
serves what the MD would have (nothing fails), every request is accounted for with the reference tokens, the
roles the fault spared exit 0 at teardown, and nothing is left (the tier's autouse fixture)."""

import pytest
from test_faults import KILL_AT_S, _run, check_kill

pytestmark = [pytest.mark.emulation, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_kills(tmp_path_factory):
    fault = f"faults=[{{kill: md, at_s: {KILL_AT_S}, variants: [kill-md]}}]"
    return _run(
        tmp_path_factory,
        "ray-kills",
        ["variant_defs={kill-md: {mode: pdd}}", "variants=[kill-md]", fault, "runtime=ray"],
    )


def test_the_md_killed_mid_run_under_ray(ray_kills, reference):
    _, meta, _ = ray_kills
    assert meta["runtime"] == "ray"
    check_kill(ray_kills, reference, "md")

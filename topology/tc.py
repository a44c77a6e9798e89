"""Pure builders of tc command lines for the kernel backend (`tc-netem(8)`).

Responsible for: turning one direction's `LinkParams` into the argv of a
`tc qdisc` command, and probing whether the running kernel has netem.
Not responsible for: running commands inside a host (see `topology.shaping`),
or choosing between backends.

The netem arguments come from topology.netem_grammar's renderer, the one home of
netem's syntax. Builders return argv lists and never touch the system, so they are unit-tested
without root. A single netem qdisc carries every parameter, rate included:
netem's own rate keeps packets in order when a rate is set, which is the
semantics the userspace backend reproduces.

from __future__ import annotations

A user's distribution table (a .dist file path in LinkParams) is named to tc as iproute2 finds tables:
`distribution STEM` with TC_LIB_DIR set to the file's folder (the argv starts with `env TC_LIB_DIR=...`);
otherwise the argv carries LinkParams.netem_line() word for word. A rate trace (LinkParams.rate_trace) is
not netem's: the line carries no rate, and topology.shaping changes the rate per window
(topology.rate_trace.rate_schedule).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from topology.netem_grammar import render_netem
from topology.netem_options import is_table_file
from topology.profiles import LinkParams


def _table_dir(p: LinkParams) -> Path | None:
    """The one folder tc must read the user's tables from (delay's and slot's), None when only shipped ones."""
    names = [p.delay_distribution, *([p.slot.distribution] if p.slot and p.slot.distribution else [])]
    dirs = {Path(n).resolve().parent for n in names if is_table_file(n)}
    shipped = [n for n in names if n != "uniform" and not is_table_file(n)]
    if len(dirs) > 1 or (dirs and shipped):
        raise ValueError(f"tc reads every table from one TC_LIB_DIR: put {', '.join(names)} (.dist) in one folder")
    return dirs.pop() if dirs else None


def netem_args(p: LinkParams) -> list[str]:
    """The `netem ...` part of a qdisc command for one direction: the line LinkParams.netem_line() shows (a user's
    table by its stem, see the module docstring)."""
    args = render_netem(p, p.effective_limit_pkts)
    return ["netem", *(Path(a).name.removesuffix(".dist") if is_table_file(a) else a for a in args)]


def netem_cmd(dev: str, p: LinkParams, verb: str = "replace") -> list[str]:
    """argv that installs (`replace`) or live-changes (`change`) netem as the root qdisc of dev."""
    if verb not in ("replace", "change", "add"):
        raise ValueError(f"verb must be replace, change or add, got {verb!r}")
    table_dir = _table_dir(p)
    env = ["env", f"TC_LIB_DIR={table_dir}"] if table_dir else []
    return [*env, "tc", "qdisc", verb, "dev", dev, "root", *netem_args(p)]


def delete_root_cmd(dev: str) -> list[str]:
    """argv that removes dev's root qdisc (restoring the default)."""
    return ["tc", "qdisc", "del", "dev", dev, "root"]


def offload_off_cmd(dev: str) -> list[str]:
    """argv that turns off segmentation and checksum offloads, so each frame is shaped as on a wire.

    With them on, a 64 KB GSO frame would be shaped (and lost) as one packet, and
    veth would mark frames CHECKSUM_UNNECESSARY so a corrupted one would be accepted.
    """
    return ["ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", "tx", "off", "rx", "off"]


def kernel_has_netem() -> bool:
    """True when this kernel accepts a netem qdisc (asked on a throwaway namespace's loopback)."""
    probe = ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    return subprocess.run(probe, capture_output=True).returncode == 0

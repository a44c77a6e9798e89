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
"""

from __future__ import annotations

import subprocess

from topology.netem_grammar import render_netem
from topology.profiles import LinkParams


def netem_args(p: LinkParams) -> list[str]:
    """The `netem ...` part of a qdisc command for one direction: the line LinkParams.netem_line() shows."""
    return ["netem", *render_netem(p, p.effective_limit_pkts)]


def netem_cmd(dev: str, p: LinkParams, verb: str = "replace") -> list[str]:
    """argv that installs (`replace`) or live-changes (`change`) netem as the root qdisc of dev."""
    if verb not in ("replace", "change", "add"):
        raise ValueError(f"verb must be replace, change or add, got {verb!r}")
    return ["tc", "qdisc", verb, "dev", dev, "root", *netem_args(p)]


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

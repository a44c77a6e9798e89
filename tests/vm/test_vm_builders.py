"""No-root unit tests of the VM harness's pure builders (argv, scripts, cpio, module order)."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from vm.initramfs import CpioWriter, InitramfsError, load_order, module_name, parse_modules_dep
from vm.kernel import Kernel, parse_depends, release_of
from vm.run import RC_MARK, VMError, guest_script, parse_rc, qemu_command

MODULES_DEP = """\
kernel/net/bridge/bridge.ko: kernel/net/802/stp.ko kernel/net/llc/llc.ko
kernel/net/802/stp.ko: kernel/net/llc/llc.ko
kernel/net/llc/llc.ko:
kernel/net/sched/sch_netem.ko.xz:
"""


def test_module_name_strips_path_and_compression():
    assert module_name("kernel/net/sched/sch_netem.ko.zst") == "sch_netem"
    assert module_name("kernel/drivers/x/virtio-pci.ko") == "virtio_pci"


def test_load_order_puts_dependencies_first_and_skips_builtins():
    deps, paths = parse_modules_dep(MODULES_DEP)
    assert paths["sch_netem"] == "kernel/net/sched/sch_netem.ko.xz"
    order = load_order(["bridge", "sch_netem"], deps, builtin=set())
    assert order == ["llc", "stp", "bridge", "sch_netem"]
    assert load_order(["bridge"], deps, builtin={"llc"}) == ["stp", "bridge"]


def test_load_order_names_a_missing_module():
    deps, _ = parse_modules_dep(MODULES_DEP)
    with pytest.raises(InitramfsError, match="nonexistent"):
        load_order(["nonexistent"], deps, builtin=set())


def test_parse_depends_and_release():
    out = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n"
    assert parse_depends(out) == "linux-image-6.1.0-57-cloud-amd64"
    assert release_of("linux-image-6.1.0-57-cloud-amd64") == "6.1.0-57-cloud-amd64"


def test_guest_script_survives_awkward_arguments(tmp_path):
    argv = ["printf", "%s|", "a b", "it's", 'x"y', "$HOME", "new\nline"]
    script = guest_script(argv, tmp_path, {"PATH": "/usr/bin:/bin"})
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True).stdout
    assert out == "a b|it's|x\"y|$HOME|new\nline|"


def test_cpio_archive_is_readable_by_cpio(tmp_path):
    cpio = CpioWriter()
    cpio.add_dir("d")
    cpio.add_file("d/f", b"hello", 0o755)
    data = gzip.compress(cpio.finish())
    listing = subprocess.run(["cpio", "-t"], input=gzip.decompress(data), capture_output=True).stdout
    assert listing.split() == [b"d", b"d/f"]


def test_qemu_command_has_no_network_and_tcg():
    kernel = Kernel("linux-image-x", "1", "x", Path("/k"))
    argv = qemu_command(kernel, Path("/i"), {"hostroot": Path("/s")}, 3072, 2)
    assert argv[argv.index("-nic") + 1] == "none" and "-nodefaults" in argv
    assert argv[argv.index("-accel") + 1] == "tcg"
    assert "vhost-user-fs-pci,chardev=fs0,tag=hostroot" in argv


def test_parse_rc_reads_marker_or_explains():
    assert parse_rc(["boot", f"{RC_MARK}3", "reboot: Power down"]) == 3
    with pytest.raises(VMError, match="insmod"):
        parse_rc(["PDDLAB-ERROR: insmod sch_netem"])

"""The emulated network: two clusters joined by a shaped WAN link.

Division of labour:
- `naming`: the one naming scheme (hosts, interfaces, addresses, ports).
- `profiles`: netem profiles, validated YAML -> typed `LinkParams`.
- `netem_model`: netem's per-packet decisions as pure Python (used by the
  userspace backend; unit-tested without root).
- `tc`: pure builders of tc command lines for the kernel backend.
- `userspace`: the userspace link emulator (a packet forwarder on the WAN wire).
- `shaping`: the backend interface (`tc` | `userspace` | `auto`).
- `net`: the Mininet topology, its bring-up and teardown.
- `capture`: tcpdump captures on the WAN link.
"""

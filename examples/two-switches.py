"""Two switches, two hosts each, joined by one shaped link: a Mininet topology class, as `mn --custom` takes it.

    pddlab net --custom examples/two-switches.py --topo twoswitches
    pddlab net --custom examples/two-switches.py --topo twoswitches,40,100

(mn --custom examples/two-switches.py --topo twoswitches --link tc builds the same
network in Mininet's own way: one LAN, 10.0.0.0/8; pddlab routes between the switches, docs/network.md.)
"""

from mininet.topo import Topo


class TwoSwitches(Topo):
    """h1, h2 on s1; h3, h4 on s2; s1-s2 delay_ms each way (RTT 2 x delay_ms) at bw_mbit (0: unlimited)."""

    def build(self, delay_ms=20, bw_mbit=0):
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        for h, s in (("h1", s1), ("h2", s1), ("h3", s2), ("h4", s2)):
            self.addLink(self.addHost(h), s)
        self.addLink(s1, s2, delay=f"{delay_ms}ms", **({"bw": bw_mbit} if bw_mbit else {}))


topos = {"twoswitches": TwoSwitches}

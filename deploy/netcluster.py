#!/usr/bin/python3
"""Emulated clusters on one machine, from Linux network namespaces (needs root).

Three geometries, each built from nothing and removed again (close(), or the
with-block's end, also on an exception; the processes started in it are
stopped by their pids first):

- SharedMedium: one namespace whose loopback is shaped with tbf to `rate`:
  every node runs in it, and every byte, up and down, shares the one link
  (a hub, or a single busy NIC). MTU 1500, so that tbf sees Ethernet-sized
  frames (lo's 64 KiB packets would exceed the bucket).
- Switched: one namespace per node, each joined by a veth pair to a bridge
  in a switch namespace; both ends of every pair are shaped with tbf (the
  node's end shapes what it sends, the bridge's end what it receives), so
  every node has a full-duplex link of `rate` to a non-blocking switch.
  Node i is 10.213.78.(i+1) on its eth0.
- Sites: data centres joined by a wide-area link. Node 0 (apsd) sits on a
  core bridge; each site is a bridge of its own with its nodes on unshaped
  veths (the fast local network), joined to the core by one veth pair shaped
  at both ends to `rate` (the slow link every byte between the site and apsd
  shares, full duplex). Node i is 10.213.79.(i+1); the nodes of a site talk
  to each other without crossing the slow link.

No delay is added: this kernel has no netem (`tc qdisc ... netem` answers
"Specified qdisc kind is unknown"), so the latency is the veth and bridge's
own (tens of microseconds; `--check` measures it).

Names start with apsd-bench-<pid>- so that runs never clash. Used by
tests/bench/bench_cluster.py; by hand:

    /usr/bin/python3 deploy/netcluster.py --kind switched --nodes 4 --rate 1gbit --check
"""

import argparse
import os
import subprocess
import sys
import time

SWITCH_NET = "10.213.78"  # the switched cluster's /24, inside its namespaces only
SITES_NET = "10.213.79"  # the sites' /24, inside their namespaces only
PYTHON = "/usr/bin/python3"


def default_burst(rate):
    """A bucket of 2 ms of the rate (244 KiB at 1 Gbit/s). It is 1% or less of
    an all-reduce step of 200 ms or more, and it lets veth's GSO packets (up to
    64 KiB) through whole: with a bucket smaller than a packet tbf cuts every
    packet into frames, and on 2 cores that kernel work, not the rate, set the
    pace (a switched e4m3 step took 1.5 s at 30 KiB against 0.4 s at 256 KiB)."""
    bits = parse_rate(rate)
    return f"{max(4, int(bits / 8 * 2e-3) // 1024)}kb"


def parse_rate(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"rate {rate!r}: give e.g. 1gbit or 100mbit")


class Cluster:
    """Namespaces and processes; close() removes everything this object made."""

    def __init__(self, rate, burst=None, mtu=1500, tag=None):
        self.rate, self.mtu = rate, mtu
        self.burst = burst or default_burst(rate)
        self.tag = tag or f"apsd-bench-{os.getpid()}"
        self.netns, self.procs = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def sh(self, *cmd):
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def add_netns(self, name):
        self.sh("ip", "netns", "add", name)
        self.netns.append(name)
        self.sh("ip", "-n", name, "link", "set", "lo", "up")

    def tbf(self, ns, dev):
        self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                "rate", self.rate, "burst", self.burst, "latency", "50ms")

    def start(self, node, argv, **kw):
        """Starts argv in node's namespace; close() stops it by its pid."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(node), *argv],
                             start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop_procs(self, grace=5.0):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def close(self):
        self.stop_procs()
        for name in reversed(self.netns):
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
        self.netns = []


class SharedMedium(Cluster):
    """Every node in one namespace; its loopback is the one shaped link."""

    kind = "shared"
    ifname = "lo"

    def __init__(self, rate, burst=None, mtu=1500, tag=None):
        super().__init__(rate, burst, mtu, tag)
        self.name = f"{self.tag}-shm"
        try:
            self.add_netns(self.name)
            self.sh("ip", "-n", self.name, "link", "set", "lo", "mtu", str(mtu))
            self.tbf(self.name, "lo")
        except BaseException:
            self.close()
            raise

    def ns(self, node):
        return self.name

    def addr(self, node):
        return "127.0.0.1"


class Switched(Cluster):
    """One namespace per node, a full-duplex shaped link each, one bridge."""

    kind = "switched"
    ifname = "eth0"

    def __init__(self, nodes, rate, burst=None, mtu=1500, tag=None):
        super().__init__(rate, burst, mtu, tag)
        self.nodes = nodes
        self.switch = f"{self.tag}-sw"
        try:
            self.add_netns(self.switch)
            self.sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            self.sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i in range(nodes):
                self.add_node(i)
        except BaseException:
            self.close()
            raise

    def add_node(self, i):
        ns, port = self.ns(i), f"p{i}"
        self.add_netns(ns)
        self.sh("ip", "link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name",
                port, "netns", self.switch)
        self.sh("ip", "-n", ns, "link", "set", "eth0", "mtu", str(self.mtu))
        self.sh("ip", "-n", self.switch, "link", "set", port, "mtu", str(self.mtu))
        self.sh("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
        self.sh("ip", "-n", ns, "link", "set", "eth0", "up")
        self.sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        self.tbf(ns, "eth0")  # what node i sends
        self.tbf(self.switch, port)  # what node i receives

    def ns(self, node):
        return f"{self.tag}-n{node}"

    def addr(self, node):
        return f"{SWITCH_NET}.{node + 1}"


class Sites(Cluster):
    """Node 0 on a core bridge; sites of nodes on bridges of their own, each joined to
    the core by one shaped link. sites: nodes per site, e.g. (2, 2): nodes 1-2 at site
    0, nodes 3-4 at site 1."""

    kind = "sites"
    ifname = "eth0"

    def __init__(self, sites, rate, burst=None, mtu=1500, tag=None):
        super().__init__(rate, burst, mtu, tag)
        self.sites = list(sites)
        self.core = f"{self.tag}-core"
        self.site_of = [None] + [s for s, n in enumerate(self.sites) for _ in range(n)]
        try:
            self.add_netns(self.core)
            self.bridge(self.core)
            for s in range(len(self.sites)):
                self.add_site(s)
            for i in range(len(self.site_of)):
                self.add_node(i)
        except BaseException:
            self.close()
            raise

    def bridge(self, ns):
        self.sh("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
        self.sh("ip", "-n", ns, "link", "set", "br0", "up")

    def veth(self, ns_a, name_a, ns_b, name_b):
        self.sh("ip", "link", "add", "name", name_a, "netns", ns_a, "type", "veth", "peer",
                "name", name_b, "netns", ns_b)
        for ns, name in ((ns_a, name_a), (ns_b, name_b)):
            self.sh("ip", "-n", ns, "link", "set", name, "mtu", str(self.mtu))

    def add_site(self, s):
        ns = f"{self.tag}-s{s}"
        self.add_netns(ns)
        self.bridge(ns)
        self.veth(ns, "wan", self.core, f"wan{s}")
        self.sh("ip", "-n", ns, "link", "set", "wan", "master", "br0", "up")
        self.sh("ip", "-n", self.core, "link", "set", f"wan{s}", "master", "br0", "up")
        self.tbf(ns, "wan")  # what the site sends to apsd
        self.tbf(self.core, f"wan{s}")  # what the site receives

    def add_node(self, i):
        ns, site = self.ns(i), self.site_of[i]
        sw = self.core if site is None else f"{self.tag}-s{site}"
        self.add_netns(ns)
        self.veth(ns, "eth0", sw, f"p{i}")
        self.sh("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
        self.sh("ip", "-n", ns, "link", "set", "eth0", "up")
        self.sh("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0", "up")

    def ns(self, node):
        return f"{self.tag}-n{node}"

    def addr(self, node):
        return f"{SITES_NET}.{node + 1}"


# ---------------------------------------------------------------- --check

_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(200):
    c.sendall(c.recv(1))
n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n)
"""

_SOURCE = """
import socket, sys, time
host, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(100):
    try:
        c = socket.create_connection((host, port)); break
    except OSError:
        time.sleep(0.05)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtt = []
for _ in range(200):
    t = time.perf_counter(); c.sendall(b"p"); c.recv(1); rtt.append(time.perf_counter() - t)
rtt.sort()
buf = b"x" * (1 << 20)
t0 = time.perf_counter()
sent = 0
while sent < total:
    sent += c.send(buf[: min(len(buf), total - sent)])
c.shutdown(socket.SHUT_WR); c.recv(1)
print(time.perf_counter() - t0, rtt[len(rtt) // 2] * 1e6)
"""


def check(cluster, a, b, mbytes=50):
    """Payload rate of one TCP stream from node a to node b (Gbit/s), and the
    median round trip of one byte over it (us, Python on both ends)."""
    port = 5999
    sink = cluster.start(b, [PYTHON, "-c", _SINK, str(port)], stdout=subprocess.PIPE, text=True)
    src = cluster.start(a, [PYTHON, "-c", _SOURCE, cluster.addr(b), str(port),
                            str(mbytes << 20)], stdout=subprocess.PIPE, text=True)
    secs, rtt_us = map(float, src.communicate(timeout=120)[0].split())
    sink.communicate(timeout=30)
    return (mbytes << 20) * 8 / secs / 1e9, rtt_us


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=["shared", "switched", "sites"], default="switched")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--burst", default=None)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--check", action="store_true",
                    help="build it, time one TCP stream from node 0 to node 1, remove it")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("netcluster.py: needs root (ip netns, tc)")
    makers = {"shared": lambda: SharedMedium(a.rate, a.burst, a.mtu),
              "switched": lambda: Switched(a.nodes, a.rate, a.burst, a.mtu),
              # nodes - 1 workers in two sites, node 0 (apsd) at the core
              "sites": lambda: Sites((a.nodes // 2, a.nodes - 1 - a.nodes // 2), a.rate,
                                     a.burst, a.mtu)}
    make = makers[a.kind]
    with make() as c:
        print(f"{c.kind}: namespaces {', '.join(c.netns)}; tbf rate {c.rate} burst {c.burst} "
              f"mtu {c.mtu}")
        if a.check:
            gbps, rtt = check(c, 0, 1)
            print(f"one TCP stream node 0 -> node 1: {gbps:.3f} Gbit/s of payload; "
                  f"1-byte round trip {rtt:.0f} us (median of 200)")
            if a.kind == "sites":
                gbps, rtt = check(c, 1, 2)
                print(f"one TCP stream node 1 -> node 2 (one site): {gbps:.3f} Gbit/s; "
                      f"1-byte round trip {rtt:.0f} us")
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    print("namespaces left:", "none" if c.tag not in left else left)
    return 0


if __name__ == "__main__":
    sys.exit(main())

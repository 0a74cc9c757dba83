"""Two hosts in network namespaces joined by a veth pair, for AF_XDP tests.

    server ns  [srv veth 10.77.x.1 fd77:x::1] ===== [cli veth 10.77.x.2 fd77:x::2]  client ns

Fixed addresses and MACs; GRO off on the server side and UDP segmentation
offload off on the client side (AF_XDP must not see coalesced UDP). Torn down on exit even when the test fails. Needs
root: under CI=true a missing privilege fails the test, it never skips.
"""

import itertools
import os
import shutil
import subprocess

_ids = itertools.count()


def sh(*cmd, check=True, ns=None, **kw):
    if ns:
        cmd = ("ip", "netns", "exec", ns) + cmd
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


def delete_namespaces(names):
    """Kills what runs in each namespace and deletes it (missing ones too)."""
    for ns in names:
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            sh("kill", "-9", pid, check=False)
        sh("ip", "netns", "del", ns, check=False)


def require_root():
    if os.geteuid() != 0:
        raise AssertionError("AF_XDP tests need root (network namespaces, XDP, AF_XDP)")


class Topology:
    def __init__(self, queues=1):
        require_root()
        n = f"{os.getpid() % 10000}{next(_ids)}"
        self.idx = int(n) % 250 + 1
        self.srv_ns, self.cli_ns = f"xq-s{n}", f"xq-c{n}"
        self.srv_if, self.cli_if = f"xqs{n}", f"xqc{n}"
        self.srv_ip, self.cli_ip = f"10.77.{self.idx}.1", f"10.77.{self.idx}.2"
        self.srv_ip6, self.cli_ip6 = f"fd77:{self.idx:x}::1", f"fd77:{self.idx:x}::2"
        self.queues = queues

    def __enter__(self):
        try:
            sh("ip", "netns", "add", self.srv_ns)
            sh("ip", "netns", "add", self.cli_ns)
            q = ["numtxqueues", str(self.queues), "numrxqueues", str(self.queues)]
            sh("ip", "link", "add", self.srv_if, *q, "type", "veth", "peer", "name", self.cli_if,
               *q)
            for dev, ns, mac, ip, ip6 in (
                    (self.srv_if, self.srv_ns, "02:77:00:00:00:01", self.srv_ip, self.srv_ip6),
                    (self.cli_if, self.cli_ns, "02:77:00:00:00:02", self.cli_ip, self.cli_ip6)):
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                sh("ip", "-n", ns, "link", "set", dev, "address", mac, "up")
                sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                sh("ip", "-n", ns, "addr", "add", f"{ip6}/64", "dev", dev, "nodad")
            sh("ethtool", "-K", self.srv_if, "gro", "off", ns=self.srv_ns)
            # A veth hands a local sender's UDP GSO batch to its peer as one
            # super-packet, which generic XDP then redirects whole: several
            # QUIC datagrams glued into one. A real NIC segments on the wire;
            # here the client's kernel must segment before the veth.
            sh("ethtool", "-K", self.cli_if, "tx-udp-segmentation", "off", ns=self.cli_ns)
            # Wait for the link (and IPv6) to come up.
            sh("ping", "-c", "1", "-W", "2", self.srv_ip, ns=self.cli_ns)
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        delete_namespaces((self.srv_ns, self.cli_ns))

    def xdp_attached(self):
        """The XDP program id attached to the server veth, or None."""
        out = sh("ip", "-d", "link", "show", self.srv_if, ns=self.srv_ns).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("prog/xdp id "):
                return int(line.split()[2])
        return None

    def xdp_packets_per_queue(self):
        """Frames the server veth's XDP program saw, per RX queue."""
        out = sh("ethtool", "-S", self.srv_if, ns=self.srv_ns).stdout
        counts = {}
        for line in out.splitlines():
            name, _, value = line.strip().partition(":")
            if name.startswith("rx_queue_") and name.endswith("_xdp_packets"):
                counts[int(name.split("_")[2])] = int(value)
        return [counts[q] for q in sorted(counts)]

    def client_ports_by_queue(self, dst_port, candidates=range(41000, 41100)):
        """For each server RX queue, a client UDP source port whose datagrams
        to (srv_ip, dst_port) arrive on it. A veth picks the queue from the
        flow hash of the 4-tuple (fixed for the boot), so it is found by
        sending short junk from each candidate port (a native XDP program
        must be attached; xdpqd's drops the junk) and watching the per-queue
        counters."""
        found = {}
        for port in candidates:
            before = self.xdp_packets_per_queue()
            sh("/usr/bin/python3", "-c",
               "import socket\n"
               "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
               f"s.bind(('{self.cli_ip}', {port}))\n"
               f"for i in range(8): s.sendto(b'probe', ('{self.srv_ip}', {dst_port}))\n",
               ns=self.cli_ns)
            after = self.xdp_packets_per_queue()
            hit = [q for q, (a, b) in enumerate(zip(before, after)) if b - a >= 8]
            if len(hit) == 1:
                found.setdefault(hit[0], port)
            if len(found) == self.queues:
                return found
        raise AssertionError(f"no source port per queue found: {found}")

    def restrict_client_ports(self, ports):
        """The client's kernel may pick only these ephemeral UDP ports."""
        lo, hi = min(ports), max(ports)
        reserved = [str(p) for p in range(lo, hi + 1) if p not in ports]
        sh("sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={lo} {hi}", ns=self.cli_ns)
        sh("sysctl", "-q", "-w", "net.ipv4.ip_local_reserved_ports=" + ",".join(reserved),
           ns=self.cli_ns)


class Namespaces:
    """Namespaces self.ns (name by role), built by build() on entry and all
    deleted on exit, or if building fails."""

    def __enter__(self):
        try:
            self.build()
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        delete_namespaces(self.ns.values())


class RoutedTopology(Namespaces):
    """Client and server in different subnets, two routers between them,
    joined by two bridges in a switch namespace:

        cli 10.80.x.2 ─┬─ lan bridge ─┬─ r1 10.80.x.1 │ 10.81.x.1 ─┬─ wan bridge ─ srv 10.81.x.2
                       └──────────────┴─ r2 10.80.x.3 │ 10.81.x.3 ─┘
        (and fd80:x::/64, fd81:x::/64 alike)

    The client's gateway is r1, the server's is r2, and r1 discards what is
    addressed to the client: the server's replies get through only when it
    sends them where its own routing table says (r2), not back to the router
    the client's packets came from. Fixed MACs; torn down on exit."""

    def __init__(self):
        require_root()
        n = f"{os.getpid() % 10000}{next(_ids)}"
        self.idx = int(n) % 250 + 1
        x = self.idx
        self.ns = {k: f"xr-{k}{n}" for k in ("cli", "r1", "r2", "sw", "srv")}
        self.cli_ns, self.srv_ns = self.ns["cli"], self.ns["srv"]
        self.srv_if = f"xrs{n}"
        self.cli_ip, self.srv_ip = f"10.80.{x}.2", f"10.81.{x}.2"
        self.cli_ip6, self.srv_ip6 = f"fd80:{x:x}::2", f"fd81:{x:x}::2"
        self.r2_wan_ip, self.r2_wan_ip6 = f"10.81.{x}.3", f"fd81:{x:x}::3"
        self.r2_wan_if = f"xr2w{n}"
        self.n = n

    def _link(self, ns, dev, peer, bridge, mac, addrs):
        sh("ip", "link", "add", dev, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", dev, "netns", self.ns[ns])
        sh("ip", "link", "set", peer, "netns", self.ns["sw"])
        sh("ip", "-n", self.ns["sw"], "link", "set", peer, "master", bridge, "up")
        sh("ip", "-n", self.ns[ns], "link", "set", dev, "address", mac, "up")
        for a in addrs:
            extra = ["nodad"] if ":" in a else []
            sh("ip", "-n", self.ns[ns], "addr", "add", a, "dev", dev, *extra)

    def build(self):
        x, n = self.idx, self.n
        for ns in self.ns.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sw = self.ns["sw"]
        for br in ("brl", "brw"):
            sh("ip", "-n", sw, "link", "add", br, "type", "bridge")
            sh("ip", "-n", sw, "link", "set", br, "up")
        self._link("cli", f"xrc{n}", f"xpc{n}", "brl", "02:80:00:00:00:02",
                   [f"{self.cli_ip}/24", f"{self.cli_ip6}/64"])
        self._link("r1", f"xr1l{n}", f"xp1l{n}", "brl", "02:80:00:00:01:01",
                   [f"10.80.{x}.1/24", f"fd80:{x:x}::1/64"])
        self._link("r2", f"xr2l{n}", f"xp2l{n}", "brl", "02:80:00:00:02:01",
                   [f"10.80.{x}.3/24", f"fd80:{x:x}::3/64"])
        self._link("r1", f"xr1w{n}", f"xp1w{n}", "brw", "02:81:00:00:01:01",
                   [f"10.81.{x}.1/24", f"fd81:{x:x}::1/64"])
        self._link("r2", self.r2_wan_if, f"xp2w{n}", "brw", "02:81:00:00:02:01",
                   [f"{self.r2_wan_ip}/24", f"{self.r2_wan_ip6}/64"])
        self._link("srv", self.srv_if, f"xpsv{n}", "brw", "02:81:00:00:00:02",
                   [f"{self.srv_ip}/24", f"{self.srv_ip6}/64"])
        for r in ("r1", "r2"):
            sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", ns=self.ns[r])
            sh("sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1", ns=self.ns[r])
        # r1 forwards towards the server, never back to the client.
        sh("ip", "-n", self.ns["r1"], "route", "add", "blackhole", f"{self.cli_ip}/32")
        sh("ip", "-n", self.ns["r1"], "-6", "route", "add", "blackhole", f"{self.cli_ip6}/128")
        sh("ip", "-n", self.cli_ns, "route", "add", "default", "via", f"10.80.{x}.1")
        sh("ip", "-n", self.cli_ns, "-6", "route", "add", "default", "via", f"fd80:{x:x}::1")
        sh("ip", "-n", self.srv_ns, "route", "add", "default", "via", self.r2_wan_ip)
        sh("ip", "-n", self.srv_ns, "-6", "route", "add", "default", "via", self.r2_wan_ip6)
        sh("ethtool", "-K", self.srv_if, "gro", "off", ns=self.srv_ns)
        # The client's kernel segments before its veth (see Topology).
        sh("ethtool", "-K", f"xrc{n}", "tx-udp-segmentation", "off", ns=self.cli_ns)

    def server_neighbor(self, ip):
        """The server kernel's neighbour entry for ip (lladdr and state)."""
        return sh("ip", "-n", self.srv_ns, "neigh", "show", ip, "dev", self.srv_if).stdout.strip()


class BalancerTopology(Namespaces):
    """Two server nodes behind a router that balances by QUIC-LB server ID,
    as an ECMP router or an L4 balancer in front of a fleet would:

        cli 10.86.x.2 ── lb 10.86.x.1 │ 10.87.x.1 ── n1 10.87.x.2 (VIP on lo)
                                      │ 10.88.x.1 ── n2 10.88.x.2 (VIP on lo)

    Both nodes hold the service address VIP (10.89.x.1). The router's main
    table reaches it by ECMP over both nodes, hashed on the 4-tuple
    (fib_multipath_hash_policy 1). Its nftables rules read a QUIC packet's
    DCID (plaintext QUIC-LB, config 0, a 1-byte server ID and a 15-byte
    nonce: first octet 0x10) and mark the packet with the server ID; marks
    1 and 2 route to n1 and n2 whatever the 4-tuple. Anything else (a
    client's first Initial, unroutable CIDs) stays on the ECMP hash.
    Torn down on exit."""

    FIRST_OCTET = 0x10  # config 0 | CID length 17 - 1

    def __init__(self):
        require_root()
        if not shutil.which("nft"):
            raise AssertionError("nft is missing: run scripts/setup.sh (package nftables)")
        n = f"{os.getpid() % 10000}{next(_ids)}"
        x = int(n) % 250 + 1
        self.n, self.x = n, x
        self.ns = {k: f"xb-{k}{n}" for k in ("cli", "lb", "n1", "n2")}
        self.cli_ns = self.ns["cli"]
        self.cli_ip, self.vip = f"10.86.{x}.2", f"10.89.{x}.1"
        self.node_ip = {1: f"10.87.{x}.2", 2: f"10.88.{x}.2"}
        self.node_if = {1: f"xbn1{n}", 2: f"xbn2{n}"}
        self.lb_in = f"xblc{n}"

    def _veth(self, a, a_dev, a_ip, b, b_dev, b_ip):
        sh("ip", "link", "add", a_dev, "type", "veth", "peer", "name", b_dev)
        for ns, dev, ip in ((a, a_dev, a_ip), (b, b_dev, b_ip)):
            sh("ip", "link", "set", dev, "netns", self.ns[ns])
            sh("ip", "-n", self.ns[ns], "addr", "add", ip, "dev", dev)
            sh("ip", "-n", self.ns[ns], "link", "set", dev, "up")

    def build(self):
        x, n, lb = self.x, self.n, self.ns["lb"]
        for ns in self.ns.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        self._veth("cli", f"xbc{n}", f"{self.cli_ip}/24", "lb", self.lb_in, f"10.86.{x}.1/24")
        for k in (1, 2):
            self._veth("lb", f"xbl{k}{n}", f"10.8{6 + k}.{x}.1/24", f"n{k}", self.node_if[k],
                       f"{self.node_ip[k]}/24")
            node = self.ns[f"n{k}"]
            sh("ip", "-n", node, "addr", "add", f"{self.vip}/32", "dev", "lo")
            sh("ip", "-n", node, "route", "add", "default", "via", f"10.8{6 + k}.{x}.1")
            sh("ethtool", "-K", self.node_if[k], "gro", "off", ns=node)
        sh("ip", "-n", self.cli_ns, "route", "add", "default", "via", f"10.86.{x}.1")
        sh("ethtool", "-K", f"xbc{n}", "tx-udp-segmentation", "off", ns=self.cli_ns)
        for key, val in (("net.ipv4.ip_forward", 1), ("net.ipv4.fib_multipath_hash_policy", 1),
                         ("net.ipv4.conf.all.rp_filter", 0),
                         ("net.ipv4.conf.default.rp_filter", 0)):
            sh("sysctl", "-q", "-w", f"{key}={val}", ns=lb)
        sh("ip", "-n", lb, "route", "add", f"{self.vip}/32",
           "nexthop", "via", self.node_ip[1], "nexthop", "via", self.node_ip[2])
        for k in (1, 2):
            sh("ip", "-n", lb, "route", "add", f"{self.vip}/32", "via", self.node_ip[k],
               "table", str(100 + k))
            sh("ip", "-n", lb, "rule", "add", "fwmark", str(k), "table", str(100 + k))
        self.route_by_server_id(True)

    def route_by_server_id(self, on):
        """Installs (or removes: plain ECMP) the QUIC-LB rules."""
        lb = self.ns["lb"]
        sh("nft", "delete", "table", "ip", "quiclb", ns=lb, check=False)
        if not on:
            return
        # Offsets from the UDP header (@th, in bits): payload byte 0 at 64.
        # Short header (top bit 0): DCID from payload byte 1. Long header:
        # DCID length at byte 5, DCID from byte 6.
        rules = ["table ip quiclb {\n chain pre {\n"
                 "  type filter hook prerouting priority mangle; policy accept;\n"]
        for sid in (1, 2):
            match = f"ip daddr {self.vip} udp dport 4433"
            rules.append(f"  {match} @th,64,1 0 @th,72,8 {self.FIRST_OCTET:#x} @th,80,8 {sid} "
                         f"meta mark set {sid}\n")
            rules.append(f"  {match} @th,64,1 1 @th,104,8 17 @th,112,8 {self.FIRST_OCTET:#x} "
                         f"@th,120,8 {sid} meta mark set {sid}\n")
        rules.append(" }\n}\n")
        sh("nft", "-f", "-", ns=lb, input="".join(rules))

    def ecmp_node(self, sport):
        """The node the router's ECMP hash picks for the client's sport."""
        out = sh("ip", "-n", self.ns["lb"], "route", "get", self.vip, "from", self.cli_ip, "iif",
                 self.lb_in, "ipproto", "udp", "sport", str(sport), "dport", "4433").stdout
        for k, ip in self.node_ip.items():
            if f"via {ip} " in out:
                return k
        raise AssertionError(f"no node in: {out}")

    def ports_by_node(self, candidates=range(42000, 42200)):
        """A client source port the ECMP hash sends to each node."""
        found = {}
        for port in candidates:
            found.setdefault(self.ecmp_node(port), port)
            if len(found) == 2:
                return found
        raise AssertionError(f"ECMP sent every port to one node: {found}")

    def restrict_client_ports(self, ports):
        Topology.restrict_client_ports(self, ports)

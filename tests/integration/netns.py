"""Two hosts in network namespaces joined by a veth pair, for AF_XDP tests.

    server ns  [srv veth 10.77.x.1 fd77:x::1] ===== [cli veth 10.77.x.2 fd77:x::2]  client ns

Fixed addresses and MACs; GRO off on the server side and UDP segmentation
offload off on the client side (AF_XDP must not see coalesced UDP). Torn down on exit even when the test fails. Needs
root: under CI=true a missing privilege fails the test, it never skips.
"""

import itertools
import os
import subprocess

_ids = itertools.count()


def sh(*cmd, check=True, ns=None, **kw):
    if ns:
        cmd = ("ip", "netns", "exec", ns) + cmd
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


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
        for ns in (self.srv_ns, self.cli_ns):
            sh("ip", "netns", "pids", ns, check=False)
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                sh("kill", "-9", pid, check=False)
            sh("ip", "netns", "del", ns, check=False)

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

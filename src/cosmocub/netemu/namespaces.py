"""Emulated nodes on a switched network: Linux network namespaces, a bridge, shaped veth links.

`emulated_nodes(nodes=N, rate_mbit=R)` makes N "node" namespaces and one "switch" namespace
holding a bridge; node k joins the bridge by a veth pair (`node{k}` in its namespace, `port{k}` on
the switch) and gets 10.77.0.(k+1)/24. With R > 0 both ends of every link carry a `tbf` qdisc at
R Mbit/s: what a node sends and what the switch sends it, as on a full-duplex cluster link; MTU-
sized packets and a bucket of one of them, so every message crosses at R, also after a pause.
`netem` is not in this kernel, so the links have a rate only, no added latency or loss. IPv6 is
off in every namespace, so a link carries only what the ranks send (and IPv4's ARP).

Nothing is created in the machine's own namespace (each veth is made inside the switch namespace
and its node end moved straight into the node's). Everything lives in namespaces named
`<prefix><pid>-…`; deleting a namespace deletes its links and qdiscs. They are deleted on exit,
on an exception, on SIGTERM/SIGINT (the handlers raise, the `finally` cleans up), and — after a
SIGKILL — by the next `emulated_nodes` with the same prefix, which deletes every namespace whose
owning pid is gone (killing what still runs inside it). Needs root or CAP_NET_ADMIN; without,
`EmulationUnavailableError` says why before anything is made.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cosmocub.io import signals_raise

DEFAULT_PREFIX = "ccub-"
SUBNET = "10.77.0"  # private; each emulation has its own switch, so runs never share it
CAP_NET_ADMIN = 12
# A shaped link's token bucket: one 1514-byte frame (a 1500-byte MTU and its Ethernet header, as
# tbf counts it) with room for tc's rounding; see _shape.
BURST_BYTES = 2048


class EmulationUnavailableError(RuntimeError):
    """This process cannot create network namespaces (message: why, in one line)."""


@dataclass(frozen=True, kw_only=True)
class EmulatedNode:
    index: int
    netns: str
    interface: str
    address: str

    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns]

    def tx_bytes(self) -> int:
        """Bytes this node's link has sent (read in its namespace: `ip netns exec` mounts the
        namespace's own sysfs)."""
        return int(self._run(["cat", f"/sys/class/net/{self.interface}/statistics/tx_bytes"]))

    def set_link(self, up: bool) -> None:
        """Take the node's link down (a cut cable) or bring it back up."""
        _ip(["-n", self.netns, "link", "set", self.interface, "up" if up else "down"])

    def _run(self, argv: Sequence[str]) -> str:
        return subprocess.run(
            [*self.exec_prefix(), *argv], check=True, capture_output=True, text=True
        ).stdout


@dataclass(frozen=True, kw_only=True)
class EmulatedNetwork:
    nodes: tuple[EmulatedNode, ...]
    switch_netns: str
    rate_mbit: float

    def tx_bytes(self) -> list[int]:
        return [node.tx_bytes() for node in self.nodes]


def check_privileges() -> None:
    """Raise EmulationUnavailableError unless this process may create network namespaces."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise EmulationUnavailableError(f"{', '.join(missing)} not found (package iproute2)")
    if not _has_cap_net_admin():
        raise EmulationUnavailableError(
            f"network namespaces need root or CAP_NET_ADMIN (running as uid {os.geteuid()})"
        )


@contextlib.contextmanager
def emulated_nodes(
    *, nodes: int, rate_mbit: float, prefix: str = DEFAULT_PREFIX
) -> Iterator[EmulatedNetwork]:
    """`nodes` namespaces on a bridge, links shaped to rate_mbit (0 = unshaped)."""
    if nodes < 1 or nodes > 250:
        raise ValueError(f"emulated_nodes: nodes must be 1..250, got {nodes}")
    if rate_mbit < 0:
        raise ValueError(f"emulated_nodes: rate_mbit must be >= 0, got {rate_mbit}")
    if not re.fullmatch(r"[a-z][a-z0-9]{0,10}-", prefix):
        raise ValueError(f"emulated_nodes: prefix {prefix!r} is not like 'ccub-' (a-z0-9, '-')")
    check_privileges()
    remove_stale(prefix)
    tag = f"{prefix}{os.getpid()}-"
    net = EmulatedNetwork(
        nodes=tuple(
            EmulatedNode(
                index=k, netns=f"{tag}n{k}", interface=f"node{k}", address=f"{SUBNET}.{k + 1}"
            )
            for k in range(nodes)
        ),
        switch_netns=f"{tag}sw",
        rate_mbit=rate_mbit,
    )
    with signals_raise():
        try:
            _build(net)
            yield net
        finally:
            _remove([net.switch_netns, *(n.netns for n in net.nodes)])


def remove_stale(prefix: str) -> list[str]:
    """Delete the namespaces `<prefix><pid>-…` whose pid no longer runs; returns their names."""
    stale = []
    for name in list_namespaces(prefix):
        match = re.fullmatch(re.escape(prefix) + r"(\d+)-\w+", name)
        if match and not _pid_alive(int(match.group(1))):
            stale.append(name)
    _remove(stale)
    return stale


def list_namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def _build(net: EmulatedNetwork) -> None:
    sw = net.switch_netns
    _ip(["netns", "add", sw])
    _no_ipv6(sw)
    _ip(["-n", sw, "link", "add", "br0", "type", "bridge"])
    _ip(["-n", sw, "link", "set", "br0", "up"])
    for node in net.nodes:
        port = f"port{node.index}"
        _ip(["netns", "add", node.netns])
        _no_ipv6(node.netns)
        _ip(["-n", node.netns, "link", "set", "lo", "up"])  # ranks of one node talk over lo
        _ip(["-n", sw, "link", "add", port, "type", "veth", "peer", "name", node.interface])
        _ip(["-n", sw, "link", "set", node.interface, "netns", node.netns])
        _ip(["-n", sw, "link", "set", port, "master", "br0", "up"])
        _ip(["-n", node.netns, "addr", "add", f"{node.address}/24", "dev", node.interface])
        _ip(["-n", node.netns, "link", "set", node.interface, "up"])
        if net.rate_mbit > 0:
            _shape(node.netns, node.interface, net.rate_mbit)
            _shape(sw, port, net.rate_mbit)


def _no_ipv6(netns: str) -> None:
    """No IPv6 in `netns`, for links made after this. With it, a link that comes up sends its
    own neighbour discovery, multicast listener reports and router solicitations for ~6 s (586
    bytes a node, measured): traffic no rank sent, counted in the wire bytes of whatever epoch
    is running then. The ranks talk IPv4. (A kernel without IPv6 has nothing to switch off.)"""
    if not os.path.isdir("/proc/sys/net/ipv6"):
        return
    # /proc/sys/net is the writer's network namespace's: write it from inside.
    script = "; ".join(
        f"echo 1 > /proc/sys/net/ipv6/conf/{which}/disable_ipv6" for which in ("all", "default")
    )
    _ip(["netns", "exec", netns, "sh", "-c", script])


def _shape(netns: str, interface: str, mbit: float) -> None:
    """Make `interface` a link of `mbit` on which any message, after any pause, crosses at the
    rate. Two things let bytes through faster, and both go:
    - a GSO packet: TCP hands a veth up to 64 KiB as one packet, which tbf lets pass at once when
      its bucket holds it; `gso_max_segs 1` makes TCP send MTU-sized packets, as a NIC puts them
      on the wire after TSO;
    - the bucket itself: whatever it holds after a pause crosses at memory speed (a 64 KiB bucket
      let a 48 kB message cross "10 Mbit/s" in 0.3 ms, where the wire needs 38 ms). It holds
      BURST_BYTES: one MTU-sized frame (tbf drops a packet larger than its bucket) and room for
      tc's rounding of the bucket into clock ticks, ~12 % of a 16 KiB message (the frames' own
      headers add 4.6 % back).
    The queue holds 1 s of traffic (at least 4 MiB) so that TCP is slowed by the rate, not by
    drops and retransmits."""
    bytes_per_s = mbit * 1e6 / 8
    limit = max(4 * 1024 * 1024, int(bytes_per_s))
    _ip(["-n", netns, "link", "set", interface, "gso_max_segs", "1"])
    _ip(
        [
            "netns",
            "exec",
            netns,
            "tc",
            "qdisc",
            "add",
            "dev",
            interface,
            "root",
            "tbf",
            "rate",
            f"{mbit}mbit",
            "burst",
            str(BURST_BYTES),
            "limit",
            str(limit),
        ]
    )


def _remove(names: Sequence[str]) -> None:
    """Kill what runs in each namespace, then delete it; ignores ones already gone."""
    for name in names:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _ip(args: Sequence[str]) -> None:
    argv = ["ip", *args]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulationUnavailableError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def _has_cap_net_admin() -> bool:
    # The effective capability, not the uid: root in an unprivileged container lacks it.
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> CAP_NET_ADMIN & 1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

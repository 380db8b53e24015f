"""Time TCP messages across an emulated link as its receiver sees them, each after an idle gap:
the one probe of the link-rate test (tests/test_netemu.py) and of benchmarks/bench_links.py."""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cosmocub.netemu.namespaces import EmulatedNetwork

HEADER = struct.Struct("!Q")  # the message's length, ahead of it
ACK = struct.Struct("!d")  # the receiver's clock when the message's last byte arrived
WARM_UP_BYTES = 1024
READY_TIMEOUT_S = 30.0  # the receiver's Python start-up, on a loaded machine
SLOWEST_RATIO = 20.0  # the sender is given up on past this many times the wire's time (+ 30 s)


@dataclass(frozen=True, kw_only=True)
class Crossing:
    size_bytes: int
    rate_mbit: float
    seconds: float  # the sender's first byte -> the receiver's last byte

    @property
    def ideal_s(self) -> float:
        return ideal_seconds(self.size_bytes, self.rate_mbit)

    @property
    def ratio(self) -> float:
        return self.seconds / self.ideal_s


def ideal_seconds(size_bytes: int, rate_mbit: float) -> float:
    """The wire's time for size_bytes of payload at rate_mbit (headers not counted)."""
    if rate_mbit <= 0:
        raise ValueError(f"ideal_seconds: rate_mbit must be > 0, got {rate_mbit}")
    return size_bytes * 8 / (rate_mbit * 1e6)


def time_messages(
    net: EmulatedNetwork,
    *,
    sizes: Sequence[int],
    repeats: int,
    gap_s: float,
    python: str = sys.executable,
) -> list[Crossing]:
    """Send each size `repeats` times (sizes interleaved, so load drift spreads over all of them)
    from node 0 to node 1 over one TCP connection, as gloo keeps its pairs, idle `gap_s` before
    each message. The sender reads CLOCK_MONOTONIC (one clock for every namespace) before its
    first byte, the receiver after the last byte and sends that reading back as the ack, so
    neither side's socket buffer hides the wire. Both run as `python -m cosmocub.netemu.linkprobe`
    under `ip netns exec` with this process's environment, and are killed on the way out."""
    if len(net.nodes) < 2:
        raise ValueError(f"time_messages: needs 2 emulated nodes, got {len(net.nodes)}")
    if net.rate_mbit <= 0:
        raise ValueError("time_messages: the links are unshaped (rate_mbit 0), no rate")
    if not sizes or min(sizes) < 1 or repeats < 1 or gap_s < 0:
        raise ValueError(
            f"time_messages: sizes must be >= 1 B, repeats >= 1, gap_s >= 0; got sizes {sizes}, "
            f"repeats {repeats}, gap_s {gap_s}"
        )
    sender_node, receiver_node = net.nodes[0], net.nodes[1]
    module = [python, "-m", "cosmocub.netemu.linkprobe"]
    wire_s = sum(ideal_seconds(size, net.rate_mbit) for size in sizes)
    timeout_s = repeats * (len(sizes) * gap_s + SLOWEST_RATIO * wire_s) + 30.0
    procs: list[subprocess.Popen] = []
    try:
        receiver = subprocess.Popen(
            [*receiver_node.exec_prefix(), *module, "receive", "--address", receiver_node.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(receiver)
        port = _read_port(receiver)
        sender = subprocess.Popen(
            [
                *sender_node.exec_prefix(),
                *module,
                "send",
                "--address",
                receiver_node.address,
                "--port",
                str(port),
                "--repeats",
                str(repeats),
                "--gap-s",
                str(gap_s),
                "--sizes",
                *map(str, sizes),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(sender)
        try:
            out, err = sender.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"link probe: the sender ran past {timeout_s:.0f} s") from exc
        if sender.returncode != 0:
            raise RuntimeError(f"link probe sender failed ({sender.returncode}): {err[-2000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    rate = net.rate_mbit
    return [
        Crossing(size_bytes=r["size_bytes"], rate_mbit=rate, seconds=r["seconds"])
        for r in map(json.loads, out.splitlines())
    ]


def _read_port(receiver: subprocess.Popen) -> int:
    ready, _, _ = select.select([receiver.stdout], [], [], READY_TIMEOUT_S)
    line = receiver.stdout.readline() if ready else ""
    if not line.startswith("listening "):
        receiver.kill()
        raise RuntimeError(
            f"link probe receiver did not start within {READY_TIMEOUT_S:.0f} s: "
            f"{line!r} {receiver.communicate()[1][-2000:]}"
        )
    return int(line.split()[1])


def _receive(address: str) -> None:
    """Serve one connection: per message, read its length and bytes, then ack with the clock."""
    with socket.create_server((address, 0)) as server:
        print(f"listening {server.getsockname()[1]}", flush=True)
        conn, _ = server.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = memoryview(bytearray(1 << 20))
        while header := _recv_exactly(conn, HEADER.size, eof_ok=True):
            (remaining,) = HEADER.unpack(header)
            while remaining:
                got = conn.recv_into(buffer, min(remaining, len(buffer)))
                if got == 0:
                    raise ConnectionError(f"link probe: the sender left {remaining} B short")
                remaining -= got
            conn.sendall(ACK.pack(time.monotonic()))


def _send(address: str, port: int, sizes: Sequence[int], repeats: int, gap_s: float) -> None:
    """Print one JSON line {size_bytes, seconds} per timed message."""
    with socket.create_connection((address, port), timeout=READY_TIMEOUT_S) as sock:
        sock.settimeout(None)
        # As gloo does: the message's last segment must not wait for an ACK (Nagle).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _exchange(sock, HEADER.pack(WARM_UP_BYTES) + bytes(WARM_UP_BYTES))  # ARP, code paths
        for _ in range(repeats):
            for size in sizes:
                message = HEADER.pack(size) + bytes(size)  # built before the clock starts
                time.sleep(gap_s)
                first, last = _exchange(sock, message)
                print(json.dumps({"size_bytes": size, "seconds": last - first}), flush=True)


def _exchange(sock: socket.socket, message: bytes) -> tuple[float, float]:
    first = time.monotonic()
    sock.sendall(message)
    (last,) = ACK.unpack(_recv_exactly(sock, ACK.size))
    return first, last


def _recv_exactly(sock: socket.socket, size: int, *, eof_ok: bool = False) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            if eof_ok and not data:
                return b""
            raise ConnectionError(f"link probe: connection closed {size - len(data)} B short")
        data += chunk
    return data


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cosmocub.netemu.linkprobe")
    roles = parser.add_subparsers(dest="role", required=True)
    receive = roles.add_parser("receive")
    receive.add_argument("--address", required=True)
    send = roles.add_parser("send")
    send.add_argument("--address", required=True)
    send.add_argument("--port", type=int, required=True)
    send.add_argument("--sizes", type=int, nargs="+", required=True)
    send.add_argument("--repeats", type=int, required=True)
    send.add_argument("--gap-s", type=float, required=True)
    args = parser.parse_args(argv)
    if args.role == "receive":
        _receive(args.address)
    else:
        _send(args.address, args.port, args.sizes, args.repeats, args.gap_s)


if __name__ == "__main__":
    main()

"""A TCP proxy per gateway replica in front of every Redis endpoint, which the nemesis
can blackhole: it stops forwarding (bytes wait, no connection is closed, none is
refused), as a network partition does, then forwards again.

Redis names its own addresses to clients: the sentinels name the primary and its
replicas (``SENTINEL MASTERS``, ``get-master-addr-by-name``, ``SLAVES``), a Cluster
node names the nodes of the slot map (``CLUSTER SLOTS``) and of redirections
(``-MOVED 1234 127.0.0.1:PORT``). So that a gateway replica reaches those nodes
through its own proxy too, the server-to-client bytes are rewritten: each data
node's real port, where it appears as an address (``$5\\r\\nPORT\\r\\n``,
``:PORT\\r\\n``, ``127.0.0.1:PORT``), becomes the port of this replica's proxy for
that node. Every port involved has five digits (the kernel's ephemeral range), so
a rewrite never changes a length and needs no RESP parser. The caveat: a value in
the data that is exactly a node's port in one of those forms (a 5-digit bulk
string, or integer reply) would be rewritten too; the gateway stores no such value.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

READ = 65536


def patterns(ports: dict[int, int]) -> dict[bytes, bytes]:
    """The byte forms of each real port (a key) to rewrite into its proxy's (the value)."""
    out: dict[bytes, bytes] = {}
    for real, proxied in ports.items():
        a, b = str(real).encode(), str(proxied).encode()
        if len(a) != len(b):
            raise ValueError(f"ports {real} and {proxied} differ in length")
        out[b"$%d\r\n%s\r\n" % (len(a), a)] = b"$%d\r\n%s\r\n" % (len(b), b)
        out[b":%s\r\n" % a] = b":%s\r\n" % b
        out[b"127.0.0.1:%s" % a] = b"127.0.0.1:%s" % b
    return out


class Rewriter:
    """Rewrites ``patterns`` in a byte stream cut anywhere: the end of a chunk that may
    begin a pattern is held back until the next chunk (a whole RESP reply ends in CRLF,
    which begins no pattern, so a reply is never held)."""

    def __init__(self, rewrites: dict[bytes, bytes]) -> None:
        self.rewrites = rewrites
        self.longest = max((len(p) for p in rewrites), default=0)
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        buf = self.tail + data
        for old, new in self.rewrites.items():
            if old in buf:
                buf = buf.replace(old, new)
        hold = 0
        for k in range(min(self.longest - 1, len(buf)), 0, -1):
            end = buf[-k:]
            if any(p.startswith(end) for p in self.rewrites):
                hold = k
                break
        self.tail = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


class Link:
    """One listening port forwarding to one Redis endpoint, for one gateway replica."""

    def __init__(self, switch: asyncio.Event, target: int, listen: socket.socket) -> None:
        self.switch = switch  # set: forwarding; clear: blackholed
        self.target = target
        self.listen = listen  # bound already: no other process can take its port meanwhile
        self.rewrites: dict[bytes, bytes] = {}
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, sock=self.listen)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        with contextlib.suppress(asyncio.CancelledError):  # closed: no traceback logged
            await self._serve(reader, writer, task)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[Any]
    ) -> None:
        try:
            await self.switch.wait()  # a connection made into a partition waits (no SYN-ACK)
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            except OSError:
                return  # the node is down: the client sees the connection close
            try:
                pumps = [
                    asyncio.create_task(self._pump(reader, up_writer, None)),
                    asyncio.create_task(self._pump(up_reader, writer, Rewriter(self.rewrites))),
                ]
                try:
                    await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for pump in pumps:
                        pump.cancel()
                    for pump in pumps:
                        with contextlib.suppress(BaseException):
                            await pump
            finally:
                up_writer.close()
        finally:
            writer.close()
            self.tasks.discard(task)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, rewriter: Rewriter | None
    ) -> None:
        try:
            while data := await src.read(READ):
                await self.switch.wait()  # blackholed: hold what came, forward nothing
                if rewriter is not None:
                    data = rewriter.feed(data)
                dst.write(data)
                await dst.drain()
            if rewriter is not None:
                dst.write(rewriter.flush())
                await dst.drain()
        except OSError:
            return


def bound() -> socket.socket:
    """A listening socket on a free 5-digit port of 127.0.0.1 (the rewrite needs 5)."""
    while True:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        if len(str(sock.getsockname()[1])) == 5:
            sock.listen(128)
            sock.setblocking(False)
            return sock
        sock.close()


class ReplicaProxy:
    """All the links of one gateway replica: one per Redis endpoint, one switch."""

    def __init__(self, name: str, data_ports: list[int], other_ports: list[int]) -> None:
        self.name = name
        self.switch = asyncio.Event()
        self.switch.set()
        every = [*data_ports, *other_ports]
        sockets = [bound() for _ in every]
        self.port = {real: s.getsockname()[1] for real, s in zip(every, sockets, strict=True)}
        rewrites = patterns({p: self.port[p] for p in data_ports})
        self.links = [Link(self.switch, real, s) for real, s in zip(every, sockets, strict=True)]
        for link in self.links:
            link.rewrites = rewrites

    @property
    def blackholed(self) -> bool:
        return not self.switch.is_set()

    def cut(self) -> None:
        self.switch.clear()

    def restore(self) -> None:
        self.switch.set()

    async def start(self) -> None:
        for link in self.links:
            await link.start()

    async def close(self) -> None:
        self.switch.set()
        for link in self.links:
            await link.close()

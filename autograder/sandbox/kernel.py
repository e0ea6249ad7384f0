"""The kernel's side of a sandbox as jupyter_client sees it: a kernel manager that starts the kernel in its
sandbox (:class:`SandboxedKernelManager`), a relay process between kernel and grader that passes on only what fits
(:class:`KernelRelay`), and capped ZMQ sockets and channels on the grader's side (:func:`capped_context`,
:class:`CappedChannel`, :class:`ReadyClient`): what a kernel sends cannot grow the grader's memory past a budget.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from queue import Empty

import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Any, Int, Type, default
from zmq.utils.monitor import parse_monitor_message

from autograder.sandbox.launch import Sandbox
from autograder.sandbox.warm import WarmSandbox

# Messages from the kernel that may wait in one of the grader's sockets: what the grader holds unread is at most
# this many frames of at most cell_output_bytes (more wait in the kernel, whose sends then block or are dropped).
QUEUED_MESSAGES = 32
# The relay's memory for messages on their way (see KernelRelay): this many of cell_output_bytes, and 64 MB.
RELAY_MESSAGES = 16


def capped_context(message_bytes: int) -> zmq.asyncio.Context:
    """A ZMQ context whose sockets refuse any frame over ``message_bytes``: libzmq reads a frame's length before
    its body and closes the connection instead of allocating it (``ZMQ_MAXMSGSIZE``), so no single frame the
    kernel sends is ever allocated in the grader; at most :data:`QUEUED_MESSAGES` messages wait unread
    (``ZMQ_RCVHWM``). Every socket the grader connects to a kernel comes from such a context. Not bounded here:
    the number of frames of one message (libzmq receives a message's frames whole, past its high-water mark); the
    kernel's sockets are reached through a :class:`KernelRelay` for that."""
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, message_bytes)
    context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
    return context


class ConnectionDropped(ConnectionError):
    """libzmq closed a connection to the kernel: a frame over the size cap (see :func:`capped_context`) or the
    kernel's end. The channel has reconnected; what the kernel sent meanwhile is lost."""


class CappedChannel(AsyncZMQSocketChannel):
    """jupyter_client's channel that says when its connection was closed, and connects again.

    After a frame over ``ZMQ_MAXMSGSIZE`` libzmq drops the connection for good (a protocol error, no reconnect):
    without this, an IOPub channel would stay silent for the rest of the notebook and each later cell would wait
    for its idle status. The socket's monitor reports the drop; the channel replaces its socket with a new one to
    the same endpoint and raises :class:`ConnectionDropped` once, so that its reader can say what was lost."""

    def __init__(self, socket: zmq.asyncio.Socket, session, loop=None) -> None:
        super().__init__(socket, session)
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    async def get_msg(self, timeout: float | None = None) -> dict:
        assert self.socket is not None
        poller = zmq.asyncio.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        ready = dict(await poller.poll(None if timeout is None else int(timeout * 1000)))
        if self._monitor in ready:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            self._reconnect(event["endpoint"].decode())
            raise ConnectionDropped(f"the kernel's connection {event['endpoint'].decode()} was closed")
        if self.socket in ready:
            return await self._recv()
        raise Empty

    def _reconnect(self, endpoint: str) -> None:
        old, kind, identity = self.socket, self.socket.type, self.socket.get(zmq.ROUTING_ID)
        old.disable_monitor()
        self._monitor.close(linger=0)
        old.close(linger=0)
        self.socket = old.context.socket(kind)
        self.socket.linger = 1000
        if identity:
            self.socket.set(zmq.ROUTING_ID, identity)
        if kind == zmq.SUB:
            self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.socket.connect(endpoint)

    def close(self) -> None:
        if self.socket is not None:
            self._monitor.close(linger=0)
        super().close()

    stop = close


# The relay (see KernelRelay), run as `python -c _RELAY KERNEL_IP RELAY_IP PORTS FRAME_BYTES SPARE_BYTES`: for each
# channel a socket bound for the grader (front) and one connected to the kernel (back), and messages copied between
# them; it queues what the grader has not read yet (libzmq's default 1000 messages a socket, within its memory). A
# back connection libzmq closes (a frame over FRAME_BYTES, or no memory left for a message) is opened again, and the
# front one with it, so that the grader sees its own connection close. End of stdin ends it.
_RELAY = r"""
import json, resource, sys, zmq
kernel, outer, ports = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
frame_bytes, spare = int(sys.argv[4]), int(sys.argv[5])
context = zmq.Context()
kinds = {channel: (zmq.XPUB, zmq.XSUB) if channel == "iopub" else (zmq.ROUTER, zmq.DEALER) for channel in ports}


def back(channel):
    sock = context.socket(kinds[channel][1])
    sock.setsockopt(zmq.MAXMSGSIZE, frame_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    sock.linger = 0
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(f"ipc://{kernel}-{ports[channel]}")
    return sock, monitor


def front(channel):
    sock = context.socket(kinds[channel][0])
    sock.linger = 0
    sock.bind(f"ipc://{outer}-{ports[channel]}")
    return sock


def watch():
    poller, owner = zmq.Poller(), {}
    poller.register(sys.stdin, zmq.POLLIN)
    for channel, socks in links.items():
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
            owner[sock] = channel
    return poller, owner


links = {channel: [front(channel), *back(channel)] for channel in ports}
poller, owner = watch()
with open("/proc/self/status") as status:
    mapped = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + spare, mapped + spare))
print("ready", flush=True)
while True:
    for sock, _ in poller.poll():
        if sock is sys.stdin:
            sys.exit(0)
        channel = owner[sock]
        outer_sock, inner_sock, monitor = links[channel]
        if sock is monitor:
            for old in (monitor, inner_sock, outer_sock):
                old.close()
            links[channel] = [front(channel), *back(channel)]
            poller, owner = watch()
            break  # the events left were polled on closed sockets
        target = inner_sock if sock is outer_sock else outer_sock
        frames = sock.recv_multipart(copy=False)
        try:
            target.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # no peer yet, or a full queue: dropped, as a PUB socket does
            pass
"""


class KernelRelay:
    """A process between one kernel's sockets and the grader's, whose memory is capped.

    libzmq caps a frame (``ZMQ_MAXMSGSIZE``), not the number of frames of one message, and receives all of them
    before its reader sees the first: a kernel sending one message of many capped frames would have it received
    whole into the memory of whatever connects to it. The grader connects only to this relay. There, such a
    message runs out of its ``spare`` bytes of address space: libzmq closes the kernel's connection (the relay
    opens it again, and the grader sees its own close: see :class:`CappedChannel`) or aborts the relay (the
    grader's client then finds the kernel gone). What fits is passed on as it came."""

    def __init__(self, kernel_ip: str, ports: dict[str, int], frame_bytes: int, spare: int):
        self.folder = tempfile.mkdtemp(prefix="relay-")  # the grader's own: the kernel never sees it
        self.ip = os.path.join(self.folder, "r")
        self.spare = spare
        env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # one malloc arena: its address space is what it uses
        self.process = subprocess.Popen(
            [sys.executable, "-c", _RELAY, kernel_ip, self.ip, json.dumps(ports), str(frame_bytes), str(spare)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.stopped = False

    def wait_ready(self, timeout: float = 30.0) -> None:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready or self.process.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError("the relay between the kernel and the grader did not start")

    def alive(self) -> bool:
        return self.process.poll() is None

    def died(self) -> bool:
        """Whether it ended by itself (aborted by libzmq: a message over its memory), not by :meth:`stop`."""
        return not self.stopped and not self.alive()

    def stop(self) -> None:
        self.stopped = True
        if self.alive():
            self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class ReadyClient(AsyncKernelClient):
    """jupyter_client's client, but ready as soon as the kernel has answered ``kernel_info`` on both channels.

    jupyter_client then waits for 0.2 s of IOPub silence ("flush"): a fixed 0.2 s per graded notebook. Nothing
    needs that flush: nbclient reads only the IOPub messages whose parent is the request it sent, so what
    ``kernel_info`` leaves there (its status messages) is skipped when a cell runs. The loop is jupyter_client
    8's ``_async_wait_for_ready`` (a client made by its kernel manager) without that last flush: recheck it when
    jupyter_client changes (tests/test_ready_client.py)."""

    message_bytes = Int(0, help="the largest frame accepted from the kernel (see capped_context); 0: no cap")
    relay = Any(None, help="the KernelRelay its sockets connect to, if any: the kernel is gone when it is")
    shell_channel_class = Type(CappedChannel)
    iopub_channel_class = Type(CappedChannel)

    @default("context")
    def _context_default(self) -> zmq.asyncio.Context:
        if not self.message_bytes:
            return super()._context_default()
        self._created_context = True
        return capped_context(self.message_bytes)

    async def _async_is_alive(self) -> bool:
        return (self.relay is None or self.relay.alive()) and await super()._async_is_alive()

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                msg = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                pass
            else:
                if msg["msg_type"] == "kernel_info_reply":
                    try:  # IOPub connected: the reply's status messages reach it
                        await self.iopub_channel.get_msg(timeout=0.2)
                    except Empty:
                        pass
                    else:
                        self._handle_kernel_info_reply(msg)
                        return
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout} seconds")


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, launching the kernel inside a :class:`Sandbox` over ipc sockets."""

    box = Any(help="the Sandbox of this notebook")
    relay = Any(None, help="the KernelRelay between the kernel and the grader, while the kernel runs")

    def __init__(self, box: Sandbox, **kwargs):
        super().__init__(**kwargs)
        self.box = box
        self.client_factory = ReadyClient
        self.transport = "ipc"
        self.ip = str(box.kernel_dir / "k")  # ipc endpoints are <ip>-<port>
        self.connection_file = str(box.kernel_dir / "kernel.json")
        # Always this environment's Python kernel, whatever the notebook's metadata names; interrupt by message
        # (the kernel signals itself), since the sandbox's own processes must never receive a SIGINT.
        self._kernel_spec = KernelSpec(
            argv=[sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (sandboxed)", language="python", interrupt_mode="message", metadata={})

    @default("context")
    def _context_default(self) -> zmq.asyncio.Context:  # its control socket, connected to the kernel too
        self._created_context = True
        return capped_context(self.box.limits.cell_output_bytes)

    def client(self, **kwargs) -> ReadyClient:
        relay = {"ip": self.relay.ip, "relay": self.relay} if self.relay is not None else {}
        return super().client(message_bytes=self.box.limits.cell_output_bytes, **relay, **kwargs)

    def _make_url(self, channel: str) -> str:  # the manager's own control socket goes through the relay too
        return f"ipc://{self.relay.ip if self.relay is not None else self.ip}-{getattr(self, f'{channel}_port')}"

    def _start_relay(self) -> None:
        ports = {channel: getattr(self, f"{channel}_port") for channel in ("shell", "iopub", "stdin", "control", "hb")}
        limit = self.box.limits.cell_output_bytes
        self.relay = KernelRelay(self.ip, ports, limit, RELAY_MESSAGES * limit + (64 << 20))

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        self.box.note_others()  # before the kill: what else was still running in the sandbox
        self._note_relay()  # and before it: a relay that ends as its kernel goes did not end on what it was sent
        try:
            await super().shutdown_kernel(now=now, restart=restart)
        finally:
            self._stop_relay(noted=True)

    async def cleanup_resources(self, restart: bool = False) -> None:  # nbclient's end for a kernel that died
        try:
            await super().cleanup_resources(restart=restart)
        finally:
            self._stop_relay()

    def _note_relay(self) -> None:
        """Say so when the relay ended by itself while its kernel ran: a message over its memory."""
        if self.relay is not None and self.relay.died():
            self.box.events.append(f"the kernel sent more than {self.relay.spare / 2**20:g} MB at once (one message "
                                   "of many parts, or many messages left unread): its connection was closed")

    def _stop_relay(self, noted: bool = False) -> None:
        if self.relay is None:
            return
        if not noted:
            self._note_relay()
        self.relay.stop()
        self.relay = None

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        self.box.give(self.connection_file)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return self.box.command(super().format_kernel_cmd(extra_arguments))

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        self._start_relay()  # it starts while the kernel does
        try:
            await self._launch_in_box(kernel_cmd, **kw)
            self.relay.wait_ready()
        except BaseException:
            self._stop_relay()
            raise

    async def _launch_in_box(self, kernel_cmd: list[str], **kw) -> None:
        if isinstance(self.box, WarmSandbox):  # the student's zygote forks the kernel (no command is run)
            process = self.box.fork_kernel(self.connection_file)
            self.provisioner.process, self.provisioner.pid, self.provisioner.pgid = process, process.pid, None
            self._reconcile_connection_info(self.provisioner.connection_info)
            self.box.started(process)
            return
        kw["env"] = self.box.outer_env()
        kw["cwd"] = str(self.box.scratch)
        kw["stdout"] = subprocess.DEVNULL
        with open(self.box.log_path, "ab") as log:  # the kernel's own stderr (crash messages), size-capped
            kw["stderr"] = log
            await super()._async_launch_kernel(kernel_cmd, **kw)
        self.box.started(self.provisioner.process)

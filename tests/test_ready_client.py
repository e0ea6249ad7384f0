"""autograder.sandbox.kernel.ReadyClient: ready without jupyter_client's 0.2 s IOPub flush, and no stray output from it.

What ``kernel_info`` leaves on IOPub when the client skips the flush (the kernel's status messages) must not reach
a cell's outputs, and a kernel that died must still be reported, not waited on for ever."""

from __future__ import annotations

import asyncio
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from autograder.sandbox.kernel import ReadyClient


class _Manager(AsyncKernelManager):
    def __init__(self, argv: list[str], **kwargs):
        super().__init__(**kwargs)
        self.client_factory = ReadyClient
        self._kernel_spec = KernelSpec(argv=argv, display_name="py", language="python", metadata={})


def test_cells_right_after_ready_get_only_their_own_outputs():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('one')"),
                                         nbformat.v4.new_code_cell("2 + 2")])
    km = _Manager([sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    client = NotebookClient(nb, km=km, timeout=60)
    client.execute()
    assert isinstance(client.kc, ReadyClient)  # the client nbclient used is the quick one
    first, second = nb.cells
    assert [(o.output_type, o.get("text")) for o in first.outputs] == [("stream", "one\n")]
    assert [(o.output_type, o.data["text/plain"]) for o in second.outputs] == [("execute_result", "4")]


def test_a_kernel_that_never_answers_is_reported():
    async def wait():
        km = _Manager([sys.executable, "-c", "import time; time.sleep(60)", "{connection_file}"])
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        try:
            with pytest.raises(RuntimeError, match="respond"):
                await kc.wait_for_ready(timeout=1.5)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    asyncio.run(wait())


def test_the_grading_kernel_manager_uses_it(tmp_path):
    from types import SimpleNamespace

    import zmq

    from autograder.sandbox.kernel import QUEUED_MESSAGES, SandboxedKernelManager
    from autograder.sandbox.launch import Limits

    km = SandboxedKernelManager(SimpleNamespace(kernel_dir=tmp_path, limits=Limits(cell_output_bytes=123456)))
    assert km.client_factory is ReadyClient
    client = km.client()
    assert isinstance(client, ReadyClient)
    # every socket connected to the kernel, the client's and the manager's own, refuses frames over the cap
    for context in (client.context, km.context):
        socket = context.socket(zmq.SUB)
        assert (socket.get(zmq.MAXMSGSIZE), socket.get(zmq.RCVHWM)) == (123456, QUEUED_MESSAGES)
        socket.close()

"""What the kernel sends costs an output budget, and cannot make the grader allocate more than a capped frame.

The accounting itself (:func:`message_bytes`, :func:`message_charge`, :class:`OutputBudget`) is tested on
messages built here; :meth:`TrustedExecute.process_message`, the one point every IOPub message of a cell passes, is
fed such messages without a kernel; then a real (unsandboxed) kernel sends what a hostile notebook would, through
the grader's capped sockets. The sandboxed runs, and the grading process's peak memory, are in
tests/test_adversarial.py (the ``output_*`` attacks).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import nbformat
import pytest
from jupyter_core.utils import run_sync
from nbclient.exceptions import CellExecutionComplete
from nbconvert.preprocessors import ExecutePreprocessor
from nbformat import NotebookNode

from autograder.judge import preprocessors as plugins
from autograder.judge.preprocessors import OutputBudget, TrustedExecute, message_bytes, message_charge
from autograder.sandbox import kernel as sandbox_kernel
from tests.test_ready_client import _Manager

CAP = 1 << 20  # the cell limit, and so the largest frame the grader's sockets accept


def _msg(kind: str, content: dict, buffers=()) -> dict:
    return {"msg_type": kind, "header": {"msg_type": kind}, "parent_header": {"msg_id": "run"},
            "metadata": {}, "content": content, "buffers": list(buffers)}


# Every kind of message a kernel sends a cell, and each field of it that could carry bytes.
KINDS = {
    "stream": ({"name": "stdout", "text": "hi"}, "text"),
    "display_data": ({"data": {"text/plain": "x"}, "metadata": {}, "transient": {}}, "data"),
    "display_metadata": ({"data": {"text/plain": "x"}, "metadata": {"text/plain": {}}}, "metadata"),
    "display_transient": ({"data": {"text/plain": "x"}, "metadata": {}, "transient": {"display_id": "d"}},
                          "transient"),
    "execute_result": ({"data": {"text/plain": "x"}, "metadata": {}, "execution_count": 1}, "data"),
    "update_display_data": ({"data": {"text/plain": "x"}, "metadata": {}, "transient": {"display_id": "d"}},
                            "data"),
    "error": ({"ename": "E", "evalue": "v", "traceback": ["t"]}, "traceback"),
    "comm_open": ({"comm_id": "c", "target_name": "jupyter.widget", "data": {"state": {}}}, "data"),
    "comm_msg": ({"comm_id": "c", "data": {"method": "update", "state": {}}}, "data"),
    "clear_output": ({"wait": False}, "extra"),
}


@pytest.mark.parametrize("name", KINDS)
def test_every_field_of_every_kind_counts(name):
    content, field = KINDS[name]
    kind = name if name in ("stream", "execute_result", "error", "comm_open", "comm_msg", "clear_output",
                            "update_display_data") else "display_data"
    small = message_bytes(_msg(kind, content))
    grown = dict(content)
    junk = "j" * 10_000
    if field == "text":
        grown["text"] = content["text"] + junk
    elif field == "traceback":
        grown["traceback"] = [*content["traceback"], junk]
    elif field == "extra":  # a field no Jupyter message has, added by the kernel
        grown["extra"] = junk
    else:
        grown[field] = {**content[field], "junk": junk}
    assert message_bytes(_msg(kind, grown)) >= small + 10_000, (name, field)


def test_buffers_count_as_nbclient_keeps_them():
    content = {"comm_id": "c", "data": {"state": {}, "buffer_paths": [["a"]]}}
    plain = message_bytes(_msg("comm_msg", content))
    with_buffers = message_bytes(_msg("comm_msg", content, [b"b" * 3000, memoryview(b"c" * 3000)]))
    assert with_buffers == plain + 2 * 4000  # base64: 4 characters for 3 bytes


def test_an_update_counts_once_per_display_it_names():
    displays = {"d": {0: [0, 2], 3: [1]}, "other": {1: [0]}}  # display id -> cell -> output indices
    update = _msg("update_display_data", {"data": {"text/plain": "u" * 100}, "metadata": {},
                                          "transient": {"display_id": "d"}})
    size = message_bytes(update)
    assert message_charge(update, displays) == 3 * size
    shown = _msg("display_data", update["content"])  # rewrites the three, and adds one
    assert message_charge(shown, displays) == 4 * size
    unknown = _msg("update_display_data", {**update["content"], "transient": {"display_id": "none"}})
    assert message_charge(unknown, displays) == 0  # it rewrites nothing
    cleared = {"d": {0: [], 3: []}}  # clear_output empties a cell's list: nothing there is rewritten
    assert message_charge(update, cleared) == 0
    plain = _msg("display_data", {"data": {"text/plain": "p"}, "metadata": {}})
    assert message_charge(plain, displays) == message_bytes(plain)
    odd = _msg("update_display_data", {**update["content"], "transient": {"display_id": ["a", "list"]}})
    assert message_charge(odd, displays) == 0


def test_the_budget_closes_a_cell_then_the_notebook():
    budget = OutputBudget(cell_bytes=100, notebook_bytes=250)
    assert budget.charge(0, 60) == "" and budget.charge(0, 40) == ""
    assert budget.charge(0, 1) == "cell" and budget.charge(0, 0) == "cell"  # closed: no holes after a drop
    assert budget.charge(1, 90) == "", "a dropped message cost the notebook"
    assert budget.charge(2, 70) == "notebook" and budget.full
    assert budget.charge(3, 1) == "notebook", "the notebook's limit is for the rest of the notebook"
    assert budget.total == 190 <= budget.notebook_bytes
    other = OutputBudget(cell_bytes=100, notebook_bytes=1000)
    other.close(4)
    assert other.charge(4, 1) == "message" and other.charge(5, 1) == ""


# -- the one accounting point, fed without a kernel ----------------------------------------------------------------
def _execute(cell_bytes: int = 1000, notebook_bytes: int = 2500) -> TrustedExecute:
    execute = TrustedExecute(limits={"cell_output_bytes": cell_bytes, "output_bytes": notebook_bytes},
                             record_timing=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("") for _ in range(4)])
    execute.nb = nb
    execute.reset_execution_trackers()
    execute.clear_before_next_output = False  # set by nbclient as each cell starts
    execute._begin("lesson", "student", nb)
    return execute


def _feed(execute: TrustedExecute, index: int, messages) -> NotebookNode:
    cell = execute.nb.cells[index]
    for msg in messages:
        execute.process_message(msg, cell, index)
    return cell


def _dropped_notes(text: str) -> list[str]:
    return [n for n in plugins.NOTES.get(("lesson", "student"), []) if text in n]


@pytest.fixture(autouse=True)
def _clean_notes():
    plugins.NOTES.clear()
    yield
    plugins.NOTES.clear()


def test_widget_state_and_comm_floods_stop_at_the_cell_limit():
    execute = _execute()
    opens = [_msg("comm_open", {"comm_id": f"c{i}", "target_name": "t",
                                "data": {"state": {"_model_name": "X", "v": "w" * 300}}}) for i in range(20)]
    cell = _feed(execute, 0, opens)
    stored = sum(len(str(state)) for state in execute.widget_state.values())
    assert 0 < stored <= 1000 and 0 < len(execute.widget_state) < 20, execute.widget_state.keys()
    flood = [_msg("comm_msg", {"comm_id": "c0", "data": {"state": {"v": i}}}) for i in range(100)]
    _feed(execute, 0, flood)
    assert [o.text for o in cell.outputs] == [plugins._DROPPED["cell"]], "one note in the cell"
    assert len(_dropped_notes("output limit of a cell")) == 1, "one note in the log"
    later = _feed(execute, 1, [_msg("stream", {"name": "stdout", "text": "next cell"})])
    assert [o.text for o in later.outputs] == ["next cell"], "a flooding cell took a later cell's budget"


def test_a_malformed_message_is_ignored_with_one_note():
    execute = _execute(cell_bytes=100_000, notebook_bytes=100_000)
    malformed = [_msg("comm_open", {"comm_id": "c", "target_name": "jupyter.widget", "data": {"state": {}}}),
                 _msg("comm_msg", {"data": {"state": {}}}),  # no comm id
                 _msg("display_data", {"data": {}, "transient": "not a dict"}),
                 _msg("stream", {"name": "stdout"})]  # no text
    cell = _feed(execute, 0, malformed + [_msg("stream", {"name": "stdout", "text": "still here"})])
    assert [o.get("text") for o in cell.outputs] == ["still here"]
    assert len(_dropped_notes("malformed")) == 1


def test_display_updates_are_charged_for_every_display_they_rewrite():
    execute = _execute(cell_bytes=10_000, notebook_bytes=100_000)
    shown = [_msg("display_data", {"data": {"text/plain": "."}, "metadata": {}, "transient": {"display_id": "d"}})
             for _ in range(10)]
    _feed(execute, 0, shown)
    assert len(execute.nb.cells[0].outputs) == 10
    update = _msg("update_display_data", {"data": {"text/plain": "u" * 300}, "metadata": {},
                                          "transient": {"display_id": "d"}})
    cell = _feed(execute, 1, [update] * 3)  # each about 3.5 KB over ten displays
    assert execute.nb.cells[0].outputs[0].data["text/plain"] == "u" * 300, "the first update was applied"
    assert execute._budget.spent[1] <= 10_000 and execute._budget.refused(1) == "cell"
    assert [o.text for o in cell.outputs] == [plugins._DROPPED["cell"]]


def test_the_notebook_limit_is_noted_once_and_a_status_still_ends_a_cell():
    execute = _execute(cell_bytes=1000, notebook_bytes=1500)
    big = _msg("stream", {"name": "stdout", "text": "x" * 900})
    for index in range(3):
        _feed(execute, index, [big])
    assert [len(c.outputs) for c in execute.nb.cells[:3]] == [1, 1, 1]
    assert execute.nb.cells[1].outputs[0].text == plugins._DROPPED["notebook"]
    assert execute.nb.cells[2].outputs[0].text == plugins._DROPPED["notebook"]
    assert len(_dropped_notes("output limit of the notebook")) == 1
    idle = _msg("status", {"execution_state": "idle"})
    with pytest.raises(CellExecutionComplete):
        _feed(execute, 3, [idle])


# -- a real kernel, through the grader's capped sockets ---------------------------------------------------------
class _Capped(_Manager):
    def client(self, **kwargs):
        return super().client(message_bytes=CAP, **kwargs)


def _run(*sources: str) -> tuple[nbformat.NotebookNode, float, Exception | None]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    execute = TrustedExecute(limits={"cell_output_bytes": CAP, "output_bytes": 3 * CAP}, timeout=30,
                             iopub_timeout=2, allow_errors=True)
    execute._begin("lesson", "student", nb)
    km = _Capped([sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    started, raised = time.monotonic(), None
    try:
        ExecutePreprocessor.preprocess(execute, nb, {}, km=km)
    except Exception as exc:  # what TrustedExecute._run reports
        raised = exc
    finally:  # a kernel manager passed in is not shut down by nbclient
        execute.kc.stop_channels()
        run_sync(km.shutdown_kernel)(now=True)
    return nb, time.monotonic() - started, raised


def _texts(cell) -> list[str]:
    return [o.get("text", "") for o in cell.outputs]


HUGE_MESSAGES = {
    "display": "from IPython.display import display; display({'text/plain': 'x' * (64 << 20)}, raw=True)",
    "straight to the socket": "k = get_ipython().kernel; k.session.send(k.iopub_socket, 'display_data', "
                              "{'data': {}, 'metadata': {}}, parent=k.get_parent(), buffers=[b'x' * (200 << 20)])",
    "with no parent": "k = get_ipython().kernel; k.session.send(k.iopub_socket, 'stream', "
                      "{'name': 'stdout', 'text': 'y' * (32 << 20)})",
}


@pytest.mark.parametrize("source", HUGE_MESSAGES.values(), ids=HUGE_MESSAGES)
def test_a_message_over_the_cap_is_dropped_at_the_socket_and_later_output_arrives(source):
    nb, seconds, raised = _run("print('before')", source + "\nprint('same cell')", "print('after')")
    assert raised is None, raised
    assert _texts(nb.cells[0]) == ["before\n"] and _texts(nb.cells[2]) == ["after\n"]
    assert _texts(nb.cells[1])[-1] == plugins._DROPPED["message"]
    assert _dropped_notes("1 MB output limit of a cell in one message")
    assert seconds < 25, f"{seconds:.0f} s: the grader waited on a closed connection"


def test_a_reply_over_the_cap_stops_the_notebook_with_a_message():
    payload = ("get_ipython().payload_manager.write_payload({'source': 'page', 'start': 0, "
               "'data': {'text/plain': 'p' * (16 << 20)}})")
    nb, seconds, raised = _run("print('before')", payload, "print('after')")
    assert isinstance(raised, sandbox_kernel.ConnectionDropped), raised
    assert "limit of a cell on its shell channel" in str(raised)
    assert _texts(nb.cells[0]) == ["before\n"] and _texts(nb.cells[2]) == []
    assert seconds < 25, f"{seconds:.0f} s: the grader waited on a closed connection"


def test_many_small_messages_cost_only_their_cell():
    flood = "from IPython.display import display\nfor _ in range(1500): display({'text/plain': 's' * 2000}, raw=True)"
    nb, seconds, raised = _run(flood, "print('after')")
    assert raised is None, raised
    assert _texts(nb.cells[0])[-1] == plugins._DROPPED["cell"] and _texts(nb.cells[1]) == ["after\n"]
    assert len(nbformat.writes(nb)) < 2 * CAP


# -- the relay between a kernel and the grader ---------------------------------------------------------------------
def _peak_kb(pid: int) -> int | None:
    """A process's peak resident memory, or None once it has ended."""
    with open(f"/proc/{pid}/status") as status:
        return next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), None)


def test_the_relay_passes_messages_and_bounds_what_one_message_costs(tmp_path):
    """A stand-in kernel (plain sockets) behind a :class:`sandbox_kernel.KernelRelay`: messages pass both ways; one
    message of 400 parts of 512 KB (200 MB, each part under the frame cap) costs the relay at most its spare
    memory, never the grader, whose connection closes (to be opened again by its channel)."""
    import zmq

    context = zmq.Context()
    kernel_ip = str(tmp_path / "k")
    ports = {"shell": 1, "iopub": 2, "stdin": 3, "control": 4, "hb": 5}
    pub, shell = context.socket(zmq.PUB), context.socket(zmq.ROUTER)
    pub.bind(f"ipc://{kernel_ip}-2")
    shell.bind(f"ipc://{kernel_ip}-1")
    relay = sandbox_kernel.KernelRelay(kernel_ip, ports, CAP, 32 << 20)
    grader = sandbox_kernel.capped_context(CAP)

    async def talk():
        sub, dealer = grader.socket(zmq.SUB), grader.socket(zmq.DEALER)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(f"ipc://{relay.ip}-2")
        dealer.connect(f"ipc://{relay.ip}-1")
        await dealer.send_multipart([b"<IDS|MSG>", b"request"])
        assert shell.poll(10_000), "a request did not reach the kernel"
        *idents, request = shell.recv_multipart()
        assert request == b"request"
        shell.send_multipart([*idents, b"reply"])
        assert await dealer.poll(10_000) and (await dealer.recv_multipart())[-1] == b"reply"
        deadline = time.monotonic() + 10
        while not await sub.poll(100):  # a subscription travels through the relay: publish until one arrives
            pub.send_multipart([b"topic", b"first"])
            assert time.monotonic() < deadline, "a published message did not reach the grader"
        assert (await sub.recv_multipart())[-1] == b"first"
        base_kb = _peak_kb(relay.process.pid)
        part = b"x" * (512 << 10)
        pub.send_multipart([b"topic", *[part] * 400], copy=False)
        assert await monitor.poll(30_000), "the grader's connection stayed open"
        peak_kb = _peak_kb(relay.process.pid)
        if peak_kb is None:  # it is ending
            relay.process.wait(10)
        if relay.alive():  # libzmq closed the kernel's connection, within the relay's memory
            assert peak_kb - base_kb <= (32 << 20) >> 10, (peak_kb, base_kb)
        else:  # libzmq aborted it: the grader's client finds the kernel gone
            assert relay.died()
        print("the relay", "lives on" if relay.alive() else "was aborted")

    try:
        relay.wait_ready()
        asyncio.run(talk())
    finally:
        relay.stop()
        grader.destroy(linger=0)
        context.destroy(linger=0)
    assert not relay.alive() and not os.path.exists(relay.folder)

"""Devices: ``decoder_course.device()`` and the GPU path of lessons 07 and 10, tested on a CPU-only machine.

What a CPU can check honestly:

- the choice itself (cuda, else mps, else cpu; ``DECODER_COURSE_DEVICE`` first), with torch's availability
  probes replaced;
- the lessons' code paths with the device forced through ``DECODER_COURSE_DEVICE``: ``cpu`` runs them for real;
  ``cuda`` runs them under :class:`tests.virtual_device.VirtualDevice`, which computes on the CPU but labels every
  tensor with the device it would have on a GPU machine and fails, as CUDA does, when an operation mixes devices
  or a GPU tensor is converted to NumPy. That catches the bugs of issue 12 (batches left on the CPU, zeros built
  on the CPU, ``.numpy()`` without ``.cpu()``), and counts the synchronisations of the timing clock;
- the hidden checks' harvest, fed outputs that live on the (virtual) GPU.

What it cannot check: CUDA kernels' own numerics, CUDA autocast's op lists, and speed. Those need a GPU:
``bench/gpu_lessons.sh``.
"""

import importlib

import pytest
import torch

import decoder_course
from autograder.course import lessons
from autograder.course.reference import model as model_ref
from autograder.course.reference import numerics, training
from autograder.judge import verdicts
from decoder_course import devices
from decoder_course.data import get_task
from tests.virtual_device import VirtualDevice

CUDA = torch.device("cuda", 0)


# -- the choice -------------------------------------------------------------------------------------------------
def test_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.delenv(devices.ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert decoder_course.device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert decoder_course.device() == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert decoder_course.device() == torch.device("cpu")


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:1", "mps"])
def test_environment_variable_overrides_the_choice(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(devices.ENV, name)
    assert decoder_course.device() == torch.device(name)


def test_timer_synchronises_a_gpu_and_not_the_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda where=None: calls.append(("cuda", where)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps", None)))
    clock = devices.timer("cuda")
    start = clock()
    assert clock() >= start and calls == [("cuda", torch.device("cuda"))] * 2
    calls.clear()
    devices.timer("mps")()
    assert calls == [("mps", None)]
    calls.clear()
    devices.timer("cpu")()
    assert calls == []


def test_the_virtual_device_catches_what_a_gpu_would_refuse():
    """The negative control: without it, a passing test below would prove nothing."""
    with VirtualDevice("cuda") as vd:
        layer = torch.nn.Linear(4, 3).to("cuda")
        x = torch.randn(2, 4)
        with pytest.raises(RuntimeError, match="same device"):
            layer(x)  # a CPU batch into a GPU model: lesson 07's train() before issue 12
        y = layer(x.to("cuda"))
        assert y.device == CUDA and x.device == torch.device("cpu")
        with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
            y.detach().numpy()
        assert y.detach().cpu().numpy().shape == (2, 3)
        with pytest.raises(RuntimeError, match="same device"):
            y + torch.zeros(2, 3)  # zeros built on the CPU: lesson 10's naive softmax before issue 12
    assert vd.synchronized == 0


# -- lesson 07: the given train() ---------------------------------------------------------------------------------
def _tiny_model():
    task = get_task("reverse", min_len=3, max_len=4)
    torch.manual_seed(0)
    V = len(task.tgt_vocab)
    net = model_ref.Seq2SeqTransformer(V, V, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0)
    return task, net


def test_train_runs_on_the_device_chosen_through_the_environment(monkeypatch):
    monkeypatch.setenv(devices.ENV, "cpu")
    task, net = _tiny_model()
    history = training.train(net.to(decoder_course.device()), task, steps=3, eval_every=2, eval_pairs=20,
                             progress=False, live=False, device=decoder_course.device())
    assert history["loss"][0] == [1, 2, 3] and len(history["exact_match"][0]) == 2
    assert all(p.device.type == "cpu" for p in net.parameters())


def test_train_on_a_gpu_moves_every_batch_and_synchronises_its_clock(monkeypatch):
    monkeypatch.setenv(devices.ENV, "cuda")
    task, net = _tiny_model()
    with VirtualDevice("cuda") as vd:
        device = decoder_course.device()
        assert device.type == "cuda"
        net.to(device)
        history = training.train(net, task, steps=3, eval_every=2, eval_pairs=20, progress=False, live=False,
                                 device=device)
        assert {p.device for p in net.parameters()} == {CUDA}
        # the given greedy generation and exact match, on a batch moved to the model's device
        batch = {k: t.to(device) for k, t in task.make_batch(task.make_pairs(4, rng=3)).items()}
        pred = training.greedy_generate(net, batch["src_ids"], 5, decoder_course.BOS, batch["src_is_real"])
        assert pred.device == CUDA
        assert isinstance(task.tgt_vocab.decode_batch(pred)[0], str)  # decode copies to the CPU first
    assert not vd.mixed, vd.mixed
    assert vd.synchronized >= 2 * 3, "train's clock must synchronise the GPU before each reading"
    assert history["loss"][0] == [1, 2, 3]


def test_train_with_the_default_device_follows_the_model(monkeypatch):
    task, net = _tiny_model()
    with VirtualDevice("cuda") as vd:
        net.to("cuda")
        training.train(net, task, steps=2, eval_every=2, eval_pairs=10, progress=False, live=False)
    assert not vd.mixed and vd.synchronized > 0


# -- lesson 10: the attention paths -------------------------------------------------------------------------------
def _problem(device):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (4, 5, 5))
    allowed = torch.rand(2, 1, 4, 5, generator=g) > 0.4
    allowed[1, 0, 2] = False  # a fully masked row
    return [t.to(device) for t in (q, k, v, allowed)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lesson_10_attention_paths_on_a_gpu_agree_with_the_cpu(monkeypatch, dtype):
    monkeypatch.setenv(devices.ENV, "cpu")
    q, k, v, allowed = _problem(decoder_course.device())
    want = numerics.robust_attention(q.to(dtype), k.to(dtype), v.to(dtype), allowed)
    naive_want = numerics.naive_masked_softmax(q.to(dtype) @ k.to(dtype).transpose(-2, -1), allowed, -1e4)
    monkeypatch.setenv(devices.ENV, "cuda")
    with VirtualDevice("cuda") as vd:
        q, k, v, allowed = _problem(decoder_course.device())
        scores = q.to(dtype) @ k.to(dtype).transpose(-2, -1)
        naive = numerics.naive_masked_softmax(scores, allowed, -1e4)  # its bias is built on the scores' device
        weights = numerics.robust_masked_softmax(scores, allowed)
        out, w = numerics.robust_attention(q.to(dtype), k.to(dtype), v.to(dtype), allowed)
        with torch.autocast(q.device.type, dtype=torch.bfloat16):  # lesson 10's autocast: the device's type
            numerics.robust_attention(q, k, v, allowed)
        assert {t.device for t in (naive, weights, out, w)} == {CUDA}
        got = [t.cpu() for t in (out, w, naive)]
    assert not vd.mixed, vd.mixed
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got[2], naive_want, equal_nan=True)
    assert torch.isfinite(got[0].float()).all() and (got[1][1, :, 2] == 0).all()


# -- the hidden checks accept outputs from the GPU path -------------------------------------------------------
def _on_device(obj, device):
    """``obj`` run as GPU code runs: its tensor arguments moved to ``device``, so its outputs live there."""
    def move(value):
        return value.to(device) if isinstance(value, torch.Tensor) else value

    def wrapped(*args, **kwargs):
        return obj(*map(move, args), **{name: move(value) for name, value in kwargs.items()})

    wrapped.__name__ = getattr(obj, "__name__", "wrapped")
    return wrapped


@pytest.mark.parametrize("lesson", ["07-training", "10-numerics"])
def test_hidden_checks_accept_outputs_that_live_on_the_gpu(monkeypatch, lesson):
    monkeypatch.setenv(devices.ENV, "cuda")
    module = importlib.import_module(
        f"autograder.course.reference.{'training' if lesson == '07-training' else 'numerics'}")
    namespace = dict(vars(module))
    for name in lessons.exercises(lesson):
        if callable(namespace[name]) and not isinstance(namespace[name], type):
            namespace[name] = _on_device(namespace[name], decoder_course.device())
    with VirtualDevice("cuda") as vd:
        decided = verdicts.judge_namespace(lesson, namespace, secret=b"devices")
    failed = {item: v.message for item, v in decided.items() if not v.passed}
    assert not failed, failed
    assert not vd.mixed, vd.mixed
    # and the outputs really lived on the virtual GPU: harvest had to copy them to the CPU
    with VirtualDevice("cuda"):
        probe = _on_device(lambda x: x * 2, "cuda")(torch.ones(2))
        assert probe.device == CUDA
        with pytest.raises(TypeError):
            probe.numpy()

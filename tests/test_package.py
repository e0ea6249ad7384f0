"""The public companion package: toy data, plots and the building blocks of visible checks.

Data are checked against independent computations (``datetime.strptime`` for every date format, Python's own
``sorted``/slicing for the digit tasks, ``torch.nn.utils.rnn.pad_sequence`` for padding); the probes against
PyTorch's own attention (``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``) used right and wrong.
"""

import datetime
import os
import re
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pad_sequence  # noqa: E402

from decoder_course import BOS, EOS, PAD, checks, data, plots  # noqa: E402
from decoder_course.checks import CheckFailed  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ----------------------------------------------------------------------------------------------------
# data: Vocab
# ----------------------------------------------------------------------------------------------------
def test_vocab_special_ids_and_len():
    vocab = data.Vocab("abc")
    assert len(vocab) == 6
    assert vocab.tokens[PAD] == "<pad>" and vocab.tokens[BOS] == "<bos>" and vocab.tokens[EOS] == "<eos>"
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (PAD, BOS, EOS)
    assert vocab.encode("cab") == [5, 3, 4]
    assert vocab.encode("ab", add_bos=True, add_eos=True) == [BOS, 3, 4, EOS]
    assert vocab.encode(["b", "a"]) == [4, 3]
    with pytest.raises(ValueError, match="distinct"):
        data.Vocab("aba")
    with pytest.raises(ValueError, match="special"):
        data.Vocab(["a", "<eos>"])


def test_vocab_decode_stops_at_eos_and_skips_pad_and_bos():
    vocab = data.Vocab("abc")
    ids = [BOS, 3, PAD, 4, EOS, 5, 5]
    assert vocab.decode(ids) == "ab"
    assert vocab.decode(torch.tensor(ids)) == "ab"
    assert vocab.decode(np.array(ids)) == "ab"
    assert vocab.decode([3, 4, 5]) == "abc"  # no EOS: everything
    assert vocab.decode_batch(torch.tensor([[3, EOS, 4], [5, 4, PAD]])) == ["a", "cb"]
    with pytest.raises(IndexError):
        vocab.decode([99])


def test_vocab_unknown_token_names_it():
    with pytest.raises(KeyError, match="'z'"):
        data.Vocab("abc").encode("az")


def test_word_level_vocab_round_trip():
    vocab = data.Vocab(["the", "cat", "sat"])
    assert vocab.encode("the cat sat") == [3, 4, 5]
    assert vocab.decode(vocab.encode("sat the cat")) == "sat the cat"


@pytest.mark.parametrize("name", data.TASKS)
def test_decode_encode_round_trip_on_every_task(name):
    task = data.get_task(name)
    for src, tgt in task.make_pairs(300, rng=3, split="all"):
        assert task.src_vocab.decode(task.src_vocab.encode(src)) == src
        assert task.tgt_vocab.decode(task.tgt_vocab.encode(tgt, add_eos=True) + [7]) == tgt


# ----------------------------------------------------------------------------------------------------
# data: tasks
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", data.TASKS)
def test_make_pairs_is_deterministic_under_a_seed(name):
    task = data.get_task(name)
    first = task.make_pairs(40, rng=7)
    assert first == task.make_pairs(40, rng=7)
    assert first == task.make_pairs(40, rng=np.random.default_rng(7))
    assert first != task.make_pairs(40, rng=8)
    # A generator continues where it was: two draws from one generator differ.
    rng = np.random.default_rng(7)
    assert task.make_pairs(40, rng) != task.make_pairs(40, rng)
    # Streams are reproducible too.
    a, b = task.batches(16, seed=5), task.batches(16, seed=5)
    for _ in range(3):
        batch_a, batch_b = next(a), next(b)
        assert all(torch.equal(batch_a[k], batch_b[k]) for k in batch_a)


@pytest.mark.parametrize(
    "name, transform",
    [
        ("copy", lambda s: s),
        ("reverse", lambda s: "".join(reversed(s))),
        ("sort", lambda s: "".join(sorted(s))),
    ],
)
def test_digit_task_targets(name, transform):
    task = data.get_task(name, min_len=2, max_len=6)
    pairs = task.make_pairs(500, rng=0, split="all")
    assert all(tgt == transform(src) for src, tgt in pairs)
    assert all(src.isdigit() for src, _ in pairs)
    lengths = {len(src) for src, _ in pairs}
    assert lengths == set(range(2, 7))  # every length in [min_len, max_len], nothing else
    assert task.max_src_len == task.max_tgt_len == 6
    assert {ch for src, _ in pairs for ch in src} == set("0123456789")
    with pytest.raises(ValueError):
        data.get_task(name, min_len=0)


def test_sort_targets_are_sorted_permutations():
    for src, tgt in data.get_task("sort").make_pairs(200, rng=1):
        assert sorted(src) == list(tgt) and list(tgt) == sorted(tgt)


# strptime patterns for every written format, after the ordinal suffix is stripped: an independent parser.
STRPTIME = {
    "month_day_year": "%B %d, %Y",
    "month_ordinal_year": "%B %d, %Y",
    "day_month_year": "%d %B %Y",
    "the_ordinal_of_month": "the %d of %B, %Y",
    "abbr_day_year": "%b %d %Y",
    "abbr_dot_day_year": "%b. %d, %Y",
    "day_abbr_year_dashes": "%d-%b-%Y",
    "padded_day_abbr_year": "%d %b %Y",
    "ymd_dots": "%Y.%m.%d",
    "ymd_slashes": "%Y/%m/%d",
}
ORDINAL = re.compile(r"\b(\d{1,2})(st|nd|rd|th)\b")
SUFFIX = {1: "st", 2: "nd", 3: "rd", 11: "th", 12: "th", 13: "th", 21: "st", 22: "nd", 23: "rd", 31: "st"}


def _parse(src: str, fmt: str) -> datetime.date:
    match = ORDINAL.search(src)
    if match:
        day = int(match.group(1))
        assert match.group(2) == SUFFIX.get(day, "th"), f"wrong ordinal suffix in {src!r}"
    return datetime.datetime.strptime(ORDINAL.sub(r"\1", src), STRPTIME[fmt]).date()


def test_at_least_ten_distinct_date_formats_all_tested():
    assert len(data.DATE_FORMATS) >= 10
    assert set(data.DATE_FORMATS) == set(STRPTIME)
    assert len(set(data.DATE_FORMATS.values())) == len(data.DATE_FORMATS)
    for fmt, example in data.DATE_FORMATS.items():
        assert _parse(example, fmt) == datetime.date(1999, 3, 3)
        assert data.format_date(datetime.date(1999, 3, 3), fmt) == example


@pytest.mark.parametrize("fmt", sorted(STRPTIME))
def test_every_date_format_parses_back_to_its_iso_target(fmt):
    task = data.get_task("dates", formats=[fmt])
    pairs = task.make_pairs(400, rng=11, split="all")
    for src, tgt in pairs:
        assert _parse(src, fmt).isoformat() == tgt, (src, tgt)
        assert len(src) <= task.max_src_len
        task.src_vocab.encode(src)  # every character is in the vocabulary
    # Awkward days: every ordinal suffix, month lengths, leap day.
    for day in [datetime.date(2000, 2, 29), datetime.date(1999, 12, 31), datetime.date(2011, 11, 11),
                datetime.date(2022, 1, 22), datetime.date(2023, 9, 23), datetime.date(2001, 5, 1)]:
        assert _parse(data.format_date(day, fmt), fmt) == day


def test_dates_task_targets_years_and_unambiguity():
    task = data.get_task("dates", first_year=1990, last_year=1995)
    pairs = task.make_pairs(3000, rng=0, split="all")
    target_of = {}
    for src, tgt in pairs:
        assert datetime.date.fromisoformat(tgt).isoformat() == tgt
        assert 1990 <= int(tgt[:4]) <= 1995
        assert target_of.setdefault(src, tgt) == tgt  # a source never has two targets
    assert task.max_tgt_len == 10 and set("".join(t for _, t in pairs)) <= set("0123456789-")
    # All ten formats show up, and one date reads differently in each.
    seen = {fmt for src, tgt in pairs for fmt in STRPTIME
            if data.format_date(datetime.date.fromisoformat(tgt), fmt) == src}
    assert seen == set(STRPTIME)
    # max_src_len is the longest source any format can write (a bound that is reached, not a guess).
    days = [datetime.date(2000, 1, 1) + datetime.timedelta(days=i) for i in range(366)]
    longest = max(len(data.format_date(d, f)) for d in days for f in STRPTIME)
    assert data.get_task("dates").max_src_len == longest


# ----------------------------------------------------------------------------------------------------
# data: held-out split
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", data.TASKS)
def test_held_out_split_is_disjoint_and_about_holdout(name):
    task = data.get_task(name)
    train = task.make_pairs(3000, rng=0, split="train")
    test = task.make_pairs(300, rng=1, split="test")
    everything = task.make_pairs(3000, rng=2, split="all")
    assert not {src for src, _ in train} & {src for src, _ in test}
    if name == "dates":  # a held-out date is held out in every written format
        assert not {tgt for _, tgt in train} & {tgt for _, tgt in test}
    fraction = np.mean([data.split_of(task.split_key(s, t), task.holdout) == "test" for s, t in everything])
    assert 0.06 < fraction < 0.14
    assert all(data.split_of(task.split_key(s, t), task.holdout) == "test" for s, t in test)
    with pytest.raises(ValueError, match="split"):
        task.make_pairs(3, rng=0, split="validation")


def test_split_of_is_the_same_in_every_python_run():
    # Python's hash() of a string changes from run to run (PYTHONHASHSEED): the split must not.
    keys = [str(n) for n in range(300)] + ["1999-03-03", "2001-12-31"]
    here = [data.split_of(k) for k in keys]
    assert 5 < here.count("test") < 60
    code = f"from decoder_course.data import split_of; print(','.join(split_of(k) for k in {keys!r}))"
    other_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # a run whose hash() differs
    env = {**os.environ, "PYTHONHASHSEED": other_seed}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().split(",") == here
    assert data.split_of("x", holdout=0.0) == "train" and data.split_of("x", holdout=1.0) == "test"


# ----------------------------------------------------------------------------------------------------
# data: batches
# ----------------------------------------------------------------------------------------------------
def test_make_batch_pads_with_pad_and_marks_is_real():
    task = data.get_task("reverse")
    pairs = [("123", "321"), ("98765", "56789"), ("4", "4")]
    batch = data.make_batch(pairs, task.src_vocab, task.tgt_vocab)
    assert set(batch) == {"src_ids", "src_is_real", "tgt_ids", "tgt_is_real"}
    src_ids, tgt_ids = batch["src_ids"], batch["tgt_ids"]
    assert src_ids.shape == (3, 5) and tgt_ids.shape == (3, 6)  # (B, S), (B, T) with T counting EOS
    assert src_ids.dtype == tgt_ids.dtype == torch.int64
    assert batch["src_is_real"].dtype == batch["tgt_is_real"].dtype == torch.bool
    # The same padding as PyTorch's own pad_sequence.
    src_rows = [torch.tensor(task.src_vocab.encode(s)) for s, _ in pairs]
    tgt_rows = [torch.tensor(task.tgt_vocab.encode(t) + [EOS]) for _, t in pairs]
    want_src = pad_sequence(src_rows, batch_first=True, padding_value=PAD)
    want_tgt = pad_sequence(tgt_rows, batch_first=True, padding_value=PAD)
    assert torch.equal(src_ids, want_src) and torch.equal(tgt_ids, want_tgt)
    assert batch["src_is_real"].sum(1).tolist() == [3, 5, 1]
    assert batch["tgt_is_real"].sum(1).tolist() == [4, 6, 2]
    assert torch.equal(batch["src_is_real"], src_ids != PAD)  # digits never map to PAD
    assert torch.equal(batch["tgt_is_real"], tgt_ids != PAD)
    last_real = batch["tgt_is_real"].sum(1) - 1  # (B,)
    assert tgt_ids[torch.arange(3), last_real].tolist() == [EOS] * 3
    assert task.tgt_vocab.decode_batch(tgt_ids) == [t for _, t in pairs]
    assert (src_ids[:, 0] != BOS).all() and (tgt_ids[:, 0] != BOS).all()  # no BOS: shift_right adds it


def test_make_batch_pad_to():
    task = data.get_task("copy")
    batch = task.make_batch([("12", "12")], pad_to=(6, 8))
    assert batch["src_ids"].shape == (1, 6) and batch["tgt_ids"].shape == (1, 8)
    assert batch["src_ids"][0, 2:].eq(PAD).all() and batch["tgt_ids"][0, 3:].eq(PAD).all()
    assert task.make_batch([("12", "12")], pad_to=5)["tgt_ids"].shape == (1, 5)
    with pytest.raises(ValueError, match="pad_to"):
        task.make_batch([("1234", "1234")], pad_to=3)


def test_batches_stream_fast_and_from_the_right_split():
    task = data.get_task("dates")
    stream = task.batches(128, seed=0, split="test")
    start = time.perf_counter()
    for _ in range(50):
        batch = next(stream)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"50 held-out date batches took {elapsed:.2f} s"
    assert batch["src_ids"].shape[0] == 128
    for tgt in task.tgt_vocab.decode_batch(batch["tgt_ids"]):
        assert data.split_of(tgt, task.holdout) == "test"


# ----------------------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------------------
ALLOWED = np.tril(np.ones((3, 4), dtype=bool))  # (T, S) = (3, 4), causal


def test_plot_mask_draws_allowed_and_blocked_cells():
    ax = plots.plot_mask(ALLOWED, title="causal", query_labels=list("abc"), key_labels=list("wxyz"))
    assert isinstance(ax, Axes) and len(ax.figure.axes) == 1
    image = np.asarray(ax.images[0].get_array())
    np.testing.assert_array_equal(image, ALLOWED.astype(int))
    # The colour of an allowed cell differs from a blocked one, and blocked is the pale one.
    allowed_rgba = ax.images[0].to_rgba(np.array([[1]]))[0, 0]
    blocked_rgba = ax.images[0].to_rgba(np.array([[0]]))[0, 0]
    assert allowed_rgba[:3].mean() < blocked_rgba[:3].mean()
    assert ax.get_xlabel() == "key position (S)" and ax.get_ylabel() == "query position (T)"
    assert ax.get_title() == "causal"
    assert [t.get_text() for t in ax.get_xticklabels()] == list("wxyz")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("abc")


def test_plot_mask_takes_the_first_item_of_a_torch_batch_mask():
    mask = torch.zeros(2, 1, 3, 4, dtype=torch.bool)
    mask[0, 0] = torch.from_numpy(ALLOWED)
    mask[1, 0] = True
    ax = plots.plot_mask(mask)
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), ALLOWED.astype(int))
    ax = plots.plot_mask(ALLOWED.astype(np.int64))  # 0/1 numbers are read as a mask
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), ALLOWED.astype(int))
    with pytest.raises(ValueError, match="additive bias"):
        plots.plot_mask(np.where(ALLOWED, 0.0, -1e9))
    with pytest.raises(ValueError, match="labels"):
        plots.plot_mask(ALLOWED, key_labels=["a"])


def test_plot_masks_side_by_side():
    masks = [ALLOWED, ~ALLOWED, torch.ones(3, 4, dtype=torch.bool)]
    fig = plots.plot_masks(masks, titles=["a", "b", "c"])
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    for ax, mask, title in zip(fig.axes, masks, "abc", strict=True):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), np.asarray(mask).astype(int))
        assert ax.get_title() == title


def test_plot_attention_heatmap_with_colorbar():
    weights = torch.softmax(torch.randn(2, 3, 4, 5), dim=-1)  # (B, H, T, S)
    ax = plots.plot_attention(weights, query_tokens=list("abcd"), key_tokens=list("vwxyz"), title="t")
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), weights[0, 0].numpy(), rtol=1e-6)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("vwxyz")


def test_plot_attention_heads_small_multiples():
    weights = torch.softmax(torch.randn(3, 4, 5, requires_grad=True), dim=-1)  # (H, T, S), with grad
    fig = plots.plot_attention_heads(weights, ncols=2, title="heads")
    assert isinstance(fig, Figure) and len(fig.axes) == 3 + 1  # three heads and one shared colour bar
    for h, ax in enumerate(fig.axes[:3]):
        drawn = np.asarray(ax.images[0].get_array())
        np.testing.assert_allclose(drawn, weights[h].detach().numpy(), rtol=1e-6)
    with pytest.raises(ValueError):
        plots.plot_attention_heads(torch.rand(4, 5))


def _blocked_patches(ax):
    return [p for p in ax.patches if p.get_gid() == plots.BLOCKED_GID]


def _pixel(ax, t, s):
    """The mean RGB of a 5×5-pixel window at the centre of cell (t, s) of a drawn heatmap."""
    fig = ax.figure
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    x, y = ax.transData.transform((s, t))
    row, col = int(round(rgba.shape[0] - y)), int(round(x))
    return rgba[row - 2:row + 3, col - 2:col + 3].reshape(-1, 3).mean(axis=0)


def test_attention_heatmap_marks_blocked_cells_and_fully_masked_rows():
    allowed = np.tril(np.ones((4, 5), dtype=bool))  # (T, S)
    allowed[2] = False  # query 2 has no allowed key
    weights = np.where(allowed, 0.25, 0.0)  # (T, S): blocked weights are 0, as attention gives them
    weights[3, 0] = 0.0  # an allowed key whose weight is 0: drawn as a weight, not as blocked
    ax = plots.plot_attention(weights, allowed=allowed)
    patches = _blocked_patches(ax)
    # one patch per blocked cell, exactly on that cell; a fully masked row has its own hatch
    cells = sorted((int(p.get_y() + 0.5), int(p.get_x() + 0.5)) for p in patches)
    assert cells == sorted(zip(*np.nonzero(~allowed))), "every blocked cell, and only those, is covered"
    for p in patches:
        want = plots.NO_KEY_HATCH if int(p.get_y() + 0.5) == 2 else plots.BLOCKED_HATCH
        assert p.get_hatch() == want
    # what the reader sees: a blocked cell and a fully masked row are not the colour of a zero weight
    zero = np.array(matplotlib.colormaps["viridis"](0.0)[:3])
    np.testing.assert_allclose(_pixel(ax, 3, 0), zero, atol=0.08)  # an allowed zero weight
    assert np.abs(_pixel(ax, 0, 3) - zero).max() > 0.3, "a blocked cell looks like a zero weight"
    assert np.abs(_pixel(ax, 2, 0) - zero).max() > 0.3, "a fully masked row looks like zero weights"
    labels = [t.get_text() for legend in ax.figure.legends for t in legend.get_texts()]
    assert any("blocked" in label for label in labels) and any("no" in label for label in labels), labels
    # without a mask nothing is marked; a mask of the wrong shape is refused
    assert not _blocked_patches(plots.plot_attention(weights))
    with pytest.raises(ValueError, match="broadcast"):
        plots.plot_attention(weights, allowed=np.ones((3, 5), dtype=bool))
    plt.close("all")


def test_attention_heads_mark_blocked_cells_in_every_head():
    allowed = torch.ones(2, 1, 3, 4, dtype=torch.bool).tril()  # (B, 1, T, S): broadcast over the heads
    weights = torch.softmax(torch.randn(2, 3, 3, 4).masked_fill(~allowed, -1e9), dim=-1)  # (B, H, T, S)
    fig = plots.plot_attention_heads(weights, allowed=allowed)
    heads = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("head")]
    assert len(heads) == 3
    for ax in heads:
        assert len(_blocked_patches(ax)) == int((~allowed[0, 0]).sum())
    assert fig.legends, "the hatches need a legend"
    plt.close("all")


def test_plot_positional_encoding_and_speedup():
    pe = np.sin(np.arange(12)[:, None] / (1 + np.arange(8)[None, :]))  # (T, D)
    ax = plots.plot_positional_encoding(pe)
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), pe)
    assert len(ax.figure.axes) == 2 and ax.get_xlabel() == "dimension (D)"
    fig = plots.plot_speedup([16, 32, 64], [1.0, 2.0, 4.0], [0.5, 0.5, 0.5], labels=("no cache", "cache"))
    assert len(fig.axes) == 2
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata(), [2.0, 4.0, 8.0])
    # the y label fits beside the panel: the ratio's long wording is the panel's title
    assert len(fig.axes[1].get_ylabel()) <= 16 and "no cache" in fig.axes[1].get_title()
    fig.canvas.draw()
    label = fig.axes[1].yaxis.label.get_window_extent()
    assert label.y0 >= 0 and label.y1 <= fig.bbox.height, "the speed-up label is cut off"
    with pytest.raises(ValueError):
        plots.plot_speedup([1, 2], [1.0], [1.0, 2.0])


def test_plot_curves_accepts_every_history_form():
    fig = plots.plot_curves({"loss": [2.0, 1.0, 0.5], "exact_match": [0.0, 0.5, 1.0]})
    assert len(fig.axes) == 2
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [2.0, 1.0, 0.5])
    assert fig.axes[0].get_yscale() == "log"
    fig = plots.plot_curves({"loss": ([1, 2, 3], [2.0, 1.0, 0.5]), "exact_match": ([3], [0.9])})
    np.testing.assert_allclose(fig.axes[1].lines[0].get_xdata(), [3])
    fig = plots.plot_curves([{"step": 10, "loss": 1.0}, {"step": 20, "loss": 0.5}])
    assert len(fig.axes) == 1
    np.testing.assert_allclose(fig.axes[0].lines[0].get_xdata(), [10, 20])


def test_live_curves_print_mode(capsys):
    curves = plots.LiveCurves(mode="print", every_s=0)
    for step in range(3):
        curves.update(step, loss=1.0 / (step + 1), token_accuracy=step / 2)
    curves.update(2, exact_match=0.75)
    fig = curves.final()
    out = capsys.readouterr().out
    assert "step 0: loss 1" in out and "exact_match 0.75" in out
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [1.0, 0.5, 1 / 3])
    assert curves.history["exact_match"] == ([2.0], [0.75])
    assert len(plots.plot_curves(curves).axes) == 2


def test_live_curves_silent_mode_prints_nothing(capsys):
    curves = plots.LiveCurves(mode="silent", every_s=0)
    curves.update(1, loss=torch.tensor(0.5))
    assert len(curves.final().axes) == 1
    assert capsys.readouterr().out == ""


def test_live_curves_notebook_mode_updates_one_display(monkeypatch):
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(("update", obj))

    def fake_display(obj, display_id=False):
        shown.append(("display", obj))
        return Handle()

    monkeypatch.setattr(plots, "_display", fake_display)
    curves = plots.LiveCurves(mode="notebook", every_s=0)
    for step in range(3):
        curves.update(step, loss=1.0)
    curves.final()
    assert [kind for kind, _ in shown] == ["display", "update", "update", "update"]
    assert all(obj.data[:4] == b"\x89PNG" for _, obj in shown)
    # Throttled: with a long interval only the first update and the final one draw.
    shown.clear()
    curves = plots.LiveCurves(mode="notebook", every_s=3600)
    for step in range(50):
        curves.update(step, loss=1.0)
    curves.final()
    assert [kind for kind, _ in shown] == ["display", "update"]


def test_live_curves_auto_mode_outside_a_notebook_prints():
    assert plots.LiveCurves().mode == "print"


# ----------------------------------------------------------------------------------------------------
# checks: running checks
# ----------------------------------------------------------------------------------------------------
def test_check_prints_a_tick_on_success(capsys):
    with checks.check("shapes agree"):
        pass
    assert capsys.readouterr().out == "✓ shapes agree\n"


def test_check_prefixes_the_title_on_failure(capsys):
    with pytest.raises(CheckFailed, match=r"^✗ rows: row \[0\] of the attention weights sums to 2, not 1"):
        with checks.check("rows"):
            checks.expect_rows_sum_to_one(np.array([[1.0, 1.0]]))
    with pytest.raises(CheckFailed, match="^✗ plain: x must be positive$") as info:
        with checks.check("plain"):
            raise AssertionError("x must be positive")
    assert isinstance(info.value.__cause__, AssertionError)  # the failing line stays in the traceback
    assert "✓" not in capsys.readouterr().out


def test_check_explains_not_implemented_and_passes_crashes_through(capsys):
    def causal_mask(T):
        # YOUR CODE HERE
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match=r"✗ mask: `causal_mask` is not implemented yet: replace"):
        with checks.check("mask"):
            causal_mask(3)
    with pytest.raises(ZeroDivisionError):
        with checks.check("divide"):
            1 / 0  # noqa: B018
    assert "✗ divide: raised ZeroDivisionError" in capsys.readouterr().out


def test_check_as_decorator_and_run_checks(capsys):
    ran = []

    @checks.check("decorated")
    def decorated():
        ran.append("decorated")

    decorated()

    def first():
        """The first check."""
        ran.append("first")

    def second():
        ran.append("second")
        raise CheckFailed("broken")

    def third():
        ran.append("third")

    assert checks.run_checks(first, ("named", lambda: None)) == 2
    with pytest.raises(CheckFailed, match="✗ second: broken"):
        checks.run_checks(first, second, third)
    assert ran == ["decorated", "first", "first", "second"]  # stops at the first failure
    out = capsys.readouterr().out
    assert "✓ decorated" in out and "✓ The first check." in out and "✓ named" in out


def test_not_implemented_message():
    assert "`split_heads` is not implemented yet" in checks.not_implemented_message(name="split_heads")
    assert "raise NotImplementedError()" in checks.not_implemented_message(NotImplementedError())


# ----------------------------------------------------------------------------------------------------
# checks: type, shape, dtype
# ----------------------------------------------------------------------------------------------------
def test_expect_type():
    checks.expect_type(np.zeros(2), np.ndarray)
    checks.expect_type((1, 2), tuple)
    with pytest.raises(CheckFailed, match="forget to `return`"):
        checks.expect_type(None, np.ndarray, "causal_mask(3)")
    with pytest.raises(CheckFailed, match="works in NumPy"):
        checks.expect_type(torch.zeros(2), np.ndarray)
    with pytest.raises(CheckFailed, match="works in PyTorch"):
        checks.expect_type(np.zeros(2), torch.Tensor)
    with pytest.raises(CheckFailed, match="as a tuple"):
        checks.expect_type(np.zeros(2), tuple, "attention")
    with pytest.raises(CheckFailed, match="not a Python list"):
        checks.expect_type([1, 2], np.ndarray)


def test_expect_shape_names_the_swapped_dimensions():
    x = np.zeros((2, 4, 3, 5))
    checks.expect_shape(x, (2, 4, 3, 5))
    checks.expect_shape(x, (None, 4, None, 5))
    with pytest.raises(CheckFailed) as info:
        checks.expect_shape(x, (2, 3, 4, 5), "weights", names="B, H, T, S")
    want = "weights: expected (B, H, T, S) = (2, 3, 4, 5), got (2, 4, 3, 5): did you swap T and H?"
    assert str(info.value) == want
    with pytest.raises(CheckFailed, match=r"expected \(B, H, T, S\) = \(2, 3, 4, 5\)"):
        checks.expect_shape(torch.zeros(2, 4, 3, 5), {"B": 2, "H": 3, "T": 4, "S": 5})


def test_expect_shape_diagnoses_missing_merged_extra_and_permuted_axes():
    with pytest.raises(CheckFailed, match="H and Dh are merged into one axis of size 8"):
        checks.expect_shape(np.zeros((2, 5, 8)), (2, 2, 5, 4), names="B H T Dh")
    with pytest.raises(CheckFailed, match="the H axis is missing"):
        checks.expect_shape(np.zeros((2, 5, 7)), (2, 3, 5, 7), names="B H T S")
    with pytest.raises(CheckFailed, match="extra axis at position 1 \\(of size 1"):
        checks.expect_shape(np.zeros((2, 1, 5, 7)), (2, 5, 7), names="B T S")
    with pytest.raises(CheckFailed, match=r"in the order \(B, T, S, H\)"):
        checks.expect_shape(np.zeros((2, 5, 7, 3)), (2, 3, 5, 7), names="B H T S")
    with pytest.raises(CheckFailed, match="T is 6, expected 5"):
        checks.expect_shape(np.zeros((2, 6, 7)), (2, 5, 7), names="B T S")
    with pytest.raises(CheckFailed, match="axis 1 is 6, expected 5"):
        checks.expect_shape(np.zeros((2, 6, 7)), (2, 5, 7))
    with pytest.raises(CheckFailed, match="should be an array"):
        checks.expect_shape([[1, 2]], (1, 2))
    with pytest.raises(CheckFailed, match="forget to `return`"):
        checks.expect_shape(None, (1, 2))


def test_expect_dtype_and_expect_bool():
    checks.expect_dtype(np.zeros(2, np.float32), np.float32)
    checks.expect_dtype(torch.zeros(2), torch.float32)
    checks.expect_dtype(torch.zeros(2, dtype=torch.bfloat16), "float")
    checks.expect_dtype(np.zeros(2, np.int32), ("integer", "bool"))
    checks.expect_bool(torch.ones(2, dtype=torch.bool))
    checks.expect_bool(np.ones(2, dtype=bool))
    with pytest.raises(CheckFailed, match="dtype bool, got float32: a mask in this course is boolean"):
        checks.expect_bool(np.ones(2, np.float32), "causal_mask(2)")
    with pytest.raises(CheckFailed, match="float32, got float64: float32 inputs became float64"):
        checks.expect_dtype(np.zeros(2), np.float32)
    with pytest.raises(CheckFailed, match="token ids .* are integers"):
        checks.expect_dtype(torch.zeros(2), torch.int64)
    with pytest.raises(CheckFailed, match="got int64"):
        checks.expect_dtype(np.zeros(2, np.int64), "float")


# ----------------------------------------------------------------------------------------------------
# checks: values
# ----------------------------------------------------------------------------------------------------
def test_expect_finite_points_at_the_nan():
    checks.expect_finite(np.array([1.0, -1e30]))
    checks.expect_finite(np.array([True, False]))
    x = np.zeros((2, 3))
    x[1, 2] = np.nan
    message = r"contains NaN at \[1, 2\] \(1 NaN values in all\): a fully masked row divided 0 by 0\?"
    with pytest.raises(CheckFailed, match=message):
        checks.expect_finite(x)
    with pytest.raises(CheckFailed, match=r"contains -inf at \[0\]"):
        checks.expect_finite(torch.tensor([-float("inf"), 1.0]))


def test_expect_close_reports_the_largest_error_and_where():
    want = np.arange(6.0).reshape(2, 3)
    checks.expect_close(want + 1e-7, want)
    checks.expect_close(torch.tensor(want), want)  # torch against NumPy
    checks.expect_close(np.array([np.inf, 1.0]), np.array([np.inf, 1.0]))
    got = want.copy()
    got[1, 0] += 0.5
    got[0, 2] += 0.25
    message = r"max abs error 0.5 at \[1, 0\] \(got 3.5, expected 3\); 2 of 6 entries.*: scale by 1/sqrt"
    with pytest.raises(CheckFailed, match=message):
        checks.expect_close(got, want, "out", hint="scale by 1/sqrt(Dh)")
    with pytest.raises(CheckFailed, match=r"expected shape \(2, 3\), got \(3, 2\)"):
        checks.expect_close(want.T, want)  # shape first: broadcasting must not hide a transpose
    with pytest.raises(CheckFailed, match=r"contains NaN at \[0, 1\] where 1 is expected"):
        bad = want.copy()
        bad[0, 1] = np.nan
        checks.expect_close(bad, want)
    with pytest.raises(CheckFailed, match=r"wrong at 1 of 2 entries, the first at \[1\]: got True, expected"):
        checks.expect_close(np.array([True, True]), np.array([True, False]))


def _masked_weights(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax weights with fully masked rows set to zero, built from PyTorch's own softmax."""
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0)  # fully masked rows: 0/0 → 0


def test_expect_rows_sum_to_one_on_pytorch_softmax():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 5)  # (B, H, T, S)
    allowed = torch.rand(2, 1, 4, 5) > 0.3  # (B, 1, T, S)
    allowed[1, 0, 2] = False  # a fully masked row
    weights = _masked_weights(scores, allowed)
    checks.expect_rows_sum_to_one(torch.softmax(scores, dim=-1))
    checks.expect_rows_sum_to_one(weights, allowed)

    uniform = weights.clone()
    uniform[1, :, 2] = 1.0 / 5  # what a -1e9 fill alone gives
    message = r"row \[1, 0, 2\] .* has no allowed key, so it must be all zeros, but it sums to 1 \(a uniform"
    with pytest.raises(CheckFailed, match=message):
        checks.expect_rows_sum_to_one(uniform, allowed)
    nan = weights.clone()
    nan[1, :, 2] = float("nan")
    with pytest.raises(CheckFailed, match="divided 0 by 0"):
        checks.expect_rows_sum_to_one(nan, allowed)
    some_key = allowed.clone()
    some_key[1, 0, 2, 0] = True  # no fully masked row left
    with pytest.raises(CheckFailed, match=r"put weight .* on a blocked key at \[0, 0, "):
        checks.expect_rows_sum_to_one(torch.softmax(scores, dim=-1), some_key)
    with pytest.raises(CheckFailed, match="wrong axis"):
        checks.expect_rows_sum_to_one(torch.softmax(scores, dim=-2))
    with pytest.raises(CheckFailed, match="negative"):
        checks.expect_rows_sum_to_one(torch.tensor([[1.5, -0.5]]))


def test_expect_unchanged_and_expect_inputs_unchanged():
    x = np.arange(4.0)
    before = checks.snapshot(x)
    checks.expect_unchanged(before, x)
    x[2] = -1
    message = r"you modified the caller's input in place \(first at \[2\]: it was 2, now -1\)"
    with pytest.raises(CheckFailed, match=message):
        checks.expect_unchanged(before, x, "scores")

    def in_place(scores, allowed):
        scores[~allowed] = -1e9
        return scores

    def pure(scores, allowed):
        return torch.where(allowed, scores, torch.tensor(-1e9))

    scores, allowed = torch.randn(3, 4), torch.rand(3, 4) > 0.5
    allowed[0, 0] = False
    out = checks.expect_inputs_unchanged(pure, scores, allowed=allowed)
    assert torch.equal(out, pure(scores, allowed))
    with pytest.raises(CheckFailed, match="argument 0 of in_place was changed: you modified the caller's"):
        checks.expect_inputs_unchanged(in_place, scores, allowed)


def test_to_numpy_handles_grad_and_half_precision():
    x = torch.ones(2, 3, dtype=torch.bfloat16, requires_grad=True) * 2
    np.testing.assert_array_equal(checks.to_numpy(x), np.full((2, 3), 2.0, np.float32))


# ----------------------------------------------------------------------------------------------------
# checks: probes
# ----------------------------------------------------------------------------------------------------
def test_causal_probe_passes_causal_functions():
    x = np.random.default_rng(0).normal(size=(2, 6, 3))  # (B, T, D)
    checks.causal_leakage_probe(lambda a: np.cumsum(a, axis=1), x)
    checks.causal_leakage_probe(lambda a: torch.cumsum(a, dim=1), torch.from_numpy(x))
    # A running mean over the past is causal too.
    checks.causal_leakage_probe(lambda a: np.cumsum(a, axis=1) / np.arange(1, 7)[None, :, None], x)


def test_causal_probe_catches_a_mean_over_the_whole_sequence():
    x = np.random.default_rng(0).normal(size=(2, 6, 3))
    message = r"^position 0 changed when only positions > 0 were changed: your mask lets the future leak"
    with pytest.raises(CheckFailed, match=message):
        checks.causal_leakage_probe(lambda a: a - a.mean(axis=1, keepdims=True), x)


def test_causal_probe_names_the_leaking_position():
    def leaks_at_2(a):  # position 2 also sees position 3
        out = np.cumsum(a, axis=1)
        out[:, 2] += a[:, 3]
        return out

    message = r"^position 2 changed when only positions > 2 were changed: your mask lets the future leak"
    with pytest.raises(CheckFailed, match=message):
        checks.causal_leakage_probe(leaks_at_2, np.ones((2, 5, 3)))


def test_causal_probe_on_pytorch_attention_and_token_ids():
    torch.manual_seed(0)
    B, H, T, Dh = 2, 2, 5, 4
    x = torch.randn(B, H, T, Dh)  # probe along T (axis 2)
    causal_sdpa = lambda a: F.scaled_dot_product_attention(a, a, a, is_causal=True)  # noqa: E731
    checks.causal_leakage_probe(causal_sdpa, x, time_axis=2)
    with pytest.raises(CheckFailed, match="lets the future leak"):
        checks.causal_leakage_probe(lambda a: F.scaled_dot_product_attention(a, a, a), x, time_axis=2)

    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))  # (T, S), True = may attend
    # nn.MultiheadAttention's attn_mask has the opposite polarity (True = blocked): invert at the boundary.
    right = lambda a: mha(a, a, a, attn_mask=~allowed)  # noqa: E731
    wrong = lambda a: mha(a, a, a, attn_mask=allowed)  # noqa: E731  the trap: course polarity passed as-is
    seq = torch.randn(B, T, 8)
    checks.causal_leakage_probe(right, seq)
    with pytest.raises(CheckFailed, match="lets the future leak"):
        checks.causal_leakage_probe(wrong, seq)

    # Token ids (integers) are perturbed into other ids; the weights' query axis is axis 2.
    embed = nn.Embedding(13, 8)
    ids = torch.randint(3, 13, (B, T))
    checks.causal_leakage_probe(lambda t: mha(embed(t), embed(t), embed(t), attn_mask=~allowed)[1], ids,
                                out_time_axis=1)
    with pytest.raises(CheckFailed, match="lets the future leak"):
        checks.causal_leakage_probe(lambda t: mha(embed(t), embed(t), embed(t))[0], ids)


def test_causal_probe_refuses_random_functions():
    dropout = nn.Dropout(0.5).train()
    with pytest.raises(CheckFailed, match="different outputs for the same input.*dropout"):
        checks.causal_leakage_probe(lambda a: torch.cumsum(dropout(a), dim=1), torch.ones(2, 5, 3))


def test_padding_probe_on_pytorch_attention():
    torch.manual_seed(0)
    B, T, D = 2, 5, 8
    x = torch.randn(B, T, D)
    is_real = torch.tensor([[True, True, True, True, True], [True, True, True, False, False]])  # (B, S)
    mha = nn.MultiheadAttention(D, 2, batch_first=True).eval()
    # key_padding_mask: True = padding (PyTorch's polarity), so it is ~is_real.
    checks.padding_leakage_probe(lambda a: mha(a, a, a, key_padding_mask=~is_real), x, is_real)
    sdpa_allowed = is_real[:, None, None, :]  # (B, 1, 1, S)
    padded_sdpa = lambda a: F.scaled_dot_product_attention(a, a, a, attn_mask=sdpa_allowed[:, 0])  # noqa: E731
    checks.padding_leakage_probe(padded_sdpa, x, is_real)
    message = r"at batch item 1, position 0 changed when only padded positions were changed: padded keys leak"
    with pytest.raises(CheckFailed, match=message):
        checks.padding_leakage_probe(lambda a: mha(a, a, a), x, is_real)
    with pytest.raises(CheckFailed, match="padded keys leak"):
        checks.padding_leakage_probe(lambda a: mha(a, a, a, key_padding_mask=is_real), x, is_real)


def test_padding_probe_cross_attention_and_pooling():
    torch.manual_seed(1)
    memory = torch.randn(2, 6, 4)  # (B, S, D)
    is_real = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    queries = torch.randn(2, 3, 4)  # (B, T, D), T != S: every output row is compared

    def cross(mem, mask=True):
        allowed = is_real[:, None, :] if mask else None  # (B, 1, S)
        return F.scaled_dot_product_attention(queries, mem, mem, attn_mask=allowed)

    checks.padding_leakage_probe(cross, memory, is_real)
    with pytest.raises(CheckFailed, match="padded keys leak"):
        checks.padding_leakage_probe(lambda mem: cross(mem, mask=False), memory, is_real)

    def pooled(a, mask=True):  # (B, S, D) -> (B, 1, D)
        weights = is_real[:, :, None].float() if mask else torch.ones_like(a[..., :1])
        return (a * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True)

    checks.padding_leakage_probe(pooled, memory, is_real)
    with pytest.raises(CheckFailed, match="batch item 1, position 0"):
        checks.padding_leakage_probe(lambda a: pooled(a, mask=False), memory, is_real)
    with pytest.raises(ValueError, match="at least one padded"):
        checks.padding_leakage_probe(pooled, memory, torch.ones(2, 6, dtype=torch.bool))


def test_checks_never_change_their_inputs():
    x = torch.randn(2, 5, 3)
    before = x.clone()
    checks.causal_leakage_probe(lambda a: torch.cumsum(a, dim=1), x)
    is_real = torch.tensor([[True] * 5, [True, True, True, False, False]])
    checks.padding_leakage_probe(lambda a: a * 2, x, is_real)
    checks.expect_close(x, before)
    assert torch.equal(x, before)



def test_check_failures_render_as_their_message_in_jupyter():
    """IPython shows _render_traceback_'s lines instead of a traceback through the checker's internals."""
    err = CheckFailed("✗ causal_mask: position 2 changed when only positions > 2 were changed\nsecond line")
    lines = err._render_traceback_()
    assert len(lines) == 2
    assert lines[0].endswith("✗ causal_mask: position 2 changed when only positions > 2 were changed")
    assert "CheckFailed" in lines[0] and lines[1] == "second line"

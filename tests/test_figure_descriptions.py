"""Every figure says what it shows (issue 37, point 6): its description is computed from the data it draws.

The helpers of ``decoder_course.plots`` describe their panels (a mask's pattern, each query's strongest key, a
positional encoding's range); a panel drawn with ``plt`` directly is described from what it holds. In a kernel,
``decoder_course`` registers the figure's ``text/html`` form: an ``<img>`` whose ``alt`` is that description, which
JupyterLab prefers to the PNG (tests/test_accessibility.py reads it in the browser).
"""

import html
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import decoder_course  # noqa: E402
from decoder_course import plots  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("T", [3, 6])
def test_a_causal_mask_is_described_as_causal_with_its_size(T):
    ax = plots.plot_mask(np.tril(np.ones((T, T), dtype=bool)), title="causal")
    text = plots.figure_description(ax.figure)
    assert text.startswith(f"'causal': mask {T}×{T}") and "True on and below the diagonal" in text, text


def test_a_padding_mask_names_its_blocked_keys():
    is_real = np.array([True, True, True, True, False, False])
    text = plots.figure_description(plots.plot_mask(np.broadcast_to(is_real, (3, 6))).figure)
    assert "mask 3×6" in text and "keys 4–5 blocked" in text and "keys 0–3 allowed" in text, text


def test_any_other_mask_is_described_row_by_row():
    mask = np.array([[True, False, False], [True, True, False], [False, False, False]])  # causal, last row padded
    text = plots.figure_description(plots.plot_mask(torch.tensor(mask)).figure)
    assert "3 of 9 cells True" in text and "query 1: keys 0–1" in text and "query 2: no key" in text, text


def test_all_true_and_all_false_masks():
    assert "every cell True" in plots.figure_description(plots.plot_mask(np.ones((2, 2), bool)).figure)
    assert "every cell False" in plots.figure_description(plots.plot_mask(np.zeros((2, 2), bool)).figure)


def test_plot_masks_describes_each_panel():
    fig = plots.plot_masks([np.tril(np.ones((4, 4), bool)), np.ones((4, 4), bool)], titles=["causal", "all"])
    text = plots.figure_description(fig)
    assert text.startswith("Panel 1 of 2: 'causal': mask 4×4") and "Panel 2 of 2: 'all': mask 4×4" in text, text


def test_attention_names_each_querys_strongest_key_from_the_weights():
    weights = np.array([[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.2, 0.2, 0.6]])
    text = plots.figure_description(plots.plot_attention(weights, query_tokens=list("abc"), key_tokens=list("xyz")))
    assert "3 queries (rows) × 3 keys (columns)" in text, text
    assert "query 0 'a' → key 0 'x' (1.00)" in text and "query 1 'b' → key 1 'y' (0.70)" in text, text
    assert "query 2 'c' → key 2 'z' (0.60)" in text


def test_attention_with_a_mask_says_what_is_blocked_and_which_rows_have_no_key():
    weights = np.array([[1.0, 0.0], [0.0, 0.0]])
    allowed = np.array([[True, False], [False, False]])
    text = plots.figure_description(plots.plot_attention(weights, allowed=allowed))
    assert "3 entries blocked by the mask" in text and "query 1: no allowed key (all zeros)" in text, text


def test_attention_heads_describe_every_head():
    weights = torch.stack([torch.eye(3), torch.eye(3).flip(-1)])  # (H, T, S): head 1 looks at the mirror key
    text = plots.figure_description(plots.plot_attention_heads(weights, title="two heads"))
    assert text.startswith("Figure 'two heads'.") and "Panel 2 of 2: 'head 1'" in text, text
    assert "query 0 → key 2 (1.00)" in text  # head 1's first query, from the data


def test_a_long_list_is_cut_and_says_how_many_more():
    text = plots.figure_description(plots.plot_attention(np.eye(12)))
    assert "query 7 → key 7" in text and "query 8 → key 8" not in text and "and 4 more" in text, text


def test_positional_encoding_gives_its_size_range_and_frequencies():
    T, D = 16, 8
    position = np.arange(T)[:, None]
    pe = np.sin(position / 10000 ** (np.arange(D)[None, :] / D) + 0.5)
    text = plots.figure_description(plots.plot_positional_encoding(pe))
    assert f"{T} positions (rows) × {D} dimensions (columns)" in text, text
    assert re.search(r"dimension 0 changes sign [1-9]\d* times and dimension 7 0 times", text), text


def test_a_figure_drawn_without_a_helper_is_described_from_its_lines_and_labels():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2, 3, 4, 5, 6, 7], [5.0, 4.0, 3.2, 2.5, 2.1, 1.9, 1.7, 1.8], label="train")
    ax.axhline(1.75, linestyle="--", label="held-out 1.75")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("GPT")
    text = plots.figure_description(fig)
    assert text.startswith("'GPT': 'train': 8 points from x=0 to x=7, y going from 5 to 1.8 (lowest 1.7 at x=6")
    assert "'held-out 1.75': a horizontal line at 1.75" in text and "x axis step, y axis loss" in text, text


def test_a_heatmap_and_text_labels_drawn_without_a_helper():
    fig, axes = plt.subplots(1, 2)
    axes[0].imshow(np.arange(6).reshape(2, 3))
    axes[1].text(0.5, 0.5, "inf")
    text = plots.figure_description(fig)
    assert "Panel 1 of 2: a heatmap of 2 rows × 3 columns, values from 0 to 5" in text, text
    assert "Panel 2 of 2: labels 'inf'" in text, text


def test_curves_and_speedup_are_described_from_their_values():
    text = plots.figure_description(plots.plot_curves({"loss": [2.0, 1.0, 0.5]}))
    assert "'loss': 3 points (0, 2), (1, 1), (2, 0.5)" in text and "(log scale)" in text, text
    text = plots.figure_description(plots.plot_speedup([8, 16], [1.0, 4.0], [1.0, 1.0]))
    assert "Panel 2 of 2:" in text and "(8, 1), (16, 4)" in text, text


def test_describe_replaces_the_computed_text_and_refuses_what_is_not_one():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    plots.describe(ax, "  a rising   line ")
    assert plots.figure_description(fig) == "a rising line"
    plots.describe(fig, "the whole figure")
    assert plots.figure_description(fig) == "the whole figure"
    with pytest.raises(TypeError, match="pass the ax"):
        plots.describe("fig", "text")
    with pytest.raises(ValueError, match="say what the figure shows|says what the figure shows"):
        plots.describe(ax, " ")


@pytest.mark.parametrize("title", ['"><script>alert(1)</script>', "a & b < c", "it's \"quoted\""])
def test_the_html_form_is_a_png_whose_alt_is_the_escaped_description(title):
    ax = plots.plot_mask(np.tril(np.ones((3, 3), bool)), title=title)
    page = plots.figure_html(ax.figure)
    found = re.fullmatch(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">', page)
    assert found, page[:200]
    assert html.unescape(found.group(2)) == plots.figure_description(ax.figure)
    assert "<script" not in found.group(2) and title in html.unescape(found.group(2))


def test_live_curves_show_their_description_beside_the_png():
    curves = plots.LiveCurves(mode="silent")
    curves.update(0, loss=2.0)
    curves.update(1, loss=1.0)
    curves.final()  # drawn, as each update draws it in a notebook
    data = curves._png()._repr_mimebundle_()
    assert set(data) == {"image/png", "text/html", "text/plain"}
    assert "'loss': 2 points (0, 2), (1, 1)" in data["text/plain"], data["text/plain"]
    assert f'alt="{html.escape(data["text/plain"])}"' in data["text/html"]


def test_in_a_kernel_every_figure_gets_its_html_form_with_alt():
    """The registration ``decoder_course`` makes when imported in a kernel: by name, for any Figure."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.pylabtools import select_figure_formats

    shell = InteractiveShell.instance()
    try:
        assert decoder_course.describe_figures_in_notebooks()
        # the inline backend sets its formats on pyplot's import, and removes every per-type formatter of Figure
        select_figure_formats(shell, {"png"})
        fig, ax = plt.subplots()
        ax.plot([3.0, 2.0, 1.0])
        data, _ = shell.display_formatter.format(fig)
        assert 'alt="a line: 3 points (0, 3), (1, 2), (2, 1)"' in data["text/html"], data.get("text/html")
        assert data["image/png"], "the PNG is still there, for front ends that show no HTML"
    finally:
        InteractiveShell.clear_instance()


def test_outside_a_kernel_nothing_is_registered():
    assert decoder_course.describe_figures_in_notebooks() is False

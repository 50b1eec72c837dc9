"""Figures: SVG in every committed notebook, Chinese in the Chinese edition, drawn with a font that has every glyph."""

import re
import warnings

import matplotlib
import nbformat
import pytest
from matplotlib.figure import Figure

from dp_helpers.tool import i18n
from dp_helpers.tool.messages_zh import MESSAGES
from tools import edition, font

SVG, PNG = "image/svg+xml", "image/png"
TEXT = re.compile(r"<!-- (.*?) -->", re.S)  # matplotlib writes each text it draws as outlines after a comment of it


def figures(path) -> list[dict]:
    """The image outputs of a committed notebook, as their mime bundles."""
    nb = nbformat.read(path, as_version=4)
    return [o.data for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if SVG in o.get("data", {}) or PNG in o.get("data", {})]


def test_the_course_font_has_every_chinese_character_a_figure_may_draw():
    from fontTools.ttLib import TTFont

    cmap = TTFont(i18n.COURSE_FONT)["cmap"].getBestCmap()
    # the messages and the translations' code (what a figure draws) among all the course's Chinese text
    missing = sorted(ch for ch in font.course_characters() if ord(ch) not in cmap)
    assert not missing, f"the course font lacks {''.join(missing)}: run python tools/font.py on the full Noto Sans CJK SC"


def test_under_zh_cn_a_figure_draws_chinese_without_a_missing_glyph(tmp_path):
    try:
        with matplotlib.rc_context(), warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" and draws a box
            i18n.set_language("zh-CN")
            assert matplotlib.rcParams["font.family"][0] == "DejaVu Sans"
            assert "DP Course Sans SC" in matplotlib.rcParams["font.family"]
            fig = Figure()
            fig.subplots().set_title("每个 rank 的损失 −1")
            fig.savefig(tmp_path / "zh.svg")
    finally:
        i18n.set_language("en")
    assert "每个 rank 的损失 −1" in TEXT.findall((tmp_path / "zh.svg").read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", edition.english_notebooks(), ids=lambda p: p.name)
def test_every_figure_is_vector_and_the_chinese_editions_figures_are_chinese(path):
    english, chinese = figures(path), figures(edition.edition_of(path))
    assert all(SVG in f and PNG not in f for f in english + chinese), "a figure kept as PNG: re-execute the notebook"
    assert len(chinese) == len(english)
    sentences = {k for k, v in MESSAGES.items() if " " in k.strip() and "{" not in k and k != v}  # helpers' labels
    for i, figure in enumerate(chinese):
        texts = TEXT.findall(figure[SVG])
        assert any(edition.CJK.search(t) for t in texts), f"figure {i} of the edition has no Chinese"
        english_left = [t for t in texts if t in sentences]
        assert not english_left, f"figure {i} of the edition still says {english_left}"

"""The language of checker messages and figure labels: the Chinese edition's notebooks call set_language("zh-CN").

They import it from dp_helpers.course.i18n, the name they have always used; it lives here, in the tool, because
the plotting helpers (tool/plotting.py) label figures with it and the tool never imports the course.

A message is written once, in English, as a template: `tr("{n} cases agree with the reference.", n=len(cases))`.
Under "zh-CN" the template's entry in `messages_zh.MESSAGES` is filled in instead (the English one where it has none,
which tests/test_i18n.py does not allow for any template in the package). A table of hints keeps its English
entries marked with `tr_later(...)`, where the tests find them too, and calls `tr(entry)` where it is used. The
plotting helpers label their figures with tr() too, and under "zh-CN" matplotlib draws Chinese glyphs with an
installed CJK font or, where there is none (Colab, Kaggle), with the course's own (fonts/, tools/font.py).
"""

from __future__ import annotations

from pathlib import Path

from dp_helpers.tool.errors import UsageError

LANGUAGES = ("en", "zh-CN")
_current = {"language": "en"}  # set by the notebook, never at import


# fonts with Simplified Chinese that a learner's machine may have, preferred in this order to the course's own
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "Microsoft YaHei", "PingFang SC", "SimHei")
COURSE_FONT = Path(__file__).with_name("fonts") / "dp-course-sans-sc.otf"  # the characters of the course's own text


def set_language(language: str) -> None:
    """Choose the language of every checker message and figure label from now on: "en" or "zh-CN"."""
    if language not in LANGUAGES:
        raise UsageError(f"language {language!r} is not one of {', '.join(LANGUAGES)}.")  # a ValueError
    _current["language"] = language
    if language == "zh-CN":
        use_chinese_font()


def use_chinese_font() -> list[str]:
    """Let matplotlib draw Chinese: Latin from DejaVu Sans, each CJK glyph from the first CJK font that has it."""
    from matplotlib import font_manager, rcParams

    installed = {font.name for font in font_manager.fontManager.ttflist}
    if "DP Course Sans SC" not in installed:
        font_manager.fontManager.addfont(str(COURSE_FONT))
    # a list of concrete families: matplotlib >= 3.6 falls back glyph by glyph along it (a generic family would not)
    rcParams["font.family"] = ["DejaVu Sans", *(f for f in CJK_FONTS if f in installed), "DP Course Sans SC"]
    return rcParams["font.family"]


def language() -> str:
    """The language checker messages are written in now."""
    return _current["language"]


def tr(template: str, **values) -> str:
    """The English template, or its translation in the current language, filled in with values (str.format)."""
    if language() == "zh-CN":
        from dp_helpers.tool.messages_zh import MESSAGES

        template = MESSAGES.get(template, template)
    return template.format(**values)


def tr_later(template: str) -> str:
    """Mark an English template kept in a table and translated where it is used, `tr(entry)`: returned as it is."""
    return template

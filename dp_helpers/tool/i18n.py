"""The language of checker messages: the Chinese edition's notebooks call set_language("zh-CN"); English otherwise.

A message is written once, in English, as a template: `tr("{n} cases agree with the reference.", n=len(cases))`.
Under "zh-CN" the template's entry in `messages_zh.MESSAGES` is filled in instead (the English one where it has none,
which tests/test_i18n.py does not allow for any template in the package). A table of hints keeps its English
entries marked with `tr_later(...)`, where the tests find them too, and calls `tr(entry)` where it is used.
"""

from __future__ import annotations

from dp_helpers.tool.request import UsageError

LANGUAGES = ("en", "zh-CN")
_current = {"language": "en"}  # set by the notebook, never at import


def set_language(language: str) -> None:
    """Choose the language of every checker message from now on: "en" or "zh-CN"."""
    if language not in LANGUAGES:
        raise UsageError(f"language {language!r} is not one of {', '.join(LANGUAGES)}.")  # a ValueError
    _current["language"] = language


def language() -> str:
    """The language checker messages are written in now."""
    return _current["language"]


def tr(template: str, **values) -> str:
    """The English template, or its translation in the current language, filled in with values (str.format)."""
    if language() == "zh-CN":
        from dp_helpers.course.messages_zh import MESSAGES

        template = MESSAGES.get(template, template)
    return template.format(**values)


def tr_later(template: str) -> str:
    """Mark an English template kept in a table and translated where it is used, `tr(entry)`: returned as it is."""
    return template

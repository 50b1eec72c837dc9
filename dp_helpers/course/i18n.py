"""The Chinese edition's switch: its notebooks' setup cells call `set_language("zh-CN")` from here.

The machinery lives in the tool (dp_helpers/tool/i18n.py), where the plotting helpers label figures with it too;
this module is the name the notebooks import it by.
"""

from dp_helpers.tool.i18n import language, set_language

__all__ = ["language", "set_language"]

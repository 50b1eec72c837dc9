"""The course's Chinese figure font: `python tools/font.py NotoSansCJKsc-Regular.otf` rewrites dp_helpers/tool/fonts/.

Figures in the Chinese edition draw their Chinese text with a CJK font. Most machines a learner uses (Colab, Kaggle,
a fresh Linux) have none, so the package carries one: Noto Sans CJK SC Regular (SIL Open Font License 1.1), cut
down to the characters the course's Chinese text uses (its translations, README, front page and checker messages)
and renamed, as the licence asks of a modified font, so that it never stands in for a full Noto installed beside it.
Run it again from the full font when tests/test_figures.py says a character is missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FONT = REPO / "dp_helpers" / "tool" / "fonts" / "dp-course-sans-sc.otf"
FAMILY = "DP Course Sans SC"
SOURCES = ("dp_helpers/tool/messages_zh.py", "i18n/zh-CN/*.md", "*.zh-CN.md", "site/front/zh-CN.md", "docs/*.zh-CN.md")


def is_cjk(ch: str) -> bool:
    """A character a Latin font lacks: CJK ideographs, their punctuation and full-width forms."""
    return ord(ch) >= 0x2E80


def course_characters() -> set[str]:
    """Every CJK character of the course's Chinese text."""
    return {ch for pattern in SOURCES for path in REPO.glob(pattern) for ch in path.read_text(encoding="utf-8")
            if is_cjk(ch)}


def subset(full: Path, out: Path = FONT) -> int:
    """Write the full font cut down to the course's characters (and ASCII) under the course's family name; its size."""
    from fontTools import subset as ft
    from fontTools.ttLib import TTFont

    options = ft.Options()
    options.name_IDs, options.layout_features, options.hinting = ["*"], [], False  # hinting: 40 % of the bytes
    font = TTFont(full)
    cut = ft.Subsetter(options)
    cut.populate(unicodes={ord(ch) for ch in course_characters()} | set(range(0x20, 0x7F)))
    cut.subset(font)
    for record in font["name"].names:  # family, full and PostScript names: the licence's rule for a modified font
        if record.nameID in (1, 3, 4, 6, 16, 17):
            name = FAMILY.replace(" ", "") if record.nameID == 6 else FAMILY
            record.string = name + ("-Regular" if record.nameID == 6 else " Regular" if record.nameID == 4 else "")
    font.save(out)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """CLI: subset the font given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("full_font", type=Path, help="NotoSansCJKsc-Regular.otf (Noto CJK's Simplified Chinese)")
    size = subset(parser.parse_args(argv).full_font)
    print(f"{FONT.relative_to(REPO)}: {len(course_characters())} characters, {size // 1000} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

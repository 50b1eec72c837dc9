"""A figure's alt text, read from the SVG matplotlib saved: each panel's title, axis labels and legend, in its words.

matplotlib draws a figure's text as outlines (svg.fonttype "path") and writes each string before it as an XML
comment, inside the group of the artist that drew it: an Axes ("axes_N"), an axis ("matplotlib.axis_N") with
its ticks ("xtick_N", "ytick_N"), a legend ("legend_N"). The site (tools/site.py) gives every figure this text as
its alt, so that a reader who cannot see the figure hears what it shows, in the page's language.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

WORDS = {"en": {"figure": "Figure: ", "y": "{y} against {x}", "axis": "axis: {label}", "legend": "legend: {names}",
                "labels": "labels: {names}", "and": "; ", "list": ", "},
         "zh-CN": {"figure": "图：", "y": "纵轴：{y}，横轴：{x}", "axis": "坐标轴：{label}", "legend": "图例：{names}",
                   "labels": "标注：{names}", "and": "；", "list": "、"}}
LIMIT = 600  # characters: a screen reader reads all of it, a page's alt need not be the figure's every label


def texts(group: ET.Element, skip: tuple[str, ...] = ()) -> list[str]:
    """The strings drawn inside a group, in order, leaving out the groups whose id starts with one of `skip`."""
    found = []
    for child in group:
        if child.tag is ET.Comment:
            found.append(" ".join(child.text.split()))
        elif not child.get("id", "").startswith(skip):
            found += texts(child, skip)
    return [t for t in found if t]


def children(group: ET.Element, prefix: str) -> list[ET.Element]:
    """The groups below `group` whose id starts with prefix (not inside another such group)."""
    found = []
    for child in group:
        found += [child] if child.get("id", "").startswith(prefix) else children(child, prefix)
    return found


def panel(axes: ET.Element, lang: str) -> str:
    """One Axes in a sentence: its title (drawn last), its axes' labels, its legend, a drawing's other labels."""
    words = WORDS[lang]
    axes_labels = [(texts(a, ("xtick", "ytick")) or [""])[-1] for a in children(axes, "matplotlib.axis")]
    free = [t for t in texts(axes, ("matplotlib.axis", "legend")) if re.search(r"[^\W\d_]", t)]  # not bare numbers
    legend = [t for g in children(axes, "legend") for t in texts(g)]
    parts = free[-1:]
    if len(axes_labels) == 2 and all(axes_labels):
        parts.append(words["y"].format(y=axes_labels[1], x=axes_labels[0]))
    elif any(axes_labels):
        parts.append(words["axis"].format(label=next(label for label in axes_labels if label)))
    if legend:
        parts.append(words["legend"].format(names=words["list"].join(dict.fromkeys(legend))))
    if free[:-1] and not axes_labels:  # a drawing (its axes hidden): every box and arrow label says what it shows
        parts.append(words["labels"].format(names=words["and"].join(dict.fromkeys(free[:-1]))))
    return words["and"].join(parts)


def alt_text(svg: str, lang: str = "en") -> str:
    """What a saved matplotlib figure shows, in one line of at most LIMIT characters."""
    root = ET.fromstring(svg.encode(), parser=ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))
    panels = [p for p in (panel(a, lang) for a in children(root, "axes")) if p]
    text = WORDS[lang]["figure"] + " | ".join(panels)
    return text if len(text) <= LIMIT else text[:LIMIT - 1] + "…"

"""Where the course is published, kept in pyproject.toml alone: `python tools/repository.py` writes it everywhere.

The repository's URL is pyproject.toml's `[project.urls] Repository`, its branch `[tool.dp-course] branch`. A
notebook must carry both, because Colab and Kaggle open it alone: its Colab and Kaggle badges and its setup cell's
`git clone`. This command writes them into every notebook, its Chinese translation (i18n/zh-CN/, with the hash of
the English cell it translates) and its Chinese edition; `tools/notebooks.py check` names a notebook that disagrees;
the website (tools/site.py) reads pyproject.toml itself. A fork changes the two lines and runs this.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLUG = r"[\w.-]+/[\w.-]+"  # owner/name as GitHub spells them
BADGE_COLAB = re.compile(rf"https://colab\.research\.google\.com/github/{SLUG}/blob/[\w./-]+?/(notebooks/[\w.-]+\.ipynb)")
BADGE_KAGGLE = re.compile(rf"https://kaggle\.com/kernels/welcome\?src=https://github\.com/{SLUG}/blob/[\w./-]+?/"
                          r"(notebooks/[\w.-]+\.ipynb)")
CLONE = re.compile(r'subprocess\.run\(\["git", "clone"[^\]]*\], check=True\)')


@dataclass(frozen=True)
class Home:
    """A GitHub repository and branch, and the links the course makes into them."""

    url: str
    branch: str

    @property
    def slug(self) -> str:
        """owner/name."""
        return self.url.removeprefix("https://github.com/")

    def colab(self, path: str) -> str:
        """Colab's link that opens one of the repository's notebooks."""
        return f"https://colab.research.google.com/github/{self.slug}/blob/{self.branch}/{path}"

    def kaggle(self, path: str) -> str:
        """Kaggle's link that opens one of the repository's notebooks."""
        return f"https://kaggle.com/kernels/welcome?src={self.url}/blob/{self.branch}/{path}"

    def file(self, path: str, folder: bool = False) -> str:
        """GitHub's page of a file (or folder) on the branch."""
        return f"{self.url}/{'tree' if folder else 'blob'}/{self.branch}/{path}"

    def clone(self) -> str:
        """The setup cell's clone of the branch."""
        return f'subprocess.run(["git", "clone", "-q", "--depth", "1", "-b", "{self.branch}", "{self.url}", "dp-course"], check=True)'


def read_toml(path: Path) -> dict:
    """pyproject.toml as a dict (on Python 3.10, without tomllib: only the two keys this module reads)."""
    text = path.read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:
        url = re.search(r'^Repository\s*=\s*"([^"]*)"', text, re.M)
        branch = re.search(r'^\[tool\.dp-course\][^\[]*?^branch\s*=\s*"([^"]*)"', text, re.M | re.S)
        return {"project": {"urls": {"Repository": url[1] if url else ""}},
                "tool": {"dp-course": {"branch": branch[1] if branch else ""}}}
    return tomllib.loads(text)


@functools.cache  # read once per process: the site asks it for every link it rewrites
def home(root: Path = ROOT) -> Home:
    """The repository and branch pyproject.toml names; one sentence if either is missing or not on GitHub."""
    meta = read_toml(root / "pyproject.toml")
    url = meta.get("project", {}).get("urls", {}).get("Repository", "").rstrip("/").removesuffix(".git")
    branch = meta.get("tool", {}).get("dp-course", {}).get("branch", "")
    if not re.fullmatch(rf"https://github\.com/{SLUG}", url) or not re.fullmatch(r"[\w./-]+", branch):
        raise ValueError(f"pyproject.toml must name a GitHub repository ([project.urls] Repository = "
                         f"\"https://github.com/OWNER/NAME\", now {url!r}) and its branch ([tool.dp-course] branch, "
                         f"now {branch!r}): Colab opens notebooks from GitHub only.")
    return Home(url, branch)


def stamp(text: str, where: Home) -> str:
    """`text` with every Colab or Kaggle notebook link and the setup cell's clone pointing at `where`."""
    text = BADGE_COLAB.sub(lambda m: where.colab(m.group(1)), text)
    text = BADGE_KAGGLE.sub(lambda m: where.kaggle(m.group(1)), text)
    return CLONE.sub(lambda m: where.clone(), text)


def stamp_notebooks(root: Path = ROOT) -> list[Path]:
    """Write pyproject.toml's repository into every English notebook and its translation; returns what changed."""
    import nbformat

    sys.path.insert(0, str(root))
    from tools import edition

    where, changed = home(root), []
    for notebook in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if notebook.name.endswith(".zh-CN.ipynb"):
            continue
        nb, hashes = nbformat.read(notebook, as_version=4), {}
        for cell in nb.cells:
            new = stamp(cell.source, where)
            if new != cell.source:
                hashes[edition.source_hash(cell.source)], cell.source = edition.source_hash(new), new
        if hashes:
            nbformat.write(nb, notebook)
            changed += [notebook, *restamp_translation(root / "i18n" / "zh-CN" / f"{notebook.stem}.md", where, hashes)]
    return changed


def restamp_translation(path: Path, where: Home, hashes: dict[str, str]) -> list[Path]:
    """A translation's links and clone re-pointed, and each stamped block marked as translating the new English."""
    if not path.exists():
        return []
    text = stamp(path.read_text(encoding="utf-8"), where)
    text = re.sub(r"(<!-- cell \S+ · \w+ · en )(\w+)( -->)", lambda m: m[1] + hashes.get(m[2], m[2]) + m[3], text)
    path.write_text(text, encoding="utf-8")
    return [path]


def ran_current_code(edition, path: Path) -> bool:
    """Whether a Chinese edition's outputs come from its code as it is, before the repository is rewritten in it."""
    import nbformat

    return path.exists() and not edition.run_problems(nbformat.read(path, as_version=4), path.name)


def main() -> int:
    """Stamp the notebooks, then rebuild the Chinese editions of those that changed (a run's stamp kept valid)."""
    try:
        changed = stamp_notebooks()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    english = [p for p in changed if p.suffix == ".ipynb"]
    if english:
        from tools import edition

        ran = [p for p in english if ran_current_code(edition, edition.edition_of(p))]
        for problem in (p for problems in edition.translate(english).values() for p in problems):
            print(problem)
        for path in ran:  # only the repository's address changed in their code: the run's outputs still hold
            edition.stamp_run(edition.edition_of(path))
    print(f"{len(english)} notebook(s) now point at {home().file('')} ({len(changed) - len(english)} translation(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

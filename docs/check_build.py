"""Checks the built HTML of the executed guides: a guide that plots shows its figure.

A figure is lost silently when the guides run under a non-inline matplotlib backend
(``MPLBACKEND=Agg`` in the environment overrides the kernel's inline one): the build has no
warning for it. Run after ``sphinx-build`` (``.ci/run`` does):

  python docs/check_build.py docs/_build/html
"""

import pathlib
import re
import sys


def main(html_dir: str) -> int:
  docs = pathlib.Path(__file__).parent
  missing = []
  for source in sorted((docs / "guides").glob("*.md")):
    text = source.read_text()
    figures = len(re.findall(r"plt\.show\(\)", text))
    if not figures:
      continue
    page = pathlib.Path(html_dir) / "guides" / f"{source.stem}.html"
    images = len(re.findall(r"<img ", page.read_text())) if page.exists() else 0
    if images < figures:
      missing.append(f"{page}: {figures} plt.show() in {source.name}, {images} images")
  for line in missing:
    print(f"error: a guide's figure is missing: {line}", file=sys.stderr)
  return 1 if missing else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html"))

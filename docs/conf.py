"""Sphinx configuration: the API reference from docstrings, guides executed by myst-nb.

Sphinx with myst-nb and the book theme is what JAX, optax and flax build their sites with,
so a JAX user finds the same layout and the same notebook-style guides. ``-W`` turns every
warning into an error; the guides run at build time and a failing cell fails the build.
"""

import importlib
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

project = "fedco"
author = "the fedco authors"
copyright = "2026, the fedco authors"  # noqa: A001 (Sphinx's name)

extensions = [
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx.ext.mathjax",
  "sphinx.ext.viewcode",
  "myst_nb",
]

html_theme = "sphinx_book_theme"
html_title = "fedco"
html_theme_options = {"show_toc_level": 2}
exclude_patterns = ["_build", "check_docstrings.py", "**.ipynb_checkpoints"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}

# Docstrings: Google style (napoleon); attributes as fields, not separate objects, so a
# NamedTuple's Attributes section and its members never describe one name twice.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_inherit_docstrings = False

# Guides: every cell runs at build time (no cache from an earlier build), and an error fails.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence"]

# The public modules, in the order the reference lists them; each object is documented once,
# under the first module whose ``__all__`` lists it (the rule tests/test_docstrings.py uses).
API = (
  ("fedco", "Top level: algorithms, problems, the simulator"),
  ("fedco.algorithms", "Algorithms: building blocks"),
  ("fedco.problems", "Problems"),
  ("fedco.runtime", "Runtime: simulate, sweep, writers"),
  ("fedco.data", "Data"),
  ("fedco.privacy", "Privacy"),
  ("fedco.compression", "Compression"),
  ("fedco.models", "Models"),
  ("fedco.extend", "Extension API: your own algorithm"),
  ("fedco.testing", "Testing kit: check your algorithm"),
  ("fedco.estimators", "Estimators"),
  ("fedco.metrics", "Metrics"),
  ("fedco.checkpoint", "Checkpoints"),
  ("fedco.io", "Files"),
)


def _data_doc(attr: str) -> list:
  """The ``#:`` comment above ``attr``'s assignment in whichever fedco module assigns it."""
  from sphinx.pycode import ModuleAnalyzer

  for name in sorted(m for m in sys.modules if m == "fedco" or m.startswith("fedco.")):
    try:
      docs = ModuleAnalyzer.for_module(name).find_attr_docs()
    except Exception:  # noqa: BLE001 (compiled or source-less modules have none)
      continue
    if ("", attr) in docs:
      return [line for line in docs[("", attr)] if line.strip()]
  raise ValueError(f"public data {attr!r} has no '#:' comment where it is assigned")


def _directive(obj) -> str:
  if inspect.isclass(obj):
    return "autoclass"
  if inspect.isfunction(obj) or callable(obj):
    return "autofunction"
  return "autodata"


def write_api_pages(out_dir: str) -> None:
  """Writes one reST page per public module (generated; not kept in git)."""
  os.makedirs(out_dir, exist_ok=True)
  seen = {}
  toc = []
  for name, title in API:
    module = importlib.import_module(name)
    lines = [title, "=" * len(title), "", f".. automodule:: {name}", ""]
    here, elsewhere = [], []
    for attr in module.__all__:
      obj = getattr(module, attr)
      if inspect.ismodule(obj):
        continue
      key = id(obj) if (callable(obj) or inspect.isclass(obj)) else (name, attr)
      if key in seen:
        elsewhere.append(f":py:obj:`{attr} <{seen[key]}>`")
        continue
      seen[key] = f"{name}.{attr}"
      here.append((attr, obj))
    for attr, obj in here:
      directive = _directive(obj)
      if directive == "autodata":  # a dict or an int: its type's docstring says nothing
        lines += [f".. py:data:: {name}.{attr}", ""]
        lines += ["   " + line for line in _data_doc(attr)] + [""]
        continue
      lines += [f".. {directive}:: {name}.{attr}"]
      if directive == "autoclass":
        lines += ["   :members:"]
      lines += [""]
    if elsewhere:
      lines += ["Also available here, documented where first listed: " + ", ".join(elsewhere), ""]
    page = name.replace(".", "_")
    toc.append(page)
    with open(os.path.join(out_dir, page + ".rst"), "w") as f:
      f.write("\n".join(lines))
  index = ["API reference", "=============", "", ".. toctree::", "   :maxdepth: 1", ""]
  index += [f"   {page}" for page in toc]
  with open(os.path.join(out_dir, "index.rst"), "w") as f:
    f.write("\n".join(index) + "\n")


write_api_pages(os.path.join(os.path.dirname(os.path.abspath(__file__)), "api"))

"""Sphinx configuration: the API reference from docstrings, guides executed by myst-nb.

Sphinx with myst-nb and the book theme is what JAX, optax and flax build their sites with,
so a JAX user finds the same layout and the same notebook-style guides. ``-W`` turns every
warning into an error; the guides run at build time and a failing cell fails the build.
"""

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
exclude_patterns = [
  "_build",
  "screenshots",
  "check_docstrings.py",
  "check_build.py",
  "**.ipynb_checkpoints",
]
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
# Show the argument types by their names, not expanded (optax.ScalarOrSchedule is a long
# Union); the keys are the annotations as written (modules use postponed annotations).
autodoc_type_aliases = {
  name: f"fedco.extend.{name.split('.')[-1]}"
  for name in (
    "ScalarOrSchedule",
    "base.ScalarOrSchedule",
    "extend.ScalarOrSchedule",
    "Optimizer",
    "base.Optimizer",
    "extend.Optimizer",
  )
}
autodoc_inherit_docstrings = False

# Guides: every cell runs at build time (no cache from an earlier build), and an error fails.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence"]

# The title of each public module's page; fedco._api.PUBLIC_MODULES gives the modules and
# their order, and says where each object is documented (the first module listing it, the
# rule tests/test_docstrings.py uses).
TITLES = {
  "fedco": "Top level: algorithms, problems, the simulator",
  "fedco.algorithms": "Algorithms: building blocks",
  "fedco.problems": "Problems",
  "fedco.runtime": "Runtime: simulate, sweep, writers",
  "fedco.data": "Data",
  "fedco.privacy": "Privacy",
  "fedco.compression": "Compression",
  "fedco.byzantine": "Byzantine robustness",
  "fedco.models": "Models",
  "fedco.extend": "Extension API: your own algorithm",
  "fedco.testing": "Testing kit: check your algorithm",
  "fedco.experiment": "Experiments: the skeleton your experiment plugs into",
  "fedco.estimators": "Estimators",
  "fedco.metrics": "Metrics",
  "fedco.checkpoint": "Checkpoints",
  "fedco.io": "Files",
}


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


def _page(module_name: str, entries) -> str:
  title = TITLES[module_name]
  lines = [title, "=" * len(title), "", f".. automodule:: {module_name}", ""]
  elsewhere = []
  for e in entries:
    if e.home != f"{e.module}.{e.name}":
      elsewhere.append(f":py:obj:`{e.name} <{e.home}>`")
    elif e.kind in ("data", "alias"):  # a dict or a typing alias: its type's docstring
      lines += [f".. py:data:: {e.home}", ""]  # says nothing; its #: comment does
      lines += ["   " + line for line in _data_doc(e.name)] + [""]
    elif e.kind == "class":
      lines += [f".. autoclass:: {e.home}", "   :members:", ""]
    else:
      lines += [f".. autofunction:: {e.home}", ""]
  if elsewhere:
    lines += ["Also available here, documented where first listed: " + ", ".join(elsewhere), ""]
  return "\n".join(lines)


def write_api_pages(out_dir: str) -> None:
  """Writes one reST page per public module (generated; not kept in git)."""
  from fedco import _api

  os.makedirs(out_dir, exist_ok=True)
  entries = _api.entries()
  pages = []
  for module_name in _api.PUBLIC_MODULES:
    page = module_name.replace(".", "_")
    pages.append(page)
    with open(os.path.join(out_dir, page + ".rst"), "w") as f:
      f.write(_page(module_name, [e for e in entries if e.module == module_name]))
  index = ["API reference", "=============", "", ".. toctree::", "   :maxdepth: 1", ""]
  index += [f"   {page}" for page in pages]
  with open(os.path.join(out_dir, "index.rst"), "w") as f:
    f.write("\n".join(index) + "\n")


write_api_pages(os.path.join(os.path.dirname(os.path.abspath(__file__)), "api"))

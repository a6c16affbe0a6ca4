"""Renders public docstrings as Sphinx would (napoleon's Google style, then docutils).

Usage: ``python docs/check_docstrings.py fedco.problems [fedco.data ...]``; prints each
docutils warning with the name it came from and exits 1 if there was one. Quicker than a
whole ``sphinx-build -W`` while writing docstrings; the build itself is the final check.
"""

import importlib
import inspect
import io
import sys

import docutils.core
import docutils.utils
from sphinx.ext.napoleon import Config
from sphinx.ext.napoleon.docstring import GoogleDocstring

_CONFIG = Config(napoleon_use_param=True, napoleon_use_rtype=True, napoleon_use_ivar=True)
# Roles and directives Sphinx adds, which plain docutils does not know.
_PRELUDE = "\n".join(
  f".. role:: {r}(literal)"
  for r in ("func", "class", "meth", "mod", "attr", "obj", "data", "exc", "doc", "ref", "py:func")
)


def _warnings(doc: str) -> str:
  rst = str(GoogleDocstring(inspect.cleandoc(doc), _CONFIG))
  stream = io.StringIO()
  docutils.core.publish_doctree(
    _PRELUDE + "\n\n" + rst,
    settings_overrides={"warning_stream": stream, "report_level": 2, "halt_level": 5},
  )
  return stream.getvalue()


def main(names) -> int:
  bad = 0
  for name in names:
    module = importlib.import_module(name)
    objects = [(name, module)] + [(f"{name}.{a}", getattr(module, a)) for a in module.__all__]
    for qualified, obj in objects:
      doc = getattr(obj, "__doc__", None)
      own = obj is module or inspect.isfunction(obj) or inspect.isclass(obj)
      if not own or not isinstance(doc, str):
        continue
      found = _warnings(doc)
      if found:
        bad += 1
        print(f"== {qualified}\n{found}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

"""The package's shape: no import cycles among fedco's modules (imports inside functions
included), no private name taken across modules, ``import fedco`` without orbax, and
runtime modules a newcomer can read one at a time (under 300 lines of code each).

Code lines leave out docstrings, comments and blank lines: the docstrings are the API
reference (issue 29 added Args, Returns and Examples to every public name), and the
formatter (ruff, decision 79) spreads long calls over lines; neither makes a module harder
to read.
"""

import ast
import io
import pathlib
import sys
import tokenize

import pytest

from tests import helpers

PACKAGE = helpers.ROOT / "fedco"
MAX_RUNTIME_CODE_LINES = 280


def _module_name(path):
  parts = path.relative_to(helpers.ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, modules):
  """The fedco modules ``path`` imports anywhere, inside functions too (an import deferred
  into a function still ties the two modules: it only hides the cycle until that function
  runs), except under ``if TYPE_CHECKING:``, which never runs (``from a import b`` counts
  ``a.b`` when that is a module, else ``a``)."""
  out = set()
  for node in _import_nodes(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names if alias.name in modules)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        out.add(full if full in modules else node.module)
  return {m for m in out if m in modules}


def _import_nodes(tree):
  """Every import statement of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
  stack = [tree]
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      stack.extend(node.orelse)
    else:
      stack.extend(ast.iter_child_nodes(node))


def _graph():
  files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  return {name: _imports(path, files) - {name} for name, path in files.items()}


def _cycle(graph):
  """One import cycle among modules (package ``__init__`` re-exports excluded), or None."""
  graph = {k: {m for m in v if not _is_package(m)} for k, v in graph.items() if not _is_package(k)}
  state = {}

  def visit(node, stack):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt) :] + [nxt]
      if nxt not in state:
        found = visit(nxt, stack + [nxt])
        if found:
          return found
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node, [node])
      if found:
        return found
  return None


def _is_package(name):
  return (helpers.ROOT / pathlib.Path(*name.split(".")) / "__init__.py").exists()


def test_no_import_cycles_among_fedco_modules():
  assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_the_cycle_finder_finds_a_cycle():
  assert _cycle({"fedco.a": {"fedco.b"}, "fedco.b": {"fedco.c"}, "fedco.c": {"fedco.a"}}) == [
    "fedco.a",
    "fedco.b",
    "fedco.c",
    "fedco.a",
  ]


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
  module = tmp_path / "m.py"
  module.write_text(
    "from typing import TYPE_CHECKING\n"
    "if TYPE_CHECKING:\n"
    "  from fedco.b import B\n"
    "def f():\n"
    "  from fedco import c  # deferred: still an edge\n"
    "  import fedco.d\n"
  )
  modules = {"fedco.b", "fedco.c", "fedco.d"}
  assert _imports(module, modules) == {"fedco.c", "fedco.d"}


def _private_crossings(files):
  """``(module, from module, name)`` for every private name (one leading underscore) a
  fedco module takes from another: by ``from a import _b`` or as ``a._b``."""
  hits = set()
  for name, path in files.items():
    tree = ast.parse(path.read_text())
    aliases = {}  # local name -> the fedco module it stands for
    for node in _import_nodes(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedco"):
        for alias in node.names:
          full = f"{node.module}.{alias.name}"
          if full in files:
            aliases[alias.asname or alias.name] = full
          elif _private(alias.name):
            hits.add((name, node.module, alias.name))
      elif isinstance(node, ast.Import):
        aliases.update({a.asname or a.name: a.name for a in node.names if a.name in files})
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and _private(node.attr)
      ):
        hits.add((name, aliases[node.value.id], node.attr))
  return sorted(hits)


def _private(name):
  return name.startswith("_") and not name.startswith("__")


def test_no_private_name_crosses_modules():
  files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  assert _private_crossings(files) == []


def test_the_crossing_finder_finds_private_names_taken_from_another_module(tmp_path):
  (tmp_path / "a.py").write_text("def _helper():\n  return 1\n")
  (tmp_path / "b.py").write_text(
    "from fedco.a import _helper\nfrom fedco import a\ndef f():\n  return a._other()\n"
  )
  files = {"fedco.a": tmp_path / "a.py", "fedco.b": tmp_path / "b.py"}
  assert _private_crossings(files) == [
    ("fedco.b", "fedco.a", "_helper"),
    ("fedco.b", "fedco.a", "_other"),
  ]


def test_the_runtime_imports_no_experiment_code_and_data_no_runtime():
  graph = _graph()
  for name, deps in graph.items():
    if name.startswith("fedco.data"):
      assert not any(d.startswith("fedco.runtime") for d in deps), (name, deps)
    assert not any(d.startswith("experiments") for d in deps), (name, deps)


@pytest.mark.parametrize("path", sorted((PACKAGE / "runtime").glob("*.py")), ids=lambda p: p.name)
def test_runtime_modules_stay_short(path):
  lines = _code_lines(path.read_text())
  assert lines <= MAX_RUNTIME_CODE_LINES, f"{path.name} has {lines} lines of code"


def _code_lines(source: str) -> int:
  """Lines holding code: not blank, not only a comment, not part of a docstring."""
  docstrings = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      first = node.body[0] if node.body else None
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
          docstrings.update(range(first.lineno, first.end_lineno + 1))
  skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
  code = set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type not in skip and token.type != tokenize.ENDMARKER:
      code.update(range(token.start[0], token.end[0] + 1))
  return len(code - docstrings)


def test_code_lines_leave_out_docstrings_comments_and_blanks():
  source = 'def f():\n  """Doc.\n\n  More.\n  """\n  # note\n\n  return (1 +\n          2)\n'
  assert _code_lines(source) == 3


def test_import_fedco_leaves_orbax_until_a_checkpoint_is_asked_for():
  probe = (
    "import sys, fedco\n"
    "print(any(m.startswith('orbax') for m in sys.modules))\n"
    "fedco.checkpoint.Checkpointer\n"
    "print(any(m.startswith('orbax') for m in sys.modules))\n"
  )
  done = helpers.run(
    [sys.executable, "-c", probe], cwd=helpers.ROOT, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ["False", "True"]

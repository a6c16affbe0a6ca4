"""The package's shape: no import cycles among fedco's modules, and runtime modules a
newcomer can read one at a time (under 300 lines of code each).

Code lines leave out docstrings, comments and blank lines: the docstrings are the API
reference (issue 29 added Args, Returns and Examples to every public name), and the
formatter (ruff, decision 79) spreads long calls over lines; neither makes a module harder
to read.
"""

import ast
import io
import pathlib
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedco"
MAX_RUNTIME_CODE_LINES = 280


def _module_name(path):
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, modules):
  """The fedco modules ``path`` imports at module level (``from a import b`` counts ``a.b``
  when that is a module, else ``a``)."""
  out = set()
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names if alias.name in modules)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        out.add(full if full in modules else node.module)
  return {m for m in out if m in modules}


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
  return (ROOT / pathlib.Path(*name.split(".")) / "__init__.py").exists()


def test_no_import_cycles_among_fedco_modules():
  assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_the_cycle_finder_finds_a_cycle():
  assert _cycle({"fedco.a": {"fedco.b"}, "fedco.b": {"fedco.c"}, "fedco.c": {"fedco.a"}}) == [
    "fedco.a",
    "fedco.b",
    "fedco.c",
    "fedco.a",
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

"""pytest defaults for this repository.

The suite runs on two pytest-xdist workers, each test module on one worker (``--dist
loadfile``: module fixtures and shared compiled runs stay in one process), unless the
command line decides otherwise: ``-n0`` or ``-p no:xdist`` runs in this process (a subset,
a debugger), ``-n 4`` on four workers. Set here rather than in ``setup.cfg``'s ``addopts``,
where ``-n 2`` would make ``-p no:xdist`` an error.
"""

import pathlib

import pytest
from _pytest import doctest

WORKERS = 2


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
  if (
    not config.pluginmanager.hasplugin("xdist")
    or hasattr(config, "workerinput")
    or config.option.numprocesses is not None
    or config.getoption("usepdb", False)
  ):
    return
  config.option.numprocesses = WORKERS
  if config.option.dist == "no":
    config.option.dist = "loadfile"


_FEDCO = pathlib.Path(__file__).parent / "fedco"


def pytest_collect_file(file_path, parent):
  """Collects the examples in ``fedco/``'s docstrings as doctests (``testpaths`` names it).

  Only the library's modules: ``--doctest-modules`` would also import every helper under
  ``tests/`` (some set ``XLA_FLAGS`` when imported).
  """
  if file_path.suffix == ".py" and _FEDCO in file_path.parents:
    return doctest.DoctestModule.from_parent(parent, path=file_path)
  return None

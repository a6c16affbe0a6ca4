"""The README's Python examples run as written; the sketches in README and guides compile.

The guides in ``docs/guides`` run their cells when the docs are built (``.ci/run``).
"""

import re

import pytest

from tests import helpers

README = helpers.ROOT / "README.md"
ALL_BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
GUIDE_BLOCKS = [
  block
  for guide in sorted((helpers.ROOT / "docs" / "guides").glob("*.md"))
  for block in re.findall(r"```python\n(.*?)```", guide.read_text(), flags=re.S)
]
# Blocks marked "# sketch" hold placeholders (the multi-host one runs on every host): they are
# compiled and their fedco names checked, not executed.
SKETCHES = [b for b in ALL_BLOCKS + GUIDE_BLOCKS if b.startswith("# sketch")]
BLOCKS = [b for b in ALL_BLOCKS if not b.startswith("# sketch")]


def test_readme_has_examples():
  assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, capsys):
  namespace = {}
  exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), namespace)
  if "result" in namespace:  # the simulation example converges and reports its ledger
    result = namespace["result"]
    assert result.metrics["grad_norm"][-1] < result.metrics["grad_norm"][0]
    assert result.ledger["up_per_client_per_round"] == {"params": 4, "y": 10}
  if "params" in namespace and "returns" in namespace:  # the own-loop example converges
    import numpy as np

    # ... and prints its result: the objective at the start and at the end, lower
    printed = re.findall(
      r"objective (-?[\d.]+) at x = 0, (-?[\d.]+) at x = \[", capsys.readouterr().out
    )
    assert len(printed) == 1 and float(printed[0][1]) < float(printed[0][0]), printed

    from fedco.problems import portfolio_stationary_point

    x_star = portfolio_stationary_point([np.asarray(namespace["returns"])], 1.0)
    # stochastic run: well inside a third of the starting distance |x*|
    assert np.linalg.norm(np.asarray(namespace["params"]) - x_star) < np.linalg.norm(x_star) / 3
    import fedco

    # the example composes: a chained fedco algorithm whose schedule lives in the state
    assert isinstance(namespace["opt"], fedco.Algorithm) and namespace["opt"].name == "feddro"
    hyperparams = namespace["state"][0].hyperparams
    assert float(hyperparams["learning_rate"]) < 0.5 * float(namespace["schedule"](0))


def test_readme_sketches_compile_and_name_real_functions():
  from fedco.runtime import distributed

  assert SKETCHES
  for block in SKETCHES:
    compile(block, "README.md[sketch]", "exec")
    for name in re.findall(r"distributed\.(\w+)\(", block):
      assert callable(getattr(distributed, name, None)), name

"""The algorithm modules stay modules: ``fedco.algorithms.scaffold`` is the module
``fedco/algorithms/scaffold.py`` (the package used to overwrite six of them with the
factories of the same name), the factories stay ``fedco.<name>`` and ``ALGORITHMS[name]``,
and ``fedco.algorithms.base`` still gives every name it held before the contract moved to
``fedco.algorithms.core`` (issue 46)."""

import importlib
import pathlib
import types

import pytest

import fedco
from fedco import algorithms

ROOT = pathlib.Path(algorithms.__file__).parent
MODULES = sorted(
  p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "base") and p.stem[0] != "_"
)
# Every public name fedco/algorithms/base.py defined before the split.
BASE_NAMES = (
  "PyTree",
  "CommPlan",
  "Algorithm",
  "ScalarOrSchedule",
  "Optimizer",
  "factory",
  "UnknownAlgorithmError",
  "REGISTRY",
  "register",
  "strong",
  "at_round_start",
  "at_round_end",
  "Pending",
  "has_pending",
  "init_trackers",
  "fill_pending",
  "pending_or",
  "get_field",
  "set_fields",
  "chain",
  "named_chain",
  "InjectedServerState",
  "inject_hyperparams",
  "make_plan",
  "RoundInfo",
  "ServerAggregator",
  "weighted_client_mean",
  "optax_aggregator",
  "as_aggregator",
  "project_simplex",
  "averaging_server",
  "param_optimizer",
  "require",
  "oracles",
  "add_grads",
  "select",
)


def test_the_algorithm_modules_are_found():
  assert {"scaffold", "fedprox", "fedavg", "feddro", "comfedl", "gcivr", "meta"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_every_algorithm_module_is_a_module_under_its_name(name):
  module = importlib.import_module(f"fedco.algorithms.{name}")
  assert isinstance(module, types.ModuleType)
  assert module.__name__ == f"fedco.algorithms.{name}"
  assert getattr(algorithms, name) is module


def test_every_factory_is_fedco_name_and_in_algorithms():
  shadowed = set(MODULES) & set(algorithms.ALGORITHMS)
  assert shadowed == {"comfedl", "fedavg", "feddro", "fedprox", "gcivr", "scaffold"}
  for name, factory in algorithms.ALGORITHMS.items():
    assert callable(factory) and not isinstance(factory, types.ModuleType), name
    assert getattr(fedco, name) is factory and fedco.ALGORITHMS[name] is factory, name
    assert name in fedco.__all__, name
    if name not in shadowed:  # where no module has its name, the package holds it too
      assert getattr(algorithms, name) is factory and name in algorithms.__all__, name
  assert fedco.scaffold is fedco.ALGORITHMS["scaffold"]
  assert fedco.algorithms.scaffold.scaffold is fedco.scaffold


@pytest.mark.parametrize("name", BASE_NAMES)
def test_every_public_name_of_base_is_still_there(name):
  base = importlib.import_module("fedco.algorithms.base")
  exec(f"from fedco.algorithms.base import {name}", {})
  assert name in base.__all__
  assert getattr(base, name) is not None


def test_base_names_are_the_core_objects():
  from fedco import extend
  from fedco.algorithms import base

  assert base.REGISTRY is algorithms.ALGORITHMS
  for name in extend.__all__:
    if hasattr(base, name):
      assert getattr(base, name) is getattr(extend, name), name


def test_run_fingerprints_name_moved_code_as_before_the_split():
  """Checkpoints of an injected algorithm written before base.py was split still resume:
  its functions (now in fedco.algorithms.core) are described by their old module name.
  The value is this run's fingerprint at commit 3387a5f (before the split)."""
  import jax.numpy as jnp
  import numpy as np

  from fedco.runtime import fingerprint

  x = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
  data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(2)])
  problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
  algorithm = fedco.inject_hyperparams(fedco.fedavg)(learning_rate=0.1, local_steps=1)
  sim = fedco.Simulator(problem, algorithm, data, batch_size=None)
  description = fingerprint.describe_run(sim, np.zeros(2, np.float32), 0, sim.init(jnp.zeros(2)))
  assert fingerprint.fingerprint(description) == "51841724428e4799"

"""Every algorithm of ``fedco.ALGORITHMS`` with the settings the tests use.

The one registry is ``fedco.ALGORITHMS`` (name -> factory); each algorithm declares its
test configurations where it is defined (``@fedco.extend.register(settings={label:
kwargs})``), so a new algorithm is covered by the contract, hyperparameter, simulate, mesh
and multi-process tests without an entry here. This module derives the labels and adds
the helpers those tests share.
"""

import inspect

import jax.numpy as jnp
import optax

import fedco
from fedco.algorithms import personal
from fedco.problems import portfolio

# registry name -> [(label, keyword arguments; local_steps only where a test must not set it)]
SETTINGS = {name: list(factory.settings.items()) for name, factory in fedco.ALGORITHMS.items()}

CASES = {label: (name, kwargs) for name, entries in SETTINGS.items() for label, kwargs in entries}


def factory(label):
  """The registry factory behind a test label."""
  return fedco.ALGORITHMS[CASES[label][0]]


def kwargs(label, *, local_steps=5, num_examples=1):
  """The test's keyword arguments for ``label`` (``local_steps`` where the factory has it;
  ``num_examples`` for primal-dual DRO's row weights)."""
  name, kw = CASES[label]
  kw = dict(kw)
  parameters = inspect.signature(fedco.ALGORITHMS[name]).parameters
  if "local_steps" in parameters:
    kw.setdefault("local_steps", local_steps)
  if "num_examples" in parameters:
    kw["num_examples"] = num_examples
  return kw


def numeric_hyperparams(label):
  """The test's float arguments for ``label`` that ``inject_hyperparams`` makes state."""
  static = set(factory(label).static_args)
  return {k: v for k, v in kwargs(label).items() if k not in static and isinstance(v, float)}


def inactive_clip():
  """A global-norm clip that never bites (composition must then change nothing)."""
  return optax.clip_by_global_norm(1e12)


def build(label, **options):
  """``fedco.ALGORITHMS[name](**kwargs(label, **options))``."""
  return factory(label)(**kwargs(label, **options))


def model_of(algorithm, params, state):
  """The model a client predicts with: ``params``, or its personal model where the
  algorithm keeps part of the model private (FedPer's and FedRep's heads never reach
  ``params``)."""
  if algorithm.name in ("fedper", "fedrep"):
    return personal.personal_model(algorithm, params, state)
  return params


def problem_for(algorithm):
  """A small problem of the algorithm's kind for federated runs: the portfolio problem
  (local- or global-inner), or a plain per-example loss on the same ``{"r": [n, d]}`` data."""
  if algorithm.problem_kind == "plain":
    return fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2) + 0.1 * jnp.sum(x**4))
  return portfolio(1.0, kind=algorithm.problem_kind)

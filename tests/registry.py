"""Every algorithm of ``fedco.ALGORITHMS`` with the settings the tests use.

The one registry is ``fedco.ALGORITHMS`` (name -> factory). This module only says which
keyword arguments each registry entry gets in tests (some entries, like ``fedavg_co``, are
tested in several configurations), so a registry entry without settings here fails
``tests/test_contract.py::test_every_registry_algorithm_has_test_settings``.
"""

import inspect

import jax.numpy as jnp
import optax

import fedco
from fedco.problems import portfolio

# registry name -> [(label, keyword arguments; local_steps only where a test must not set it)]
SETTINGS = {
    "comfedl": [("comfedl", dict(learning_rate=0.1))],
    "local_scgd": [("local_scgd", dict(learning_rate=0.1, gamma=0.9))],
    "local_scgdm": [("local_scgdm", dict(learning_rate=1.0, beta=0.1, alpha=0.8, gamma=0.7))],
    "fedavg": [("fedavg", dict(learning_rate=0.1))],
    "fedavg_co": [(f"fedavg_co_{case}", dict(learning_rate=0.1, case=case))
                  for case in ("I", "II", "modified")],
    "mbsgd": [("mbsgd", dict(learning_rate=0.1))],
    "feddro": [("feddro", dict(learning_rate=0.1, beta=0.5))],
    "ds_feddro": [("ds_feddro", dict(learning_rate=0.1, beta=0.5))],
    "qfedavg": [("qfedavg", dict(learning_rate=0.1, q=0.2))],
    "drfa": [("drfa", dict(learning_rate=0.1, weights_lr=0.08))],
    "afl": [("afl", dict(learning_rate=0.1, weights_lr=0.1))],
    "gcivr": [("gcivr", dict(learning_rate=0.1, refresh_every=5))],
    # the portfolio's inner is not shaped like the parameters: MOML's full J_g^T direction
    "local_moml": [("local_moml", dict(learning_rate=0.1, beta=0.7, first_order=False))],
    # sample reweighting on the one-"example" loss [Phi(x)]: p* = [1], i.e. GD on Phi
    "fastdro": [("fastdro", dict(learning_rate=0.1, geometry="cvar", size=0.5))],
    # N p_i-weighted steps on 130 rows: more than one local step diverges at this rate
    "primal_dual_dro": [("primal_dual_dro", dict(learning_rate=0.1, local_steps=1,
                                                 weights_lr=0.01))],
    "per_fedavg": [("per_fedavg", dict(learning_rate=0.1))],
    "fedmaml": [("fedmaml", dict(learning_rate=0.1))],
    "tr_maml": [("tr_maml", dict(learning_rate=0.1, weights_lr=0.08))],
    "ditto": [("ditto", dict(learning_rate=0.1, lam=0.1))],
}

CASES = {label: (name, kwargs) for name, entries in SETTINGS.items()
         for label, kwargs in entries}


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


def problem_for(algorithm):
  """A small problem of the algorithm's kind for federated runs: the portfolio problem
  (local- or global-inner), or a plain per-example loss on the same ``{"r": [n, d]}`` data."""
  if algorithm.problem_kind == "plain":
    return fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2) + 0.1 * jnp.sum(x ** 4))
  return portfolio(1.0, kind=algorithm.problem_kind)

"""Hyperparameters of every registry algorithm: NumPy scalars work like Python numbers, and
non-finite, wrongly typed or conflicting values are a one-line ``ValueError`` naming the
argument, raised by fedco (never from inside jax)."""

import inspect
import os
import traceback

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from tests import registry

LABELS = sorted(registry.CASES)


BAD = {
  "inf": float("inf"),
  "-inf": float("-inf"),
  "nan": float("nan"),
  "str": "0.1",
  "bool": True,
  "list": [0.1],
  "None-like": object(),
}
CASES = [
  (label, arg, bad)
  for label in LABELS
  for arg in sorted(registry.numeric_hyperparams(label))
  for bad in BAD
]


def _assert_clear(err, arg):
  message = str(err.value)
  assert "\n" not in message, message
  assert arg in message, message
  innermost = traceback.extract_tb(err.value.__traceback__)[-1].filename
  assert f"{os.sep}jax{os.sep}" not in innermost, innermost


@pytest.mark.parametrize("label,arg,bad", CASES)
def test_bad_hyperparameter_is_a_one_line_value_error(label, arg, bad):
  kw = registry.kwargs(label)
  with pytest.raises(ValueError) as err:
    registry.factory(label)(**{**kw, arg: BAD[bad]})
  _assert_clear(err, arg)


def test_every_algorithm_has_bad_hyperparameter_cases():
  assert {label for label, _, _ in CASES} == set(LABELS)
  assert len(CASES) >= 70


@pytest.mark.parametrize("label", LABELS)
def test_numpy_scalars_work_like_python_numbers(label):
  kw = registry.kwargs(label)
  as_numpy = {
    k: (
      np.float32(v)
      if isinstance(v, float)
      else np.int64(v)
      if isinstance(v, int) and not isinstance(v, bool)
      else v
    )
    for k, v in kw.items()
  }
  python = registry.factory(label)(**kw)
  numpy = registry.factory(label)(**as_numpy)
  assert numpy.plan == python.plan and numpy.name == python.name


@pytest.mark.parametrize("name", sorted(fedco.ALGORITHMS))
def test_a_non_integer_local_steps_is_refused(name):
  if "local_steps" not in inspect.signature(fedco.ALGORITHMS[name]).parameters:
    pytest.skip("no local steps")
  kw = registry.kwargs(registry.SETTINGS[name][0][0])
  for bad in (2.5, "5", 0, True):
    with pytest.raises(ValueError) as err:
      fedco.ALGORITHMS[name](**{**kw, "local_steps": bad})
    _assert_clear(err, "local_steps")


@pytest.mark.parametrize("name", sorted(fedco.ALGORITHMS))
def test_a_bad_optimizer_is_refused(name):
  kw = registry.kwargs(registry.SETTINGS[name][0][0])
  kw.pop("learning_rate")
  for bad in ("adam", 3, lambda lr: "not a transform"):
    with pytest.raises(ValueError) as err:
      fedco.ALGORITHMS[name](**kw, optimizer=bad)
    _assert_clear(err, "optimizer")


def test_learning_rate_schedule_is_accepted_and_a_bad_one_refused():
  schedule = optax.linear_schedule(0.1, 0.0, 100)
  assert isinstance(fedco.feddro(schedule, 5), fedco.Algorithm)
  with pytest.raises(ValueError) as err:
    fedco.feddro(float("nan"), 5)
  _assert_clear(err, "learning_rate")


def test_inject_hyperparams_with_a_traced_local_steps_is_a_clear_error():
  import jax.numpy as jnp

  with pytest.raises(ValueError) as err:  # optax's wrapper without static_args
    optax.inject_hyperparams(fedco.feddro)(0.1, 5).init(jnp.zeros(3))
  assert "local_steps" in str(err.value) and "static_args" in str(err.value)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(normalized=True), "gamma"),
    (dict(normalized=True, gamma=0.0), "gamma"),
    (dict(gamma=0.5), "normalized=True"),
    (dict(normalized=1, gamma=0.5), "normalized"),
  ],
)
def test_normalized_comfedl_arguments_are_checked(kwargs, match):
  with pytest.raises(ValueError, match=match):
    fedco.comfedl(0.1, 2, **kwargs)


def test_normalized_comfedl_needs_a_scalar_inner_value():
  data = fedco.FederatedData.from_clients([{"r": np.ones((4, 3), np.float32)}] * 2)
  with pytest.raises(ValueError, match="scalar inner value"):
    fedco.simulate(
      fedco.problems.portfolio(1.0, kind="local"),
      fedco.comfedl(0.1, 2, normalized=True, gamma=0.5),
      data,
      jnp.zeros(3),
      rounds=1,
    )

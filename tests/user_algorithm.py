"""A researcher's own algorithm, written outside the package with ``fedco.extend`` only.

Local SGD with heavy-ball momentum whose buffer is shared: each client steps with
``m <- beta m + g``, ``x <- x - eta m``, and the server averages the models and the clients'
momentum buffers at the end of each round (``m`` is an ``every_round`` field, broadcast
back). Not registered, so ``fedco.ALGORITHMS`` never sees it.

``python tests/user_algorithm.py`` runs every check of ``fedco.testing.check_algorithm`` on
it (the mesh check needs ``XLA_FLAGS=--xla_force_host_platform_device_count=8``) and prints
the report as one JSON line; ``tests/test_testing_kit.py`` runs it so.
"""

from __future__ import annotations

import json
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco import extend


class MomentumState(NamedTuple):
  count: jax.Array
  m: optax.Params


@extend.factory(static=("local_steps", "optimizer"))
def shared_momentum(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  beta: float = 0.5,
  optimizer: extend.Optimizer = None,
  momentum_dtype=None,
  plan_field: str = "m",
  server: Optional[optax.GradientTransformation] = None,
  host_noise: bool = False,
  client_noise: float = 0.0,
) -> extend.Algorithm:
  """Local heavy-ball SGD with the momentum buffer averaged each round.

  ``momentum_dtype``, ``plan_field``, ``server`` and ``host_noise`` exist to break the
  contract on purpose in tests: a buffer whose dtype the first update changes, a plan naming
  a field the state lacks, a server that ignores the uploads, NumPy noise in ``update``
  (fixed when ``jax.jit`` traces it). ``client_noise`` adds that much Gaussian noise to the
  buffer from ``update``'s ``client_key`` (each client's own at each step).
  """
  if optimizer is not None:  # refused, never silently ignored
    raise ValueError("optimizer: shared_momentum steps with its own momentum; leave it None")
  rate = 0.1 if learning_rate is None else learning_rate

  def init(params, *, inner_value=None):
    del inner_value
    m = jax.tree.map(lambda p: jnp.zeros_like(p, momentum_dtype), extend.strong(params))
    return MomentumState(jnp.zeros([], jnp.int32), m)

  def update(updates, state, params=None, *, client_key=None, **unused):
    del params, unused
    m = jax.tree.map(lambda m, g: beta * m + g, state.m, updates)
    if client_key is not None:  # (client_noise may be injected: no Python branch on it)
      m = jax.tree.map(lambda v: v + client_noise * jax.random.normal(client_key, v.shape), m)
    if host_noise:
      m = jax.tree.map(lambda v: v + np.random.normal(size=np.shape(v)).astype(v.dtype), m)
    step = jax.tree.map(lambda v: -rate * v, m)
    return step, MomentumState(state.count + 1, m)

  plan = extend.make_plan(local_steps, every_round=(plan_field,))
  return extend.Algorithm(
    init,
    update,
    plan,
    extend.averaging_server() if server is None else server,
    "shared_momentum",
    "plain",
  )


if __name__ == "__main__":
  import fedco.testing  # pylint: disable=g-import-not-at-top

  report = fedco.testing.check_algorithm(
    shared_momentum, learning_rate=0.1, local_steps=3, beta=0.5
  )
  print(json.dumps({"devices": jax.device_count(), **report}), flush=True)

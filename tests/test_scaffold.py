"""SCAFFOLD (option II, partial participation) against a float64 NumPy transcription of
Karimireddy et al. 2020, Algorithm 1, and against FedAvg's client drift.

Problem: least squares per client, ``h_i(x) = mean_e 0.5 (a_e . x - b_e)^2``, with clients
whose own optima lie far apart (``b = A x_i*`` plus a little noise), so FedAvg's local steps
drift towards each client's ``x_i*``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from tests import helpers

D = helpers.LSQ_DIM
PROBLEM = helpers.LEAST_SQUARES
grad = helpers.least_squares_grad


def make_clients(num_clients=6, sizes=None, spread=3.0, seed=0):
  """Per-client ``{a: [n, D], b: [n]}`` with far-apart client optima."""
  sizes = sizes or [6 + (k % 3) for k in range(num_clients)]
  return helpers.least_squares_clients(sizes, spread=spread, seed=seed)


def scaffold_reference(
  clients, x0, lr, local_steps, server_lr, sampled, survivors=None, steps_done=None
):
  """Algorithm 1 (option II) as printed, in float64: rounds of the sampled clients; a
  client that did not survive counts nowhere, a straggler takes its ``steps_done`` steps."""
  n = len(clients)
  x = np.array(x0, np.float64)
  c = np.zeros(D)
  c_i = [np.zeros(D) for _ in range(n)]
  for r, ids in enumerate(sampled):
    dys, dcs = [], []
    for j, i in enumerate(ids):
      if survivors is not None and not survivors[r][j]:
        continue
      k = local_steps if steps_done is None else int(steps_done[r][j])
      y = x.copy()
      for _ in range(k):
        y = y - lr * (grad(clients[i], y) - c_i[i] + c)
      c_plus = c_i[i] - c + (x - y) / (k * lr)  # option II
      dys.append(y - x)
      dcs.append(c_plus - c_i[i])
      c_i[i] = c_plus
    if dys:
      x = x + server_lr * np.mean(dys, axis=0)
      c = c + len(dcs) / n * np.mean(dcs, axis=0)
  return x, c, c_i


def run_x64(algorithm, clients, rounds, **kw):
  """``fedco.simulate`` full-batch in float64; returns the result (host arrays)."""
  with jax.enable_x64(True):
    data = fedco.FederatedData.from_clients(
      [{k: np.asarray(v, np.float64) for k, v in c.items()} for c in clients]
    )
    result = fedco.simulate(
      PROBLEM, algorithm, data, jnp.zeros(D, jnp.float64), rounds=rounds, batch_size=None, **kw
    )
    assert np.asarray(result.params).dtype == np.float64
    return result


def test_scaffold_equals_the_float64_transcription_with_partial_participation():
  clients = make_clients()
  lr, steps, server_lr, rounds = 0.05, 4, 0.7, 8
  result = run_x64(
    fedco.scaffold(lr, steps, server_lr=server_lr), clients, rounds, clients_per_round=3, seed=2
  )
  sampled = np.asarray(result.metrics["clients"])
  assert sampled.shape == (rounds, 3)
  # some client sits out a round and comes back: its c_i must persist across rounds
  assert len({tuple(s) for s in sampled}) > 1
  x_ref, c_ref, ci_ref = scaffold_reference(clients, np.zeros(D), lr, steps, server_lr, sampled)
  assert np.max(np.abs(x_ref)) > 0.5  # the run moved: the comparison can fail
  np.testing.assert_allclose(np.asarray(result.params), x_ref, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(result.state.server["c"]), c_ref, rtol=1e-10, atol=1e-12)
  # every client's control variate (c_i+ of its last round, 0 if never sampled)
  np.testing.assert_allclose(
    np.asarray(result.state.clients.c_plus), np.stack(ci_ref), rtol=1e-10, atol=1e-12
  )


def test_scaffold_with_dropouts_and_stragglers_equals_the_transcription():
  """A dropped client counts nowhere (not in ``|S|``, its ``c_i`` unchanged); a straggler
  uploads the values of the steps it did (option II with its own ``k``)."""
  clients = make_clients()
  lr, steps, server_lr, rounds = 0.05, 4, 1.0, 10
  result = run_x64(
    fedco.scaffold(lr, steps, server_lr=server_lr),
    clients,
    rounds,
    clients_per_round=4,
    participation=0.75,
    straggler_prob=0.5,
    seed=5,
  )
  sampled = np.asarray(result.metrics["clients"])
  alive = np.asarray(result.metrics["survivors"])
  done = np.asarray(result.metrics["local_steps"])
  assert not alive.all() and np.any((done > 0) & (done < steps))  # both faults happened
  x_ref, c_ref, ci_ref = scaffold_reference(
    clients, np.zeros(D), lr, steps, server_lr, sampled, survivors=alive, steps_done=done
  )
  np.testing.assert_allclose(np.asarray(result.params), x_ref, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(result.state.server["c"]), c_ref, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(
    np.asarray(result.state.clients.c_plus), np.stack(ci_ref), rtol=1e-10, atol=1e-12
  )


@pytest.mark.parametrize("clients_per_round", [None, 3])
def test_scaffold_removes_fedavg_client_drift(clients_per_round):
  """Far-apart client optima, 10 local steps: FedAvg settles where the local drifts
  balance, SCAFFOLD at the global optimum (exact gradient norm at least 100x smaller)."""
  clients = [
    {k: v.astype(np.float32) for k, v in c.items()}
    for c in make_clients(num_clients=6, sizes=[8] * 6, spread=5.0, seed=1)
  ]
  data = fedco.FederatedData.from_clients(clients)
  lr, steps, rounds = 0.05, 10, 300
  kw = dict(
    rounds=rounds,
    batch_size=None,
    exact_grad_norm=True,
    clients_per_round=clients_per_round,
    seed=0,
  )
  fedavg = fedco.simulate(
    PROBLEM, fedco.fedavg(lr, steps, weighting="uniform"), data, jnp.zeros(D), **kw
  )
  scaffold = fedco.simulate(PROBLEM, fedco.scaffold(lr, steps), data, jnp.zeros(D), **kw)
  g_fedavg = float(fedavg.metrics["grad_norm"][-1])
  g_scaffold = float(scaffold.metrics["grad_norm"][-1])
  print(
    f"clients_per_round={clients_per_round}: final exact grad norm "
    f"FedAvg {g_fedavg:.3e}, SCAFFOLD {g_scaffold:.3e}, ratio {g_fedavg / g_scaffold:.3g}"
  )
  assert g_fedavg > 1e-2  # the drift is visible
  assert g_scaffold * 100 <= g_fedavg


def test_server_lr_is_checked():
  for bad in (0.0, -1.0, float("nan"), True, "1"):
    with pytest.raises(ValueError, match="server_lr"):
      fedco.scaffold(0.1, 5, server_lr=bad)


def test_scaffold_keeps_only_its_control_variate_per_client_between_rounds():
  """Decision 109: ``c`` (the server's, broadcast), ``c_round`` and ``c_i`` (set by a round's
  first step) are ``round_local``: a run of K clients stores one model-sized field per
  client, ``c_plus``, not four (Shakespeare's 715 roles held 9.4 GB of them)."""
  clients = fedco.FederatedData.from_clients(make_clients(6))
  result = fedco.simulate(
    PROBLEM,
    fedco.scaffold(0.05, 3),
    clients,
    jnp.zeros(D),
    rounds=3,
    clients_per_round=2,
    batch_size=None,
    evaluate=False,
  )
  state = result.state.clients
  assert state.c is None and state.c_round is None and state.c_i is None
  assert state.c_plus.shape == (6, D)
  sizes = [leaf.size for leaf in jax.tree.leaves(state)]
  assert sum(sizes) == 6 * D + 6  # c_plus and the step count
  assert result.state.server["c"].shape == (D,)
  with pytest.raises(ValueError, match="round_local names"):
    fedco.extend.make_plan(3, every_step=("y",), round_local=("y",))

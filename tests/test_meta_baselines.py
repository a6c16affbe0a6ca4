"""Per-FedAvg / FedMAML, TR-MAML and Ditto (SPEC 3) against transcriptions of the pseudocode.

The MAML baselines run ``fedco.simulate`` on a one-hidden-layer tanh MLP (hidden 8) with two
task slots per episode, mini-batches of episodes (``batch_size=2``, drawn with replacement)
and several clients of different sizes. The references are the SPEC pseudocode written out in
float64 JAX (an unrolled-autodiff transcription: a hand-written MLP, ``jax.grad`` for
gradients and ``jax.jvp`` of a gradient for Hessian-vector products), never touching fedco's
problems, oracles or runtime. They replay the runtime's batch draws from its key schedule:
``SimState.key`` is the first half of ``split(PRNGKey(seed))``, each round splits it into
``(key, k_sample, k_round, k_res, k_agg)``, the sampled ids are the sorted first ``m`` of
``permutation(k_sample, K)``, client ``k``'s step ``t`` key is
``fold_in(fold_in(k_round, k), t)`` and ``split(., 3)`` gives the inner (``D``), outer
(``D'``) and next-inner (``D''``) batch keys, each drawing ``randint(., (b,), 0, n_k)``
positions into the client's episodes. Ditto's reference is NumPy with closed-form gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.models.mlp import MLP, init_mlp
from fedco.problems import portfolio
from fedco.problems.maml import MAML, maml

A = 0.3  # the problem's inner lr: large enough that the Hessian term matters
T, SHOTS = 2, 4  # task slots per episode, points per support/query set
LR = 0.1  # meta step b
DELTA = 1e-3  # Hessian-free finite difference
STEPS, ROUNDS, BATCH = 2, 3, 2
MODEL = MLP(hidden=(8,), out=1, activation=jnp.tanh)
PROBLEM = maml(MODEL.apply, A)


# ---- data -------------------------------------------------------------------------------


def maml_clients(sizes, seed=0, scales=None):
  """Client ``k`` holds ``sizes[k]`` episodes of its own ``T`` sinusoid tasks (fixed per
  slot); ``scales[k]`` multiplies its tasks' amplitudes (larger: harder tasks)."""
  rng = np.random.default_rng(seed)
  clients = []
  for k, n in enumerate(sizes):
    amp = rng.uniform(0.5, 1.5, T) * (1.0 if scales is None else scales[k])
    phase = rng.uniform(0.0, np.pi, T)

    def points(n, amp=amp, phase=phase):
      x = rng.uniform(-2.0, 2.0, (n, T, SHOTS, 1))
      return x, amp[None, :, None, None] * np.sin(x + phase[None, :, None, None])

    (sx, sy), (qx, qy) = points(n), points(n)
    ep = {
      "support_x": sx,
      "support_y": sy,
      "query_x": qx,
      "query_y": qy,
      "task_weight": rng.dirichlet(np.ones(T), size=n),
    }
    clients.append({k2: v.astype(np.float32) for k2, v in ep.items()})
  return clients


def init_params(seed=0):
  return init_mlp(MODEL, 1, seed=seed)


def flat(tree):
  return np.concatenate([np.asarray(l, np.float64).ravel() for l in jax.tree.leaves(tree)])


# ---- the runtime's draws, replayed (outside x64: keys and int32 draws as the runtime) ---


def schedule(seed, rounds, sizes, m, steps=STEPS, batch=BATCH):
  """Per round: ``(ids, {k: [(pos_D, pos_D', pos_D'') for each step]})``."""
  n = len(sizes)
  key, _ = jax.random.split(jax.random.PRNGKey(seed))
  out = []
  for _ in range(rounds):
    key, k_sample, k_round, _, _ = jax.random.split(key, 5)
    ids = np.arange(n) if m == n else np.sort(np.asarray(jax.random.permutation(k_sample, n))[:m])
    draws = {}
    for k in ids:
      draws[int(k)] = []
      for t in range(steps):
        skey = jax.random.fold_in(jax.random.fold_in(k_round, int(k)), t)
        draws[int(k)].append(
          tuple(
            np.asarray(jax.random.randint(kk, (batch,), 0, sizes[k]))
            for kk in jax.random.split(skey, 3)
          )
        )
    out.append((ids, draws))
  return out


# ---- float64 reference MAML pieces (hand-written MLP, plain autodiff) -------------------


def _mlp(w, x):
  p = w["params"]
  h = jnp.tanh(x @ p["hidden_0"]["kernel"] + p["hidden_0"]["bias"])
  return h @ p["out"]["kernel"] + p["out"]["bias"]


def _task_loss(w, x, y):
  """``L(w; {(x_s, y_s)}) = mean_s (mlp(x_s) - y_s)^2``."""
  return jnp.mean(jnp.sum((_mlp(w, x) - y) ** 2, axis=-1))


_grad_L = jax.grad(_task_loss)


def _hvp(w, x, y, v):
  """``Hess L(w; x, y) v`` (forward-over-reverse)."""
  return jax.jvp(lambda u: _grad_L(u, x, y), (w,), (v,))[1]


def _axpy(a, s, b):
  return jax.tree.map(lambda u, v: u + s * v, a, b)


def _mean(trees):
  return jax.tree.map(lambda *v: sum(v) / len(v), *trees)


def _adapt(w, bg, t):
  """``w~_t = w - a grad f_t(w; D)``: the mean support gradient of slot ``t`` over ``D``."""
  n = bg["support_x"].shape[0]
  g = _mean([_grad_L(w, bg["support_x"][e, t], bg["support_y"][e, t]) for e in range(n)])
  return _axpy(w, -A, g)


def _query_grad(wt, bf, t):
  """``g_t = grad f_t(w~; D')``: the weighted query gradient of slot ``t`` over ``D'``."""
  n = bf["query_x"].shape[0]
  return _mean(
    [
      jax.tree.map(
        lambda a, e=e: bf["task_weight"][e, t] * a,
        _grad_L(wt, bf["query_x"][e, t], bf["query_y"][e, t]),
      )
      for e in range(n)
    ]
  )


def _query_loss(wt, bf, t):
  n = bf["query_x"].shape[0]
  return (
    sum(
      bf["task_weight"][e, t] * _task_loss(wt, bf["query_x"][e, t], bf["query_y"][e, t])
      for e in range(n)
    )
    / n
  )


def _second_order(w, g, bn, t, variant):
  """``(I - a Hess f_t(w; D'')) g`` exactly, first-order (``g``), or by gradient differences."""
  n = bn["support_x"].shape[0]
  if variant == "first_order":
    return g
  if variant == "exact":
    hg = _mean([_hvp(w, bn["support_x"][e, t], bn["support_y"][e, t], g) for e in range(n)])
  else:
    hg = _mean(
      [
        jax.tree.map(
          lambda a, b: (a - b) / (2 * DELTA),
          _grad_L(_axpy(w, DELTA, g), bn["support_x"][e, t], bn["support_y"][e, t]),
          _grad_L(_axpy(w, -DELTA, g), bn["support_x"][e, t], bn["support_y"][e, t]),
        )
        for e in range(n)
      ]
    )
  return _axpy(g, -A, hg)


@functools.partial(jax.jit, static_argnames="variant")
def _per_fedavg_step(w, bg, bf, bn, variant):
  """SPEC 3: w~ = w - a grad f(w; D); g = grad f(w~; D'); w -= b (I - a Hess f(w; D'')) g,
  summed over the task slots."""
  directions = [
    _second_order(w, _query_grad(_adapt(w, bg, t), bf, t), bn, t, variant) for t in range(T)
  ]
  return _axpy(w, -LR, jax.tree.map(lambda *d: sum(d), *directions))


@jax.jit
def _tr_maml_step(w, bg, bf):
  """ComFedL-MAML's step (one batch for the adaptation and its Jacobian) and the adapted
  loss ``e = sum_t f_t(w~_t; D')`` at ``w``."""
  direction, loss = [], 0.0
  for t in range(T):
    wt = _adapt(w, bg, t)
    direction.append(_second_order(w, _query_grad(wt, bf, t), bg, t, "exact"))
    loss = loss + _query_loss(wt, bf, t)
  return _axpy(w, -LR, jax.tree.map(lambda *d: sum(d), *direction)), loss


def _gather(client, pos):
  return {k: jnp.asarray(np.asarray(v, np.float64)[pos]) for k, v in client.items()}


def _to64(tree):
  return jax.tree.map(lambda a: jnp.asarray(np.asarray(a, np.float64)), tree)


def per_fedavg_reference(clients, w0, sched, variant):
  """Rounds of local Per-FedAvg steps; the server averages the clients' models uniformly."""
  with jax.enable_x64(True):
    w = _to64(w0)
    for ids, draws in sched:
      finals = []
      for k in ids:
        wk = w
        for pg, pf, pn in draws[int(k)]:
          c = clients[k]
          wk = _per_fedavg_step(wk, _gather(c, pg), _gather(c, pf), _gather(c, pn), variant)
        finals.append(wk)
      w = _mean(finals)
    return jax.tree.map(np.asarray, w)


def project_simplex_bisect(v):
  """``argmin_{p in simplex} ||p - v||``: ``p = max(v - theta, 0)`` with ``sum p = 1``,
  ``theta`` by bisection (float64)."""
  lo, hi = np.min(v) - 1.0, np.max(v)
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if np.sum(np.maximum(v - mid, 0.0)) > 1.0 else (lo, mid)
  return np.maximum(v - 0.5 * (lo + hi), 0.0)


def tr_maml_reference(clients, w0, sched, weight_lr, m):
  """Local ComFedL-MAML steps; e_k at the round's model; x -= sum_S (K/m) p_k (x - x_k);
  p = Proj(p + eta v) with v_k = (K/m) e_k on the sampled clients."""
  n = len(clients)
  p = np.full(n, 1.0 / n)
  ps = []
  with jax.enable_x64(True):
    x = _to64(w0)
    for ids, draws in sched:
      x_new, v = x, np.zeros(n)
      for k in ids:
        wk = x
        for t, (pg, pf, _) in enumerate(draws[int(k)]):
          wk, loss = _tr_maml_step(wk, _gather(clients[k], pg), _gather(clients[k], pf))
          if t == 0:
            v[k] = (n / m) * float(loss)
        x_new = jax.tree.map(lambda a, b, c, p=p, k=k: a - (n / m) * p[k] * (b - c), x_new, x, wk)
      x = x_new
      p = project_simplex_bisect(p + weight_lr * v)
      ps.append(p)
    return jax.tree.map(np.asarray, x), np.array(ps)


# ---- Per-FedAvg: the runtime against the transcription ----------------------------------

PF_SIZES = (3, 5)


@pytest.fixture(scope="module")
def pf_setup():
  clients = maml_clients(PF_SIZES, seed=0)
  return clients, fedco.FederatedData.from_clients(clients), init_params(0)


_PF_RUNS = {}


def _pf_run(pf_setup, variant):
  if variant not in _PF_RUNS:
    _, data, w0 = pf_setup
    _PF_RUNS[variant] = fedco.simulate(
      PROBLEM,
      fedco.per_fedavg(LR, STEPS, variant=variant, delta=DELTA),
      data,
      w0,
      rounds=ROUNDS,
      seed=3,
      batch_size=BATCH,
      evaluate=False,
    )
  return _PF_RUNS[variant]


@pytest.mark.parametrize(
  "variant, atol", [("exact", 2e-5), ("first_order", 2e-5), ("hessian_free", 1e-4)]
)
def test_per_fedavg_matches_transcription(pf_setup, variant, atol):
  clients, _, w0 = pf_setup
  res = _pf_run(pf_setup, variant)
  sched = schedule(3, ROUNDS, PF_SIZES, len(PF_SIZES))
  # the three batches of a step differ, so D, D' and D'' are told apart
  assert any(not np.array_equal(d[0], d[2]) for _, dr in sched for k in dr for d in dr[k])
  ref = per_fedavg_reference(clients, w0, sched, variant)
  got = flat(res.params)
  assert np.max(np.abs(flat(ref) - flat(w0))) > 1e-2  # the run moves
  np.testing.assert_allclose(got, flat(ref), rtol=2e-4, atol=atol)
  if variant == "exact":  # the reference can tell the Hessian term apart
    fo = per_fedavg_reference(clients, w0, sched, "first_order")
    assert np.max(np.abs(flat(fo) - flat(ref))) > 50 * atol
    # ledger: only the model goes each way
    d = flat(w0).size
    assert res.ledger["up_per_client_per_round"] == {"params": d}
    assert res.ledger["down_per_client_per_round"] == {"params": d}


def test_fedmaml_is_per_fedavg():
  alg, ref = fedco.fedmaml(LR, STEPS), fedco.per_fedavg(LR, STEPS)
  assert alg.name == "fedmaml" and alg.problem_kind == "local" and alg.plan == ref.plan
  problem = portfolio(1.0, kind="local")
  rng = np.random.default_rng(0)
  batches = [{"r": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)} for _ in range(3)]
  _, kwargs = fedco.oracle_args(problem, *batches)
  params = jnp.asarray([0.1, -0.2, 0.3])
  steps = [a.update(None, a.init(params), params, **kwargs)[0] for a in (alg, ref)]
  np.testing.assert_array_equal(np.asarray(steps[0]), np.asarray(steps[1]))


# ---- Per-FedAvg directions on one batch -------------------------------------------------


def _episode_batch(seed=1, n=2):
  c = maml_clients((n,), seed=seed)[0]
  return {k: jnp.asarray(v) for k, v in c.items()}


@functools.partial(jax.jit, static_argnames="problem_id")
def _directions(params, batch, problem_id):
  """``{variant: z}``: each variant's direction of one Per-FedAvg step with all three
  batches equal (``lr = 1``, so ``z = -step``)."""
  problem = _PROBLEMS[problem_id]
  _, kwargs = fedco.oracle_args(problem, batch, batch, batch)
  out = {}
  for variant in ("exact", "first_order", "hessian_free"):
    alg = fedco.per_fedavg(1.0, variant=variant, delta=DELTA)
    state = alg.init(params, inner_value=kwargs["inner_fn"](params))
    step, _ = alg.update(None, state, params, **kwargs)
    out[variant] = flat_jnp(jax.tree.map(jnp.negative, step))
  return out


def flat_jnp(tree):
  return jnp.concatenate([jnp.ravel(l) for l in jax.tree.leaves(tree)])


def _single_task_problem(meta=MAML(MODEL.apply, A)):
  """MAML without task slots (slot 0 of each episode): the inner value is shaped like the
  parameters."""
  inner = lambda w, e: meta.adapt(w, e["support_x"][0], e["support_y"][0])
  outer = lambda y, e: meta.task_loss(y, e["query_x"][0], e["query_y"][0])
  return fedco.local_inner(inner, outer, outer_uses_data=True, name="single_task")


_PROBLEMS = {"table": PROBLEM, "params": _single_task_problem()}


@pytest.mark.parametrize("problem_id", ["table", "params"])
def test_per_fedavg_directions(problem_id):
  params, batch = init_params(1), _episode_batch()
  problem = _PROBLEMS[problem_id]
  w1 = jnp.full((2,), 0.5, jnp.float32)
  loss = lambda p: problem.client_objective(p, batch, w1)
  z = {k: np.asarray(v, np.float64) for k, v in _directions(params, batch, problem_id).items()}
  exact = z["exact"]
  # exact = the gradient of the MAML loss w -> f(g(w)) when D = D' = D''
  np.testing.assert_allclose(exact, flat(jax.jit(jax.grad(loss))(params)), rtol=1e-4, atol=1e-6)
  # first order = the gradient with the inner gradient held constant (J_g = I)
  meta_fo = MAML(MODEL.apply, A, first_order=True)
  problem_fo = meta_fo.problem() if problem_id == "table" else _single_task_problem(meta_fo)
  loss_fo = lambda p: problem_fo.client_objective(p, batch, w1)
  first = z["first_order"]
  np.testing.assert_allclose(first, flat(jax.jit(jax.grad(loss_fo))(params)), rtol=1e-4, atol=1e-6)
  assert np.linalg.norm(first - exact) > 0.05 * np.linalg.norm(exact)  # the term matters
  # Hessian-free: a central difference of the inner map along each slot's query gradient
  hf = z["hessian_free"]
  np.testing.assert_allclose(hf, exact, rtol=1e-2, atol=1e-2 * np.abs(exact).max())


def test_per_fedavg_with_unweighted_slot_ignores_it():
  """A slot with outer weight 0 contributes nothing in any variant (its G is exactly 0)."""
  params, batch = init_params(2), _episode_batch(seed=4)
  batch = {**batch, "task_weight": jnp.asarray([[1.0, 0.0], [1.0, 0.0]])}
  only = {k: v[:, :1] for k, v in batch.items()}  # the same episodes with slot 0 alone
  only["task_weight"] = jnp.ones((2, 1))
  both, single = _directions(params, batch, "table"), _directions(params, only, "table")
  for variant in ("exact", "first_order", "hessian_free"):
    np.testing.assert_allclose(
      np.asarray(both[variant]), np.asarray(single[variant]), rtol=1e-4, atol=1e-6
    )


def test_per_fedavg_first_order_needs_a_parameter_shaped_inner():
  problem = portfolio(1.0, kind="local")
  examples = {"r": jnp.ones((4, 3))}
  _, kwargs = fedco.oracle_args(problem, examples, examples, examples)
  params = jnp.zeros(3)
  for variant in ("first_order", "hessian_free"):
    alg = fedco.per_fedavg(0.1, variant=variant)
    with pytest.raises(ValueError, match="variant='exact'"):
      alg.init(params, inner_value=kwargs["inner_fn"](params))
    state = alg.init(params)  # without an inner value the check happens in update
    with pytest.raises(ValueError, match="variant='exact'"):
      alg.update(None, state, params, **kwargs)
  alg = fedco.per_fedavg(0.1)  # the exact direction works on any local-inner problem
  state = alg.init(params, inner_value=kwargs["inner_fn"](params))
  step, _ = alg.update(None, state, params, **kwargs)
  assert np.all(np.isfinite(np.asarray(step)))


# ---- TR-MAML ----------------------------------------------------------------------------

TR_SIZES, TR_M, TR_SEED, TR_RATE, TR_ROUNDS = (3, 4, 5), 2, 1, 0.02, 4
HARD = 2


@pytest.fixture(scope="module")
def tr_run():
  clients = maml_clients(
    TR_SIZES, seed=5, scales=[4.0 if k == HARD else 0.5 for k in range(len(TR_SIZES))]
  )
  data = fedco.FederatedData.from_clients(clients)
  w0 = init_params(0)
  res = fedco.simulate(
    PROBLEM,
    fedco.tr_maml(LR, STEPS, weights_lr=TR_RATE),
    data,
    w0,
    rounds=TR_ROUNDS,
    seed=TR_SEED,
    batch_size=BATCH,
    clients_per_round=TR_M,
    evaluate=False,
  )
  return clients, w0, res


def test_tr_maml_matches_transcription(tr_run):
  clients, w0, res = tr_run
  sched = schedule(TR_SEED, TR_ROUNDS, TR_SIZES, TR_M)
  ids = np.stack([s[0] for s in sched])
  np.testing.assert_array_equal(np.asarray(res.metrics["clients"]), ids)
  assert len({tuple(r) for r in ids}) > 1  # rounds sample different clients
  x_ref, ps_ref = tr_maml_reference(clients, w0, sched, TR_RATE, TR_M)
  assert np.max(np.abs(flat(x_ref) - flat(w0))) > 1e-2
  np.testing.assert_allclose(flat(res.params), flat(x_ref), rtol=2e-4, atol=2e-5)
  p = np.asarray(res.state.server_opt_state.p, np.float64)
  np.testing.assert_allclose(p, ps_ref[-1], rtol=1e-4, atol=1e-5)
  assert np.all(ps_ref[-1] > 0) and np.max(np.abs(ps_ref[-1] - 1 / 3)) > 1e-2  # interior, moved
  # ledger: the model and the adapted loss go up, the model comes down
  d = flat(w0).size
  assert res.ledger["up_per_client_per_round"] == {"params": d, "loss": 1}
  assert res.ledger["down_per_client_per_round"] == {"params": d}


def test_tr_maml_weights_stay_on_the_simplex_and_favour_the_hard_client(tr_run):
  clients, w0, res = tr_run
  p = np.asarray(res.state.server_opt_state.p, np.float64)
  assert np.all(p >= 0) and abs(p.sum() - 1.0) < 1e-6
  _, ps_ref = tr_maml_reference(
    clients, w0, schedule(TR_SEED, TR_ROUNDS, TR_SIZES, TR_M), TR_RATE, TR_M
  )
  for p_r in ps_ref:
    assert np.all(p_r >= 0) and abs(p_r.sum() - 1.0) < 1e-9
  assert np.argmax(p) == HARD and p[HARD] > 1 / 3 + 0.05


def _fake_round(alive):
  """One TR-MAML aggregator update on hand-made client values (K = 3, clients 0 and 2)."""
  alg = fedco.tr_maml(0.1, 2, weights_lr=0.5)
  x = {"w": jnp.asarray([1.0, -1.0])}
  state = alg.server.init({"params": x}, jnp.asarray([3, 4, 5]))
  clients = {
    "params": {"w": jnp.asarray([[0.0, 0.0], [2.0, 2.0]])},
    "loss": jnp.asarray([1.0, 3.0]),
  }
  info = fedco.algorithms.RoundInfo(
    jnp.asarray([0, 2]),
    jnp.asarray([0.5, 0.5]),
    jnp.asarray([3, 5]),
    3,
    jax.random.PRNGKey(0),
    lambda *a: None,
    None if alive is None else jnp.asarray(alive),
  )
  server, state = jax.jit(lambda: alg.server.update({"params": x}, state, clients, info))()
  return np.asarray(server["params"]["w"]), np.asarray(state.p)


def test_tr_maml_server_step_and_dropped_clients():
  x, p = _fake_round(None)
  # x - (3/2)(1/3)[(x - x_0) + (x - x_2)] with x = (1, -1), x_0 = 0, x_2 = 2
  np.testing.assert_allclose(x, [1.0 - 0.5 * (1.0 - 1.0), -1.0 - 0.5 * (-1.0 - 3.0)])
  np.testing.assert_allclose(
    p, project_simplex_bisect(np.full(3, 1 / 3) + 0.5 * 1.5 * np.array([1.0, 0.0, 3.0])), atol=1e-6
  )
  x, p = _fake_round([True, False])  # client 2 dropped: it moves neither x nor p
  np.testing.assert_allclose(x, [1.0 - 0.5 * 1.0, -1.0 - 0.5 * -1.0])
  np.testing.assert_allclose(
    p, project_simplex_bisect(np.full(3, 1 / 3) + 0.5 * 1.5 * np.array([1.0, 0.0, 0.0])), atol=1e-6
  )
  x, p = _fake_round([False, False])  # nobody survived: nothing moves
  np.testing.assert_allclose(x, [1.0, -1.0])
  np.testing.assert_allclose(p, np.full(3, 1 / 3), atol=1e-7)


def test_tr_maml_records_the_loss_at_the_rounds_model():
  """``loss`` is set at local step 0 (or ``count % local_steps == 0`` in a user's loop) to
  ``f(g(x))`` and kept for the rest of the round."""
  problem = portfolio(1.0, kind="local")
  examples = {"r": jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float32)}
  _, kwargs = fedco.oracle_args(problem, examples, examples, examples)
  value = lambda x: kwargs["outer_fn"](kwargs["inner_fn"](x))
  alg = fedco.tr_maml(0.1, 3, weights_lr=0.1)
  params = jnp.full((3,), 0.2)
  state = alg.init(params)
  update = jax.jit(lambda s, p: alg.update(None, s, p, **kwargs))
  seen = []
  for t in range(5):  # no local_step: the count fallback
    step, state = update(state, params)
    if t % 3 == 0:
      expected = float(value(params))
    np.testing.assert_allclose(float(state.loss), expected, rtol=1e-6)
    seen.append(float(state.loss))
    params = optax.apply_updates(params, step)
  assert seen[0] != seen[3]
  state = alg.init(params)
  _, state = alg.update(None, state, params, local_step=1, **kwargs)  # not a round start
  assert float(state.loss) == 0.0


# ---- Ditto ------------------------------------------------------------------------------

DITTO_SIZES, DITTO_D = (3, 5, 8), 3


def ditto_clients(seed=0):
  rng = np.random.default_rng(seed)
  return [
    {
      "a": rng.normal(size=(n, DITTO_D)).astype(np.float32),
      "c": rng.normal(k - 1.0, 0.5, size=(n,)).astype(np.float32),
    }
    for k, n in enumerate(DITTO_SIZES)
  ]


def _ditto_loss(w, e):
  return 0.5 * (jnp.tanh(e["a"] @ w) - e["c"]) ** 2 + 0.05 * jnp.sum(w**2)


DITTO_PROBLEM = fedco.problems.plain(_ditto_loss)


def _ditto_grad(c, pos, w):
  """The mean gradient of ``0.5 (tanh(a.w) - c)^2 + 0.05 |w|^2`` over the drawn rows."""
  a = np.asarray(c["a"], np.float64)[pos]
  y = np.asarray(c["c"], np.float64)[pos]
  t = np.tanh(a @ w)
  return np.mean(((t - y) * (1 - t**2))[:, None] * a, axis=0) + 0.1 * w


def ditto_reference(clients, x0, sched, lr, lam, personal_lr):
  """FedAvg (sample-weighted server mean) plus each client's personal model."""
  x = np.array(x0, np.float64)
  personal = [x.copy() for _ in clients]
  anchors = [x.copy() for _ in clients]
  for ids, draws in sched:
    finals, sizes = [], []
    for k in ids:
      xk, anchors[k] = x.copy(), x.copy()
      for _, pf, _ in draws[int(k)]:  # h's gradient and value are on the outer batch D'
        v = personal[k]
        personal[k] = v - personal_lr * (_ditto_grad(clients[k], pf, v) + lam * (v - x))
        xk = xk - lr * _ditto_grad(clients[k], pf, xk)
      finals.append(xk)
      sizes.append(DITTO_SIZES[k])
    w = np.array(sizes, np.float64) / sum(sizes)
    x = sum(wi * xi for wi, xi in zip(w, finals))
  return x, np.array(personal), np.array(anchors)


def test_ditto_matches_transcription():
  clients = ditto_clients()
  data = fedco.FederatedData.from_clients(clients)
  x0 = np.array([0.3, -0.2, 0.1], np.float32)
  lr, lam, plr, steps, rounds, m, seed = 0.2, 0.5, 0.3, 3, 4, 2, 2
  res = fedco.simulate(
    DITTO_PROBLEM,
    fedco.ditto(lr, steps, lam=lam, personal_lr=plr),
    data,
    jnp.asarray(x0),
    rounds=rounds,
    seed=seed,
    batch_size=BATCH,
    clients_per_round=m,
    evaluate=False,
  )
  sched = schedule(seed, rounds, DITTO_SIZES, m, steps=steps)
  ids = np.stack([s[0] for s in sched])
  np.testing.assert_array_equal(np.asarray(res.metrics["clients"]), ids)
  assert len({tuple(r) for r in ids}) > 1
  x, personal, anchors = ditto_reference(clients, x0.astype(np.float64), sched, lr, lam, plr)
  assert np.max(np.abs(x - x0)) > 1e-2
  np.testing.assert_allclose(np.asarray(res.params, np.float64), x, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
    np.asarray(res.state.clients.personal, np.float64), personal, rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(
    np.asarray(res.state.clients.anchor, np.float64), anchors, rtol=1e-4, atol=1e-5
  )
  # personal models are not the global model, and the server mean is sample-weighted
  assert np.min(np.abs(personal - x).max(axis=1)) > 1e-2
  uniform = fedco.simulate(
    DITTO_PROBLEM,
    fedco.ditto(lr, steps, lam=lam, personal_lr=plr, weighting="uniform"),
    data,
    jnp.asarray(x0),
    rounds=1,
    seed=seed,
    batch_size=BATCH,
    clients_per_round=m,
    evaluate=False,
  )
  x1, _, _ = ditto_reference(clients, x0.astype(np.float64), sched[:1], lr, lam, plr)
  assert np.max(np.abs(np.asarray(uniform.params) - x1)) > 1e-4
  # only the global model is communicated
  assert res.ledger["up_per_client_per_round"] == {"params": DITTO_D}
  assert res.ledger["down_per_client_per_round"] == {"params": DITTO_D}


def _ditto_loop(lam, personal_lr, steps_per_round, total_steps, lr=0.2):
  """Ditto in a user's own loop on one client's whole data (no ``local_step``)."""
  c = ditto_clients(1)[2]
  examples = {k: jnp.asarray(v) for k, v in c.items()}
  grad_h_fn, kwargs = fedco.oracle_args(DITTO_PROBLEM, examples, examples, examples)
  alg = fedco.ditto(lr, steps_per_round, lam=lam, personal_lr=personal_lr)
  params = jnp.asarray([0.3, -0.2, 0.1])
  state = alg.init(params)
  history = [params]
  for _ in range(total_steps):
    step, state = alg.update(grad_h_fn(params), state, params, **kwargs)
    params = optax.apply_updates(params, step)
    history.append(params)
  return c, history, state


def test_ditto_with_lam_zero_is_local_sgd_on_the_client_loss():
  c, history, state = _ditto_loop(0.0, 0.05, 2, 6)
  pos = np.arange(len(c["c"]))
  v = np.array([0.3, -0.2, 0.1])
  for _ in range(6):
    v = v - 0.05 * _ditto_grad(c, pos, v)
  np.testing.assert_allclose(np.asarray(state.personal, np.float64), v, rtol=1e-5, atol=1e-6)
  # the global model is SGD at its own rate: a different point
  assert np.max(np.abs(np.asarray(history[-1]) - v)) > 1e-2


def test_ditto_with_large_lam_tracks_the_anchor():
  # lam * eta_p = 1: v = anchor - eta_p grad F(v) after every step
  _, history, state = _ditto_loop(1e3, 1e-3, 3, 6)
  # the count fallback re-anchors at steps 0 and 3: the anchor is the model before step 3
  np.testing.assert_allclose(np.asarray(state.anchor), np.asarray(history[3]), rtol=1e-6)
  gap = np.abs(np.asarray(state.personal) - np.asarray(state.anchor)).max()
  assert gap < 2e-3
  assert np.abs(np.asarray(history[3]) - np.asarray(history[0])).max() > 50 * gap


def test_ditto_needs_the_loss_value():
  alg = fedco.ditto()
  state = alg.init(jnp.zeros(2))
  with pytest.raises(ValueError, match="extra_fn"):
    alg.update(jnp.zeros(2), state, jnp.zeros(2))


# ---- arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
  "make, name",
  [
    (lambda: fedco.per_fedavg(-0.1), "learning_rate"),
    (lambda: fedco.per_fedavg(0.1, 0), "local_steps"),
    (lambda: fedco.per_fedavg(variant="second_order"), "variant"),
    (lambda: fedco.per_fedavg(variant="hessian_free", delta=0.0), "delta"),
    (lambda: fedco.per_fedavg(optimizer="adam"), "optimizer"),
    (lambda: fedco.fedmaml(0.0), "learning_rate"),
    (lambda: fedco.tr_maml(0.0), "learning_rate"),
    (lambda: fedco.tr_maml(0.1, weights_lr=-1.0), "weights_lr"),
    (lambda: fedco.tr_maml(0.1, local_steps=2.5, weights_lr=0.1), "local_steps"),
    (lambda: fedco.ditto(lam=-0.1), "lam"),
    (lambda: fedco.ditto(personal_lr=0.0), "personal_lr"),
    (lambda: fedco.ditto(learning_rate="0.2"), "learning_rate"),
    (lambda: fedco.ditto(weighting="median"), "weighting"),
    (lambda: fedco.ditto(local_steps=0), "local_steps"),
  ],
)
def test_bad_arguments_raise(make, name):
  with pytest.raises(ValueError, match=name):
    make()


def test_registered():
  for name in ("per_fedavg", "fedmaml", "tr_maml", "ditto"):
    assert fedco.ALGORITHMS[name] is getattr(fedco, name)
    assert name in fedco.__all__ and name in fedco.algorithms.__all__
  assert {fedco.per_fedavg().problem_kind, fedco.tr_maml().problem_kind} == {"local"}
  assert fedco.ditto().problem_kind == "plain"

"""fedco.simulate against independent float64 NumPy transcriptions of SPEC section 2.

Every algorithm runs full-batch (``batch_size=None``): each inner, outer and next-inner
sample is the client's whole data, averaged over its examples, so the pseudocode is
deterministic and NumPy can follow it step by step, communication included (what is
averaged after every step, what at the end of a round, and the server rates). Clients have
different sizes (3, 5 and 8 examples), so a per-example instead of a per-client mean, or a
size-weighted instead of a uniform client mean, shows up.

Problem (d = 3, p = 2), per example ``e = {A: [p, d], c: [p], b: [d]}``:
  inner   g(x; e) = tanh(A x)
  outer   local-inner  f(y; e) = 0.5 ||y - c||^2     (f_k = mean over client k's examples)
          global-inner f(y) = sum log(1 + y^2)        (deterministic, shared)
  extra   h(x; e) = 0.05 ||x||^2 + b.x
  plain   l(x; e) = h(x; e) + 0.5 ||tanh(A x) - c||^2  (plain FedAvg)
"""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco

D, P = 3, 2
SIZES = (3, 5, 8)
ROUNDS = 4
STEPS = 3
RTOL, ATOL = 1e-4, 1e-5


# ---- data and the float64 client oracles ------------------------------------------------


def make_examples(sizes=SIZES, seed=0):
  rng = np.random.default_rng(seed)
  return [
    {
      "A": rng.normal(size=(n, P, D)).astype(np.float32),
      "c": rng.normal(size=(n, P)).astype(np.float32),
      "b": (0.5 * rng.normal(size=(n, D))).astype(np.float32),
    }
    for n in sizes
  ]


class Client:
  """Client k's full-data oracles in float64 (means over its examples)."""

  def __init__(self, ex):
    self.A = np.asarray(ex["A"], np.float64)
    self.c = np.asarray(ex["c"], np.float64)
    self.b = np.asarray(ex["b"], np.float64)
    self.n = self.A.shape[0]

  def g(self, x):
    return np.tanh(self.A @ x).mean(0)

  def jt(self, x, v):
    """J_g(x)^T v = mean_i A_i^T (v * (1 - tanh(A_i x)^2))."""
    t = np.tanh(self.A @ x)
    return np.einsum("npd,np->d", self.A, v * (1 - t**2)) / self.n

  def h(self, x):
    return 0.05 * x @ x + self.b.mean(0) @ x

  def grad_h(self, x):
    return 0.1 * x + self.b.mean(0)

  def f_local(self, y):
    return 0.5 * np.mean(np.sum((y - self.c) ** 2, axis=-1))

  def grad_f_local(self, y):
    return y - self.c.mean(0)

  def plain_loss(self, x):
    r = np.tanh(self.A @ x) - self.c
    return 0.05 * x @ x + self.b.mean(0) @ x + 0.5 * np.mean(np.sum(r**2, axis=-1))

  def plain_grad(self, x):
    t = np.tanh(self.A @ x)
    return (
      0.1 * x + self.b.mean(0) + np.einsum("npd,np->d", self.A, (t - self.c) * (1 - t**2)) / self.n
    )


def f_global(y):
  return np.sum(np.log1p(y**2))


def grad_f_global(y):
  return 2 * y / (1 + y**2)


def local_objective(C, x):
  return np.mean([c.f_local(c.g(x)) + c.h(x) for c in C])


def global_objective(C, x):
  return f_global(np.mean([c.g(x) for c in C], axis=0)) + np.mean([c.h(x) for c in C])


def plain_objective(C, x):
  return np.mean([c.plain_loss(x) for c in C])


# ---- the same problems in JAX, for fedco ------------------------------------------------


def _inner(x, e):
  return jnp.tanh(e["A"] @ x)


def _extra(x, e):
  return 0.05 * x @ x + e["b"] @ x


LOCAL = fedco.local_inner(
  _inner, lambda y, e: 0.5 * jnp.sum((y - e["c"]) ** 2), _extra, outer_uses_data=True
)
GLOBAL = fedco.global_inner(_inner, lambda y: jnp.sum(jnp.log1p(y**2)), _extra)
PLAIN = fedco.problems.plain(
  lambda x, e: 0.5 * 0.1 * x @ x + e["b"] @ x + 0.5 * jnp.sum((jnp.tanh(e["A"] @ x) - e["c"]) ** 2)
)


# ---- the generic round driver (SPEC section 0 round structure) --------------------------


def reference(
  C,
  x0,
  state0,
  step,
  *,
  rounds=ROUNDS,
  local_steps=STEPS,
  every_step=(),
  every_round=(),
  server_lr=None,
  weights=None,
  on_sync=None,
  sampled=None,
  objective=None,
):
  """Runs rounds of ``local_steps`` local steps in NumPy.

  Args:
    C: the clients (``Client``).
    x0: the initial server model.
    state0: every client's initial state dict (already the common ``y_bar_0`` etc.).
    step: ``(k, x, s) -> (x, s)``, one local step of client ``k``.
    every_step: state keys set to their mean over the round's clients after every step.
    every_round: state keys aggregated with ``x`` at the end of a round.
    server_lr: ``{key: rate}`` for ``"x"`` and the every-round keys; the server does
      ``v = v - rate (v - mean_k v_k)`` (rate 1: plain averaging).
    weights: per-client weights of the means (default uniform).
    on_sync: ``(k, x_bar, s) -> s``, applied to each round client after the broadcast.
    sampled: the clients of each round (default all).
    objective: ``x -> float``, recorded at the server model after each round.

  Returns:
    ``(x, objectives)``.
  """
  K = len(C)
  states = [dict(state0) for _ in range(K)]
  server = {"x": np.array(x0, np.float64), **{f: state0[f] for f in every_round}}
  shared = {f: state0[f] for f in every_step}
  rate = {key: 1.0 for key in server}
  rate.update(server_lr or {})
  objs = []
  for r in range(rounds):
    S = list(range(K)) if sampled is None else [int(k) for k in sampled[r]]
    w = np.array([1.0 if weights is None else weights[k] for k in S], np.float64)
    w = w / w.sum()

    def mean(values, w=w):
      return sum(wi * v for wi, v in zip(w, values))

    xs = {k: server["x"] for k in S}
    for k in S:
      states[k].update({f: server[f] for f in every_round}, **shared)
    for _ in range(local_steps):
      for k in S:
        xs[k], states[k] = step(k, xs[k], dict(states[k]))
      for f in every_step:
        avg = mean([states[k][f] for k in S])
        for k in S:
          states[k][f] = avg
    shared = {f: states[S[0]][f] for f in every_step}
    client_values = {"x": [xs[k] for k in S], **{f: [states[k][f] for k in S] for f in every_round}}
    for key in server:
      server[key] = server[key] - rate[key] * (server[key] - mean(client_values[key]))
    for k in S:
      states[k].update({f: server[f] for f in every_round})
      if on_sync is not None:
        states[k] = on_sync(k, server["x"], states[k])
    objs.append(objective(server["x"]))
  return server["x"], np.array(objs)


# ---- per-algorithm steps, from the SPEC pseudocode --------------------------------------


def comfedl_step(C, lr):  # SPEC 2.1
  def step(k, x, s):
    c = C[k]
    y = c.g(x)
    u = c.jt(x, c.grad_f_local(y)) + c.grad_h(x)
    return x - lr * u, s

  return step


def local_scgd_step(C, lr, gamma):  # SPEC 2.2
  def step(k, x, s):
    c = C[k]
    u = (1 - gamma) * s["u"] + gamma * c.g(x)
    z = c.jt(x, c.grad_f_local(u)) + c.grad_h(x)
    return x - lr * z, {**s, "u": u}

  return step


def local_scgdm_step(C, eta, beta, alpha, gamma):  # SPEC 2.3
  def step(k, x, s):
    c = C[k]
    if s["t"] == 0:
      u = c.g(x)
      z = c.jt(x, c.grad_f_local(u)) + c.grad_h(x)
      m = z
    else:
      u = (1 - gamma * eta) * s["u"] + gamma * eta * c.g(x)
      z = c.jt(x, c.grad_f_local(u)) + c.grad_h(x)
      m = (1 - alpha * eta) * s["m"] + alpha * eta * z
    return x - beta * eta * m, {"t": s["t"] + 1, "u": u, "m": m}

  return step


def fedavg_co_step(C, lr):  # SPEC 2.4: step with the local y_k, then y_k = g_k(x_k)
  def step(k, x, s):
    c = C[k]
    z = c.jt(x, grad_f_global(s["y"])) + c.grad_h(x)
    x_new = x - lr * z
    return x_new, {**s, "y": c.g(x_new)}

  return step


def feddro_step(C, lr, beta):  # SPEC 2.5 steps 1-3 (s["y"] is the shared y_bar)
  def step(k, x, s):
    c = C[k]
    z = c.grad_h(x) + c.jt(x, grad_f_global(s["y"]))
    x_new = x - lr * z
    y = (1 - beta) * (s["y"] - c.g(x)) + c.g(x_new)
    return x_new, {**s, "y": y}

  return step


def ds_feddro_step(C, lr, beta):  # SPEC 2.6 local step (client's own y_k)
  def step(k, x, s):
    c = C[k]
    z = c.grad_h(x) + c.jt(x, grad_f_global(s["y"]))
    x_new = x - lr * z
    return x_new, {**s, "y": (1 - beta) * s["y"] + beta * c.g(x_new)}

  return step


def plain_sgd_step(C, lr):  # SPEC 3, FedAvg: local SGD on the client loss
  def step(k, x, s):
    return x - lr * C[k].plain_grad(x), s

  return step


def mbsgd_reference(C, x0, lr, rounds):
  """SPEC 2.7 directly: y_bar = mean_k g_k(x); z_bar = mean_k z_k(y_bar); x -= lr z_bar."""
  x = np.array(x0, np.float64)
  objs = []
  for _ in range(rounds):
    y_bar = np.mean([c.g(x) for c in C], axis=0)
    z_bar = np.mean([c.jt(x, grad_f_global(y_bar)) + c.grad_h(x) for c in C], axis=0)
    x = x - lr * z_bar
    objs.append(global_objective(C, x))
  return x, np.array(objs)


# ---- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def setup():
  examples = make_examples()
  data = fedco.FederatedData.from_clients(examples)
  C = [Client(ex) for ex in examples]
  x0 = (0.5 * np.random.default_rng(1).normal(size=D)).astype(np.float32)
  y_bar0 = np.mean([c.g(x0.astype(np.float64)) for c in C], axis=0)
  return data, C, x0, y_bar0


def run_fedco(problem, alg, data, x0, rounds=ROUNDS, **kw):
  return fedco.simulate(problem, alg, data, jnp.asarray(x0), rounds=rounds, batch_size=None, **kw)


def check(result, x_ref, objs_ref, x0):
  x = np.asarray(result.params, np.float64)
  # the runs must move: otherwise the comparison could not fail
  assert np.max(np.abs(x_ref - np.asarray(x0, np.float64))) > 1e-2
  np.testing.assert_allclose(x, x_ref, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    np.asarray(result.metrics["objective"], np.float64), objs_ref, rtol=RTOL, atol=ATOL
  )


# ---- local-inner ------------------------------------------------------------------------


def test_comfedl(setup):
  data, C, x0, _ = setup
  lr = 0.3
  res = run_fedco(LOCAL, fedco.comfedl(lr, STEPS), data, x0)
  x_ref, objs = reference(C, x0, {}, comfedl_step(C, lr), objective=lambda x: local_objective(C, x))
  check(res, x_ref, objs, x0)


def test_comfedl_by_data_size(setup):
  """weighting="samples" on the printed step: the server averages by data size (clients of
  3, 5 and 8 examples); the reported objective stays the problem's uniform mean."""
  data, C, x0, _ = setup
  lr = 0.3
  res = run_fedco(LOCAL, fedco.comfedl(lr, STEPS, weighting="samples"), data, x0)
  x_ref, objs = reference(
    C,
    x0,
    {},
    comfedl_step(C, lr),
    weights=[c.n for c in C],
    objective=lambda x: local_objective(C, x),
  )
  check(res, x_ref, objs, x0)
  uniform, _ = reference(C, x0, {}, comfedl_step(C, lr), objective=lambda x: 0.0)
  assert np.max(np.abs(x_ref - uniform)) > 1e-3  # the weights matter here


def test_local_scgd(setup):
  data, C, x0, y_bar0 = setup
  lr, gamma = 0.3, 0.6
  res = run_fedco(LOCAL, fedco.local_scgd(lr, STEPS, gamma=gamma), data, x0)
  x_ref, objs = reference(
    C,
    x0,
    {"u": y_bar0},
    local_scgd_step(C, lr, gamma),
    every_round=("u",),
    objective=lambda x: local_objective(C, x),
  )
  check(res, x_ref, objs, x0)


def test_local_scgdm(setup):
  data, C, x0, y_bar0 = setup
  eta, beta, alpha, gamma = 1.0, 0.3, 0.8, 0.7
  res = run_fedco(
    LOCAL, fedco.local_scgdm(eta, STEPS, beta=beta, alpha=alpha, gamma=gamma), data, x0
  )
  x_ref, objs = reference(
    C,
    x0,
    {"t": 0, "u": y_bar0, "m": np.zeros(D)},
    local_scgdm_step(C, eta, beta, alpha, gamma),
    every_round=("u", "m"),
    objective=lambda x: local_objective(C, x),
  )
  check(res, x_ref, objs, x0)


# ---- global-inner -----------------------------------------------------------------------


def _fedavg_co_reference(C, x0, y_bar0, lr, case):
  comm = {
    "I": dict(on_sync=lambda k, x_bar, s: {**s, "y": C[k].g(x_bar)}),
    "II": dict(every_round=("y",)),
    "modified": dict(every_step=("y",)),
  }[case]
  return reference(
    C, x0, {"y": y_bar0}, fedavg_co_step(C, lr), objective=lambda x: global_objective(C, x), **comm
  )


@pytest.mark.parametrize("case", ["I", "II", "modified"])
def test_fedavg_co(setup, case):
  data, C, x0, y_bar0 = setup
  lr = 0.3
  res = run_fedco(GLOBAL, fedco.fedavg_co(lr, STEPS, case=case), data, x0)
  x_ref, objs = _fedavg_co_reference(C, x0, y_bar0, lr, case)
  check(res, x_ref, objs, x0)


def test_fedavg_co_cases_are_distinguishable(setup):
  """The three references differ by far more than the tolerance, so each test can fail."""
  _, C, x0, y_bar0 = setup
  finals = {
    case: _fedavg_co_reference(C, x0, y_bar0, 0.3, case)[0] for case in ("I", "II", "modified")
  }
  for a, b in [("I", "II"), ("I", "modified"), ("II", "modified")]:
    assert np.max(np.abs(finals[a] - finals[b])) > 1e-3, (a, b)


def test_mbsgd(setup):
  data, C, x0, _ = setup
  lr, rounds = 0.3, 6
  res = run_fedco(GLOBAL, fedco.mbsgd(lr), data, x0, rounds=rounds)
  x_ref, objs = mbsgd_reference(C, x0, lr, rounds)
  check(res, x_ref, objs, x0)


def test_feddro(setup):
  data, C, x0, y_bar0 = setup
  lr, beta = 0.3, 0.4
  res = run_fedco(GLOBAL, fedco.feddro(lr, STEPS, beta=beta), data, x0)
  x_ref, objs = reference(
    C,
    x0,
    {"y": y_bar0},
    feddro_step(C, lr, beta),
    every_step=("y",),
    objective=lambda x: global_objective(C, x),
  )
  check(res, x_ref, objs, x0)


def test_ds_feddro(setup):
  data, C, x0, y_bar0 = setup
  lr, beta, gx, gy = 0.2, 0.4, 1.3, 1.4
  res = run_fedco(
    GLOBAL, fedco.ds_feddro(lr, STEPS, beta=beta, server_lr_x=gx, server_lr_y=gy), data, x0
  )
  x_ref, objs = reference(
    C,
    x0,
    {"y": y_bar0},
    ds_feddro_step(C, lr, beta),
    every_round=("y",),
    server_lr={"x": gx, "y": gy},
    objective=lambda x: global_objective(C, x),
  )
  check(res, x_ref, objs, x0)


# ---- plain FedAvg -----------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_fedavg(setup, weighting):
  data, C, x0, _ = setup
  lr = 0.2
  res = run_fedco(PLAIN, fedco.fedavg(lr, STEPS, weighting=weighting), data, x0)
  weights = [c.n for c in C] if weighting == "samples" else None
  x_ref, objs = reference(
    C, x0, {}, plain_sgd_step(C, lr), weights=weights, objective=lambda x: plain_objective(C, x)
  )
  check(res, x_ref, objs, x0)
  if weighting == "samples":  # the weighting matters on this data
    x_uniform, _ = reference(
      C, x0, {}, plain_sgd_step(C, lr), objective=lambda x: plain_objective(C, x)
    )
    assert np.max(np.abs(x_uniform - x_ref)) > 1e-3


# ---- partial participation --------------------------------------------------------------


def _sampled(res, rounds):
  ids = np.asarray(res.metrics["clients"])
  assert ids.shape == (rounds, 2)
  assert np.all(np.diff(ids, axis=1) > 0)  # sorted, distinct
  assert len({tuple(row) for row in ids}) > 1, "pick a seed whose rounds sample differently"
  return ids


def test_comfedl_partial_participation(setup):
  data, C, x0, _ = setup
  lr, rounds = 0.3, 6
  res = run_fedco(
    LOCAL, fedco.comfedl(lr, STEPS), data, x0, rounds=rounds, clients_per_round=2, seed=3
  )
  ids = _sampled(res, rounds)
  x_ref, objs = reference(
    C,
    x0,
    {},
    comfedl_step(C, lr),
    rounds=rounds,
    sampled=ids,
    objective=lambda x: local_objective(C, x),
  )
  check(res, x_ref, objs, x0)


def test_feddro_partial_participation(setup):
  data, C, x0, y_bar0 = setup
  lr, beta, rounds = 0.3, 0.4, 6
  res = run_fedco(
    GLOBAL, fedco.feddro(lr, STEPS, beta=beta), data, x0, rounds=rounds, clients_per_round=2, seed=3
  )
  ids = _sampled(res, rounds)
  x_ref, objs = reference(
    C,
    x0,
    {"y": y_bar0},
    feddro_step(C, lr, beta),
    rounds=rounds,
    every_step=("y",),
    sampled=ids,
    objective=lambda x: global_objective(C, x),
  )
  check(res, x_ref, objs, x0)


# ---- float64 runs and stragglers ---------------------------------------------------------


def test_float64_run_matches_the_float64_reference_to_round_off(setup):
  """Under x64 every mean (batch weights, client weights) is taken in float64: FedDRO on
  clients of 3, 5 and 8 examples (weights 1/3, 1/5) equals NumPy to 1e-12."""
  import jax

  _, C, x0, _ = setup
  lr, beta = 0.3, 0.4
  with jax.enable_x64(True):
    examples = [{k: np.asarray(v, np.float64) for k, v in ex.items()} for ex in make_examples()]
    data = fedco.FederatedData.from_clients(examples)
    x64 = np.asarray(x0, np.float64)
    res = fedco.simulate(
      GLOBAL,
      fedco.feddro(lr, STEPS, beta=beta),
      data,
      jnp.asarray(x64),
      rounds=ROUNDS,
      batch_size=None,
    )
    assert np.asarray(res.params).dtype == np.float64
  y_bar0 = np.mean([c.g(x64) for c in C], axis=0)
  x_ref, objs = reference(
    C,
    x64,
    {"y": y_bar0},
    feddro_step(C, lr, beta),
    every_step=("y",),
    objective=lambda x: global_objective(C, x),
  )
  assert np.max(np.abs(x_ref - x64)) > 1e-2
  np.testing.assert_allclose(np.asarray(res.params), x_ref, rtol=1e-12, atol=1e-13)
  np.testing.assert_allclose(np.asarray(res.metrics["objective"]), objs, rtol=1e-12)


def test_fedavg_co_case1_with_stragglers(setup):
  """Case I refreshes ``y_k = g_k(x_bar)`` at the first step of every round after the first,
  also when a straggler did fewer steps in the round before (keyed on the local step, not
  on the client's step count)."""
  data, C, x0, y_bar0 = setup
  lr, rounds = 0.3, 6
  res = run_fedco(
    GLOBAL,
    fedco.fedavg_co(lr, STEPS, case="I"),
    data,
    x0,
    rounds=rounds,
    straggler_prob=0.5,
    seed=1,
  )
  steps = np.asarray(res.metrics["local_steps"])
  assert np.any(steps < STEPS) and np.any(steps == STEPS)
  step = fedavg_co_step(C, lr)
  x = np.asarray(x0, np.float64)
  ys = [y_bar0] * len(C)
  objs = []
  for r in range(rounds):
    if r > 0:
      ys = [c.g(x) for c in C]
    xs = []
    for k in range(len(C)):
      xk, s = x, {"y": ys[k]}
      for _ in range(int(steps[r, k])):
        xk, s = step(k, xk, s)
      xs.append(xk)
      ys[k] = s["y"]
    x = np.mean(xs, axis=0)
    objs.append(global_objective(C, x))
  check(res, x, np.array(objs), x0)


# ---- normalised ComFedL (an inference from the papers' text; see fedco/algorithms/comfedl.py)


def _client_loss(x, e):
  return 0.5 * jnp.sum((jnp.tanh(e["A"] @ x) - e["c"]) ** 2)


def _loss_and_grad(c, x):
  """Client ``c``'s mean loss ``0.5 ||tanh(A x) - c||^2`` and its gradient, float64."""
  t = np.tanh(c.A @ x)
  r = t - c.c
  return 0.5 * np.mean(np.sum(r**2, -1)), np.einsum("npd,np->d", c.A, r * (1 - t**2)) / c.n


def normalized_comfedl_reference(C, x0, lr, gamma, rounds=ROUNDS, weights=None):
  """Each round: L = log(sum_k p_k exp(f_k(x_bar)/gamma)) (log-sum-exp; p uniform, or
  ``weights`` normalised), then every client steps x -= lr exp(f_k(x)/gamma - L) grad f_k(x);
  the server averages with p."""
  p = np.ones(len(C)) if weights is None else np.asarray(weights, np.float64)
  p = p / p.sum()

  def log_normalizer(x):
    v = np.array([_loss_and_grad(c, x)[0] for c in C]) / gamma
    return v.max() + np.log(np.sum(p * np.exp(v - v.max())))

  def step(k, x, s):
    f, g = _loss_and_grad(C[k], x)
    return x - lr * np.exp(f / gamma - s["L"]) * g, s

  x0 = np.asarray(x0, np.float64)
  return reference(
    C,
    x0,
    {"L": log_normalizer(x0)},
    step,
    rounds=rounds,
    weights=weights,
    on_sync=lambda k, x_bar, s: {**s, "L": log_normalizer(x_bar)},
    objective=lambda x: 0.0,
  )[0]


@pytest.mark.parametrize("gamma", [0.5, 1e-4])
def test_normalized_comfedl(setup, gamma):
  """The float64 transcription, full batch; gamma 1e-4 puts f/gamma near 1e4, where the
  literal exp-form step is inf in float32 (so the exp-form objective is not evaluated)."""
  data, C, x0, _ = setup
  lr = 0.3
  res = run_fedco(
    fedco.problems.client_kl_dro(_client_loss, gamma),
    fedco.comfedl(lr, STEPS, normalized=True, gamma=gamma),
    data,
    x0,
    evaluate=False,
  )
  x_ref = normalized_comfedl_reference(C, x0, lr, gamma)
  f0 = np.array([_loss_and_grad(c, np.asarray(x0, np.float64))[0] for c in C])
  assert gamma > 0.1 or f0.max() / gamma > 5e3
  assert np.max(np.abs(x_ref - np.asarray(x0, np.float64))) > 1e-2
  # at f/gamma ~ 1e4 float32 holds the exponent f/gamma - L to about 1e4 * 6e-8
  tol = dict(rtol=RTOL, atol=ATOL) if gamma > 0.1 else dict(rtol=5e-3, atol=5e-4)
  np.testing.assert_allclose(np.asarray(res.params, np.float64), x_ref, **tol)
  assert res.ledger["up_per_client_per_round"] == {"params": D, "log_normalizer": 1}
  assert res.ledger["down_per_client_per_round"] == {"params": D, "log_normalizer": 1}
  if gamma > 0.1:  # the option composes: injected (gamma static) and chained, same numbers
    composed = fedco.chain(
      optax.clip_by_global_norm(1e12),
      fedco.inject_hyperparams(fedco.comfedl)(lr, STEPS, normalized=True, gamma=gamma),
    )
    again = run_fedco(
      fedco.problems.client_kl_dro(_client_loss, gamma), composed, data, x0, evaluate=False
    )
    np.testing.assert_allclose(np.asarray(again.params), np.asarray(res.params), rtol=1e-6)
  else:  # the literal exp-form step overflows here
    literal = run_fedco(
      fedco.problems.client_kl_dro(_client_loss, gamma),
      fedco.comfedl(lr, STEPS),
      data,
      x0,
      evaluate=False,
      check_finite=False,
    )
    assert not np.all(np.isfinite(np.asarray(literal.params)))


def test_normalized_comfedl_data_size_prior(setup):
  """weighting="samples": the KL ball around the data mixture p_k = n_k/N (clients of 3, 5
  and 8 examples), in both the normaliser and the server's average."""
  data, C, x0, _ = setup
  lr, gamma = 0.3, 0.5
  res = run_fedco(
    fedco.problems.client_kl_dro(_client_loss, gamma),
    fedco.comfedl(lr, STEPS, normalized=True, gamma=gamma, weighting="samples"),
    data,
    x0,
    evaluate=False,
  )
  x_ref = normalized_comfedl_reference(C, x0, lr, gamma, weights=[c.n for c in C])
  np.testing.assert_allclose(np.asarray(res.params, np.float64), x_ref, rtol=RTOL, atol=ATOL)
  uniform = normalized_comfedl_reference(C, x0, lr, gamma)
  assert np.max(np.abs(x_ref - uniform)) > 1e-2  # the prior matters on these clients

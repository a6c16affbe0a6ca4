"""FedPer, FedRep and APFL (issue 49) against float64 NumPy transcriptions of the papers.

The model is a one-hidden-layer tanh network with a linear head, ``{"body": W, "head": {"b",
"u"}}``, on ``0.5 (tanh(a W) u + b - c)^2 + 0.05 |params|^2``, with closed-form gradients.
The runs sample 2 of 3 clients a round with dropout and stragglers; the references follow
the runtime's recorded clients, survivors and step counts, on whole-client batches.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.algorithms import personal

SIZES, D, H = (3, 5, 8), 3, 2
ROUNDS, STEPS, M = 5, 3, 2
HEAD = ("head",)


def clients(seed=0):
  rng = np.random.default_rng(seed)
  return [
    {"a": rng.normal(size=(n, D)), "c": rng.normal(k - 1.0, 0.5, size=(n,))}
    for k, n in enumerate(SIZES)
  ]


def loss(p, e):
  z = jnp.tanh(e["a"] @ p["body"])
  pred = z @ p["head"]["u"] + p["head"]["b"]
  reg = sum(jnp.sum(v**2) for v in jax.tree.leaves(p))
  return 0.5 * (pred - e["c"]) ** 2 + 0.05 * reg


PROBLEM = fedco.plain(loss)


def x0():
  rng = np.random.default_rng(7)
  return {
    "body": rng.normal(size=(D, H)) * 0.5,
    "head": {"b": np.array(0.1), "u": rng.normal(size=H)},
  }


def grad(c, p):
  """The mean gradient of the loss over all of client ``c``'s rows (float64)."""
  a, y = c["a"], c["c"]
  z = np.tanh(a @ p["body"])
  r = z @ p["head"]["u"] + p["head"]["b"] - y
  n = len(y)
  return {
    "body": a.T @ (r[:, None] * p["head"]["u"][None, :] * (1 - z**2)) / n + 0.1 * p["body"],
    "head": {"b": np.mean(r) + 0.1 * p["head"]["b"], "u": (r @ z) / n + 0.1 * p["head"]["u"]},
  }


def tmap(f, *trees):
  return jax.tree.map(f, *trees)


def run(alg, **options):
  kwargs = dict(participation=0.8, straggler_prob=0.5, **options)
  with jax.enable_x64(True):
    data = fedco.FederatedData.from_clients(clients())
    res = fedco.simulate(
      PROBLEM, alg, data, tmap(jnp.asarray, x0()), rounds=ROUNDS, seed=4, batch_size=None,
      evaluate=False, clients_per_round=M, **kwargs,
    )  # fmt: skip
    out = jax.tree.map(lambda a: np.asarray(a, np.float64), jax.device_get((res.params, res.state)))
  plan = [
    [(int(k), int(n)) for k, alive, n in zip(ids, alv, steps) if alive]
    for ids, alv, steps in zip(
      np.asarray(res.metrics["clients"]),
      np.asarray(res.metrics["survivors"]),
      np.asarray(res.metrics["local_steps"]),
    )
  ]
  return out, plan, res


def personal_models(alg, res):
  """Every client's model, in float64."""
  with jax.enable_x64(True):
    models = personal.personal_models(alg, res.params, res.state.clients)
    return jax.tree.map(lambda a: np.asarray(a, np.float64), models)


def server_mean(x, finals):
  if not finals:
    return x
  w = np.array([SIZES[k] for k, _ in finals], np.float64)
  w = w / w.sum()
  return tmap(lambda *xs: sum(wi * xi for wi, xi in zip(w, xs)), *[f for _, f in finals])


def representation_reference(plan, lr, head_lr, head_steps):
  """FedPer (``head_steps=None``) and FedRep, client by client."""
  cs, x = clients(), x0()
  heads = [x["head"] for _ in SIZES]
  for survivors in plan:
    finals = []
    for k, steps in survivors:
      xk = x
      for s in range(steps):
        g = grad(cs[k], {"body": xk["body"], "head": heads[k]})
        if head_steps is None or s < head_steps:
          heads[k] = tmap(lambda h, gi: h - head_lr * gi, heads[k], g["head"])
        if head_steps is None or s >= head_steps:
          xk = {"body": xk["body"] - lr * g["body"], "head": xk["head"]}
      finals.append((k, xk))
    x = server_mean(x, finals)
  return x, heads


def apfl_reference(plan, lr, alpha, adaptive, local_lr, alpha_lr):
  cs, x = clients(), x0()
  local, alphas = [x for _ in SIZES], [alpha for _ in SIZES]
  for survivors in plan:
    finals = []
    for k, steps in survivors:
      xk = x
      for _ in range(steps):
        v, a = local[k], alphas[k]
        mixed = tmap(lambda vi, xi, a=a: a * vi + (1 - a) * xi, v, xk)
        g_mix = grad(cs[k], mixed)
        g_x = grad(cs[k], xk)
        local[k] = tmap(lambda vi, gi, a=a: vi - local_lr * a * gi, v, g_mix)
        if adaptive:
          inner = sum(
            np.sum((vi - xi) * gi) for vi, xi, gi in zip(*map(jax.tree.leaves, (v, xk, g_mix)))
          )
          alphas[k] = float(np.clip(a - alpha_lr * inner, 0.0, 1.0))
        xk = tmap(lambda xi, gi: xi - lr * gi, xk, g_x)
      finals.append((k, xk))
    x = server_mean(x, finals)
  return x, local, alphas


def close(actual, expected):
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def check_plan(plan):
  """The schedule exercises what the references must follow."""
  sampled = [k for survivors in plan for k, _ in survivors]
  assert len(set(sampled)) == len(SIZES)  # every client trains at some point
  assert any(len(s) < M for s in plan)  # a dropout
  assert any(0 < n < STEPS for s in plan for _, n in s)  # a straggler


@pytest.mark.parametrize("name", ["fedper", "fedrep"])
def test_representation_methods_match_the_transcription(name):
  lr, head_lr = 0.3, 0.2
  if name == "fedper":
    alg, head_steps = fedco.fedper(lr, STEPS, head=HEAD, head_lr=head_lr), None
  else:
    alg, head_steps = fedco.fedrep(lr, STEPS, head_steps=2, head=HEAD, head_lr=head_lr), 2
  (params, state), plan, res = run(alg)
  check_plan(plan)
  x, heads = representation_reference(plan, lr, head_lr, head_steps)
  close(params, x)
  # the state keeps the head's leaves (b, u), one row per client, each client's own
  b, u = state.clients.head
  close((b, u), (np.array([h["b"] for h in heads]), np.array([h["u"] for h in heads])))
  assert np.ptp(u, axis=0).max() > 1e-2
  # the server's head never moves; the body does
  close(params["head"], x0()["head"])
  assert np.abs(params["body"] - x0()["body"]).max() > 1e-2
  # each client predicts with the server's body and its own head
  models = personal_models(alg, res)
  close(models["head"], {"b": b, "u": u})
  close(models["body"], np.broadcast_to(params["body"], (len(SIZES), D, H)))


@pytest.mark.parametrize("adaptive", [True, False])
def test_apfl_matches_the_transcription(adaptive):
  lr, local_lr, alpha_lr, alpha = 0.3, 0.25, 0.5, 0.4
  alg = fedco.apfl(lr, STEPS, alpha=alpha, adaptive=adaptive, local_lr=local_lr, alpha_lr=alpha_lr)
  (params, state), plan, res = run(alg)
  check_plan(plan)
  x, local, alphas = apfl_reference(plan, lr, alpha, adaptive, local_lr, alpha_lr)
  close(params, x)
  close(state.clients.local, tmap(lambda *v: np.stack(v), *local))
  np.testing.assert_allclose(state.clients.alpha, alphas, rtol=1e-11)
  if adaptive:
    assert np.ptp(alphas) > 1e-3  # each client learns its own weight
  else:
    assert set(alphas) == {alpha}
  models = personal_models(alg, res)
  a = np.asarray(alphas)
  expected = tmap(
    lambda v, xi: (
      a.reshape((-1,) + (1,) * xi.ndim) * v + (1 - a.reshape((-1,) + (1,) * xi.ndim)) * xi
    ),
    state.clients.local,
    params,
  )
  close(models, expected)


def test_fedrep_in_a_users_loop_takes_its_phases_from_the_count():
  """No ``local_step``: the first ``head_steps`` of every ``local_steps`` updates move the
  head, the rest the body; the server averages the body alone (here: nobody)."""
  c = clients()[1]
  examples = {k: jnp.asarray(v, jnp.float32) for k, v in c.items()}
  grad_h, oracles = fedco.oracle_args(PROBLEM, examples, examples)
  alg = fedco.fedrep(0.1, 3, head_steps=1, head=HEAD)
  params = tmap(lambda v: jnp.asarray(v, jnp.float32), x0())
  state = alg.init(params)
  moved = []
  for _ in range(6):
    before = (params, state.head)
    step, state = alg.update(grad_h(params), state, params, **oracles)
    params = optax.apply_updates(params, step)
    moved.append(
      (
        bool(np.abs(np.asarray(state.head[1]) - np.asarray(before[1][1])).max() > 0),
        bool(np.abs(np.asarray(params["body"]) - np.asarray(before[0]["body"])).max() > 0),
      )
    )
  assert moved == [(True, False), (False, True), (False, True)] * 2


def test_the_uplink_is_the_whole_model_and_heads_stream_from_disk(tmp_path):
  """The plan communicates the model (the head's entries of the change are zeros), and a
  streamed run keeps every client's head on disk, equal to the in-memory run's."""
  data = fedco.FederatedData.from_clients(
    [{k: np.asarray(v, np.float32) for k, v in c.items()} for c in clients()]
  )
  store = fedco.data.write_store(tmp_path / "clients", data)
  alg = fedco.fedrep(0.1, 3, head=HEAD)
  params = tmap(lambda v: jnp.asarray(v, jnp.float32), x0())
  kwargs = dict(rounds=4, seed=1, batch_size=2, clients_per_round=2, evaluate=False, chunk_rounds=2)
  memory = fedco.simulate(PROBLEM, alg, data, params, **kwargs)
  assert memory.ledger["up_per_client_per_round"] == {"params": D * H + 1 + H}
  streamed = fedco.simulate(PROBLEM, alg, store, params, checkpoint_dir=tmp_path / "ck", **kwargs)
  from fedco.runtime import paging

  states = paging.StateStore.open(tmp_path / "ck" / "client_state", streamed.state)
  on_disk = paging.unpaged(streamed.state, states)
  for a, b in zip(
    jax.tree.leaves(memory.state.clients), jax.tree.leaves(on_disk.clients), strict=True
  ):
    np.testing.assert_array_equal(a, b)


def test_head_masks_by_name_by_leaf_and_by_entry():
  params = {
    "Dense_0": {"kernel": np.zeros((2, 3)), "bias": np.zeros(3)},
    "Dense_1": {"kernel": np.zeros((3, 1))},
  }
  by_name = personal.head_mask(params, ("Dense_1",))
  assert [m.all() or not m.any() for m in by_name] == [True] * 3
  assert [bool(m.any()) for m in by_name] == [False, False, True]
  by_leaf = personal.head_mask(
    params, lambda p: {"Dense_0": {"kernel": False, "bias": True}, "Dense_1": {"kernel": False}}
  )
  assert [bool(m.any()) for m in by_leaf] == [True, False, False]
  entries = personal.head_mask(np.zeros(4), personal.last_entries)
  assert entries[0].tolist() == [False, False, False, True]


@pytest.mark.parametrize(
  "build, match",
  [
    (lambda: fedco.fedrep(0.1, 3, head_steps=3), "head_steps must be an integer in \\[1, 2\\]"),
    (lambda: fedco.fedrep(0.1, 1), "local_steps must be an integer >= 2"),
    (lambda: fedco.apfl(0.1, alpha=1.5), "alpha"),
    (lambda: fedco.fedper(optax.constant_schedule(0.1)), "head_lr must be given"),
    (lambda: fedco.fedper(0.1, weighting="size"), "weighting"),
    (lambda: fedco.fedper(0.1, head="head").init(x0()), "head='head'"),
    (lambda: fedco.fedper(0.1, head=("nothing",)).init(x0()), "selects no parameter"),
    (lambda: fedco.fedper(0.1, head=("body", "head")).init(x0()), "nothing would be shared"),
    (lambda: fedco.fedper(0.1, head=lambda p: [True]).init(x0()), "tree of booleans"),
    (lambda: personal.personal_model(fedco.fedavg(0.1), x0(), None), "personal_model takes"),
  ],
)
def test_bad_arguments_are_refused_in_one_line(build, match):
  with pytest.raises(ValueError, match=match) as err:
    build()
  assert "\n" not in str(err.value)


def test_a_problem_without_the_loss_value_is_refused():
  for alg in (fedco.fedper(0.1, head=HEAD), fedco.apfl(0.1)):
    state = alg.init(x0())
    with pytest.raises(ValueError, match="extra_fn"):
      alg.update(x0(), state, x0())


@pytest.mark.parametrize("factory", [fedco.fedper, fedco.fedrep, fedco.apfl])
def test_the_kit_passes_on_a_model_with_a_named_head(factory):
  """The registry's kit runs on flat models (``last_entries``); here a head by name."""
  kwargs = {"apfl": {}, "fedper": {"head": HEAD}, "fedrep": {"head": HEAD, "head_steps": 1}}
  kwargs = kwargs[factory.__name__]
  params = {"body": jnp.full((3,), 0.1), "head": jnp.full((2,), 0.1)}
  problem = fedco.plain(lambda p, e: 0.5 * jnp.sum((p["body"][:2] + p["head"] - e["r"][:2]) ** 2))
  checks = ("builds", "state", "jit", "chain", "inject", "simulate")
  out = fedco.testing.check_algorithm(
    factory, learning_rate=0.1, local_steps=3, problem=problem, params=params, checks=checks,
    **kwargs,
  )  # fmt: skip
  assert out == {c: "passed" for c in checks}

r"""Personalisation by a shared representation (FedPer, FedRep) and by mixing (APFL).

Each client keeps a private part of the model from round to round (the client-state
contract of :mod:`fedco.extend`: fields the plan does not name never leave the client); the
server trains the shared part by averaging, as FedAvg does. All three run on a plain
problem (``h_k``, the client loss) and take their gradients with ``jax.grad(extra_fn)`` at
the model the client predicts with, on the step's batch (the batch ``updates`` was
computed on).

**The head** (FedPer, FedRep): the parameters a client keeps to itself, named by ``head``:
a sequence of names (a leaf is in the head when a key on its path is one of them: a flax
model's ``("Dense_1",)``, or ``("head",)`` for ``{"body": ..., "head": ...}``) or a function
``params -> `` a tree of booleans, one per leaf or one per entry (an array of the leaf's
shape), as ``optax.masked`` takes. The client state keeps only the leaves the head touches,
so a private dense layer costs that layer, not a model, per client. With ``x`` the server's
model, ``merge(x, h)`` is ``x`` with the head's entries taken from ``h``.

FedPer (Arivazhagan, Aggarwal, Singh, Choudhary 2019), per local step on a batch ``xi``::

    g = grad h_k(merge(x, h_k); xi)
    h_k = h_k - eta_h g[head]                 (private)
    x   = x   - eta g[body]                   (averaged by the server every round)

FedRep (Collins, Hassani, Mokhtari, Shakkottai 2021, Algorithm 1): the round's first
``head_steps`` steps train the head alone with the representation fixed, the rest train the
representation alone with the new head::

    step s <  head_steps:  h_k = h_k - eta_h grad h_k(merge(x, h_k); xi)[head]
    step s >= head_steps:  x   = x   - eta   grad h_k(merge(x, h_k); xi)[body]

APFL (Deng, Kamani, Mahdavi 2020, Algorithm 1 with the adaptive ``alpha`` of its eq. (7)):
a client keeps a local model ``v_k`` and a mixing weight ``alpha_k``, predicts with
``vbar_k = alpha_k v_k + (1 - alpha_k) x_k`` and, per local step, from the step's
iterates::

    x_k     = x_k - eta grad h_k(x_k; xi)                                   (averaged)
    v_k     = v_k - eta_v grad_v h_k(alpha_k v_k + (1 - alpha_k) x_k; xi)
    alpha_k = clip(alpha_k - eta_a <v_k - x_k, grad h_k(vbar_k; xi)>, 0, 1)

(the three right-hand sides read the iterates before the step).

**Choices.** The server mean is weighted by client sample counts (``weighting="samples"``,
FedAvg's, as :func:`fedco.ditto` does); ``"uniform"`` is offered. FedPer and FedRep upload
the whole model as every fedco plan does: the head's entries of a client's change are zeros,
so the server's head never moves from the initial model (it is the starting head of a
client's first round) and the ledger counts those zeros (a ``top_k`` codec would not send
them). APFL's ``alpha`` follows the paper's per-step gradient, projected on ``[0, 1]`` as
the authors' code projects it; their code updates ``alpha`` once a round with a mixed
gradient and a ``0.02 alpha`` term, and steps ``v_k`` after ``x_k``: fedco transcribes the
paper. ``optimizer`` replaces the shared model's SGD step only; the private steps are SGD.
A client predicts with :func:`personal_model` (its merged model; APFL's mixture with the
server's model).

References:
  Arivazhagan, Aggarwal, Singh, Choudhary, "Federated learning with personalization layers"
  (2019). Collins, Hassani, Mokhtari, Shakkottai, "Exploiting shared representations for
  personalized federated learning" (ICML 2021). Deng, Kamani, Mahdavi, "Adaptive
  personalized federated learning" (2020).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco import _validate, extend

#: What ``head`` may be: key names, or ``params -> `` a tree of booleans (per leaf or entry).
Head = Union[Sequence[str], Callable[[Any], Any]]
#: The registry names whose clients predict with a model of their own (:func:`personal_model`).
PERSONAL = ("fedper", "fedrep", "apfl", "ditto")
#: The weightings of the server mean the three factories offer.
WEIGHTINGS = ("samples", "uniform")


def last_entries(params) -> Any:
  """A head of the last entry of every leaf: the registry's test setting, for the flat
  models of the contract tests (a flax model names its head's layers instead).

  Args:
    params: a model (a pytree of arrays).

  Returns:
    a tree of boolean NumPy arrays shaped like ``params``' leaves, ``True`` at each
    leaf's last entry (in C order).

  Examples:
    >>> import numpy as np
    >>> from fedco.algorithms import personal
    >>> personal.last_entries(np.zeros(3)).tolist()
    [False, False, True]
  """

  def mark(leaf):
    flat = np.zeros(np.size(leaf), bool)
    flat[-1:] = True
    return flat.reshape(np.shape(leaf))

  return jax.tree.map(mark, params)


def head_mask(params, head: Head) -> list:
  """Per leaf of ``params`` (``jax.tree.leaves`` order), a boolean NumPy array of its shape:
  the head's entries.

  Args:
    params: the model.
    head: key names, or a function of ``params`` giving a tree of booleans (one per leaf,
      or an array of the leaf's shape).

  Returns:
    a list of boolean arrays, one per leaf.

  Raises:
    ValueError: ``head`` is neither; its function's tree does not match ``params``; it
      selects no entry, or every entry (nothing would be shared).

  Examples:
    >>> import numpy as np
    >>> from fedco.algorithms import personal
    >>> params = {"body": np.zeros(2), "head": np.zeros(3)}
    >>> [m.tolist() for m in personal.head_mask(params, ("head",))]
    [[False, False], [True, True, True]]
  """
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  paths, leaves = [p for p, _ in flat], [x for _, x in flat]
  if callable(head):
    marks = head(params)
    try:
      flags = treedef.flatten_up_to(marks)  # type: ignore[attr-defined]
    except (ValueError, TypeError):
      raise ValueError(
        "head: its function must return a tree of booleans shaped like params, one per leaf"
      ) from None
    masks = [np.broadcast_to(np.asarray(f, bool), np.shape(x)) for f, x in zip(flags, leaves)]
  elif isinstance(head, (list, tuple)) and head and all(isinstance(n, str) for n in head):
    names = set(head)
    masks = [
      np.full(np.shape(x), bool(names & {_key_name(k) for k in path}))
      for path, x in zip(paths, leaves)
    ]
  else:
    raise ValueError(
      f"head={head!r}: give the names of the head's keys (a non-empty tuple of strings) or a "
      "function of params returning a tree of booleans"
    )
  chosen = sum(int(m.sum()) for m in masks)
  if chosen == 0:
    keys = sorted({_key_name(k) for path in paths for k in path})
    raise ValueError(
      f"head={head!r} selects no parameter of the model; its keys: {', '.join(keys[:12])}"
    )
  if chosen == sum(m.size for m in masks):
    raise ValueError(f"head={head!r} selects every parameter: nothing would be shared")
  return masks


def _key_name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def own_rate(name: str, value: Optional[float], learning_rate, default: float) -> float:
  """A private step's fixed rate: ``value``, else ``learning_rate`` (``default`` when that is
  ``None``); a schedule ``learning_rate`` needs ``value`` given.

  Raises:
    ValueError: a rate is not positive, or ``learning_rate`` is a schedule and ``value`` is
      ``None``.

  Examples:
    >>> from fedco.algorithms import personal
    >>> personal.own_rate("head_lr", None, 0.3, 0.1), personal.own_rate("head_lr", 0.2, None, 0.1)
    (0.3, 0.2)
  """
  if value is not None:
    return _validate.positive(name, value)
  if callable(learning_rate):
    raise ValueError(
      f"{name} must be given (a number > 0) when learning_rate is a schedule: the private "
      "step needs a fixed rate"
    )
  return _validate.positive("learning_rate", default if learning_rate is None else learning_rate)


class HeadState(NamedTuple):
  """FedPer's and FedRep's client state: the private head (the leaves it touches)."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  head: Any
  opt_state: optax.OptState


class _Split(NamedTuple):
  """The head's masks and which leaves the state keeps."""

  masks: list
  kept: tuple
  treedef: Any


def _split(params, head: Head) -> _Split:
  masks = head_mask(params, head)
  kept = tuple(i for i, m in enumerate(masks) if m.any())
  return _Split(masks, kept, jax.tree.structure(params))


def merge(params, kept_leaves, split: _Split):
  """``params`` with the head's entries taken from the kept leaves."""
  leaves = jax.tree.leaves(params)
  for i, h in zip(split.kept, kept_leaves):
    m = split.masks[i]
    leaves[i] = h if m.all() else jnp.where(m, h, leaves[i])
  return jax.tree.unflatten(split.treedef, leaves)


def _representation(name: str, head: Head, head_steps: Optional[int], plan, eta_h, opt):
  """The FedPer / FedRep transform (``head_steps=None``: both parts every step)."""
  steps = plan.local_steps

  def init(params, *, inner_value=None):
    del inner_value
    params = extend.strong(params)
    split = _split(params, head)
    leaves = jax.tree.leaves(params)
    return HeadState(
      jnp.zeros([], jnp.int32), tuple(leaves[i] for i in split.kept), opt.init(params)
    )

  def update(updates, state, params=None, *, extra_fn=None, local_step=None, **unused):
    del updates, unused
    extend.require("extra_fn (the client loss on the step's batch)", extra_fn, name)
    split = _split(params, head)
    grads = jax.tree.leaves(jax.grad(extra_fn)(merge(params, state.head, split)))
    body = [jnp.where(m, 0.0, g).astype(g.dtype) for m, g in zip(split.masks, grads)]
    new_head = tuple(
      jnp.where(split.masks[i], h - eta_h * grads[i], h).astype(h.dtype)
      for i, h in zip(split.kept, state.head)
    )
    step, opt_state = opt.update(jax.tree.unflatten(split.treedef, body), state.opt_state, params)
    if head_steps is not None:  # FedRep: the head's phase, then the representation's
      index = state.count % steps if local_step is None else jnp.asarray(local_step)
      on_head = index < head_steps
      new_head = extend.select(on_head, new_head, state.head)
      step = extend.select(on_head, jax.tree.map(jnp.zeros_like, step), step)
      opt_state = extend.select(on_head, state.opt_state, opt_state)
    return step, HeadState(state.count + 1, new_head, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), name, "plain")


@extend.register(settings={"fedper": dict(learning_rate=0.1, head=last_entries)})
@extend.factory(static=("local_steps", "optimizer", "head"))
def fedper(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  head: Head = ("head",),
  head_lr: Optional[float] = None,
  weighting: str = "samples",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedPer (Arivazhagan et al. 2019): a shared body averaged by the server, a private head.

  Every local step trains the whole model a client predicts with, :math:`(x_{body},
  h_k)`, on the step's batch; the body's change is averaged every round, the head
  :math:`h_k` stays on the client (:mod:`fedco.algorithms.personal`):

  .. math::

     g = \nabla h_k(\mathrm{merge}(x, h_k); \xi), \qquad
     h_k \leftarrow h_k - \eta_h\, g_{head}, \qquad x \leftarrow x - \eta\, g_{body}.

  Client state ``HeadState(count, head, opt_state)``: ``head`` holds the leaves ``head``
  touches (the initial model's at first), kept through rounds the client is not sampled
  in (``result.state.clients.head``, leaves ``[K, ...]``); :func:`personal_model` gives
  the merged model.

  Args:
    learning_rate: the body's local rate :math:`\eta > 0` or an optax schedule; ``None``:
      0.1.
    local_steps: local steps per round, a positive int.
    head: the private parameters: key names (default ``("head",)``) or a function of
      ``params`` giving a tree of booleans per leaf or per entry (:func:`head_mask`).
    head_lr: the head's SGD rate :math:`\eta_h > 0`; ``None``: ``learning_rate``.
    weighting: the server mean, ``"samples"`` (default) or ``"uniform"``.
    optimizer: the body's step (:func:`fedco.extend.param_optimizer`).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose plan averages the model.

  Raises:
    ValueError: a rate is not positive, ``weighting`` is unknown; from ``init``, ``head``
      selects nothing or everything; from ``update``, a problem without ``extra_fn``.

  Examples:
    One client, :math:`h(x) = \frac12 \lVert x - (1, 2) \rVert^2` with the second entry
    its head: the body moves on the server's model, the head in the client's state.

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))
    >>> batch = {"t": jnp.array([[1.0, 2.0]])}
    >>> grad_h, oracles = fedco.oracle_args(problem, batch, batch)
    >>> alg = fedco.fedper(0.5, local_steps=1, head=lambda p: jnp.arange(2) == 1)
    >>> x = jnp.zeros(2)
    >>> state = alg.init(x)
    >>> step, state = alg.update(grad_h(x), state, x, **oracles)
    >>> optax.apply_updates(x, step).tolist(), state.head[0].tolist()
    ([0.5, 0.0], [0.0, 1.0])
  """
  eta_h = own_rate("head_lr", head_lr, learning_rate, 0.1)
  _validate.one_of("weighting", weighting, WEIGHTINGS)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.1)
  plan = extend.make_plan(local_steps, weighting=weighting)
  return _representation("fedper", head, None, plan, eta_h, opt)


@extend.register(settings={"fedrep": dict(learning_rate=0.1, head=last_entries, head_steps=1)})
@extend.factory(static=("local_steps", "head_steps", "optimizer", "head"))
def fedrep(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  head_steps: Optional[int] = None,
  head: Head = ("head",),
  head_lr: Optional[float] = None,
  weighting: str = "samples",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedRep (Collins et al. 2021): a client's head first, then the shared representation.

  A round's first ``head_steps`` local steps train the client's private head :math:`h_k`
  with the representation fixed; the rest train the representation with the new head
  fixed, and the server averages it (:mod:`fedco.algorithms.personal`):

  .. math::

     s < \tau_h:\; h_k \leftarrow h_k - \eta_h \nabla_{h} h_k(\mathrm{merge}(x, h_k); \xi),
     \qquad s \ge \tau_h:\; x \leftarrow x - \eta \nabla_{body} h_k(\mathrm{merge}(x, h_k);
     \xi).

  The step's index ``s`` is the runtime's ``local_step`` (the state's count in a loop of
  your own); a straggler that stops before ``head_steps`` uploads no change. Client state
  and :func:`personal_model` as :func:`fedper`'s.

  Args:
    learning_rate: the representation's rate :math:`\eta > 0` or an optax schedule;
      ``None``: 0.1.
    local_steps: local steps per round :math:`\tau_h + \tau_\phi`, an int ``>= 2``.
    head_steps: :math:`\tau_h`, ``1 .. local_steps - 1``; ``None``: ``local_steps - 1``
      (the paper trains the head 10 epochs and the representation 1).
    head: the private parameters (as :func:`fedper`'s).
    head_lr: the head's SGD rate :math:`\eta_h > 0`; ``None``: ``learning_rate`` (the
      paper uses one rate).
    weighting: the server mean, ``"samples"`` (default) or ``"uniform"``.
    optimizer: the representation's step (:func:`fedco.extend.param_optimizer`).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose plan averages the model.

  Raises:
    ValueError: ``head_steps`` is outside ``1 .. local_steps - 1``, a rate is not
      positive, ``weighting`` is unknown; from ``init``, ``head`` selects nothing or
      everything; from ``update``, a problem without ``extra_fn``.

  Examples:
    Two steps on :math:`h(x) = \frac12 \lVert x - (1, 2) \rVert^2`, the second entry the
    head: step 0 moves the head only, step 1 the representation only.

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))
    >>> batch = {"t": jnp.array([[1.0, 2.0]])}
    >>> grad_h, oracles = fedco.oracle_args(problem, batch, batch)
    >>> alg = fedco.fedrep(0.5, local_steps=2, head=lambda p: jnp.arange(2) == 1)
    >>> x = jnp.zeros(2)
    >>> state = alg.init(x)
    >>> for _ in range(2):
    ...   step, state = alg.update(grad_h(x), state, x, **oracles)
    ...   x = optax.apply_updates(x, step)
    >>> x.tolist(), state.head[0].tolist()
    ([0.5, 0.0], [0.0, 1.0])
  """
  steps = _validate.positive_int("local_steps", local_steps, minimum=2)
  tau_h = _validate.positive_int(
    "head_steps",
    steps - 1 if head_steps is None else head_steps,
    maximum=steps - 1,
    note="local_steps - 1: the body trains after the head",
  )
  eta_h = own_rate("head_lr", head_lr, learning_rate, 0.1)
  _validate.one_of("weighting", weighting, WEIGHTINGS)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.1)
  plan = extend.make_plan(local_steps, weighting=weighting)
  return _representation("fedrep", head, int(tau_h), plan, eta_h, opt)


class APFLState(NamedTuple):
  """APFL's client state: the local model ``v_k`` and its mixing weight ``alpha``."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  local: Any
  alpha: jnp.ndarray
  opt_state: optax.OptState


@extend.register(settings={"apfl": dict(learning_rate=0.1, alpha=0.25)})
@extend.factory(static=("local_steps", "optimizer"))
def apfl(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  alpha: float = 0.25,
  adaptive: bool = True,
  local_lr: Optional[float] = None,
  alpha_lr: Optional[float] = None,
  weighting: str = "samples",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""APFL (Deng, Kamani, Mahdavi 2020): each client mixes its local model with the global.

  A client keeps a local model :math:`v_k` and a weight :math:`\alpha_k`, and predicts with
  :math:`\bar v_k = \alpha_k v_k + (1 - \alpha_k) x`. Per local step, from the step's
  iterates (:mod:`fedco.algorithms.personal`):

  .. math::

     x &\leftarrow x - \eta\, \nabla h_k(x; \xi) \quad \text{(averaged every round)}, \\
     v_k &\leftarrow v_k - \eta_v\, \nabla_v h_k(\alpha_k v_k + (1 - \alpha_k) x; \xi), \\
     \alpha_k &\leftarrow \Pi_{[0, 1]}\bigl(\alpha_k - \eta_\alpha \langle v_k - x,
     \nabla h_k(\bar v_k; \xi) \rangle\bigr) \quad \text{(when } ``adaptive``).

  Client state ``APFLState(count, local, alpha, opt_state)``: :math:`v_k` starts at the
  initial model and :math:`\alpha_k` at ``alpha``, both kept through rounds the client is
  not sampled in; :func:`personal_model` gives :math:`\bar v_k` at the server's model.

  Args:
    learning_rate: the global model's local rate :math:`\eta > 0` or an optax schedule;
      ``None``: 0.1.
    local_steps: local steps per round, a positive int.
    alpha: the initial (or, without ``adaptive``, fixed) mixing weight in ``[0, 1]``
      (the paper tries 0.25, 0.5 and 0.75).
    adaptive: whether :math:`\alpha_k` learns (the paper's eq. (7)); default ``True``.
    local_lr: :math:`\eta_v > 0`; ``None``: ``learning_rate`` (the paper's one rate).
    alpha_lr: :math:`\eta_\alpha > 0`; ``None``: ``learning_rate``.
    weighting: the server mean, ``"samples"`` (default) or ``"uniform"``.
    optimizer: the global model's step (:func:`fedco.extend.param_optimizer`).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose plan averages the model.

  Raises:
    ValueError: ``alpha`` is outside ``[0, 1]``, a rate is not positive, ``weighting`` is
      unknown; from ``update``, a problem without ``updates`` or ``extra_fn``.

  Examples:
    With ``alpha = 1`` fixed the local model is SGD on the client's own loss:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))
    >>> batch = {"t": jnp.array([[1.0, 2.0]])}
    >>> grad_h, oracles = fedco.oracle_args(problem, batch, batch)
    >>> alg = fedco.apfl(0.5, local_steps=1, alpha=1.0, adaptive=False)
    >>> x = jnp.zeros(2)
    >>> step, state = alg.update(grad_h(x), alg.init(x), x, **oracles)
    >>> step.tolist(), state.local.tolist(), float(state.alpha)
    ([0.5, 1.0], [0.5, 1.0], 1.0)
  """
  _validate.bounded("alpha", alpha, 0.0, 1.0, closed_low=True, closed_high=True)
  eta_v = own_rate("local_lr", local_lr, learning_rate, 0.1)
  eta_a = own_rate("alpha_lr", alpha_lr, learning_rate, 0.1)
  _validate.one_of("weighting", weighting, WEIGHTINGS)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.1)
  plan = extend.make_plan(local_steps, weighting=weighting)

  def init(params, *, inner_value=None):
    del inner_value
    params = extend.strong(params)
    dtype = jax.tree.leaves(params)[0].dtype
    return APFLState(jnp.zeros([], jnp.int32), params, jnp.asarray(alpha, dtype), opt.init(params))

  def update(updates, state, params=None, *, extra_fn=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, "apfl")
    extend.require("extra_fn (the client loss on the step's batch)", extra_fn, "apfl")

    def mixed_loss(v, a):
      return extra_fn(jax.tree.map(lambda vi, xi: a * vi + (1 - a) * xi, v, params))

    grad_v, grad_a = jax.grad(mixed_loss, argnums=(0, 1))(state.local, state.alpha)
    local = jax.tree.map(lambda v, g: v - eta_v * g, state.local, grad_v)
    new_alpha = jnp.clip(state.alpha - eta_a * grad_a, 0.0, 1.0) if adaptive else state.alpha
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, APFLState(state.count + 1, local, new_alpha, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "apfl", "plain")


def personal_models(algorithm: extend.Algorithm, params, clients):
  """Every client's model: :func:`personal_model` over a run's stacked client states.

  Args:
    algorithm: as for :func:`personal_model`.
    params: the server's model.
    clients: the clients' states, leaves ``[K, ...]`` (``result.state.clients``).

  Returns:
    the clients' models, every leaf ``[K, ...]``.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import personal
    >>> alg = fedco.apfl(0.5, alpha=0.5, adaptive=False)
    >>> one = alg.init(jnp.zeros(2))
    >>> clients = jax.tree.map(lambda a: jnp.stack([a, a]), one)._replace(
    ...   local=jnp.array([[2.0, 0.0], [0.0, 4.0]]))
    >>> personal.personal_models(alg, jnp.zeros(2), clients).tolist()
    [[1.0, 0.0], [0.0, 2.0]]
  """
  return jax.vmap(lambda state: personal_model(algorithm, params, state))(clients)


def personal_model(algorithm: extend.Algorithm, params, client_state):
  """The model one client predicts with, from the server's model and its state.

  FedPer and FedRep: ``params`` with the client's head; APFL: ``alpha_k v_k + (1 -
  alpha_k) params``; Ditto: its personal model. For every client of a run at once:
  :func:`personal_models`.

  Args:
    algorithm: the run's algorithm, built by :func:`fedper`, :func:`fedrep`, :func:`apfl`
      or :func:`fedco.ditto` (its ``arguments`` name the factory and the head).
    params: the server's model.
    client_state: one client's state (unstacked).

  Returns:
    the client's model, shaped like ``params``.

  Raises:
    ValueError: ``algorithm`` was not built by one of those factories.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import personal
    >>> alg = fedco.apfl(0.5, alpha=0.25, adaptive=False)
    >>> state = alg.init(jnp.ones(2))._replace(local=jnp.array([5.0, 1.0]))
    >>> personal.personal_model(alg, jnp.ones(2), state).tolist()
    [2.0, 1.0]
  """
  arguments = getattr(algorithm, "arguments", None) or {}
  kind = arguments.get("factory")
  if kind not in PERSONAL:
    raise ValueError(f"algorithm: built by {kind!r}; personal_model takes {', '.join(PERSONAL)}")
  if kind in ("fedper", "fedrep"):
    head = extend.get_field(client_state, "head")
    return merge(params, head, _split(params, arguments["head"]))
  if kind == "apfl":
    a = extend.get_field(client_state, "alpha")
    v = extend.get_field(client_state, "local")
    return jax.tree.map(lambda vi, xi: a * vi + (1 - a) * xi, v, params)
  return extend.get_field(client_state, "personal")  # Ditto

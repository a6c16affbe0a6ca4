"""ComFedL (papers 000/001, Algorithm 1): local-inner compositional FedAvg.

Each sampled client starts from the server model and, for ``tau`` local steps, draws a batch
``B`` for ``g`` and ``B~`` for ``f`` and steps

    y = g_k(x; B),    u = J_g(x; B)^T grad f_k(y; B~) + grad h_k(x),    x = x - eta u;

the server averages the sampled clients' models (uniformly; by data size with
``weighting="samples"``). The inner value is fresh every step (no tracker), so ComFedL is
biased for a fixed batch and relies on ``b`` for accuracy.
With the client-level KL-DRO outer ``f = exp(./gamma)`` (deterministic), ``u`` reduces to
``exp(l_B(x)/gamma)/gamma * grad l_B(x)``. Named variants ComFedL-MAML and ComFedL-DAMAML are
this algorithm on the MAML and DA-MAML problems.

**Normalised client weights** (``normalized=True``, an inference from the papers' text, not
their printed algorithm). On the client-level KL-DRO exp form the literal step weighs client
``k``'s gradient by ``exp(f_k/gamma)/gamma``, which is about 5e5 at ``gamma = 0.2`` on E1 and
diverges at round 1. Paper 001 treats the exp form (its eq. 6) and the log form
``gamma log(1/n sum_i exp(f_i/gamma))`` (eq. 5) as interchangeable and reports the method
"pretty robust with different values of gamma" over [0.1, 0.5, 1, 5] and that clients with
easier distributions get a smaller rate; both fit the log form's gradient, whose client
weights are ``n softmax(f/gamma)_k`` (mean 1 over clients). So with ``normalized=True``:
each round every sampled client reports its loss at the server model on a fresh batch,
``f_k(x_bar)``, the server broadcasts the log-normaliser ``L = log(1/m sum_k
exp(f_k(x_bar)/gamma))`` (log-sum-exp, stable for any ``f/gamma``), and clients step

    y = g_k(x; B),    u = exp(y/gamma - L) J_g(x; B)^T,    x = x - eta u,

i.e. ``exp((f - c)/gamma)/Z`` with the shift ``c`` folded into ``L``. On client-level
KL-DRO the inner value is the client's scalar loss ``f``; the problem's outer function is
not used (its temperature is ``gamma``). On a problem whose outer carries an ``outer_link``
(ComFedL-DAMAML: ``exp((L_k(y) - shift)/gamma)`` around the query loss ``L_k`` of the adapted
model ``y = g_k(x)``) the loss is the one inside the link: clients report ``L_k`` at the
adapted server model on fresh support and query batches (the plan's
``round_start_value="pre_link"``) and step

    y = g_k(x; B),    u = exp(L_k(y; B~)/gamma - L) J_g(x; B)^T grad L_k(y; B~),

the gradient of ``gamma log(1/m sum_k exp(L_k/gamma))`` with the normaliser frozen for the
round (the link's shift cancels in the normalisation). One more float per client per round
goes up (the loss) and down (``L``). The weight ``exp(y/gamma - L)`` uses each local step's
own batch loss ``y`` (ComFedL tracks nothing): against a batch at the client's round-start
loss ``f_k``, the step is ``exp((y - f_k)/gamma)`` times larger, about 20 for a batch 0.6
above it at ``gamma = 0.2``. On E1 with real MNIST and ``weighting="samples"`` at
learning rate 0.01 that diverges on 4 of 10 seeds; at ``gamma = 0.5`` those 4 finish
(README, "On real MNIST").

**The prior over clients** (``weighting``). The papers' problem centres the KL ball at the
uniform ``1/K``: the server averages uniformly and ``L`` is the uniform mean. With
``weighting="samples"`` the centre is the clients' data mixture ``p_k = n_k / N``: the server
averages with ``p_k`` and ``L = log(sum_k p_k exp(f_k/gamma))``, so the rounds follow
``gamma log sum_k p_k exp(f_k/gamma)``, which tends to FedAvg's objective ``sum_k p_k f_k`` as
``gamma`` grows (the uniform prior tends to uniformly weighted FedAvg instead). On the
literal step the same weights turn the exp form into ``sum_k p_k exp(f_k/gamma)``. The
problem's reported ``objective`` stays its own uniform mean over clients (as for FedAvg by
data size).

References:
  Wu, Huang et al., "Federated compositional optimization / ComFedL" (papers 000 and 001).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, estimators, extend


class ComFedLState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  opt_state: optax.OptState


class NormalizedComFedLState(NamedTuple):
  """``log_normalizer``: this round's ``L``, set by the server before the local steps."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  log_normalizer: jnp.ndarray
  opt_state: optax.OptState


@extend.register(settings={"comfedl": dict(learning_rate=0.1)})
@extend.factory(static=("local_steps", "optimizer", "normalized", "gamma", "weighting"))
def comfedl(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  normalized: bool = False,
  gamma: Optional[float] = None,
  weighting: str = "uniform",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""ComFedL (papers 000/001, Algorithm 1): compositional FedAvg for local-inner problems.

  Solves the **local-inner** problem :math:`F(x) = \frac{1}{K}\sum_k [f_k(g_k(x)) +
  h_k(x)]` (client-level KL-DRO, MAML, DA-MAML). Each round the server samples :math:`m`
  of the :math:`K` clients without replacement and broadcasts :math:`\bar x`; each sampled
  client sets :math:`x = \bar x` and, for :math:`\tau` local steps, draws a batch
  :math:`B` for :math:`g` and :math:`\tilde B` for :math:`f` and steps

  .. math::

    y = g_k(x; B), \qquad u = J_{g_k}(x; B)^\top \nabla f_k(y; \tilde B) + \nabla h_k(x),
    \qquad x \leftarrow x - \eta u;

  the server averages the sampled clients' models (uniformly; by data size with
  ``weighting="samples"``). The inner value is fresh every step (no tracker), so the step
  is biased for a fixed batch size :math:`b`. On client-level KL-DRO
  (:func:`fedco.problems.client_kl_dro`, :math:`f = \exp(\cdot/\gamma)`) the step is
  :math:`\exp(l_B(x)/\gamma)/\gamma \, \nabla l_B(x)`. ComFedL-MAML and ComFedL-DAMAML are
  this algorithm on :func:`fedco.problems.maml` and :func:`fedco.problems.da_maml`.

  **Normalised weights** (``normalized=True``; **Choice**, an inference from the papers'
  text, not their printed algorithm, see the module docstring): the literal weight
  :math:`\exp(f_k/\gamma)/\gamma` is about 5e5 at E1's :math:`\gamma = 0.2` and diverges.
  Instead each sampled client reports its loss :math:`f_k(\bar x)` at the round's start,
  the server broadcasts :math:`L = \log \sum_k w_k \exp(f_k(\bar x)/\gamma)` (log-sum-exp,
  :math:`w_k` the averaging weights) and the clients step with
  :math:`u = \exp(l_B(x)/\gamma - L)\, \nabla l_B(x)` (the scalar inner value
  :math:`y = l_B(x)` is the batch loss), the gradient of the log form
  :math:`\gamma \log \frac{1}{m}\sum_k \exp(f_k/\gamma)` with the normaliser frozen for the
  round. With a problem that has an ``outer_link`` (DA-MAML), the loss inside the link
  weighs :math:`J_{g_k}^\top \nabla L_k(y; \tilde B)` instead. One more float per client
  per round goes up (the loss) and down (:math:`L`).

  Communication: the model (``d`` floats) up and down per sampled client per round (plus
  the loss and :math:`L` when normalised). Paper settings (E1, client-level KL-DRO on
  MNIST): :math:`\tau = 5`, :math:`\eta = 0.01`, :math:`\gamma = 0.2` (ablations
  :math:`\gamma \in \{0.1, 0.2, 2, 5\}`, :math:`\tau \in \{1, 2, 5, 10\}`); E2
  (ComFedL-DAMAML): outer rate 0.1, :math:`\gamma = 0.5`, :math:`\tau = 5` (the inner
  rate 0.05 is the problem's).

  Args:
    learning_rate: the local step size :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.01 (paper 001's E1).
    local_steps: :math:`\tau \ge 1`, local steps per round (default 5, the papers').
    normalized: ``False`` (default, the printed algorithm): the literal weight
      :math:`\exp(f/\gamma)/\gamma` through the problem's outer function; ``True``: the
      normalised weights :math:`\exp(f/\gamma - L)` above; needs ``gamma``.
    gamma: the KL temperature :math:`\gamma > 0` of the client-level DRO problem; required
      with ``normalized=True`` and refused without it (the literal step reads the
      temperature from the problem's outer function).
    weighting: the prior of the client-level problem and the server's averaging weights:
      ``"uniform"`` (:math:`1/K`, the papers', default) or ``"samples"`` (the data sizes
      :math:`n_k/N`; then :math:`L = \log \sum_k p_k \exp(f_k/\gamma)`, see the module).
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="local"``) whose server averages the
    models; with ``normalized=True`` its plan has ``round_start=("log_normalizer",)``. In
    a user's own loop with ``normalized=True`` the caller plays the server: set
    ``log_normalizer`` with ``fedco.algorithms.set_fields`` before a round's updates.

  Raises:
    ValueError: if ``normalized`` is not a bool; ``gamma`` is missing or not positive with
      ``normalized=True``, or given without it; ``learning_rate``, ``local_steps`` or
      ``weighting`` is invalid; both ``learning_rate`` and an optax transform
      ``optimizer`` are given; or (at ``update``, normalised) the inner value is not a
      scalar loss and the problem has no ``outer_link``.

  Examples:
    One round of one client (:math:`\tau = 5` steps) on client-level KL-DRO at E1's
    :math:`\eta = 0.01`, :math:`\gamma = 0.2`; the client's loss :math:`g_k(x)` falls from
    0.5, by large steps while the weight :math:`\exp(l/\gamma)/\gamma` is large:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> loss = lambda x, example: 0.5 * jnp.sum((x - example["a"]) ** 2)
    >>> problem = fedco.problems.client_kl_dro(loss, gamma=0.2)  # f = exp(. / 0.2)
    >>> opt = fedco.comfedl(0.01, 5)
    >>> opt.problem_kind, opt.plan.local_steps, opt.plan.fields  # only the model is sent
    ('local', 5, ())
    >>> batch = {"a": jnp.array([[1.0, 0.0], [0.0, 1.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x)
    >>> losses = []
    >>> for _ in range(opt.plan.local_steps):
    ...   step, state = opt.update(None, state, x, **oracles)
    ...   x = optax.apply_updates(x, step)
    ...   losses.append(round(float(oracles["inner_fn"](x)), 4))
    >>> losses  # the minimum is 0.25
    [0.2882, 0.2738, 0.2653, 0.2601, 0.2567]
    >>> fedco.comfedl(0.01, 5, normalized=True, gamma=0.2).plan.round_start  # one float
    ('log_normalizer',)
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  if not isinstance(normalized, bool):
    raise ValueError(f"normalized must be a bool, got {normalized!r}")
  if normalized:
    gamma = _validate.positive("gamma", gamma)
  elif gamma is not None:
    raise ValueError(
      f"gamma={gamma!r} is only used with normalized=True (the literal step "
      "reads the temperature from the problem's outer function)"
    )
  if not normalized:
    plan = extend.make_plan(local_steps, weighting=weighting)
  else:

    def log_normalizer(losses, weights):
      """``log(sum_k w_k exp(f_k/gamma))`` over the surviving clients (``w`` sums to 1)."""
      return jax.nn.logsumexp(losses / gamma, b=weights)

    plan = extend.make_plan(
      local_steps,
      round_start=("log_normalizer",),
      at_init=(),
      round_start_reduce=log_normalizer,
      round_start_value="pre_link",
      weighting=weighting,
    )

  def init(params, *, inner_value=None):
    del inner_value
    if normalized:
      return NormalizedComFedLState(
        jnp.zeros([], jnp.int32), jnp.zeros([], jnp.result_type(float)), opt.init(params)
      )
    return ComFedLState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, unlinked_outer_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, _ = extend.oracles("comfedl", inner_fn, outer_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    if normalized and unlinked_outer_fn is not None:  # the loss inside the problem's link
      loss, grad_y = jax.value_and_grad(unlinked_outer_fn)(sample)
      weight = jnp.exp(loss / gamma - state.log_normalizer).astype(loss.dtype)
      z = extend.add_grads(pullback(jax.tree.map(lambda g: weight * g, grad_y)), updates)
      step, opt_state = opt.update(z, state.opt_state, params)
      return step, state._replace(count=state.count + 1, opt_state=opt_state)
    if normalized:
      leaves = jax.tree.leaves(sample)
      if (
        len(leaves) != 1 or jax.tree.structure(sample).num_nodes != 1 or jnp.shape(leaves[0]) != ()
      ):
        raise ValueError(
          "comfedl(normalized=True) needs a scalar inner value (the client's "
          "loss, as in fedco.problems.client_kl_dro) or a problem with an "
          "outer_link (DA-MAML), got an inner value of shapes "
          f"{jax.tree.map(jnp.shape, sample)} and no link"
        )
      weight = jnp.exp(sample / gamma - state.log_normalizer)
      z = extend.add_grads(pullback(weight.astype(sample.dtype)), updates)
      step, opt_state = opt.update(z, state.opt_state, params)
      return step, state._replace(count=state.count + 1, opt_state=opt_state)
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, sample), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, ComFedLState(state.count + 1, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "comfedl", "local")

r"""Write your own algorithm: the public pieces, and the contract they follow.

An algorithm is a factory decorated with :func:`factory` that returns an :class:`Algorithm`:
an ``optax.GradientTransformationExtraArgs`` (``init``, ``update``) plus a communication
plan (:func:`make_plan`), a server and a name. Written with this module alone, in your own
file, it runs everywhere a built-in one does: your own loop, ``optax.chain``,
:func:`fedco.inject_hyperparams`, :func:`fedco.simulate`, :func:`fedco.sweep`, a device
mesh, several processes, checkpoints, privacy and compression; and
:func:`fedco.testing.check_algorithm` checks it as fedco's own suite checks the built-ins.

A minimal algorithm (local SGD with server averaging; ``fedco.fedavg`` is the full one):

>>> import jax.numpy as jnp
>>> import optax
>>> from typing import NamedTuple, Optional
>>> import fedco
>>> from fedco import extend
>>>
>>> class State(NamedTuple):
...   count: jnp.ndarray
...   opt_state: optax.OptState
>>>
>>> @extend.factory(static=("local_steps", "optimizer"))
... def local_sgd(learning_rate: Optional[extend.ScalarOrSchedule] = None,
...               local_steps: int = 5, *, optimizer: extend.Optimizer = None):
...   opt = extend.param_optimizer(learning_rate, optimizer, default=0.1)
...
...   def init(params, *, inner_value=None):
...     del inner_value
...     return State(jnp.zeros([], jnp.int32), opt.init(params))
...
...   def update(updates, state, params=None, **unused):  # updates: grad h (plain problems)
...     step, opt_state = opt.update(updates, state.opt_state, params)
...     return step, State(state.count + 1, opt_state)
...
...   return extend.Algorithm(init, update, extend.make_plan(local_steps),
...                           extend.averaging_server(), "local_sgd", "plain")

It is an optax transform in your own loop (here on :math:`h(x) = \tfrac12 \lVert x \rVert^2`,
so ``grad h = x``), and it meets the contract fedco's algorithms meet
(:func:`fedco.testing.check_algorithm`; here its cheap checks):

>>> alg = local_sgd(0.5)
>>> params = jnp.array([1.0, -2.0])
>>> state = alg.init(params)
>>> for _ in range(3):
...   updates, state = alg.update(params, state, params)
...   params = optax.apply_updates(params, updates)
>>> params.tolist(), int(state.count)
([0.125, -0.25], 3)
>>> fedco.testing.check_algorithm(local_sgd, learning_rate=0.1, checks=("builds", "state"))
{'builds': 'passed', 'state': 'passed'}

What ``update`` receives: ``update(updates, state, params, **kwargs)``, where the runtime
(and :func:`fedco.testing.loop_reference`) passes these keyword arguments; your own loop
passes those its algorithm needs:

* ``updates`` is the gradient of the non-compositional term ``grad h(x; xi)`` (or ``None``
  when there is none); plain FedAvg steps on it alone.
* ``inner_fn(x)`` evaluates ``g(x; zeta)`` on this step's inner sample ``zeta`` at any point
  ``x``; the algorithm differentiates it with one ``jax.vjp``.
* ``outer_fn(y)`` evaluates ``f(y; xi)``; the algorithm takes its gradient.
* ``next_inner_fn(x)`` evaluates ``g(x; zeta')`` on an independent sample, used to refresh
  trackers at the new iterate (FedDRO, DS-FedDRO, FedAvg-CO). Defaults to ``inner_fn``.
* ``extra_fn(x)`` evaluates ``h(x; xi)`` (the loss value plain baselines report).
* ``round_key`` is a PRNG key shared by all clients of the round (DRFA's snapshot step).
* ``client_key`` is a PRNG key of this client's step: its own for every client, step and
  round, the same when a run is repeated or resumed (local noise, random choices).
* ``local_step`` is the step's index within the round, ``0 .. local_steps - 1`` (Ditto
  anchors its personal model to the model the round started from at step 0).
* ``example_losses_fn(x)`` gives the per-example values ``h(x; xi_i)`` of the outer batch
  and ``example_weights`` their batch weights; ``example_rows`` are the outer batch's
  global example ids (sample-reweighting baselines: FastDRO, primal-dual DRO).
* Unknown keyword arguments are accepted and ignored (optax's extra-args contract), so take
  ``**unused``.
* **Randomness** comes from ``client_key`` (each client's own) or ``round_key`` (shared by
  the round's clients); in your own loop, pass them yourself. Host randomness
  (``numpy.random``) breaks ``jax.jit``, and the ``jit`` check says so.

The client-state contract (what the runtime does with your state):

* **Per client, private.** Each client keeps its own copy of the whole state from round to
  round (stacked on a ``[K]`` axis; with ``fedco.runtime.distributed``, where its data
  live). Fields the plan does not name never leave the client: control variates,
  personal models, error-feedback memories, optimizer moments.
* **Broadcast and aggregated.** ``every_round`` fields are sent up with the model at the end
  of each round, combined by the server, and the server's value overwrites the field in
  every participating client's state at the start of its next round. ``every_step``
  fields are averaged over the round's clients after every local step (plain mean, no
  server transform). ``at_init`` fields are averaged over all clients once, before round 1
  (default: none; name only trackers that start from each client's own sample).
* **Recomputed.** ``round_start`` fields are set at the start of each round to the mean
  over the round's clients of ``g_k(x_bar)`` (or the plan's ``round_start_reduce``);
  ``round_start_loss`` fields to each client's exact loss at the server model.
* **Reported.** ``report`` fields are sent up at the end of a round for a
  :class:`ServerAggregator` to read (not broadcast back).
* **Fields are found by name** anywhere in the state (:func:`get_field`), so chains and
  injected hyperparameters keep working; keep plan field names unique in the state.
* **Uploading a change.** A client "sends a delta" by what it leaves in a broadcast field:
  the server sees ``server_value - weighted mean of the clients' values`` (an optax
  server gets it as the pseudo-gradient; :func:`optax_aggregator`), so a client that
  writes ``c + delta_c`` into the broadcast field ``c`` uploads ``delta_c``. Under
  compression and privacy that delta (from the server's copy) is what is encoded and
  clipped.
* **What a server sees.** An optax transform receives pseudo-gradients
  ``{"params": ..., field: ...}`` of the weighted mean; a :class:`ServerAggregator`
  receives every client's ``params``, ``every_round`` and ``report`` values stacked on a
  leading ``[m]`` axis and a :class:`RoundInfo` (the clients' ids, weights, data sizes,
  ``K``, who survived): what partial-participation scaling (SCAFFOLD's ``|S| / N``) reads.
* **Position in the round.** ``update`` receives ``local_step`` (``0 .. local_steps - 1``)
  from the runtime and ``None`` in a user's loop: use :func:`at_round_start` /
  :func:`at_round_end`, which fall back to the state's step count.
* **Dropout and stragglers.** A dropped client takes no step and its state is left as it
  was; its values do not count (weight 0). A straggler stops after fewer steps: its state
  after its last step is what it uploads, so compute an upload at every step (it is then
  right whenever the client stops) rather than only at :func:`at_round_end`.
* **Trackers of the inner value** (``y``, ``u``) have the inner value's structure, which
  ``params`` does not give: start them with ``pending_or(inner_value, fill)`` and call
  :func:`fill_pending` first in ``update``; the runtime fills them at ``init`` with
  :func:`init_trackers`, each with its ``fill`` (``lambda v: v`` starts at the inner value).
* **Arguments are checked** with :func:`positive`, :func:`bounded`, :func:`positive_int`,
  :func:`one_of` and :func:`rate`: a one-line ``ValueError`` naming the argument for a bad
  concrete value, NumPy scalars accepted, injected (traced) hyperparameters passed through.
* **State structure and dtypes stay fixed** across updates (a ``lax.scan`` carry);
  start every float field in the dtype ``update`` returns (``jnp.zeros_like(params)``,
  as optax writes it, not a Python ``0.0``). The runtime strong-types the params it is
  given (decision 96); in your own jitted loops, :func:`strong` params keep weak-typed
  ones (``jnp.full(shape, 0.1)``) from making ``zeros_like`` states weak until the first
  update, which compiles the step twice.

The pieces, by what they are for:

* **The algorithm and its factory.** :class:`Algorithm` (the transform, its plan, server,
  name and problem kind); :func:`factory` marks the structural arguments that
  :func:`fedco.inject_hyperparams` must keep static; :func:`register` adds a factory to
  ``fedco.ALGORITHMS`` (only needed for the experiment configs); :func:`param_optimizer`
  builds the parameter step from ``learning_rate`` and ``optimizer``.
* **Argument types.** ``ScalarOrSchedule`` (``optax.ScalarOrSchedule``) is the type of a
  ``learning_rate``: a number or an optax schedule ``step -> rate`` (check it with
  :func:`rate`). ``Optimizer`` (``Optional[Any]``) is the type of an ``optimizer=``
  argument: ``None`` (the paper's SGD), an optax transform with its own rate, or a factory
  of the learning rate such as ``optax.adam`` (:func:`param_optimizer` reads it). Both are
  ``typing`` aliases for annotations; :func:`factory` reads them: an argument annotated
  ``Optimizer`` (or ``int``) must be among its ``static`` arguments, which it checks.
* **The communication plan.** :func:`make_plan` builds a validated :class:`CommPlan` (which
  state fields are broadcast, averaged, recomputed or reported, and when); the runtime
  reads and writes those fields with :func:`get_field` / :func:`set_fields`.
* **The server.** :func:`averaging_server` (plain model averaging), any optax transform on
  the pseudo-gradient (:func:`optax_aggregator`), or a :class:`ServerAggregator` that sees
  every client's values and a :class:`RoundInfo`; :func:`as_aggregator` turns either into
  an aggregator, :func:`weighted_client_mean` averages stacked client values,
  :func:`project_simplex` keeps client weights on the simplex, and
  :class:`InjectedServerState` is the server state under injected hyperparameters.
* **Inside update.** :func:`oracles` and :func:`require` fetch the oracles a compositional
  ``update`` receives as keyword arguments (a clear error when one is missing);
  :func:`inner_vjp` and :func:`compositional_grad` compute
  :math:`J_g(x; \zeta)^\top \nabla f(y)` without forming :math:`J_g`, and :func:`add_grads`
  adds ``grad h``; :func:`at_round_start` / :func:`at_round_end` tell where the step is in
  the round and :func:`select` branches on it without Python control flow.
* **Trackers of the inner value.** :class:`Pending`, :func:`pending_or`,
  :func:`has_pending`, :func:`fill_pending` and :func:`init_trackers` (see the contract).
* **Checks and dtypes.** :func:`positive`, :func:`bounded`, :func:`positive_int`,
  :func:`one_of`, :func:`rate` for the factory's arguments; :func:`strong` for state built
  from params.
"""

from fedco._validate import bounded, one_of, positive, positive_int, rate
from fedco.algorithms.core.composition import InjectedServerState
from fedco.algorithms.core.fields import get_field, set_fields
from fedco.algorithms.core.registry import factory, register
from fedco.algorithms.core.servers import (
  RoundInfo,
  ServerAggregator,
  as_aggregator,
  averaging_server,
  optax_aggregator,
  project_simplex,
  weighted_client_mean,
)
from fedco.algorithms.core.steps import (
  add_grads,
  at_round_end,
  at_round_start,
  oracles,
  param_optimizer,
  require,
  select,
  strong,
)
from fedco.algorithms.core.trackers import (
  Pending,
  fill_pending,
  has_pending,
  init_trackers,
  pending_or,
)
from fedco.algorithms.core.types import (
  Algorithm,
  CommPlan,
  Optimizer,
  ScalarOrSchedule,
  make_plan,
)
from fedco.estimators import compositional_grad, inner_vjp

__all__ = [
  "bounded",
  "one_of",
  "positive",
  "positive_int",
  "rate",  # argument checks, one line each
  "Algorithm",
  "CommPlan",
  "InjectedServerState",
  "Optimizer",
  "Pending",
  "RoundInfo",
  "ScalarOrSchedule",
  "ServerAggregator",
  "add_grads",
  "as_aggregator",
  "at_round_end",
  "at_round_start",
  "averaging_server",
  "compositional_grad",
  "factory",
  "fill_pending",
  "get_field",
  "has_pending",
  "init_trackers",
  "inner_vjp",
  "make_plan",
  "optax_aggregator",
  "oracles",
  "param_optimizer",
  "pending_or",
  "project_simplex",
  "register",
  "require",
  "select",
  "set_fields",
  "strong",
  "weighted_client_mean",
]

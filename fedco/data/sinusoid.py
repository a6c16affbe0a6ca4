r"""Sinusoid meta-regression tasks (paper 003 Sec. 5.1, SPEC E3) as federated episodes.

A task is ``y = A sin(x + b pi / 5)`` with ``x ~ U[-5, 5]``. Training: the 25 tasks
``A, b in {1, ..., 5}`` are shuffled and split evenly over the clients (5 tasks each for 5
clients). Test: new tasks with ``A ~ U[0.1, 5]``, ``b ~ U[0, 5]`` (600 in the paper).

Layout (see :mod:`fedco.problems.maml`): a client's examples are **episodes**. An episode
holds all ``T`` of the client's tasks in fixed slots (slot ``t`` = the client's ``t``-th task,
its global id in ``task_id``), each with ``shots`` support points and ``query_shots`` query
points, and ``task_weight`` puts ``1/m`` on ``m`` tasks drawn without replacement (the
paper's 3 tasks per client per meta-iteration; 0 on the others). The runtime's batch
sampling (one episode per inner and one per outer batch, drawn uniformly with replacement
from the client's index row) therefore picks the meta-batch's tasks and a fresh draw of
shots.

Shots are **pre-drawn**: each client gets ``episodes_per_client`` independent episodes
(default 1000, more than the steps of a default E3 run draw, so repeats are rare), because
``FederatedData`` holds arrays and the runtime gathers rows by index. Everything is a
function of ``seed``.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Tuple

import numpy as np

from fedco.data.federated import FederatedData

AMPLITUDES = (1.0, 2.0, 3.0, 4.0, 5.0)
PHASES = (1.0, 2.0, 3.0, 4.0, 5.0)
X_RANGE = (-5.0, 5.0)
TEST_AMPLITUDE = (0.1, 5.0)
TEST_PHASE = (0.0, 5.0)


def sinusoid(x, amplitude, phase):
  """``A sin(x + b pi / 5)`` (broadcasting)."""
  return amplitude * np.sin(x + phase * np.pi / 5.0)


class ClientTasks(NamedTuple):
  """The training tasks of every client: ``[K, T]`` arrays (slot ``t`` of client ``k``)."""

  amplitude: np.ndarray
  phase: np.ndarray
  task_id: np.ndarray


def assign_tasks(
  num_clients: int = 5, seed: int = 0, amplitudes=AMPLITUDES, phases=PHASES
) -> ClientTasks:
  """The grid of ``len(amplitudes) * len(phases)`` tasks, shuffled and split evenly.

  Task ``i`` of the grid has amplitude ``amplitudes[i // len(phases)]`` and phase
  ``phases[i % len(phases)]``.

  Raises:
    ValueError: the number of tasks is not a positive multiple of ``num_clients``.
  """
  n_tasks = len(amplitudes) * len(phases)
  if (
    isinstance(num_clients, bool)
    or not isinstance(num_clients, (int, np.integer))
    or num_clients < 1
    or n_tasks % num_clients
  ):
    raise ValueError(
      f"num_clients must divide the {n_tasks} training tasks evenly, got {num_clients!r}"
    )
  grid_a = np.repeat(np.asarray(amplitudes, np.float32), len(phases))
  grid_b = np.tile(np.asarray(phases, np.float32), len(amplitudes))
  order = np.random.default_rng(seed).permutation(n_tasks).reshape(num_clients, -1)
  return ClientTasks(grid_a[order], grid_b[order], order.astype(np.int32))


def draw_points(rng: np.random.Generator, amplitude, phase, n: int):
  """``n`` points per task: ``x ~ U[-5, 5]``, shapes ``amplitude.shape + (n, 1)``."""
  amplitude = np.asarray(amplitude, np.float32)[..., None, None]
  phase = np.asarray(phase, np.float32)[..., None, None]
  x = rng.uniform(
    *X_RANGE, size=np.broadcast_shapes(amplitude.shape, phase.shape)[:-2] + (n, 1)
  ).astype(np.float32)
  return x, sinusoid(x, amplitude, phase).astype(np.float32)


def episodes(
  rng: np.random.Generator,
  amplitude,
  phase,
  task_id,
  count: int,
  *,
  shots: int = 10,
  query_shots: int = 10,
  tasks_per_step: int = 3,
) -> Dict[str, np.ndarray]:
  """``count`` episodes over one client's ``T`` tasks (leading axis ``count``).

  Returns a dict with ``support_x``, ``support_y`` ``[count, T, shots, 1]``, ``query_x``,
  ``query_y`` ``[count, T, query_shots, 1]``, ``task_weight`` ``[count, T]`` (``1/m`` on
  ``m = tasks_per_step`` tasks drawn without replacement) and ``task_id`` ``[count, T]``.
  """
  t = len(amplitude)
  if not 1 <= tasks_per_step <= t:
    raise ValueError(
      f"tasks_per_step must be in [1, {t}] (the client's tasks), got {tasks_per_step!r}"
    )
  a = np.broadcast_to(np.asarray(amplitude, np.float32), (count, t))
  b = np.broadcast_to(np.asarray(phase, np.float32), (count, t))
  sx, sy = draw_points(rng, a, b, shots)
  qx, qy = draw_points(rng, a, b, query_shots)
  picks = np.argsort(rng.random((count, t)), axis=1)[:, :tasks_per_step]
  weight = np.zeros((count, t), np.float32)
  np.put_along_axis(weight, picks, 1.0 / tasks_per_step, axis=1)
  ids = np.broadcast_to(np.asarray(task_id, np.int32), (count, t)).copy()
  return {
    "support_x": sx,
    "support_y": sy,
    "query_x": qx,
    "query_y": qy,
    "task_weight": weight,
    "task_id": ids,
  }


def federated(
  seed: int = 0,
  *,
  num_clients: int = 5,
  episodes_per_client: int = 1000,
  shots: int = 10,
  query_shots: int = 10,
  tasks_per_step: int = 3,
) -> Tuple[FederatedData, ClientTasks]:
  """E3's training clients: the task split and ``episodes_per_client`` episodes each."""
  for name, value in (
    ("episodes_per_client", episodes_per_client),
    ("shots", shots),
    ("query_shots", query_shots),
  ):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  tasks = assign_tasks(num_clients, seed)
  rng = np.random.default_rng([seed, 1])
  clients = [
    episodes(
      rng,
      tasks.amplitude[k],
      tasks.phase[k],
      tasks.task_id[k],
      episodes_per_client,
      shots=shots,
      query_shots=query_shots,
      tasks_per_step=tasks_per_step,
    )
    for k in range(num_clients)
  ]
  return FederatedData.from_clients(clients), tasks


def training_eval_episode(
  tasks: ClientTasks, seed: int = 0, *, repeats: int = 4, shots: int = 10, query_shots: int = 10
) -> Dict[str, np.ndarray]:
  """One evaluation episode over every training task, ``repeats`` fresh draws each
  (``T = K * T_k * repeats`` slots in task-id order, uniform weights): the post-adaptation
  training MSE. The draws depend on ``seed`` only, not on how tasks are split over clients."""
  order = np.argsort(tasks.task_id.reshape(-1), kind="stable")  # independent of the split
  a = np.tile(tasks.amplitude.reshape(-1)[order], repeats)
  b = np.tile(tasks.phase.reshape(-1)[order], repeats)
  ids = np.tile(tasks.task_id.reshape(-1)[order], repeats)
  rng = np.random.default_rng([seed, 2])
  sx, sy = draw_points(rng, a, b, shots)
  qx, qy = draw_points(rng, a, b, query_shots)
  return {
    "support_x": sx,
    "support_y": sy,
    "query_x": qx,
    "query_y": qy,
    "task_weight": np.full(a.shape, 1.0 / a.size, np.float32),
    "task_id": ids,
  }


def unseen_tasks(
  seed: int = 0, *, num_tasks: int = 600, shots: int = 10, query_shots: int = 10
) -> Dict[str, Any]:
  """``num_tasks`` unseen tasks (``A ~ U[0.1, 5]``, ``b ~ U[0, 5]``) as one episode with
  uniform weights, plus their ``amplitude`` and ``phase``."""
  if isinstance(num_tasks, bool) or not isinstance(num_tasks, (int, np.integer)) or num_tasks < 1:
    raise ValueError(f"num_tasks must be an integer >= 1, got {num_tasks!r}")
  rng = np.random.default_rng([seed, 3])
  a = rng.uniform(*TEST_AMPLITUDE, size=num_tasks).astype(np.float32)
  b = rng.uniform(*TEST_PHASE, size=num_tasks).astype(np.float32)
  sx, sy = draw_points(rng, a, b, shots)
  qx, qy = draw_points(rng, a, b, query_shots)
  return {
    "support_x": sx,
    "support_y": sy,
    "query_x": qx,
    "query_y": qy,
    "task_weight": np.full((num_tasks,), 1.0 / num_tasks, np.float32),
    "amplitude": a,
    "phase": b,
  }

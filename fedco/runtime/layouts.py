"""Client layouts: where a round's clients sit and what each client slot reads.

A round runs ``S`` client *slots* side by side (``vmap``, laid along the mesh's clients axis
when there is one). A layout decides which client each slot holds and how it reaches its
data, as a :class:`~fedco.runtime.batching.ClientView` per slot:

* :class:`Compact` (any :class:`~fedco.data.FederatedData`): the ``m`` sampled clients fill
  the first ``m`` slots; with a mesh, ``m`` is rounded up to a multiple of the clients axis
  by padding slots that hold the out-of-range id ``K`` (they read a clipped real client's
  rows, weigh 0 in every average and their writes are dropped). Every slot reads the one
  replicated example array through its slice of the row list.
* :class:`Resident` (:class:`~fedco.data.blocks.ClientBlockData` from
  :func:`fedco.runtime.distributed.global_data`): slot ``i`` is client ``i``'s block, on the
  device that holds it; unsampled clients are masked like padding instead of moved.
"""

from __future__ import annotations

from typing import Callable, Tuple

import jax
import jax.numpy as jnp

from fedco.data.blocks import ClientBlockData
from fedco.data.federated import FederatedData
from fedco.runtime.batching import ClientView
from fedco.runtime.mesh import CLIENTS, client_vmap, place, replicated


def for_data(data: FederatedData, clients_per_round: int, mesh):
  """The layout for ``data``: resident for client blocks, compact otherwise."""
  if isinstance(data, ClientBlockData):
    if mesh is not None and data.num_blocks % mesh.shape[CLIENTS]:
      raise ValueError(
        f"data has {data.num_blocks} client blocks, not a multiple of the "
        f"mesh's {mesh.shape[CLIENTS]} {CLIENTS!r} positions; build it with "
        "fedco.runtime.distributed.global_data on the same mesh"
      )
    if mesh is not None and any(
      isinstance(getattr(leaf, "sharding", None), jax.sharding.NamedSharding)
      and leaf.sharding.mesh != mesh
      for leaf in jax.tree.leaves(data.examples)
    ):
      raise ValueError(
        "data's examples are laid out on another mesh than mesh=; build them "
        "with fedco.runtime.distributed.global_data on the same mesh"
      )
    return Resident(data.num_clients, clients_per_round, mesh, data.max_count, data.num_blocks)
  return Compact(data.num_clients, clients_per_round, mesh, data.max_count)


class Compact:
  """The sampled clients gathered into ``m`` slots (padded to the mesh); see the module."""

  resident = False

  def __init__(self, num_clients: int, clients_per_round: int, mesh, max_count: int):
    self.num_clients, self.clients_per_round = num_clients, clients_per_round
    self.mesh, self.max_count = mesh, max_count
    d = 1 if mesh is None else mesh.shape[CLIENTS]
    self.slots = -(-clients_per_round // d) * d
    self.direct = self.slots == num_clients == clients_per_round  # no gather needed

  def place_data(self, data):
    """Host side, once: the data replicated over the mesh (same input shardings each run)."""
    return data if self.mesh is None else jax.device_put(data, replicated(self.mesh))

  def init_views(self, data) -> Tuple[jax.Array, ClientView]:
    """Every client's view, for the initial states: ``(ids, views)``."""
    return jnp.arange(self.num_clients), ClientView(
      data.examples, data.offsets, data.counts, data.flat_rows
    )

  def cut(self, tree):
    """Slot values -> one per client (nothing to cut in this layout)."""
    return tree

  def map(self, fn: Callable) -> Callable:
    """``vmap`` of ``fn(id_or_key, view)`` over slots (the examples are not mapped)."""
    return jax.vmap(fn, in_axes=(0, VIEW_COMPACT))

  def step_map(self, fn: Callable, num_mapped_before: int) -> Callable:
    """``vmap`` of a client step ``fn(*unmapped, *mapped, view)`` along the mesh."""
    return client_vmap(fn, self.mesh, (None,) * 2 + (0,) * num_mapped_before + (VIEW_COMPACT,))

  def round_slots(self, real: jax.Array):
    """``(ids, mask, pick)``: each slot's client (``K`` on padding), which slots hold a
    sampled client, and how to select the sampled clients' values from slot values."""
    n, m = self.num_clients, self.clients_per_round
    ids = jnp.concatenate([real, jnp.full((self.slots - m,), n, real.dtype)])
    return ids, jnp.arange(self.slots) < m, lambda a: a[:m]

  def take(self, tree, ids):
    """Per-client values (leading axis ``K``) -> per-slot values."""
    return (
      tree if self.direct else jax.tree.map(lambda a: jnp.take(a, ids, axis=0, mode="clip"), tree)
    )

  def views(self, data, ids) -> ClientView:
    """The round's slot views (clients ``ids``), laid along the mesh."""
    start, count = place((self.take(data.offsets, ids), self.take(data.counts, ids)), self.mesh)
    return ClientView(data.examples, start, count, data.flat_rows)

  def client_losses(self, data, fn, ids):
    """``fn(k, view)`` for each listed client ``k``."""
    return self.map(fn)(
      ids, ClientView(data.examples, data.offsets[ids], data.counts[ids], data.flat_rows)
    )


class Resident(Compact):
  """One slot per client block, on the device that holds it; see the module."""

  resident = True

  def __init__(
    self, num_clients: int, clients_per_round: int, mesh, max_count: int, num_blocks: int
  ):
    super().__init__(num_clients, clients_per_round, mesh, max_count)
    self.slots = num_blocks
    self.direct = self.slots == num_clients == clients_per_round

  def place_data(self, data):
    return data  # the blocks stay where global_data put them

  def _block_views(self, data) -> Tuple[jax.Array, ClientView]:
    """``(ids, views)`` of every block: ``ids`` are the slots' clients (``K`` on padding
    blocks), each view is the block ``[max_count, ...]`` (a reshape of the sharded rows: no
    data moves) read by position (a padding block reads its own rows with client
    ``K - 1``'s count and weight 0), and ``id_offset`` is the compact id of the client's
    first example (``sum(counts[:k])``), so the example ids an algorithm sees are a
    one-process run's (primal-dual DRO keeps a weight per id)."""
    n, rows, b = self.num_clients, self.max_count, self.slots
    ids = jnp.minimum(jnp.arange(b), n)
    real = jnp.minimum(ids, n - 1)
    blocks = jax.tree.map(lambda a: a.reshape((b, rows) + a.shape[1:]), data.examples)
    counts = data.counts.astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    blocks, count, offset = place(
      (blocks, jnp.take(data.counts, real), jnp.take(starts, real)), self.mesh
    )
    return ids, ClientView(blocks, jnp.zeros([], jnp.int32), count, None, offset)

  def init_views(self, data):
    return self._block_views(data)

  def cut(self, tree):
    return jax.tree.map(lambda a: a[: self.num_clients], tree)

  def map(self, fn):
    return client_vmap(fn, self.mesh, (0, _VIEW_RESIDENT))

  def step_map(self, fn, num_mapped_before):
    return client_vmap(fn, self.mesh, (None,) * 2 + (0,) * num_mapped_before + (_VIEW_RESIDENT,))

  def round_slots(self, real):
    n, m = self.num_clients, self.clients_per_round
    ids = jnp.minimum(jnp.arange(self.slots), n)
    if m == n:
      return ids, ids < n, lambda a: a[:m]
    mask = jnp.zeros((self.slots,), bool).at[real].set(True)
    return ids, mask, lambda a: jnp.take(a, real, axis=0)

  def views(self, data, ids):
    return self._block_views(data)[1]

  def client_losses(self, data, fn, ids):
    """Every block answers on its own device, then the listed clients' answers are kept."""
    slot_ids, views = self._block_views(data)
    return jnp.take(self.map(fn)(slot_ids, views), ids, axis=0, mode="clip")


# vmap axes of a ClientView: compact slots share the examples and the row list.
# (jax's in_axes pytree convention: the fields hold axes, not the arrays they are typed as)
VIEW_COMPACT = ClientView(None, 0, 0, None, None)  # type: ignore[arg-type]
_VIEW_RESIDENT = ClientView(0, None, 0, None, 0)  # type: ignore[arg-type]

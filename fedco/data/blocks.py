"""Client-block data: every client's examples in its own fixed-size block of rows, so a block
can live on the device (and process) that trains the client. Built by
:func:`fedco.runtime.distributed.global_data`."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedco.data.federated import FederatedData


@functools.partial(
  jax.tree_util.register_dataclass,
  data_fields=["examples", "counts", "offsets", "flat_rows", "flat_owner"],
  meta_fields=["max_count"],
)
@dataclasses.dataclass(frozen=True)
class ClientBlockData(FederatedData):
  """:class:`~fedco.data.FederatedData` in client-block layout (see :func:`global_data`).

  ``examples`` leaves have ``num_blocks * max_count`` rows; client ``k`` owns rows
  ``[k * max_count, k * max_count + counts[k])`` (``offsets[k] = k * max_count``).
  Rows past a client's count, and blocks ``>= num_clients``, are padding. ``flat_rows`` is
  every row (``arange``) and ``flat_owner`` is ``num_clients`` on padding rows, so segment sums
  drop them and :meth:`flat_weights` gives them weight 0. The simulator recognises this type
  and never moves a block off the device that holds it.
  """

  @property
  def num_blocks(self) -> int:
    return self.num_examples // self.max_count

  def _owner_labels(self) -> jax.Array:
    """Each row's client index for :meth:`FederatedData.with_owner`, laid out like the
    examples and derived from the layout alone (row ``r`` is in block ``r // max_count``),
    so each device builds its own shard and nothing crosses processes. Padding rows of a
    client's block carry that client; rows of padding blocks carry ``num_clients - 1`` (a
    valid index; they are never drawn and weigh 0 in evaluation)."""
    rows, block, last = self.num_examples, self.max_count, self.num_clients - 1
    sharding = jax.tree.leaves(self.examples)[0].sharding

    def callback(index):
      start, stop, _ = index[0].indices(rows)
      return np.minimum(np.arange(start, stop) // block, last).astype(np.int32)

    return jax.make_array_from_callback((rows,), sharding, callback)

  def flat_weights(self) -> jax.Array:
    """``1/n_owner`` on real rows, 0 on padding rows."""
    n = self.num_clients
    owner = jnp.minimum(self.flat_owner, n - 1)
    return jnp.where(
      self.flat_owner < n, 1.0 / self.counts[owner].astype(jnp.result_type(float)), 0.0
    )

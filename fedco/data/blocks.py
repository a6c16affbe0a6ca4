"""Client-block data: every client's examples in its own fixed-size block of rows.

A block can then live on the device (and process) that trains the client, for multi-device
and multi-process runs. Built by :func:`fedco.runtime.distributed.global_data`.
"""

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
  """:class:`~fedco.FederatedData` in client-block layout, for sharding over devices.

  Made by :func:`fedco.runtime.distributed.global_data` from each process's own clients, not
  by hand. ``examples`` leaves have ``num_blocks * max_count`` rows; client ``k`` owns rows
  ``[k * max_count, k * max_count + counts[k])`` (``offsets[k] = k * max_count``).
  Rows past a client's count, and blocks ``>= num_clients``, are padding. ``flat_rows`` is
  every row (``arange``) and ``flat_owner`` is ``num_clients`` on padding rows, so segment sums
  drop them and :meth:`flat_weights` gives them weight 0. The simulator recognises this type
  and never moves a block off the device that holds it.

  Attributes:
    examples: pytree of arrays with ``num_blocks * max_count`` rows, sharded over the mesh's
      client axis.
    counts: ``int32 [K]``, each client's real rows.
    offsets: ``int32 [K]``, ``k * max_count``.
    flat_rows: ``int32 [num_blocks * max_count]``, every row (``arange``).
    flat_owner: ``int32 [num_blocks * max_count]``, each row's client; ``K`` on padding.
    max_count: the block size, the largest client's size.

  Examples:
    Two clients of 3 and 1 examples on a one-device mesh: client 1's block has two padding
    rows, which carry owner ``K = 2``.

    >>> import numpy as np
    >>> import fedco
    >>> clients = [{"x": np.ones((3, 2), np.float32)}, {"x": np.ones((1, 2), np.float32)}]
    >>> mesh = fedco.runtime.client_mesh(1)
    >>> data = fedco.runtime.distributed.global_data(clients, num_clients=2, mesh=mesh)
    >>> type(data).__name__, data.num_blocks, data.examples["x"].shape
    ('ClientBlockData', 2, (6, 2))
    >>> data.offsets.tolist(), data.flat_owner.tolist()
    ([0, 3], [0, 0, 0, 1, 2, 2])
  """

  @property
  def num_blocks(self) -> int:
    """The number of blocks (``>= num_clients``; the extra ones are padding)."""
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
    """Weights of the flat pairs: ``1/n_owner`` on real rows, 0 on padding rows.

    Returns:
      ``float [num_blocks * max_count]`` (the default float dtype).
    """
    n = self.num_clients
    owner = jnp.minimum(self.flat_owner, n - 1)
    return jnp.where(
      self.flat_owner < n, 1.0 / self.counts[owner].astype(jnp.result_type(float)), 0.0
    )

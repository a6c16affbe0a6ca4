"""Mean-variance portfolio (SPEC 4.7, paper 004 Sec. 2.1): a small, exactly solvable problem.

Each example is a vector of asset returns ``r``. With ``a = E[r^T x]`` and ``b = E[(r^T x)^2]``,

    g(x) = (a, b),      f(a, b) = -a + lam (b - a^2),

so ``Phi(x) = -mu^T x + lam x^T C x`` with ``mu = E r`` and ``C = E r r^T - mu mu^T``; its unique
stationary point (``C`` positive definite) is ``x* = C^{-1} mu / (2 lam)``. The problem is
global-inner: the expectation is over every client's returns, ``g = 1/K sum_k g_k``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from fedco.problems import base


def portfolio(lam: float = 1.0, *, kind: str = "global") -> base.Problem:
  """The mean-variance portfolio problem; examples are ``{"r": returns[d]}``.

  Args:
    lam: risk aversion ``lam > 0``.
    kind: ``"global"`` (the paper's federated form) or ``"local"`` (each client its own
      portfolio, ``1/K sum_k f(g_k(x))``).
  """
  if not lam > 0:
    raise ValueError(f"lam must be > 0, got {lam!r}")

  def inner(x, example):
    ret = jnp.dot(example["r"], x)
    return jnp.stack([ret, ret * ret])

  def outer(y):
    a, b = y[0], y[1]
    return -a + lam * (b - a * a)

  return base.Problem(inner, outer, None, kind, False, "portfolio")


def stationary_point(client_returns, lam: float = 1.0) -> np.ndarray:
  """``x* = C^{-1} mu / (2 lam)`` of the global-inner portfolio, in float64.

  Args:
    client_returns: a list with one ``[n_k, d]`` array of returns per client; clients count
      equally (``g = 1/K sum_k g_k``), whatever their sizes.
    lam: risk aversion.
  """
  rs = [np.asarray(r, np.float64) for r in client_returns]
  mu = np.mean([r.mean(0) for r in rs], axis=0)
  second = np.mean([r.T @ r / len(r) for r in rs], axis=0)
  cov = second - np.outer(mu, mu)
  return np.linalg.solve(cov, mu) / (2.0 * lam)

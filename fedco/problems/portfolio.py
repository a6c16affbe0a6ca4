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

from fedco import _validate
from fedco.problems import base


def portfolio(lam: float = 1.0, *, kind: str = "global") -> base.Problem:
  r"""The mean-variance portfolio (SPEC 4.7, paper 004 Sec. 2.1), a small solvable problem.

  Each example is a vector of asset returns :math:`r \in \mathbb{R}^d` and the parameters
  are the holdings :math:`x \in \mathbb{R}^d`. Per example,
  ``inner(x, example) -> [2]`` is :math:`g(x; r) = (r^\top x, (r^\top x)^2)` and the
  deterministic ``outer(y) -> scalar`` is :math:`f(a, b) = -a + \lambda (b - a^2)`, so

  .. math::

    \Phi(x) = f(\mathbb{E}[r^\top x], \mathbb{E}[(r^\top x)^2])
    = -\mu^\top x + \lambda\, x^\top C x,
    \qquad \mu = \mathbb{E}\, r, \quad C = \mathbb{E}\, r r^\top - \mu \mu^\top,

  the expected return minus :math:`\lambda` times its variance. With :math:`C` positive
  definite its unique stationary point is :math:`x^* = C^{-1} \mu / (2 \lambda)`
  (:func:`portfolio_stationary_point`). In the global-inner form the expectations are over
  every client's returns, :math:`g = \frac{1}{K} \sum_k g_k` (clients count equally); the
  variance term makes :math:`f` nonlinear, so averaging clients' own objectives is a
  different problem.

  Args:
    lam: the risk aversion :math:`\lambda > 0`; default 1.
    kind: ``"global"`` (the default; the paper's federated form) or ``"local"`` (each client
      its own portfolio, :math:`\frac{1}{K} \sum_k f(g_k(x))`).

  Returns:
    A :class:`Problem` named ``"portfolio"`` whose examples are ``{"r": float [d]}``.

  Raises:
    ValueError: if ``lam`` is not ``> 0`` or ``kind`` is not ``"global"`` or ``"local"``.

  Examples:
    Two clients of three return vectors each; the gradient vanishes at
    :func:`portfolio_stationary_point`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> returns = [
    ...   np.array([[0.1, 0.0], [0.3, 0.1], [0.2, -0.1]]),
    ...   np.array([[0.0, 0.2], [0.1, 0.4], [0.2, 0.0]]),
    ... ]
    >>> examples = {"r": jnp.asarray(np.concatenate(returns), jnp.float32)}
    >>> owner, weights = jnp.array([0, 0, 0, 1, 1, 1]), jnp.full((6,), 1 / 3)
    >>> problem = fedco.problems.portfolio(lam=1.0)
    >>> objective = lambda x: problem.evaluate(x, examples, owner, weights, num_clients=2)[0]
    >>> x_star = fedco.problems.portfolio_stationary_point(returns, lam=1.0)
    >>> value, grad = jax.jit(jax.value_and_grad(objective))(jnp.asarray(x_star, jnp.float32))
    >>> print(round(float(value), 4), bool(jnp.abs(grad).max() < 1e-4))
    -1.1146 True
  """
  _validate.positive("lam", lam)  # finite and > 0 (lam=inf has no stationary point)

  def inner(x, example):
    ret = jnp.dot(example["r"], x)
    return jnp.stack([ret, ret * ret])

  def outer(y):
    a, b = y[0], y[1]
    return -a + lam * (b - a * a)

  return base.Problem(inner, outer, None, kind, False, "portfolio")


def stationary_point(client_returns, lam: float = 1.0) -> np.ndarray:
  r"""The exact solution :math:`x^* = C^{-1} \mu / (2 \lambda)` of the global-inner portfolio.

  The stationary point of :func:`portfolio`'s :math:`\Phi(x) = -\mu^\top x + \lambda\,
  x^\top C x`, computed in float64 NumPy with :math:`\mu = \frac{1}{K} \sum_k \bar r_k`
  and :math:`C = \frac{1}{K} \sum_k \overline{r r^\top}_k - \mu \mu^\top` (each client's
  own means, then the mean over clients: the global-inner weighting). The reference a
  federated run's iterates are compared with; it does not apply to ``kind="local"``.

  Args:
    client_returns: a list with one ``[n_k, d]`` array of returns per client; clients count
      equally (:math:`g = \frac{1}{K} \sum_k g_k`), whatever their sizes.
    lam: the risk aversion :math:`\lambda > 0`; default 1.

  Returns:
    A float64 ``np.ndarray`` of shape ``[d]``.

  Raises:
    numpy.linalg.LinAlgError: if :math:`C` is exactly singular. :math:`C` needs the return
      vectors to span :math:`\mathbb{R}^d` affinely (at least :math:`d + 1` of them); a
      :math:`C` that is singular only up to round-off is not detected and gives a
      meaningless, huge :math:`x^*`.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> returns = [
    ...   np.array([[0.1, 0.0], [0.3, 0.1], [0.2, -0.1]]),
    ...   np.array([[0.0, 0.2], [0.1, 0.4], [0.2, 0.0]]),
    ... ]
    >>> x_star = fedco.problems.portfolio_stationary_point(returns, lam=1.0)
    >>> print(x_star.dtype, np.round(x_star, 4).tolist())
    float64 [11.6667, 4.7917]
    >>> print(np.round(fedco.problems.portfolio_stationary_point(returns, lam=2.0), 4).tolist())
    [5.8333, 2.3958]
  """
  rs = [np.asarray(r, np.float64) for r in client_returns]
  mu = np.mean([r.mean(0) for r in rs], axis=0)
  second = np.mean([r.T @ r / len(r) for r in rs], axis=0)
  cov = second - np.outer(mu, mu)
  return np.linalg.solve(cov, mu) / (2.0 * lam)

"""Problems: pure per-example inner, outer and extra functions (SPEC sections 0 and 4)."""

from fedco.problems.base import Problem, global_inner, local_inner, plain, weighted_mean
from fedco.problems.dro import client_kl_dro, kl_dro_value, kl_dro_weights, log_exp_form_value
from fedco.problems.portfolio import portfolio, stationary_point as portfolio_stationary_point

__all__ = [
    "Problem", "global_inner", "local_inner", "plain", "weighted_mean",
    "client_kl_dro", "kl_dro_value", "kl_dro_weights", "log_exp_form_value",
    "portfolio", "portfolio_stationary_point",
]

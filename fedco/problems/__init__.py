"""Problems: pure per-example inner, outer and extra functions (SPEC sections 0 and 4)."""

from fedco.problems.base import Problem, global_inner, local_inner, plain, weighted_mean
from fedco.problems.dro import (
  chi2_dro_value,
  client_kl_dro,
  client_kl_dro_log,
  kl_dro_value,
  kl_dro_weights,
  log_exp_form_value,
  sample_chi2_dro,
  sample_kl_dro,
  sample_kl_dro_value,
)
from fedco.problems.fairness import fairness_problem
from fedco.problems.fairness import group_metrics as fairness_metrics
from fedco.problems.maml import MAML, da_maml, da_maml_value, maml
from fedco.problems.personalized import personalized_maml
from fedco.problems.portfolio import portfolio
from fedco.problems.portfolio import stationary_point as portfolio_stationary_point

__all__ = [
  "personalized_maml",
  "MAML",
  "da_maml",
  "da_maml_value",
  "maml",
  "fairness_problem",
  "fairness_metrics",
  "Problem",
  "global_inner",
  "local_inner",
  "plain",
  "weighted_mean",
  "client_kl_dro",
  "client_kl_dro_log",
  "kl_dro_value",
  "kl_dro_weights",
  "log_exp_form_value",
  "sample_kl_dro",
  "sample_kl_dro_value",
  "sample_chi2_dro",
  "chi2_dro_value",
  "portfolio",
  "portfolio_stationary_point",
]

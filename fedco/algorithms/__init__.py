"""fedco algorithms: optax-style client transforms with a communication plan and a server."""

from fedco.algorithms.base import (Algorithm, CommPlan, InjectedServerState, Pending,
                                   RoundInfo, ServerAggregator, averaging_server, chain,
                                   get_field, init_trackers, inject_hyperparams, make_plan,
                                   named_chain, project_simplex, set_fields)
from fedco.algorithms.comfedl import comfedl
from fedco.algorithms.fedavg import fedavg, fedavg_co, mbsgd
from fedco.algorithms.feddro import ds_feddro, feddro
from fedco.algorithms.gcivr import gcivr
from fedco.algorithms.meta import ditto, fedmaml, per_fedavg, tr_maml
from fedco.algorithms.moml import local_moml
from fedco.algorithms.robust import afl, drfa, qfedavg
from fedco.algorithms.sample_dro import fastdro, primal_dual_dro
from fedco.algorithms.scgd import local_scgd, local_scgdm

__all__ = [
    "fastdro", "primal_dual_dro",
    "per_fedavg", "fedmaml", "tr_maml", "ditto",
    "local_moml", "gcivr", "Algorithm", "CommPlan", "RoundInfo", "ServerAggregator",
    "averaging_server", "make_plan", "project_simplex", "chain", "named_chain",
    "inject_hyperparams", "init_trackers", "get_field", "set_fields", "Pending",
    "InjectedServerState", "afl", "drfa", "qfedavg", "comfedl",
    "fedavg", "fedavg_co", "mbsgd", "ds_feddro", "feddro", "local_scgd", "local_scgdm",
]

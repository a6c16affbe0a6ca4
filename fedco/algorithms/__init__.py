"""fedco algorithms: optax-style client transforms with a communication plan and a server."""

from fedco.algorithms.base import Algorithm, CommPlan, averaging_server, make_plan
from fedco.algorithms.comfedl import comfedl
from fedco.algorithms.fedavg import fedavg, fedavg_co, mbsgd
from fedco.algorithms.feddro import ds_feddro, feddro
from fedco.algorithms.scgd import local_scgd, local_scgdm

__all__ = [
    "Algorithm", "CommPlan", "averaging_server", "make_plan",
    "comfedl", "fedavg", "fedavg_co", "mbsgd", "ds_feddro", "feddro", "local_scgd", "local_scgdm",
]

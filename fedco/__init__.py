"""fedco: federated compositional optimization in JAX.

Algorithms are optax-style transformations with a communication plan and a server
transform; the runtime simulates many clients in one jitted program.
"""

from fedco import (algorithms, compression, data, estimators, metrics, models, privacy,
                   problems, runtime)
from fedco.algorithms import (Algorithm, CommPlan, afl, chain, comfedl, drfa, ds_feddro,
                              fedavg, fedavg_co, feddro, gcivr, init_trackers,
                              inject_hyperparams, local_moml, local_scgd, local_scgdm, mbsgd,
                              named_chain, qfedavg, fastdro, primal_dual_dro)
from fedco.algorithms import ditto, fedmaml, per_fedavg, tr_maml
from fedco.data import FederatedData
from fedco.problems import Problem, global_inner, local_inner, plain
from fedco.runtime import Simulator, SimulationResult, SweepResult, oracle_args, simulate, sweep

__version__ = "0.2.0"

ALGORITHMS = {
    "comfedl": comfedl,
    "local_scgd": local_scgd,
    "local_scgdm": local_scgdm,
    "fedavg": fedavg,
    "fedavg_co": fedavg_co,
    "mbsgd": mbsgd,
    "feddro": feddro,
    "ds_feddro": ds_feddro,
    "qfedavg": qfedavg,
    "drfa": drfa,
    "afl": afl,
    "gcivr": gcivr,
    "local_moml": local_moml,
    "fastdro": fastdro,
    "primal_dual_dro": primal_dual_dro,
    "per_fedavg": per_fedavg,
    "fedmaml": fedmaml,
    "tr_maml": tr_maml,
    "ditto": ditto,
}

__all__ = [
    "per_fedavg", "fedmaml", "tr_maml", "ditto",
    "fastdro", "primal_dual_dro",
    "local_moml", "gcivr", "algorithms", "compression", "privacy", "data", "estimators",
    "problems", "runtime",
    "Algorithm", "CommPlan", "comfedl", "ds_feddro", "fedavg", "fedavg_co", "feddro",
    "local_scgd", "local_scgdm", "mbsgd", "qfedavg", "drfa", "afl", "FederatedData",
    "Problem", "global_inner", "local_inner", "plain", "Simulator", "SimulationResult",
    "oracle_args", "simulate", "ALGORITHMS", "chain", "named_chain", "inject_hyperparams",
    "init_trackers", "sweep", "SweepResult",
]

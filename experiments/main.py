r"""The one driver of every experiment: a config file and ``--config.<field>=`` overrides.

    python -m experiments.main --config=experiments/configs/dro_fl.py --workdir=runs/e1
    python -m experiments.main --config=experiments/configs/dro_fl_grid.py --workdir=runs/e1g
    python -m experiments.main --config=experiments/configs/adult_dro_converged.py \
        --config.seeds=0, --workdir=runs/adult_converged

Every config field can be overridden (nested: ``--config.methods.qfedavg.q=1``; every
method's ``learning_rate`` and ``local_steps`` too). The flags below decide how a run goes,
never its numbers: rerunning a command resumes its runs from their checkpoints in
``--workdir``. Bad input is one ``error:`` line (exit status 1); Ctrl-C stops after the
running chunk of rounds, checkpointed, with one line (exit status 130); a Ctrl-C while the
driver starts (seconds of imports) is one line and exit status 130 too.
"""

import os
import signal
import sys


def _starting(signum, frame):  # Ctrl-C during the imports below: nothing has run yet
  os.write(2, b"interrupted while starting, before anything ran; nothing was written\n")
  os._exit(130)


if __name__ == "__main__":
  # Only in place of Python's default handler: Ctrl-C ignored (a background job) or a
  # handler of the caller's stays as it is (decision 98).
  before = signal.getsignal(signal.SIGINT)
  if before is signal.default_int_handler:
    signal.signal(signal.SIGINT, _starting)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if not __package__:  # run as a file (python experiments/main.py): the configs import it
    sys.path.insert(0, root)
  from fedco import _startup
  from fedco.experiment import cli

  _startup.hand_over(_starting, before)  # cli.main's _startup.end() restores `before`
  cli.run(config_dir=os.path.join(root, "experiments", "configs"))

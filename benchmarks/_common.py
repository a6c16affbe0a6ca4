"""Shared pieces of the benchmark programs (no flags are defined here).

The logistic workload of ``benchmarks.logistic_loop`` (E1-shaped: multinomial logistic
regression 784 -> 10 on synthetic MNIST-shaped data), its problems and algorithms, machine
information for the JSON, a compilation counter and the timing helpers.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedco

NUM_CLASSES = 10
GAMMA = 0.2  # client-level KL-DRO regularisation (ComFedL, Local-SCGDM)
LAM = 1.0  # sample-level KL-DRO temperature (FedDRO)

# Hyperparameters of the E1 logistic workload, per algorithm. The exp-form step of ComFedL
# and Local-SCGDM is exp(l/0.2)/0.2 * grad l ~ 5e5 grad l at l ~ log 10, so their rates are
# tiny (see benchmarks/README.md, logistic_loop): 5e-9 stays finite and lowers the loss.
HYPER = {
  "fedavg": {"learning_rate": 0.05},
  "comfedl": {"learning_rate": 5e-9, "gamma": GAMMA},
  "local_scgdm": {
    "learning_rate": 1.0,
    "beta": 5e-9,
    "alpha": 0.8,
    "gamma_tracker": 0.7,
    "gamma": GAMMA,
  },
  "feddro": {"learning_rate": 0.01, "beta": 0.5, "lam": LAM},
}
ALGORITHM_NAMES = tuple(HYPER)


def cross_entropy(params, example):
  """Per-example multinomial logistic loss; ``w`` is ``[classes, in]`` (output-major, as
  ``fedco.models.LogisticRegression`` and PyTorch's ``nn.Linear`` store it)."""
  logits = params["w"] @ example["x"] + params["b"]
  return jax.nn.logsumexp(logits) - logits[example["y"]]


def define_timing_flags(
  name: str, *, rounds: int, torch_rounds: int, repeats: int, x64_check: bool = False
) -> None:
  """The flags every fedco-against-PyTorch program shares (call once, at import):
  ``--rounds``, ``--torch_rounds``, ``--repeats``, ``--torch_one_thread``, ``--out`` (default
  ``benchmarks/results/<name>.json``) and, with ``x64_check``, ``--x64_check`` and
  ``--check_only`` (the float64 subprocess)."""
  from absl import flags

  flags.DEFINE_integer("rounds", rounds, "Rounds per fedco repeat (and per central repeat).")
  flags.DEFINE_integer("torch_rounds", torch_rounds, "Rounds per repeat of the PyTorch loop.")
  flags.DEFINE_integer("repeats", repeats, "Timed repeats per side; the median is reported.")
  flags.DEFINE_boolean(
    "torch_one_thread",
    True,
    "Also time the PyTorch loop with torch.set_num_threads(1) (side "
    "'torch_1t'). On a loaded 2-core machine torch's 2 OpenMP threads "
    "oversubscribe the cores and can run far slower than 1 thread; the "
    "targets are judged against the faster torch side.",
  )
  flags.DEFINE_string("out", f"benchmarks/results/{name}.json", "Where to write the JSON.")
  if x64_check:
    flags.DEFINE_boolean(
      "x64_check", True, "Repeat the checks in float64 (a subprocess with JAX_ENABLE_X64=1)."
    )
    flags.DEFINE_boolean(
      "check_only",
      False,
      "Only run the checks and write them to --out (used for the float64 subprocess).",
    )


# HYPER keys that set the problem, not the algorithm (Local-SCGDM's tracker rate is
# "gamma_tracker" there, beside the KL temperature "gamma")
_PROBLEM_KEYS = ("gamma", "lam")


def algorithm_kwargs(name: str) -> Dict[str, Any]:
  """``fedco.ALGORITHMS[name]``'s keyword arguments from ``HYPER[name]``."""
  h = {k: v for k, v in HYPER[name].items() if k not in _PROBLEM_KEYS}
  if "gamma_tracker" in h:
    h["gamma"] = h.pop("gamma_tracker")
  return h


def make_problem_and_algorithm(name: str, local_steps: int):
  """``(problem, algorithm)`` of the logistic workload for ``name``; the algorithm comes
  from the registry, ``fedco.ALGORITHMS``."""
  if name not in HYPER:
    raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHM_NAMES)}")
  h = HYPER[name]
  if name == "fedavg":
    problem = fedco.problems.plain(cross_entropy)
  elif name in ("comfedl", "local_scgdm"):
    problem = fedco.problems.client_kl_dro(cross_entropy, gamma=h["gamma"])
  else:  # feddro: sample-level KL-DRO
    lam = h["lam"]
    problem = fedco.global_inner(
      lambda p, e: jnp.exp(cross_entropy(p, e) / lam),
      lambda y: lam * jnp.log(y),
      name="sample_kl_dro",
    )
  return problem, fedco.ALGORITHMS[name](**algorithm_kwargs(name), local_steps=local_steps)


def make_data(clients: int, per_client: int, seed: int, in_dim: int = 784):
  """Synthetic MNIST-shaped data: features uniform in [0, 1], uniform labels."""
  rng = np.random.default_rng(seed)
  n = clients * per_client
  x = rng.random((n, in_dim), dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
  rows = [np.arange(k * per_client, (k + 1) * per_client) for k in range(clients)]
  return {"x": x, "y": y}, rows


def init_params(seed: int, in_dim: int = 784):
  k = jax.random.PRNGKey(seed)
  return {
    "w": 0.01 * jax.random.normal(k, (NUM_CLASSES, in_dim), jnp.float32),
    "b": jnp.zeros((NUM_CLASSES,), jnp.float32),
  }


@jax.jit
def mean_loss(params, examples):
  return jnp.mean(jax.vmap(cross_entropy, in_axes=(None, 0))(params, examples))


def finite(tree) -> bool:
  return all(bool(np.all(np.isfinite(np.asarray(l)))) for l in jax.tree.leaves(tree))


def max_abs_diff(a, b) -> float:
  """Largest absolute difference over matching leaves of two pytrees (NumPy-able)."""
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb), (len(la), len(lb))
  return max(
    float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
    for x, y in zip(la, lb)
  )


def max_abs(a) -> float:
  return max(float(np.max(np.abs(np.asarray(x, np.float64)))) for x in jax.tree.leaves(a))


class CompileCounter:
  """Counts XLA backend compilations and sums their seconds."""

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event, duration, **kwargs):
    del kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1
      self.seconds += float(duration)


def machine_info(torch_module=None) -> Dict[str, Any]:
  """fedco's ``machine_info`` (the machine, JAX, its devices, the load at the start) plus
  NumPy, ``XLA_FLAGS``, whether a GPU was lent and PyTorch's version and threads."""
  from fedco.experiment import outputs  # pylint: disable=g-import-not-at-top

  info = outputs.machine_info()
  info["load_average_start"] = info.pop("load_average")
  info.update(
    processor=platform.processor(),
    numpy=np.__version__,
    xla_flags=os.environ.get("XLA_FLAGS", ""),
    # whether JAX runs on a GPU (this project's sessions are rarely lent one)
    gpu_lent=jax.default_backend() == "gpu",
  )
  if torch_module is not None:
    info["torch"] = torch_module.__version__
    info["torch_num_threads"] = torch_module.get_num_threads()
  return info


def load_average() -> Optional[List[float]]:
  return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


#: The repository's root (the folder holding ``benchmarks/``).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_revision(name: str) -> str:
  """The full hash of git revision ``name`` in this repository."""
  return subprocess.run(
    ["git", "rev-parse", name], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout.strip()


def has_uncommitted_changes() -> bool:
  """Whether this repository's tracked files differ from ``HEAD`` (a benchmark's head side
  then measures more than its commit)."""
  status = subprocess.run(
    ["git", "status", "--porcelain", "--untracked-files=no"],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  return bool(status.stdout.strip())


@contextlib.contextmanager
def worktree(revision: str, folder: str) -> Iterator[str]:
  """A detached ``git worktree`` of ``revision`` at ``folder`` while the block runs (a
  benchmark's base side), removed after it."""
  subprocess.run(
    ["git", "worktree", "add", "--detach", folder, revision],
    cwd=ROOT,
    capture_output=True,
    check=True,
  )
  try:
    yield folder
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", folder], cwd=ROOT, capture_output=True)


def driver_process(tree: str, config: str, workdir: str, *flags_, env=None):
  """One whole ``python -m experiments.main --config=<config> --workdir=<workdir>
  --noprogress <flags>`` process in ``tree`` (its ``PYTHONPATH``; ``env``: extra variables):
  ``(wall seconds, the completed process)``, or ``RuntimeError`` with its stderr's tail."""
  env = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    "PYTHONPATH": tree,
    **(env or {}),
  }
  cmd = [
    sys.executable,
    "-m",
    "experiments.main",
    f"--config={config}",
    f"--workdir={workdir}",
    "--noprogress",
    *flags_,
  ]
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"the job failed in {tree}: {proc.stderr[-1500:]}")
  return seconds, proc


def timestamp() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def maxrss_bytes() -> int:
  """Peak resident set size of this process (Linux reports KiB)."""
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def disk_bytes(directory: str, prefix: str = "") -> int:
  """Bytes of disk in use (allocated blocks: sparse files count what was written) by the
  files under ``directory``'s entries whose names start with ``prefix``."""
  total = 0
  for entry in os.listdir(directory) if os.path.isdir(directory) else ():
    if not entry.startswith(prefix):
      continue
    for root, _, files in os.walk(os.path.join(directory, entry)):
      for name in files:
        try:
          total += os.stat(os.path.join(root, name)).st_blocks * 512
        except OSError:  # removed meanwhile
          pass
  return total


def leading_rows(tree) -> int:
  """The leading axis of a per-client tree's first leaf (its ``Pages``' rows when paged)."""
  leaves = jax.tree.leaves(tree)
  return int(leaves[0].shape[0]) if leaves else 0


def live_array_bytes() -> Optional[int]:
  try:
    return int(sum(a.nbytes for a in jax.live_arrays()))
  except Exception:  # pylint: disable=broad-except
    return None


def alternate(
  sides: Dict[str, Callable[[], Any]],
  repeats: int,
  counter: Optional[CompileCounter] = None,
  warm: tuple = (),
) -> Dict[str, Dict[str, Any]]:
  """Warm every side up once (timed as ``first_call_seconds``; sides named in ``warm`` are
  already warm and skip it), then time ``repeats`` rounds of calls that alternate between the
  sides, so drift on a shared machine hits all alike."""
  first = {}
  for label, fn in sides.items():
    if label in warm:
      first[label] = None
      continue
    t0 = time.perf_counter()
    fn()
    first[label] = time.perf_counter() - t0
  times = {label: [] for label in sides}
  compiles = {label: 0 for label in sides}
  for _ in range(repeats):
    for label, fn in sides.items():
      before = counter.count if counter else 0
      t0 = time.perf_counter()
      fn()
      times[label].append(time.perf_counter() - t0)
      if counter:
        compiles[label] += counter.count - before
  return {
    label: {
      "seconds": times[label],
      "median_seconds": statistics.median(times[label]),
      "first_call_seconds": first[label],
      "compiles_while_timed": compiles[label],
    }
    for label in sides
  }


def record_sides(
  rec: Dict[str, Any],
  timed: Dict[str, Dict[str, Any]],
  sides: Dict[str, Any],
  torch_sides: Dict[str, Any],
  final_key: str,
  final_fn: Callable[[Any], float],
  compare=("fedco",),
) -> str:
  """Fill ``rec`` with every side's timings and the ratios against the torch sides.

  ``sides`` maps a label to ``(rounds per repeat, final params)``; each ``timed[label]``
  (from :func:`alternate`) gains rounds/s, ms/round, whether the params are finite and
  ``final_key = final_fn(params)``. ``torch_sides`` maps a torch label to ``(federation,
  TorchSide)``. For each label in ``compare``: ``<label>_over_torch_best`` (rounds/s over
  the faster torch side's) and ``<label>_time_over_central``. Returns the faster torch label.
  """
  for label, (rounds, p) in sides.items():
    t = timed[label]
    t["rounds_per_repeat"] = rounds
    t["rounds_per_s"] = rounds / t["median_seconds"]
    t["ms_per_round"] = 1e3 * t["median_seconds"] / rounds
    t["final_params_finite"] = finite(p)
    t[final_key] = float(final_fn(jax.tree.map(jnp.asarray, p)))
    rec[label] = t
  for label, (fed, side) in torch_sides.items():
    rec[label]["rounds_run"] = fed.rounds_done
    rec[label]["threads"] = side.threads
    rec[f"fedco_over_{label}"] = rec["fedco"]["rounds_per_s"] / rec[label]["rounds_per_s"]
  best = max(torch_sides, key=lambda label: rec[label]["rounds_per_s"])
  rec["faster_torch_side"] = best
  for side in compare:
    rec[f"{side}_over_torch_best"] = rec[side]["rounds_per_s"] / rec[best]["rounds_per_s"]
    rec[f"{side}_time_over_central"] = rec[side]["ms_per_round"] / rec["central"]["ms_per_round"]
  return best


def run_worker(module: str, args, timeout: float, stderr_chars: int = 2000):
  """Run ``python -m <module> --worker <args> --result_file=<temp>`` (one measurement in a
  fresh process); returns ``(its JSON or None, the error or None, wall seconds)``, the error
  being ``"rc N: <stderr tail>"`` or ``"timeout after T s"``."""
  import json
  import subprocess
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "result.json")
    cmd = [sys.executable, "-m", module, "--worker", *args, f"--result_file={path}"]
    t0 = time.perf_counter()
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
      ok = proc.returncode == 0 and os.path.exists(path)
      error = None if ok else f"rc {proc.returncode}: {proc.stderr[-stderr_chars:]}"
    except subprocess.TimeoutExpired:
      ok, error = False, f"timeout after {timeout} s"
    wall = time.perf_counter() - t0
    if not ok:
      return None, error, wall
    with open(path) as f:
      return json.load(f), None, wall


def float64_checks(module: str, flag_names, flag_values) -> Dict[str, Any]:
  """Run ``python -m <module> --check_only`` in a subprocess with ``JAX_ENABLE_X64=1`` (x64
  must be set before jax starts), passing ``--<name>=<flag_values.name>`` for each of
  ``flag_names``; returns the JSON it writes, or ``{"error": <its stderr tail>}``."""
  import json
  import subprocess
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "checks.json")
    cmd = [
      sys.executable,
      "-m",
      module,
      "--check_only",
      f"--out={out}",
      *[f"--{n}={getattr(flag_values, n)}" for n in flag_names],
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
      cmd,
      env={**os.environ, "JAX_ENABLE_X64": "1"},
      cwd=root,
      capture_output=True,
      text=True,
      check=False,
    )
    if proc.returncode != 0:
      return {"error": proc.stderr[-2000:]}
    with open(out) as f:
      return json.load(f)


def write_json(path: str, value: Dict[str, Any]) -> None:
  import fedco.io

  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fedco.io.atomic_write_json(path, value)


class FedcoSide:
  """fedco's simulator: all clients vmapped, steps and rounds scanned, one jit per ``run``."""

  def __init__(self, problem, algorithm, host_examples, rows, params, *, batch_size, rounds, seed):
    self.data = fedco.FederatedData.from_index_lists(host_examples, rows)
    self.sim = fedco.Simulator(problem, algorithm, self.data, batch_size=batch_size, evaluate=False)
    self.rounds = rounds
    self.state = self.sim.init(params, seed)

  def run(self):
    self.state, metrics = self.sim.run(self.state, self.rounds)
    jax.block_until_ready((self.state, metrics))

  def params(self):
    return self.state.server["params"]

  def final(self):
    """``(params, examples, rounds done)``."""
    return self.params(), self.data.examples, int(self.state.round)


class CentralSide:
  """The algorithm's step on one model with the pooled batch ``K * b`` (``tau`` per round)."""

  def __init__(
    self, name, problem, algorithm, host_examples, params, *, batch, local_steps, rounds, seed
  ):
    examples = jax.tree.map(jnp.asarray, host_examples)
    n = int(examples["x"].shape[0])
    two_batches = name == "feddro"  # zeta and zeta' (the others use one batch per step)
    gather = lambda key: jax.tree.map(
      lambda a: a[jax.random.randint(key, (batch,), 0, n)], examples
    )

    def step(carry, _):
      params, st, key = carry
      key, k1, k2 = jax.random.split(key, 3)
      b1 = gather(k1)
      b2 = gather(k2) if two_batches else b1
      grad_h_fn, kwargs = fedco.oracle_args(problem, b1, b1, b2)
      grad_h = None if grad_h_fn is None else grad_h_fn(params)
      updates, st = algorithm.update(grad_h, st, params, **kwargs)
      return (optax.apply_updates(params, updates), st, key), None

    @jax.jit
    def run(params, st, key):
      (params, st, key), _ = jax.lax.scan(
        step, (params, st, key), None, length=rounds * local_steps
      )
      return params, st, key

    key = jax.random.PRNGKey(seed + 2)
    if problem.compositional:
      key, k0 = jax.random.split(key)
      b0 = gather(k0)
      y0 = problem.inner_value(params, b0, jnp.full((batch,), 1.0 / batch, jnp.float32))
      st = algorithm.init(params, inner_value=y0)
    else:
      st = algorithm.init(params)
    self._run, self.rounds = run, rounds
    self.carry = (params, st, key)

  def run(self):
    self.carry = jax.block_until_ready(self._run(*self.carry))

  def params(self):
    return self.carry[0]

"""The privacy and compression trade-off figures (:func:`tradeoff`)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from fedco.experiment import outputs
from fedco.experiment.config_methods import Method

# ---- privacy and compression trade-offs ----------------------------------------------------

TRADEOFF_AXES = {
  "epsilon": ("privacy", "epsilon spent (delta in the method's settings)", "privacy.png"),
  "bytes_up": ("compression", "bytes sent up, whole run", "compression.png"),
}


def _draw_curve(ax, rows, curve, color, xy, reference, setting) -> None:
  """One curve of a trade-off panel: its points with their seeds' standard deviations (the
  codec named beside each, on a bytes axis), a cross in the legend where every point
  diverged, and its ``reference`` run (without ``setting``) as a dashed line."""
  x, key = xy
  own = sorted(
    (
      r
      for r in rows
      if r["curve"] == curve
      and r["method"] != reference
      and r[x] is not None
      and r[key] is not None
    ),
    key=lambda r: r[x],
  )
  if own:
    ax.errorbar(
      [r[x] for r in own],
      [r[key] for r in own],
      yerr=[r[f"{key}_std"] or 0.0 for r in own],
      color=color,
      marker="o",
      capsize=3,
      label=curve,
    )
    if x == "bytes_up":  # which codec each point is
      for r in own:
        short = r["method"].removeprefix(curve + "_")
        if short == r["method"]:  # e.g. feddro_y3bit_adaptive on curve feddro_adaptive
          short = short.removeprefix(curve.split("_")[0] + "_")
        ax.annotate(
          short,
          (r[x], r[key]),
          fontsize=7,
          xytext=(4, 4),
          textcoords="offset points",
          color=color,
        )
  if not own and any(r["curve"] == curve and r["diverged_seeds"] for r in rows):
    ax.plot(
      [], [], color=color, marker="x", ls="none", label=f"{curve} with {setting}: diverged"
    )  # no point to draw, still named
  base = next((r for r in rows if r["method"] == reference), None)
  if base is not None and base[key] is not None:
    ax.axhline(base[key], color=color, ls="--", lw=1.0, label=f"{curve} without {setting}")
    if base[x] is not None:  # the uncompressed run's own bytes
      ax.plot([base[x]], [base[key]], marker="*", ms=10, color=color, ls="none")


def tradeoff(
  wd, methods: Sequence[Method], finals, x: str, panels: Sequence[tuple]
) -> Optional[Dict[str, Any]]:
  """The methods with ``privacy`` (``x="epsilon"``) or ``compression`` (``x="bytes_up"``)
  as trade-off curves: ``panels`` are ``(metric, axis label)`` pairs (or triples ending in
  ``"log"`` for a log y axis), one panel each, with each curve's points (mean over seeds, std
  bars) against ``x`` and its method without the setting as a dashed line. Saves
  ``privacy.png`` or ``compression.png`` in ``wd``; returns the summary's entry (``None``
  when no method has the setting or there are no panels)."""
  setting, xlabel, name = TRADEOFF_AXES[x]
  keys = [x] + [p[0] for p in panels]
  points = [m for m in methods if setting in m.uplink]
  if not points or not panels:
    return None
  per_run, _ = outputs.seed_statistics(finals, keys)  # no epsilon without privacy: None
  curves = list(dict.fromkeys(m.curve for m in points))
  reference = {
    c: next((m.label for m in methods if m.label == c and setting not in m.uplink), None)
    for c in curves
  }
  rows = []
  for m in methods:
    if m.curve not in curves or m.label not in per_run:
      continue
    entry = per_run[m.label]
    rows.append(
      {
        "curve": m.curve,
        "method": m.label,
        **{k: entry[k]["mean"] for k in keys},
        "diverged_seeds": entry["diverged_seeds"],
        **{f"{k}_std": entry[k]["std"] for k in keys[1:]},
      }
    )
  fig = outputs.figure(figsize=(5.5 * len(panels), 4.2))
  axes = np.atleast_1d(fig.subplots(1, len(panels)))
  for ax, (key, label, *scale) in zip(axes, panels):
    if scale == ["log"]:
      ax.set_yscale("log")
    for i, curve in enumerate(curves):
      _draw_curve(ax, rows, curve, f"C{i}", (x, key), reference[curve], setting)
    ax.set_xscale("log")
    from matplotlib import ticker  # pylint: disable=g-import-not-at-top

    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if x == "epsilon":  # a few epsilons: label them as they are
      ax.set_xticks(sorted({r[x] for r in rows if r[x] is not None}))
      ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%.3g"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(label)
    ax.grid(alpha=0.3, which="both")
  if axes[0].lines:
    axes[0].legend(fontsize=8)
  fig.tight_layout()
  wd.save_figure(fig, name)
  return {"x": x, "figure": name, "points": rows}

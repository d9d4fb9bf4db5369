"""The lookup-table policy: battery bands, thermal states, budget, margins, dwell; a TOML file.

Every key has a default, so ``hydra-edge lut`` works without a policy file; a file overrides
only what it names. The schema (types, ranges, how keys relate) is ``hydra_edge.records.policy``. An example with every key and its default::

    budget_ms = 80.0            # or --budget-ms; the latency one inference may take on mains power
    min_dwell_s = 5.0           # no switch up sooner than this after the last switch

    [thermal]
    source = "auto"             # "temperature" (°C), "android" (thermal status), "auto": from the target
    edges_c = [60.0, 70.0, 80.0]             # temperature bands: <60, 60-70, 70-80, >=80 °C
    margin_c = 3.0                           # cool this far below an edge before switching up
    derating = [1.0, 1.15, 1.4, 2.0]         # per band, used when the calibration has no --soak
    throttled_c = 80.0                       # a throttled Raspberry Pi counts as this hot
    android_derating = [1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0]   # NONE .. SHUTDOWN, without --soak

    [battery]
    margin_pct = 5.0            # recharge this far above a band edge before switching up
    charging_budget_scale = 1.0 # charging, or no battery (boards on mains)
    bands = [                   # discharging, highest first; the last must start at 0 %
      { min_pct = 50.0, budget_scale = 1.0 },
      { min_pct = 20.0, budget_scale = 0.75 },
      { min_pct = 0.0,  budget_scale = 0.5 },   # optional: max_energy_mj = 200.0
    ]

The default deratings are guesses that lean cautious, not measurements: a phone at SEVERE or a
Pi at 80 °C commonly runs a CPU-bound model 1.5-2x slower. ``hydra-edge calibrate --soak``
replaces them with what the device measured. Battery bands scale the latency budget (latency is
the energy proxy); where the calibration recorded power, ``max_energy_mj`` caps the energy of
one inference as well. A band whose budget or cap would allow more heads than a fuller band (or
charging) gets that band's choice instead: the table never gives a draining or heating device
more heads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from ..records import codec
from ..records.policy import ANDROID_STATUSES, BatteryBand, BatteryPolicy, Policy, ThermalPolicy

HINT = "see hydra_edge/lut/policy.py for every key"

__all__ = ["ANDROID_STATUSES", "BatteryBand", "BatteryPolicy", "Policy", "ThermalPolicy", "load_policy",
           "policy_from_dict"]


def policy_from_dict(d: dict[str, Any], where: str = "policy") -> Policy:
    """Build and check a policy; every problem is one line naming the key."""
    return codec.convert(d, Policy, where, HINT)


def load_policy(path: Union[str, Path, None]) -> Policy:
    """The defaults, overridden by ``path`` when given."""
    if path is None:
        return Policy()
    return codec.read_toml(path, Policy, "policy", "write one (see hydra_edge/lut/policy.py) or leave out --policy")

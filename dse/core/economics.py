"""The defaults of the cost of serving: ``configs/economics.yaml`` (package data), every figure cited.

``economics_defaults()`` returns {column: value} for ``electricity_usd_per_kwh`` ($/kWh),
``amortization_years`` (years) and ``utilization`` (share of the time serving, (0, 1]); the
evaluator fills them in where a design point leaves those columns out. The cost formula itself is
``dse.core.metrics.cost_per_million_tokens_usd``.
"""
from __future__ import annotations

from functools import lru_cache

from basis.errors import DseError, cited_number
from basis.shipped import shipped
from basis.yamlfile import load_yaml

#: the shipped defaults file
ECONOMICS_FILE = shipped("configs", "economics.yaml")
#: the columns it gives defaults for
COST_COLUMNS = ("electricity_usd_per_kwh", "amortization_years", "utilization")


@lru_cache(maxsize=4)
def economics_defaults(path: str | None = None) -> dict[str, float]:
    """{column: default} of ``COST_COLUMNS`` from ``path`` (default: the shipped file); DseError
    naming the file and the key when one is missing, uncited or out of range."""
    where = str(path or ECONOMICS_FILE)
    d = load_yaml(where, "economics defaults")
    if not isinstance(d, dict):
        raise DseError(f"{where}: expected a mapping at the top level")
    extra = set(d) - {"description", "sources", *COST_COLUMNS}
    if extra:
        raise DseError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(COST_COLUMNS)}")
    out = {}
    for k in COST_COLUMNS:
        if k not in d:
            raise DseError(f"{where}: missing required key '{k}'")
        out[k] = cited_number(d[k], f"{where}: {k}", True)
    if out["utilization"] > 1:
        raise DseError(f"{where}: utilization: expected a share in (0, 1], got {out['utilization']}")
    return out

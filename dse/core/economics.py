"""The defaults of the cost of ownership: ``configs/economics.yaml`` (package data), every figure cited.

``economics_defaults()`` returns {column: value} for ``COST_COLUMNS``: ``electricity_usd_per_kwh``
($/kWh), ``amortization_years`` (years), ``utilization`` (share of the time serving, (0, 1]),
``pue`` (facility energy over IT energy, >= 1), ``host_cost_share`` ($ of host per $ of accelerator,
>= 0) and ``network_cost_share`` (the network's share of the whole hardware cost, [0, 1)); the
evaluator fills them in where a design point leaves those columns out. The cost formulas are
``dse.core.metrics.capital_usd``, ``tco_usd_per_s`` and ``token_costs``; ``cost_items_text`` says
which items of a point's cost were cited, given or missing.
"""
from __future__ import annotations

from functools import lru_cache

from basis.errors import DseError, cited_number
from basis.shipped import shipped
from basis.yamlfile import load_yaml

#: the shipped defaults file
ECONOMICS_FILE = shipped("configs", "economics.yaml")
#: the columns it gives defaults for
COST_COLUMNS = ("electricity_usd_per_kwh", "amortization_years", "utilization", "pue", "host_cost_share",
                "network_cost_share")
#: the columns that may be 0
_ZERO_ALLOWED = ("host_cost_share", "network_cost_share")
#: each cost item in words, for ``cost_items_text``
_ITEMS = {"electricity_usd_per_kwh": "electricity", "amortization_years": "amortization", "utilization": "utilization",
          "pue": "PUE", "host_cost_share": "host share", "network_cost_share": "network share"}


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
        out[k] = cited_number(d[k], f"{where}: {k}", k not in _ZERO_ALLOWED)
    if out["utilization"] > 1:
        raise DseError(f"{where}: utilization: expected a share in (0, 1], got {out['utilization']}")
    if out["pue"] < 1:
        raise DseError(f"{where}: pue: expected facility over IT energy, at least 1, got {out['pue']}")
    if out["network_cost_share"] >= 1:
        raise DseError(f"{where}: network_cost_share: expected a share in [0, 1), got {out['network_cost_share']}")
    return out


def cost_items_text(price: str, power_known: bool = True, given=(), host_w: float = 0.0) -> str:
    """Which items of a design point's cost of ownership are cited, given or missing, in words:
    ``price`` is 'cited' (the preset's price_usd), 'given' (a price_usd column) or 'missing';
    ``power_known``: the accelerators' power is known (else their energy is missing); ``given``: the
    ``COST_COLUMNS`` the point gives itself (the others are configs/economics.yaml's cited defaults).
    ``host_w``: the host server's power per device given (``host_power_w``; 0: not modelled)."""
    given = [k for k in COST_COLUMNS if k in set(given)]
    cited = [_ITEMS[k] for k in COST_COLUMNS if k not in given]
    parts = [f"accelerator price {price}" if price != "missing" else "accelerator price MISSING (no cited price)"]
    parts.append("" if power_known else "accelerator power MISSING (see the energy note)")
    parts.append(f"{', '.join(cited)} cited (configs/economics.yaml)" if cited else "")
    parts.append(f"{', '.join(_ITEMS[k] for k in given)} given" if given else "")
    parts.append(f"host power {host_w:g} W per device given" if host_w > 0 else
                 "host power not modelled (give host_power_w)")
    return "; ".join(p for p in parts if p)

"""What limits a step: the bound taking most of its time and the operators behind it
(from the per-operator rows of an explanation; no heavy imports)."""
from __future__ import annotations

_ATTENTION = ("qk_matmul", "softmax", "sv_matmul", "flash_attention")
_COMM = ("moe_dispatch", "moe_combine", "pp_hop")



def op_group(name: str) -> str:
    """The class an operator belongs to for naming bottlenecks: '*_proj', 'attention', ...
    (a sliding-window layer's ``sliding_*`` attention counts as attention)."""
    if name.removeprefix("sliding_") in _ATTENTION:
        return "attention"
    if "all_reduce" in name or name in _COMM:
        return "communication"
    if name.startswith("expert_") and name.endswith("_proj"):
        return "expert *_proj"
    if name.endswith("_proj"):
        return "*_proj"
    if name.endswith("_norm"):
        return "*_norm"
    return name


def step_bound(rows: list[dict]) -> tuple[str, float]:
    """(bound taking most of the step's time, its share of the step): 'memory', 0.93."""
    by: dict[str, float] = {}
    for r in rows:
        by[r["bound"]] = by.get(r["bound"], 0.0) + r["total_time_s"]
    total = sum(by.values())
    if not by or total <= 0:
        return "-", 0.0
    b = max(by, key=by.get)
    return b, by[b] / total


def bottleneck(rows: list[dict]) -> dict:
    """What limits one step (prefill or decode rows of ``dse.system.analysis``): the bound that
    takes most time, and in it the operator class taking most time and what it waits
    for (weight, KV-cache or activation bytes; a compute format; the link)."""
    bound, bshare = step_bound(rows)
    total = sum(r["total_time_s"] for r in rows)
    if bound == "-":
        return {"bound": "-", "bound_share": 0.0, "group": "-", "group_share": 0.0, "what": "-", "text": "-"}
    groups: dict[str, list] = {}
    for r in rows:
        if r["bound"] == bound:
            groups.setdefault(op_group(r["name"]), []).append(r)
    group = max(groups, key=lambda g: sum(r["total_time_s"] for r in groups[g]))
    rs = groups[group]
    gshare = sum(r["total_time_s"] for r in rs) / total
    if bound in ("memory", "offload"):
        kinds = {"weight reads": sum(r["weight_bytes"] * r["count"] for r in rs),
                 "KV-cache reads": sum(r["kv_bytes"] * r["count"] for r in rs),
                 "activation traffic": sum(r["act_bytes"] * r["count"] for r in rs)}
        what = max(kinds, key=kinds.get)
        if bound == "offload":
            what += " over the host link"
    elif bound == "compute":
        fmts: dict[str, float] = {}
        for r in rs:
            fmts[r["compute_format"]] = fmts.get(r["compute_format"], 0.0) + r["total_time_s"]
        what = f"{max(fmts, key=fmts.get)} compute"
    else:
        what = "link transfers"
    return {"bound": bound, "bound_share": bshare, "group": group, "group_share": gshare, "what": what,
            "text": f"{bound}-bound ({100 * bshare:.0f} % of the step), {100 * gshare:.0f} % of the step "
                    f"in {what} of {group}"}

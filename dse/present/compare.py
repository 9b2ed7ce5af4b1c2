"""``python -m dse.study compare``: one workload on several hardware presets, side by side.

The design points (one per hardware, the same workload options) are one table through
``evaluate`` with their explanations, exactly as ``analyze`` prices one, and the summaries are shown
together: TTFT, TPOT, tokens/s (system, per user, per device), memory footprint per
device against capacity, whether it fits, and what bounds the decode step. A design
that does not fit is a row with ``fits`` False, not an error. ``--plot FILE.png``
draws the same as bars (``dse.present.plots.compare_plot``).

Nothing heavier than numpy is imported unless ``--plot`` is given.
"""
from __future__ import annotations

from basis.errors import DseError
from basis.files import output_file
from dse.present import display
from dse.present.bottleneck import step_bound
from dse.system.analysis import layout_text, summary_of
from dse.system.reasons import MEMORY_CODES

#: columns of the side-by-side table (and of the CSV), in order
COLUMNS = ("hardware", "devices", "batch", "ttft_s", "tpot_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
           "output_tokens_per_s_per_device", "energy_per_token_j", "tokens_per_joule", "power_w", "energy_basis", "cost_usd",
           "cost_per_million_tokens_usd", "cost_per_mtok_input_usd", "cost_per_mtok_output_usd", "tokens_per_dollar",
           "tco_usd_per_hour", "peak_memory_bytes", "capacity_bytes", "fits", "decode_bound",
           "decode_bound_share", "prefill_bound")


def compare_rows(ev) -> list[dict]:
    """One row per design point of an evaluation (``explain`` for every point): the
    analyze summary plus the bound of the decode step and of the prefill. A point
    infeasible for a reason other than memory is a DseError naming its hardware."""
    rows = []
    for i in range(len(ev)):
        s = summary_of(ev, i)
        if not ev.feasible[i] and int(ev.reason[i]) not in MEMORY_CODES:
            raise DseError(f"hardware '{s['hardware']}': {s['why']}")
        ex = ev.explained[i]
        dec_bound, dec_share = step_bound(ex["decode"])
        pre_bound, _ = step_bound(ex["prefill"])
        rows.append({**s, "decode_bound": dec_bound, "decode_bound_share": dec_share, "prefill_bound": pre_bound})
    return rows


def table_text(rows: list[dict]) -> str:
    """Metrics as rows, hardware as columns."""
    fmt = {"fits": lambda v: "yes" if v else "NO", "decode_bound_share": lambda v: f"{100 * v:.0f} %",
           "cost_usd": lambda v: "unknown" if v != v else display.quantity_text("cost_usd", v),
           "energy_basis": lambda v: v or "-"}
    label = {"peak_memory_bytes": "memory per device", "capacity_bytes": "capacity per device",
             "decode_bound_share": "decode time on that bound", "output_tokens_per_s": "tokens/s",
             "output_tokens_per_s_per_user": "tokens/s per user",
             "output_tokens_per_s_per_device": "tokens/s per device", "energy_per_token_j": "energy per token",
             "tokens_per_joule": "tokens per joule", "power_w": "average power", "energy_basis": "power figures from",
             "cost_per_million_tokens_usd": "$ per million tokens", "cost_per_mtok_input_usd": "$ per million input",
             "cost_per_mtok_output_usd": "$ per million output", "tokens_per_dollar": "tokens per $",
             "tco_usd_per_hour": "TCO per hour"}
    keys = [k for k in COLUMNS if k != "hardware"]
    cells = [["metric"] + [r["hardware"] for r in rows]]
    cells += [[label.get(k, k)] + [fmt.get(k, lambda v, k=k: display.quantity_text(k, v))(r[k]) for r in rows]
              for k in keys]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    first = rows[0]
    head = (f"{first['model']}: batch {first['batch'] if len({r['batch'] for r in rows}) == 1 else 'max'}, "
            f"prompt {first['prompt_len']}, generate {first['gen_len']}, weights {first['weights']} / "
            f"activations {first['activations']} / KV {first['kv']}, {_flash_text(rows)}, "
            f"{first['efficiency']} roofline")
    notes = [f"  {r['hardware']} does not fit: {r['why']}" for r in rows if not r["fits"] and r.get("why")]
    notes += [f"  {r['hardware']}: {r['hardware_note']}" for r in rows if r.get("hardware_note")]
    notes += [f"  {r['hardware']}: {r['energy_note']}" for r in rows if r.get("energy_note")]
    notes += [f"  {r['hardware']} cost: {r['cost_note']}" for r in rows if r.get("cost_note")]
    layout = _layout_lines(rows)
    return "\n".join([head, ""] + lines + ([""] + layout if layout else []) + ([""] + notes if notes else []))


def _layout_lines(rows: list[dict]) -> list[str]:
    """'Layout:' and, for each compared design on more than one device, its TP x PP x EP x DP x CP and the
    collectives it runs with the tiers each crosses (analyze's line); [] where every design is one
    device."""
    many = [r for r in rows if r["devices"] > 1]
    if not many:
        return []
    return ["Layout:"] + [f"  {r['hardware']}: {layout_text(r)}"
                          + (f"; {r['collectives']}" if r.get("collectives") else "") for r in many]


def _flash_text(rows: list[dict]) -> str:
    """How attention ran on the compared hardware: 'FlashAttention on', '... off', or on with the
    hardware that ran it unfused (the default where a device has no on-chip buffer)."""
    off = [r["hardware"] for r in rows if not r["flash_attention"]]
    if not off:
        return "FlashAttention on"
    if len(off) == len(rows):
        return "FlashAttention off"
    return f"FlashAttention on (off on {', '.join(off)}: no on-chip buffer to tile it in)"


def check_plot_path(plot: str | None):
    """The ``--plot`` file as a Path (None without one); DseError before any work for a bad name."""
    if plot is None:
        return None
    if not plot.lower().endswith((".png", ".svg", ".pdf")):
        raise DseError(f"--plot {plot}: expected a .png, .svg or .pdf file name")
    return output_file(plot, "--plot")


def show(rows: list[dict], fmt: str, plot=None) -> None:
    """Print the comparison as a table, CSV or JSON and draw it to ``plot`` if given."""
    import sys

    if fmt == "json":
        print(display.json_text(rows))
    elif fmt == "csv":
        print(display.csv_text(rows, list(COLUMNS)), end="")
    else:
        print(table_text(rows))
    if plot is not None:
        from dse.present.plots import compare_plot  # matplotlib: only with --plot
        compare_plot(plot, rows)
        print(f"plot: {plot}", file=sys.stderr)

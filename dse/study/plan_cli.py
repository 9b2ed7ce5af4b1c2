"""``dse plan``: the fewest devices and the cheapest fleet per hardware that serve a request rate
within latency SLOs (``dse.explore.plan``), as tables, JSON or CSV; and a study file that asks
the same (a ``plan:`` section), run by ``dse run`` into plan.json, plan.csv and summary.md."""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from basis.errors import DseError
from basis.files import atomic_write, output_folder
from dse.explore.plan import (
    ENUMERATED,
    MAX_COUNT,
    MAX_DEVICES,
    OBJECTIVES,
    ROW_KEYS,
    Plan,
    PlanAsk,
    ask_from_study,
    plan,
)
from dse.present import display
from dse.present.document import Bullets, Code, Document, Section, Table, html_page, markdown
from dse.study.studyfile import has_section, load_section_study, study_path
from hwmodels.presets import load_device

#: what ``plan`` prints (``--format``)
FORMATS = ("table", "json", "csv")
#: the flags of a design point that a plan sets itself (the load follows from --request-rate)
_SET_BY_PLAN = {"batch": "--batch", "concurrency": "--concurrency", "devices": "--devices",
                "target_rate": "--request-rate"}


def count_arg(text: str) -> int:
    """An argparse type: an integer from 1 to ``MAX_COUNT``."""
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= MAX_COUNT):
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_COUNT}, got {text!r}")
    return int(text)


def add_parsers(command, workload_args, point_columns) -> None:
    """Add ``plan``; ``command(name, text)`` makes a subparser, ``workload_args(parser)`` adds the
    flags ``analyze`` has, ``point_columns(args, hardware)`` reads them back as columns."""
    p = command("plan", "the fewest devices and the cheapest fleet per hardware that serve --request-rate "
                        "within the SLOs, with layout, formats, engine settings and error band")
    workload_args(p)
    for action in p._actions:       # --study gives the model instead
        if action.dest == "model":
            action.required = False
            action.help += " (required unless --study)"
    p.add_argument("--hardware", nargs="+", default=None, metavar="HW",
                   help="hardware presets to consider (see 'list hardware'); required unless --study")
    p.add_argument("--objective", nargs="+", choices=OBJECTIVES, default=["devices"],
                   help="what to rank by: devices (fewest in the service) and/or cost ($ per million output tokens; "
                        "every hardware then needs a price and an energy figure, else it is refused)")
    p.add_argument("--max-devices", type=count_arg, default=MAX_DEVICES,
                   help="most devices one replica (engine) may span: one scale-up node")
    p.add_argument("--top", type=count_arg, default=5, help="layouts shown per hardware")
    p.add_argument("--study", default=None, metavar="FILE",
                   help="read the question from a plan study (a study file with a 'plan:' section) instead")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format")
    p.set_defaults(columns_of=point_columns)


def ask_from_args(args) -> PlanAsk:
    """The PlanAsk of ``plan``'s flags; DseError for a flag a plan sets itself or a missing one."""
    typed = getattr(args, "typed", frozenset())
    if args.study:
        data = load_section_study(args.study, "plan")
        return ask_from_study(data, str(study_path(args.study)))
    for name, flag in _SET_BY_PLAN.items():
        if name in typed and name != "target_rate":
            raise DseError(f"plan: {flag}: a plan chooses the load and the devices of each replica itself "
                           f"(from --request-rate and --max-devices); leave {flag} out")
    if not args.model:
        raise DseError("plan: --model: give the model to serve (see 'list models'), or --study FILE")
    if not args.hardware:
        raise DseError("plan: --hardware: give the presets to consider (see 'list hardware'), or --study FILE")
    if not args.request_rate:
        raise DseError("plan: --request-rate: give the requests/s the service must carry (> 0)")
    base, fixed, hardware = flag_columns(args, "plan")
    return PlanAsk(base, hardware, float(args.request_rate), fixed, tuple(dict.fromkeys(args.objective)),
                   args.max_devices, args.top, bool(args.ideal))


def flag_columns(args, command: str) -> tuple[dict, dict, tuple]:
    """(the scalar columns, {column of ``ENUMERATED``: [the value a flag fixed]}, the hardware to
    consider) of a ``command`` (plan or fleet) that enumerates layouts itself: a typed flag of an
    ``ENUMERATED`` column (and tp, pp) fixes it. DseError naming --hardware for an unknown preset."""
    typed = getattr(args, "typed", frozenset())
    for h in dict.fromkeys(args.hardware):
        try:
            load_device(h)
        except DseError as e:
            raise DseError(f"{command}: --hardware: {e}") from None
    cols = args.columns_of(args, None)
    fixed = {k: [cols[k]] for k in ENUMERATED if k in cols and (k in typed or k in ("tp", "pp"))}
    base = {k: v for k, v in cols.items() if k not in ENUMERATED and k not in ("hardware", "request_rate")}
    return base, fixed, tuple(dict.fromkeys(args.hardware))


def is_plan_study(data: dict) -> bool:
    """True when a study's mapping asks for a plan (a ``plan:`` section)."""
    return has_section(data, "plan")


def cmd_plan(args) -> int:
    ask = ask_from_args(args)
    t0 = time.perf_counter()
    answer = plan(ask)
    dt = time.perf_counter() - t0
    if args.format == "json":
        print(display.json_text(answer.as_dict()))
    elif args.format == "csv":
        print(display.csv_text(csv_rows(answer), list(ROW_KEYS)), end="")
    else:
        print(plan_text(answer, ask, dt))
    return 0


def run_plan_study(data: dict, name: str, out: Path, quiet: bool = False, where: str | None = None) -> int:
    """``dse run`` of a plan study: plan.json, plan.csv, summary.md and report.html in ``out``; the
    answer printed. ``where``: the study file, as messages name it (default ``name``)."""
    ask = ask_from_study(data, where or name)       # checked before its folder is made
    out = output_folder(out)
    t0 = time.perf_counter()
    answer = plan(ask)
    dt = time.perf_counter() - t0
    text = plan_text(answer, ask, dt)
    doc = plan_document(name, str(data.get("description", "")), answer, text)
    for fname, body in (("plan.json", display.json_text(answer.as_dict()) + "\n"),
                        ("plan.csv", display.csv_text(csv_rows(answer), list(ROW_KEYS))),
                        ("summary.md", markdown(doc)), ("report.html", html_page(doc, out))):
        atomic_write(out / fname, lambda tmp, body=body: Path(tmp).write_text(body))
    print(text)
    print(f"  plan:    {out / 'plan.json'}\n  csv:     {out / 'plan.csv'}\n  summary: {out / 'summary.md'}\n"
          f"  report:  {out / 'report.html'}")
    return 0


def plan_document(name: str, description: str, answer: Plan, text: str) -> Document:
    """A plan study's report (summary.md and report.html): its question, the answer (the fewest
    devices of each hardware, ``answer-table``), the answer lines and notes, and every layout shown."""
    q = answer.percentile
    header = ["hardware", "devices", "replicas", "replica", "w/a/kv", "max running", "prefill chunk",
              f"TTFT p{q:g}", f"TPOT p{q:g}", "$ per million tokens"]
    rows = []
    for h, layouts in answer.layouts.items():
        if not layouts:
            rows.append([h, "none meets the SLOs"] + [""] * (len(header) - 2))
            continue
        r = layouts[0]
        rows.append([h, str(r["devices"]), str(r["replicas"]),
                     f"TP{r['tp']} x PP{r['pp']}" + (f" x EP{r['ep']}" if r["ep"] > 1 else ""),
                     f"{r['weights']}/{r['activations']}/{r['kv']}", str(r["max_running"]), str(r["prefill_chunk"]),
                     display.si(r["ttft_s"], "s"), display.si(r["tpot_s"], "s"), _money(r["cost_per_million_tokens_usd"])])
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith(("Answer:", "        cheapest", "  note:"))]
    return Document(name, [
        Section("", [description] if description else []),
        Section("The study's answer: the fewest devices per hardware", [
            Table(header, rows, id="answer-table"), Bullets([ln.removeprefix("note: ") for ln in lines])], id="answer"),
        Section("Every layout that meets the SLOs", [Code(text)], id="layouts")])


def csv_rows(answer: Plan) -> list[dict]:
    """Every layout row of the plan, bands as 'low..high' factors."""
    return [{k: (f"{v[0]:g}..{v[1]:g}" if isinstance(v, list) else v) for k, v in r.items()}
            for rows in answer.layouts.values() for r in rows]


def _money(v: float) -> str:
    return "-" if not math.isfinite(v) else f"${v:,.2f}" if v < 100 else f"${v:,.0f}"


def _band(b: list) -> str:
    return f"x{b[0]:.2f}..x{b[1]:.2f}"


def plan_text(answer: Plan, ask: PlanAsk, seconds: float) -> str:
    """The plan as text: a table per hardware (fewest devices first) and the answer lines."""
    q = answer.percentile
    cols = [("devices", "devices", str), ("replicas", "replicas", str),
            ("layout", "replica", str), ("formats", "w/a/kv", str),
            ("max_running", "max run", str), ("prefill_chunk", "chunk", str),
            ("goodput_per_replica", "goodput/rep", lambda v: f"{v:.2f}/s"),
            ("ttft_s", f"TTFT p{q:g}", lambda v: display.si(v, "s")),
            ("tpot_s", f"TPOT p{q:g}", lambda v: display.si(v, "s")),
            ("cost_per_million_tokens_usd", "$/Mtok", _money), ("fleet_usd_per_hour", "fleet $/h", _money),
            ("fleet_price_usd", "fleet price", _money),
            ("band_tpot", "TPOT band", _band)]
    slos = " and ".join(f"{k.removeprefix('slo_').upper()} <= {display.si(ask.base[k], 's')}"
                        for k in ("slo_ttft", "slo_tpot") if ask.base.get(k))
    out = [f"{ask.base['model']} at {ask.rate:g} requests/s (prompt {ask.base.get('prompt_len', '-')}, "
           f"generate {ask.base.get('gen_len', '-')}), {slos} at p{q:g}: {answer.candidates} engines evaluated "
           f"in {seconds:.1f} s"]
    for h, rows in answer.layouts.items():
        out += ["", f"{h}"]
        if not rows:
            out.append("  no layout meets the SLOs")
            continue
        shown = [{**r, "layout": f"TP{r['tp']} x PP{r['pp']}" + (f" x EP{r['ep']}" if r["ep"] > 1 else ""),
                  "formats": f"{r['weights']}/{r['activations']}/{r['kv']}"} for r in rows]
        out.append(display.text_table(shown, cols, left=("layout", "formats")))
    f = answer.fewest
    out += ["", f"Answer: fewest devices: {f['devices']} x {f['hardware']} ({f['replicas']} "
                f"replica{'s' if f['replicas'] != 1 else ''} of "
                f"TP{f['tp']} x PP{f['pp']}, {f['weights']}/{f['activations']}/{f['kv']}, {f['engine']} "
                f"max_running {f['max_running']}, prefill chunk {f['prefill_chunk']}; {f['efficiency']}, TPOT band "
                f"{_band(f['band_tpot'])})"]
    c = answer.cheapest
    out.append(f"        cheapest fleet: {c['devices']} x {c['hardware']} at {_money(c['cost_per_million_tokens_usd'])}"
               f" per million output tokens, {_money(c['fleet_usd_per_hour'])}/h" if c else
               "        cheapest fleet: unknown (no hardware has both a price and an energy figure; see notes)")
    out += [f"  note: {n}" for n in answer.notes]
    return "\n".join(out)


#: the handler of each subcommand this module adds
COMMANDS = {"plan": cmd_plan}

__all__ = ["add_parsers", "cmd_plan", "run_plan_study", "is_plan_study", "COMMANDS", "plan_text", "csv_rows"]

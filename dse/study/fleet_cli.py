"""``dse fleet``: the cheapest (or lowest-power) mix of hardware types and counts that serves a
request rate, or a daily rate curve, within the SLOs (``dse.explore.fleet``), beside each single
type; and a study file that asks the same (a ``fleet:`` section), run by ``dse run`` into
fleet.json and summary.md."""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from basis.errors import DseError, kind_of
from basis.files import atomic_write, output_folder
from dse.explore.fleet import OBJECTIVES, Bucket, Fleet, FleetAsk, Mix, PdPair, check_fleet, fleet
from dse.explore.plan import MAX_DEVICES, space_columns
from dse.present import display
from dse.present.document import Bullets, Code, Document, Section, Table, html_page, markdown
from dse.study.plan_cli import count_arg, flag_columns
from dse.study.studyfile import has_section, load_section_study, study_path

#: what ``fleet`` prints (``--format``)
FORMATS = ("table", "json")
#: the keys of a study's ``fleet:`` section
STUDY_KEYS = ("rate_curve", "buckets", "objective", "max_devices", "pd_pairs")
#: the keys of one of a fleet study's ``pd_pairs`` (``pd_link`` optional)
PAIR_KEYS = ("hardware", "decode_hardware", "prefill_devices", "decode_devices", "pd_link")
#: the flags of a design point that a fleet sets itself
_SET_BY_FLEET = {"batch": "--batch", "concurrency": "--concurrency", "devices": "--devices"}


def _number(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected a number, got {text!r}") from None
    return v


def rate_curve(text: str) -> tuple[tuple[float, float], ...]:
    """An argparse type: 'HOURS:RATE,HOURS:RATE,...' -> ((hours, requests/s), ...)."""
    out = []
    for part in text.split(","):
        h, sep, r = part.partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected HOURS:RATE periods separated by commas, got {part!r}")
        out.append((_number(h, "hours"), _number(r, "rate")))
    return tuple(out)


def buckets(text: str) -> tuple[Bucket, ...]:
    """An argparse type: 'SHARE:PROMPT:GEN,...' -> Buckets."""
    out = []
    for part in text.split(","):
        bits = part.split(":")
        if len(bits) != 3 or not all(b.strip().isdigit() for b in bits[1:]):
            raise argparse.ArgumentTypeError(f"expected SHARE:PROMPT_LEN:GEN_LEN buckets separated by commas, got {part!r}")
        out.append(Bucket(_number(bits[0], "share"), int(bits[1]), int(bits[2])))
    return tuple(out)


def pd_pairs(text: str) -> tuple[PdPair, ...]:
    """An argparse type: 'HW:DECODE_HW:P:D[:LINK],...' -> PdPairs (DECODE_HW 'same': the prefill's
    hardware; LINK the KV cache's, see 'list links', default: the evaluator's)."""
    out = []
    for part in text.split(","):
        bits = part.split(":")
        if len(bits) not in (4, 5) or not all(b.strip().isdigit() for b in bits[2:4]):
            raise argparse.ArgumentTypeError(f"expected HW:DECODE_HW:P:D[:LINK] pairs separated by commas, got {part!r}")
        out.append(PdPair(bits[0], bits[1], int(bits[2]), int(bits[3]), *bits[4:]))
    return tuple(out)


def add_parsers(command, workload_args, point_columns) -> None:
    """Add ``fleet``; ``command(name, text)`` makes a subparser, ``workload_args(parser)`` adds the
    flags ``analyze`` has, ``point_columns(args, hardware)`` reads them back as columns."""
    p = command("fleet", "the cheapest (or lowest-power) mix of hardware types and counts serving a rate or a "
                         "daily rate curve within the SLOs, beside each single type (a mixed-integer program)")
    workload_args(p)
    for action in p._actions:
        if action.dest == "model":
            action.required = False
            action.help += " (required unless --study)"
    p.add_argument("--hardware", nargs="+", default=None, metavar="HW",
                   help="hardware presets to mix (see 'list hardware'); those without a price are named and "
                        "left out of a cost fleet; required unless --study")
    p.add_argument("--rate-curve", type=rate_curve, default=None, metavar="H:R,...",
                   help="a day's rate curve: periods of HOURS at RATE requests/s (e.g. 8:5,10:40,6:15); "
                        "default: --request-rate all day")
    p.add_argument("--buckets", type=buckets, default=None, metavar="S:P:G,...",
                   help="request sizes: SHARE of the rate with PROMPT_LEN and GEN_LEN tokens (shares sum to 1; "
                        "default: --prompt-len and --gen-len)")
    p.add_argument("--pd-pairs", type=pd_pairs, default=None, metavar="HW:DHW:P:D[:LINK],...",
                   help="disaggregated replicas to try beside the colocated ones: P devices of HW computing "
                        "prompts, D of DHW ('same': HW) decoding, the KV cache over LINK (see 'list links'; "
                        "default: the evaluator's) (e.g. h100-sxm:mi300x:4:4:ib-ndr)")
    p.add_argument("--objective", choices=OBJECTIVES, default="cost",
                   help="what to minimise: cost ($ a day: price amortized + electricity) or power (mean W)")
    p.add_argument("--max-devices", type=count_arg, default=MAX_DEVICES,
                   help="most devices one replica (engine) may span")
    p.add_argument("--study", default=None, metavar="FILE",
                   help="read the question from a fleet study (a study file with a 'fleet:' section)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format")
    p.set_defaults(columns_of=point_columns)


def ask_from_args(args) -> FleetAsk:
    """The FleetAsk of ``fleet``'s flags; DseError for a flag a fleet sets itself or a missing one."""
    typed = getattr(args, "typed", frozenset())
    if args.study:
        return ask_from_study(load_section_study(args.study, "fleet"), str(study_path(args.study)))
    for name, flag in _SET_BY_FLEET.items():
        if name in typed:
            raise DseError(f"fleet: {flag}: a fleet chooses the load and the devices of each replica itself; "
                           f"leave {flag} out")
    if not args.model:
        raise DseError("fleet: --model: give the model to serve (see 'list models'), or --study FILE")
    if not args.hardware:
        raise DseError("fleet: --hardware: give the presets to mix (see 'list hardware'), or --study FILE")
    if args.rate_curve is None and not args.request_rate:
        raise DseError("fleet: give --request-rate (requests/s all day) or --rate-curve HOURS:RATE,...")
    if args.rate_curve is not None and args.request_rate:
        raise DseError("fleet: --request-rate and --rate-curve both give the rate: give one of them")
    base, fixed, hardware = flag_columns(args, "fleet")
    periods = args.rate_curve or ((24.0, float(args.request_rate)),)
    return FleetAsk(base, hardware, periods, args.buckets or (), fixed, args.objective, args.max_devices,
                    bool(args.ideal), args.pd_pairs or ())


def is_fleet_study(data: dict) -> bool:
    """True when a study's mapping asks for a fleet (a ``fleet:`` section)."""
    return has_section(data, "fleet")


def ask_from_study(data: dict, where: str) -> FleetAsk:
    """The FleetAsk of a study's mapping with a ``fleet:`` section: ``space`` gives the scalar columns,
    ``hardware`` (the presets to mix) and lists for ``ENUMERATED`` columns (the values tried);
    ``fleet:`` gives ``rate_curve`` ([[hours, requests/s], ...]), ``buckets`` ([{share, prompt_len,
    gen_len}, ...], optional), ``objective`` and ``max_devices``. DseError naming the key otherwise."""
    section = data.get("fleet")
    if not isinstance(section, dict):
        raise DseError(f"{where}: fleet: expected a mapping with keys {', '.join(STUDY_KEYS)}")
    unknown = sorted(set(map(str, section)) - set(STUDY_KEYS))
    if unknown:
        raise DseError(f"{where}: fleet: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(STUDY_KEYS)}")
    base, fixed, hardware = space_columns(data.get("space") or {}, where, "fleet")
    curve = section.get("rate_curve")
    if not isinstance(curve, list) or not curve or not all(isinstance(p, list) and len(p) == 2 for p in curve):
        raise DseError(f"{where}: fleet.rate_curve: expected a list of [hours, requests/s] pairs, got {kind_of(curve)}")
    raw = section.get("buckets") or []
    if not isinstance(raw, list) or not all(isinstance(b, dict) and set(b) == {"share", "prompt_len", "gen_len"}
                                            for b in raw):
        raise DseError(f"{where}: fleet.buckets: expected a list of {{share, prompt_len, gen_len}} mappings")
    pairs = section.get("pd_pairs") or []
    if not isinstance(pairs, list) or not all(isinstance(p, dict) and set(PAIR_KEYS[:4]) <= set(p) <= set(PAIR_KEYS)
                                              for p in pairs):
        raise DseError(f"{where}: fleet.pd_pairs: expected a list of {{{', '.join(PAIR_KEYS[:4])}}} mappings "
                       f"(pd_link optional)")
    ask = FleetAsk(base, hardware, tuple((p[0], p[1]) for p in curve),
                   tuple(Bucket(b["share"], b["prompt_len"], b["gen_len"]) for b in raw), fixed,
                   section.get("objective", "cost"), section.get("max_devices", MAX_DEVICES),
                   bool(data.get("ideal", False)), tuple(PdPair(**p) for p in pairs))
    check_fleet(ask, f"{where}: fleet")
    return ask


#: the keys of a fleet's CSV rows: one row per engine of the mix and of each single type's best fleet
CSV_KEYS = ("fleet", "hardware", "tp", "pp", "ep", "weights", "activations", "kv", "devices_per_replica", "owned",
            "running", "usd_per_day", "mean_power_w", "utilization")


def csv_rows(answer: Fleet) -> list[dict]:
    """The fleet's rows (``CSV_KEYS``): the mix's engines ('mixed'), then each single type's; a fleet's
    figures (a day's $, mean W, utilization) on each of its rows."""
    out = []
    for name, m in (("mixed", answer.mix), *answer.single.items()):
        for r in (m.rows if m is not None else ()):
            out.append({**{k: r[k] for k in CSV_KEYS if k in r}, "fleet": name,
                        "running": "/".join(map(str, r["running"])), "usd_per_day": m.usd_per_day,
                        "mean_power_w": m.mean_power_w, "utilization": m.utilization})
    return out


def _alone(answer: Fleet, h: str) -> str:
    """Why hardware ``h`` has no fleet of its own: left out (its note), or it cannot serve the rate alone."""
    return next((n.removeprefix(f"{h}: ") for n in answer.notes if n.startswith(f"{h}: left out")),
                "cannot serve the rate alone")


def _money(v: float) -> str:
    return "-" if not math.isfinite(v) else f"${v:,.2f}"


def _mix_line(m: Mix) -> str:
    parts = [f"{r['owned']} x {r['hardware']} (" + (f"P:D {r['disaggregate']}, " if "disaggregate" in r else "")
             + f"TP{r['tp']} x PP{r['pp']}" + (f" x EP{r['ep']}" if r["ep"] > 1 else "")
             + f", {r['weights']}/{r['activations']}/{r['kv']})" for r in m.rows]
    return " + ".join(parts)


def fleet_text(answer: Fleet, ask: FleetAsk, seconds: float) -> str:
    """The fleet as text: the question, the mix (replicas per period), and each single type beside it."""
    slos = " and ".join(f"{k.removeprefix('slo_').upper()} <= {display.si(ask.base[k], 's')}"
                        for k in ("slo_ttft", "slo_tpot") if ask.base.get(k))
    curve = ", ".join(f"{h:g} h at {r:g}/s" for h, r in ask.periods)
    sizes = ", ".join(f"{b.share:.0%} of {b.prompt_len}+{b.gen_len} tokens" for b in ask.buckets) or \
        f"prompt {ask.base.get('prompt_len', '-')}, generate {ask.base.get('gen_len', '-')}"
    m = answer.mix
    out = [f"{ask.base['model']}: {curve} ({sizes}), {slos}: {answer.candidates} engines evaluated in {seconds:.1f} s",
           "", f"Answer ({ask.objective}): {_mix_line(m)}"]
    rows = [{"hardware": r["hardware"], "layout": f"TP{r['tp']} x PP{r['pp']}", "owned": str(r["owned"]),
             "running": "/".join(map(str, r["running"])),
             "goodput": "/".join(f"{g:.2f}" for g in r["goodput_per_replica"]),
             "power": display.si(r["power_w"], "W") + (" (TDP)" if r["tdp_bound"] else "")} for r in m.rows]
    out.append(display.text_table(rows, [(k, k, str) for k in ("hardware", "layout", "owned", "running", "goodput",
                                                                "power")], left=("hardware", "layout")))
    out.append(f"  {_money(m.usd_per_day)} a day ({_money(m.capital_usd_per_day)} capital, "
               f"{_money(m.energy_usd_per_day)} energy), mean power {display.si(m.mean_power_w, 'W')}, "
               f"{m.devices} devices, utilization {m.utilization:.0%}")
    out += ["", "Single types:"]
    for h, s in answer.single.items():
        if s is None:
            out.append(f"  {h}: {_alone(answer, h)}")
        else:
            out.append(f"  {h}: {_mix_line(s)}: {_money(s.usd_per_day)} a day, mean "
                       f"{display.si(s.mean_power_w, 'W')}; the mix saves {answer.saving(h):.0%}")
    out += [f"  note: {n}" for n in answer.notes]
    return "\n".join(out)


def cmd_fleet(args) -> int:
    ask = ask_from_args(args)
    t0 = time.perf_counter()
    answer = fleet(ask)
    dt = time.perf_counter() - t0
    print(display.json_text(answer.as_dict()) if args.format == "json" else fleet_text(answer, ask, dt))
    return 0


def run_fleet_study(data: dict, name: str, out: Path, where: str | None = None) -> int:
    """``dse run`` of a fleet study: fleet.json, summary.md and report.html in ``out``; the answer printed."""
    ask = ask_from_study(data, where or name)
    out = output_folder(out)
    t0 = time.perf_counter()
    answer = fleet(ask)
    text = fleet_text(answer, ask, time.perf_counter() - t0)
    header = ["fleet", "mix", "$ a day", "mean power", "devices", "saving of the mix"]
    rows = [["mixed", _mix_line(answer.mix), _money(answer.mix.usd_per_day), display.si(answer.mix.mean_power_w, "W"),
             str(answer.mix.devices), "-"]]
    for h, s in answer.single.items():
        rows.append([h, _alone(answer, h) if s is None else _mix_line(s),
                     "-" if s is None else _money(s.usd_per_day), "-" if s is None else display.si(s.mean_power_w, "W"),
                     "-" if s is None else str(s.devices),
                     "-" if s is None else f"{answer.saving(h):.0%}"])
    doc = Document(name, [Section("", [str(data.get("description", ""))]),
                          Section("The study's answer: the mix beside each single type",
                                  [Table(header, rows, id="answer-table"), Bullets(list(answer.notes))], id="answer"),
                          Section("The fleet", [Code(text)], id="fleet")])
    for fname, body in (("fleet.json", display.json_text(answer.as_dict()) + "\n"),
                        ("fleet.csv", display.csv_text(csv_rows(answer), list(CSV_KEYS))), ("summary.md", markdown(doc)),
                        ("report.html", html_page(doc, out))):
        atomic_write(out / fname, lambda tmp, body=body: Path(tmp).write_text(body))
    print(text)
    print(f"  fleet:   {out / 'fleet.json'}\n  csv:     {out / 'fleet.csv'}\n  summary: {out / 'summary.md'}\n  report:  {out / 'report.html'}")
    return 0


#: the handler of each subcommand this module adds
COMMANDS = {"fleet": cmd_fleet}

__all__ = ["csv_rows", "CSV_KEYS", "add_parsers", "cmd_fleet", "run_fleet_study", "is_fleet_study", "ask_from_study", "COMMANDS",
           "fleet_text"]

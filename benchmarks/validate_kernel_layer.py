"""Hand-run: the kernel layer's figures.

    python benchmarks/validate_kernel_layer.py fitted|learned OUT [validate's options, e.g. --measured FILE]

runs ``dse validate`` with every measured row's ``kernel_layer`` set (the README's figures of the
kernel layer in ``evaluate``, fitted against learned): it predicts each row as ``dse validate`` does,
with the column ``kernel_layer`` added to the design points it evaluates; the report goes to OUT as
validate writes it.

    python benchmarks/validate_kernel_layer.py engines AIC_SYSTEMS_DIR [KIND ...] [--fit-rows N] [--write MODEL]

measures the transfer to a kernel-library version the fit never saw (issue 42's "one engine version
out"): for each KIND (default gemm, generation_attention, context_attention) every engine version of
aiconfigurator-core's tables is held out in turn, the layer refitted on the others (at most N rows a
GPU, default 1500) and the held-out rows predicted (``dse.fit.kernel_tables.leave_one_engine_version_out``);
it prints median and p90 APE per held-out version and over all of them, as YAML, and with
``--write MODEL`` records them in that model file's ``transfer`` section ('<kind> leave one engine
version out', beside the leave-one-GPU-out figures).
"""
import sys

import yaml

import dse.fit.validate as validate
from basis.errors import DseError
from dse.core.kernel_model import load_kernel_model
from dse.fit import kernel_tables
from dse.study.cli import main

_table_of = validate.table_of


def _with_layer(layer: str):
    def table_of(points):
        cols = _table_of(points)
        if points:
            cols["kernel_layer"] = layer
        return cols
    return table_of


def engines(argv) -> int:
    """The engine-version transfer figures (module docstring) printed as YAML; 2 on a bad folder."""
    rows, write = 1500, None
    if "--write" in argv:
        i = argv.index("--write")
        write, argv = (argv[i + 1:] or [None])[0], argv[:i] + argv[i + 2:]
        if not write:
            print("error: --write: expected the kernel model file to record the figures in", file=sys.stderr)
            return 2
    try:
        if "--fit-rows" in argv:
            i = argv.index("--fit-rows")
            rows, argv = int((argv[i + 1:] or ["?"])[0]), argv[:i] + argv[i + 2:]
            if rows < 1:
                raise ValueError
    except ValueError:
        print("error: --fit-rows: expected a whole number of rows a GPU, at least 1", file=sys.stderr)
        return 2
    root, kinds = argv[0], argv[1:] or list(kernel_tables.ENGINE_KINDS)
    bad = [k for k in kinds if k not in kernel_tables.ENGINE_KINDS]
    if bad:
        print(f"error: unknown kind '{bad[0]}'; known: {', '.join(kernel_tables.ENGINE_KINDS)}", file=sys.stderr)
        return 2
    try:
        hw = kernel_tables.hardware_table(root)
        start = load_kernel_model()["parameters"]
        out = {k: kernel_tables.leave_one_engine_version_out(k, root, hw, rows, dict(start[k])) for k in kinds}
    except DseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(out, sort_keys=False))
    if write:
        try:
            kernel_tables.record_transfer(write, {f"{k} leave one engine version out": {**v, "fit_rows": rows}
                                                  for k, v in out.items()})
        except (OSError, yaml.YAMLError) as e:
            print(f"error: {write}: cannot record the figures ({type(e).__name__})", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "engines":
        sys.exit(engines(sys.argv[2:]))
    if len(sys.argv) < 3 or sys.argv[1] not in ("fitted", "learned"):
        sys.exit("usage: python benchmarks/validate_kernel_layer.py fitted|learned OUT [validate options]\n"
                 "       python benchmarks/validate_kernel_layer.py engines AIC_SYSTEMS_DIR [KIND ...] [--fit-rows N] [--write MODEL]")
    validate.table_of = _with_layer(sys.argv[1])
    sys.exit(main(["validate", "--out", sys.argv[2], "--quiet", *sys.argv[3:]]))

"""Hand-run: ``dse validate`` with every measured row's ``kernel_layer`` set (the README's figures of
the kernel layer in ``evaluate``, fitted against learned):

    python benchmarks/validate_kernel_layer.py fitted|learned OUT [validate's options, e.g. --measured FILE]

It predicts each row as ``dse validate`` does, with the column ``kernel_layer`` added to the design
points it evaluates; the report goes to OUT as validate writes it.
"""
import sys

import dse.fit.validate as validate
from dse.study.cli import main

_table_of = validate.table_of


def _with_layer(layer: str):
    def table_of(points):
        cols = _table_of(points)
        if points:
            cols["kernel_layer"] = layer
        return cols
    return table_of


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("fitted", "learned"):
        sys.exit("usage: python benchmarks/validate_kernel_layer.py fitted|learned OUT [validate options]")
    validate.table_of = _with_layer(sys.argv[1])
    sys.exit(main(["validate", "--out", sys.argv[2], "--quiet", *sys.argv[3:]]))

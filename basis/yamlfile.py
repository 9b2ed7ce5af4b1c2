"""Reading a YAML input file (study, hardware preset, link and tier tables, calibration)
as untrusted text: UTF-8 of bounded size, safe tags only, and aliases bounded so that a
small file cannot expand into a huge one (the "billion laughs" alias bomb)."""
from __future__ import annotations

from pathlib import Path

import yaml

from basis.errors import DseError

#: the largest YAML input file read (bytes)
MAX_FILE_BYTES = 16 * 2**20
#: the most nodes a document may have once its aliases are expanded
MAX_NODES = 200_000


#: PyYAML's safe loader: its C parser (libyaml, in PyYAML's wheels) where built, ten times
#: faster than the pure-Python one it otherwise falls back to
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _BoundedLoader(_SAFE_LOADER):
    """PyYAML's safe loader, refusing a document whose aliases expand beyond ``MAX_NODES``."""

    def get_single_node(self):
        node = super().get_single_node()
        expanded_nodes(node)
        return node


def expanded_nodes(root: yaml.Node) -> int:
    """Nodes of ``root`` with every alias expanded (shared nodes counted once per use);
    yaml.YAMLError when that exceeds ``MAX_NODES`` or an alias refers to its own parent.
    Linear in the distinct nodes: each one's expanded size is computed once."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise yaml.YAMLError(f"a recursive alias (line {node.start_mark.line + 1}) is not allowed")
        open_nodes.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(size(c) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        if n > MAX_NODES:
            raise yaml.YAMLError(f"aliases expand it beyond {MAX_NODES:,} values "
                                 f"(line {node.start_mark.line + 1})")
        sizes[key] = n
        return n

    return size(root) if root is not None else 0


def load_yaml(path: str | Path, what: str):
    """The parsed content of the YAML file ``path`` (a ``what``: "study file",
    "hardware preset", ...); DseError on one line naming the file for an unreadable,
    oversized, non-UTF-8 or malformed file or one whose aliases expand too far."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise DseError(f"{p}: a {what} is at most {MAX_FILE_BYTES // 2**20} MiB; this file is "
                           f"{p.stat().st_size / 2**20:.0f} MiB")
        raw = p.read_bytes()
    except OSError as e:
        raise DseError(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DseError(f"{p}: a {what} must be UTF-8 text; byte {e.start} is not (a binary file?)") from None
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise DseError(f"{p}: not valid YAML for a {what}: nested too deeply") from None
    except yaml.YAMLError as e:
        raise DseError(f"{p}: not valid YAML for a {what}: {_yaml_message(e)}") from None


def _yaml_message(e: yaml.YAMLError) -> str:
    """A PyYAML error as one line: its problem and where."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None)
    if problem:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else str(problem)
    return " ".join(str(e).split())

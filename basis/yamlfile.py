"""Reading a YAML input file (study, hardware preset, link and tier tables, calibration)
as untrusted text: a regular UTF-8 file of bounded size (``basis.files.read_input``), safe
tags only, no key given twice in one mapping (YAML would silently keep the last), and aliases
bounded so that a small file cannot expand into a huge one (the "billion laughs" alias bomb)."""
from __future__ import annotations

from pathlib import Path

import yaml

from basis.errors import DseError, shown_path
from basis.files import MAX_TEXT_BYTES, read_input_text

#: the largest YAML input file read (bytes)
MAX_FILE_BYTES = MAX_TEXT_BYTES
#: the most nodes a document may have once its aliases are expanded
MAX_NODES = 200_000


#: PyYAML's safe loader: its C parser (libyaml, in PyYAML's wheels) where built, ten times
#: faster than the pure-Python one it otherwise falls back to
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _BoundedLoader(_SAFE_LOADER):
    """PyYAML's safe loader, refusing a document whose aliases expand beyond ``MAX_NODES`` and a
    mapping that gives one key twice (keys merged in with ``<<`` may be overridden, as YAML means)."""

    def get_single_node(self):
        node = super().get_single_node()
        expanded_nodes(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:             # an unhashable key: the safe constructor refuses it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {_cut(key)} appears twice in one mapping; give each key once",
                        key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


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
    oversized, non-UTF-8 or malformed file, one that is not a regular file, gives a key twice
    or whose aliases expand too far. The message never quotes the file's lines."""
    p = Path(path)
    text = read_input_text(p, what, MAX_FILE_BYTES)
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise DseError(f"{shown_path(p)}: not valid YAML for a {what}: nested too deeply") from None
    except yaml.YAMLError as e:
        raise DseError(f"{shown_path(p)}: not valid YAML for a {what}: {_yaml_message(e)}") from None


def _yaml_message(e: yaml.YAMLError) -> str:
    """A PyYAML error as one line: its problem and where."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None)
    if problem and " tag" in problem and "appears twice" not in problem:   # PyYAML quotes the tag: the file's text
        problem = "a tag (!...) that is not plain YAML; only plain values, lists and mappings are read"
    if problem:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else str(problem)
    return " ".join(str(e).split())


def _cut(key, limit: int = 40) -> str:
    """A mapping key for a message: its repr on one line, cut to ``limit`` characters."""
    text = " ".join(repr(key).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"

"""Workload columns -> operator arrays and footprints, cached per distinct workload.

A workload is a model run with one scenario (batch, lengths, formats, parallel layout,
attention kernel) on devices with a given on-chip buffer. Its operator tables (one
micro-batch: the prefill, the decode step attending to ``prompt_len`` cached tokens, and
the decode steps' first value and slope over the growing context, in affine pieces
(``optable.decode_pieces``: two when a sliding window fills during the generation)) and its per-device
footprint are built once and kept (``tables``). For the largest batch that fits, the
footprint is also written in closed form in the batch (``FootprintInBatch``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np

from dse.core.roofline import OpArrays, Stacked
from workloads import encoder, optable
from workloads.footprint import (
    Footprint,
    footprint,
    kv_cache_bytes_per_sequence,
    layer_parameter_count,
    live_bytes,
    peak_activation_bytes,
    stream_bytes,
    weight_bytes,
)
from workloads.model import ModelSpec, load_model
from workloads.optable import NON_LAYER_OPS
from workloads.scenario import Scenario
from workloads.techniques import NONE, Techniques


def resolve_model(value) -> ModelSpec:
    """A ModelSpec as is, else a shipped model name or a config.json path."""
    return value if isinstance(value, ModelSpec) else load_model(str(value))


@dataclass(frozen=True)
class WorkloadTables:
    """Operator arrays and footprint of one workload (per device, one micro-batch)."""

    scenario: Scenario
    prefill: OpArrays
    decode: OpArrays          # one decode step attending to prompt_len cached tokens (None: see WorkloadBatch)
    decode_first: OpArrays    # the first decode step (prompt_len + 1 keys) ...
    decode_slope: OpArrays    # ... and the increase per extra key
    prefill_table: optable.OpTable
    decode_table: optable.OpTable
    footprint: Footprint
    layer_ops: np.ndarray     # [O] bool: operators repeated per layer (CPU split)
    layer_weight_bytes: float  # weights of all the layers on one device
    decode_pieces: tuple = ()  # (first step, OpArrays, slope) of each affine piece of the decode (optable)

    def decode_steps(self, steps) -> list:
        """(first step's OpArrays, slope, number of steps) of each piece of ``steps`` decode steps
        (one piece, or two when a sliding window fills during the generation; ``steps`` one per
        workload for tables of many, whose pieces start at a step of each workload's own, 0 steps
        where a piece does not run: ``optable.decode_piece_steps``)."""
        pieces = self.decode_pieces or ((0, self.decode_first, self.decode_slope),)
        if len(pieces) == 1:
            return [(pieces[0][1], pieces[0][2], steps)]
        return [(pieces[k][1], pieces[k][2], n) for k, n in optable.decode_piece_steps([j for j, _, _ in pieces], steps)]


@lru_cache(maxsize=4096)
def tables(model: ModelSpec, batch: int, prompt_len: int, gen_len: int, weights: str, activations: str, kv: str,
           tp: int, pp: int, ep: int, flash_attention: bool, buffer: float,
           techniques: Techniques = NONE, cp: int = 1) -> WorkloadTables:
    """The WorkloadTables of one workload (``cp``: context-parallel ranks); DseError when the
    layout does not divide the model."""
    sc = Scenario.make(batch=batch, prompt_len=prompt_len, gen_len=gen_len, weights=weights,
                       activations=activations, kv=kv, tp=tp, pp=pp, ep=ep, flash_attention=flash_attention,
                       techniques=techniques, cp=cp)
    return _built(model, sc, buffer)


def _built(model: ModelSpec, sc: Scenario, buffer: float) -> WorkloadTables:
    """The WorkloadTables of the workload(s) of ``sc`` on devices with ``buffer`` bytes on chip."""
    pre, dec = _steps(model, sc, buffer)
    pieces = _pieces(model, _micro(sc), buffer)
    fp = footprint(model, sc, pre, dec)
    layer = np.array([op.name not in NON_LAYER_OPS for op in pre.operators])
    return WorkloadTables(sc, OpArrays.from_table(pre), OpArrays.from_table(dec), pieces[0][1], pieces[0][2],
                          pre, dec, fp, layer, _layer_weight_bytes(model, sc), pieces)


def _micro(sc: Scenario) -> Scenario:
    """The scenario of one micro-batch of ``sc`` (what the operator tables price)."""
    return replace(sc, batch=sc.micro_batch)


def _steps(model: ModelSpec, sc: Scenario, buffer: float) -> tuple[optable.OpTable, optable.OpTable]:
    """(prefill, decode step attending to prompt_len keys) tables of one micro-batch of ``sc``."""
    micro = _micro(sc)
    return encoder.prefill(model, micro, buffer), optable.decode_step(model, micro, sc.prompt_len, buffer)


def _pieces(model: ModelSpec, micro: Scenario, buffer: float) -> tuple:
    """(first step, OpArrays, slope) of each affine piece of the decode of the micro-batch ``micro``
    from its first generated token on (``optable.decode_pieces``)."""
    return tuple((j, OpArrays.from_table(d0), OpArrays.from_table(slope))
                 for j, d0, slope in optable.decode_pieces(model, micro, micro.prompt_len + 1, buffer))


def _layer_weight_bytes(model: ModelSpec, sc: Scenario) -> float:
    """Bytes of the weights of all the layers on one device (the CPU share of a layer split)."""
    return (layer_parameter_count(model, sc.tp) * sc.weights.bytes
            * sc.techniques.layer_weight_factor(sc.weights.bits, model.num_layers))


#: workloads whose operator tables ``WorkloadBatch`` builds at once (bounds the memory: a table of
#: many holds ~3 KB per workload). Larger blocks spread each operator's Python over more rows, but
#: take fresh memory for every array of a block: 100,000 distinct workloads ran 7 % faster at 16,384
#: rows than at 8,192 with freed memory kept (``dse.keep_freed_memory``), and no differently outside
#: the machine's noise with malloc as it is; 32,768 rows were not clearly faster again
TABLE_ROWS = 16384


#: a WorkloadBatch whose points share their workloads this many to one or more on average is
#: priced with one operator table per distinct workload (``roofline.Stacked``), not one per point
STACK_SHARE = 8
#: points of a stacked WorkloadBatch priced at once (their tables are the distinct workloads',
#: built once; a block's arrays are the points')
STACKED_ROWS = 1 << 20


def row_blocks(rows: int, block: int | None = None) -> list[slice]:
    """The rows ``0 .. rows - 1`` in blocks of ``block`` (default ``TABLE_ROWS``; slices): the
    workloads whose tables are built, and priced, at once."""
    block = block or TABLE_ROWS
    return [slice(lo, min(lo + block, rows)) for lo in range(0, rows, block)]


@dataclass(frozen=True)
class WorkloadBatch:
    """Workloads that differ only in batch, prompt and generated lengths, one per design point:
    their scenario (``Scenario.many``) and footprint (arrays, one entry per workload), and their
    operator tables built on demand, ``TABLE_ROWS`` workloads at a time (``tables``)."""

    model: ModelSpec
    scenario: Scenario
    buffer: float
    footprint: Footprint
    layer_weight_bytes: float
    workload: np.ndarray      # [P] each point's distinct workload (batch, prompt and generated lengths) ...
    distinct: Scenario        # ... of these U

    @property
    def size(self) -> int:
        return len(self.scenario.batch)

    @property
    def stacked(self) -> bool:
        """Whether the points share their workloads enough (``STACK_SHARE``) to be priced with one
        operator table per distinct workload, and these are few enough (``TABLE_ROWS``) to be
        built at once."""
        distinct = len(self.distinct.batch)
        return distinct * STACK_SHARE <= self.size and distinct <= TABLE_ROWS

    def blocks(self) -> list[slice]:
        """The points priced at once (``tables``): ``STACKED_ROWS`` where stacked, else ``TABLE_ROWS``."""
        return row_blocks(self.size, STACKED_ROWS if self.stacked else TABLE_ROWS)

    @cached_property
    def _distinct(self) -> tuple:
        """(prefill OpArrays, decode pieces) of the distinct workloads, [U, O] arrays: built once."""
        micro = _micro(self.distinct)
        return OpArrays.from_table(encoder.prefill(self.model, micro, self.buffer)), \
            _pieces(self.model, micro, self.buffer)

    def tables(self, rows: slice) -> WorkloadTables:
        """The WorkloadTables of the points ``rows`` that price them: the prefill and the decode's
        pieces, the footprint already known; no single decode step (``decode`` and ``decode_table``
        None: ``one`` has them for a workload explained). Operator arrays [W, O], one row per point,
        or, where stacked, the distinct workloads' (``Stacked``: each point reads its workload's row)."""
        sc = self.scenario.take(rows)
        if self.stacked:
            pre, pieces = self._distinct
            at = self.workload[rows]
            pieces = tuple((j[at] if np.ndim(j) else j, Stacked(d0, at), Stacked(slope, at)) for j, d0, slope in pieces)
            return WorkloadTables(sc, Stacked(pre, at), None, pieces[0][1], pieces[0][2], None, None,
                                  self._footprint(rows), None, self.layer_weight_bytes, pieces)
        micro = _micro(sc)
        pre = encoder.prefill(self.model, micro, self.buffer)
        pieces = _pieces(self.model, micro, self.buffer)
        return WorkloadTables(sc, OpArrays.from_table(pre), None, pieces[0][1], pieces[0][2], pre, None,
                              self._footprint(rows), None, self.layer_weight_bytes, pieces)

    def _footprint(self, rows) -> Footprint:
        fp = self.footprint
        return replace(fp, kv_cache_bytes=fp.kv_cache_bytes[rows], activation_bytes=fp.activation_bytes[rows])

    def take(self, rows) -> "WorkloadBatch":
        """The points ``rows`` (a slice or index array), with the same distinct workloads."""
        return replace(self, scenario=self.scenario.take(rows), footprint=self._footprint(rows),
                       workload=self.workload[rows])

    def one(self, row: int) -> WorkloadTables:
        """The WorkloadTables of workload ``row`` alone (``tables``, cached)."""
        sc = self.scenario
        return tables(self.model, int(sc.batch[row]), int(sc.prompt_len[row]), int(sc.gen_len[row]), sc.weights.name,
                      sc.activations.name, sc.kv.name, sc.tp, sc.pp, sc.ep, sc.flash_attention, self.buffer,
                      sc.techniques, sc.cp)


def workload_batch(model: ModelSpec, batch, prompt_len, gen_len, weights: str, activations: str, kv: str, tp: int,
                   pp: int, ep: int, flash_attention: bool, buffer: float,
                   techniques: Techniques = NONE, cp: int = 1, workload: np.ndarray | None = None) -> WorkloadBatch:
    """The WorkloadBatch of P points (batch, prompt_len, gen_len: integer arrays [P]) sharing
    everything else; the footprints of their distinct workloads come from the prefill and decode
    tables, built ``TABLE_ROWS`` at a time. ``workload``: [P] integers equal exactly where the
    points' (batch, prompt_len, gen_len) are (None: found here). DseError when the layout does not
    divide the model, or a decode's sliding window or KV budget would fill (priced one workload at
    a time, ``tables``)."""
    sc = Scenario.make(batch=np.asarray(batch, dtype=np.int64), prompt_len=np.asarray(prompt_len, dtype=np.int64),
                       gen_len=np.asarray(gen_len, dtype=np.int64), weights=weights, activations=activations, kv=kv,
                       tp=tp, pp=pp, ep=ep, flash_attention=flash_attention, techniques=techniques, cp=cp)
    if workload is None:
        workload = np.unique(np.stack([sc.batch, sc.prompt_len, sc.gen_len]), axis=1, return_inverse=True)[1]
    workload, first = _distinct(np.asarray(workload).reshape(-1))
    distinct = sc.take(first)
    parts = []
    for rows in row_blocks(len(first)):
        part = distinct.take(rows)
        parts.append(footprint(model, part, *_steps(model, part, buffer)))
    fp = Footprint(parts[0].weights_bytes, np.concatenate([f.kv_cache_bytes for f in parts])[workload],
                   np.concatenate([f.activation_bytes for f in parts])[workload],
                   np.concatenate([np.broadcast_to(f.state_bytes, np.shape(f.kv_cache_bytes)) for f in parts])[workload])
    return WorkloadBatch(model, sc, buffer, fp, _layer_weight_bytes(model, sc), workload, distinct)


def _distinct(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each entry's distinct value numbered 0 .. U - 1, a position holding each) of the
    non-negative integers ``labels``, in O(len + max) (no sort)."""
    seen = np.zeros(int(labels.max(initial=-1)) + 1, dtype=bool)
    seen[labels] = True
    number = np.cumsum(seen) - 1
    dense = number[labels]
    where = np.empty(int(seen.sum()), dtype=np.intp)
    where[dense] = np.arange(len(labels))           # any position of each will do: they hold one workload
    return dense, where


@dataclass(frozen=True)
class FootprintInBatch:
    """The per-device footprint of a workload as a function of its batch ``b`` (exact):

        weights = W
        kv      = ceil(b / ep) x kv_per_sequence
        act     = max over operators of (slope_o x m + intercept_o), m = micro_batch(b)

    (every operator's live activations are affine in the micro-batch; checked when built)."""

    weights: float
    kv_per_sequence: float
    act_slope: np.ndarray
    act_intercept: np.ndarray
    ep: int
    pp: int

    def at(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(weights, KV cache, activation) bytes per device at ``batch`` (an array)."""
        b = np.asarray(batch, dtype=float)
        group = np.ceil(b / self.ep)
        micro = np.ceil(group / np.minimum(group, self.pp))
        act = (micro[..., None] * self.act_slope + self.act_intercept).max(axis=-1)
        return np.full(b.shape, self.weights), group * self.kv_per_sequence, act


def _live_activations(model: ModelSpec, sc: Scenario, buffer: float) -> np.ndarray:
    """Per operator of the prefill and the decode step, the live activation bytes at
    ``sc.batch`` sequences per micro-batch (the terms ``footprint`` takes the max of)."""
    pre = encoder.prefill(model, sc, buffer)
    dec = optable.decode_step(model, sc, sc.prompt_len, buffer)
    return np.array([b for t in (pre, dec) for b in live_bytes(t, stream_bytes(model, t))], dtype=float)


@lru_cache(maxsize=1024)
def footprint_in_batch(model: ModelSpec, prompt_len: int, gen_len: int, weights: str, activations: str, kv: str,
                       tp: int, pp: int, ep: int, flash_attention: bool, buffer: float,
                       techniques: Techniques = NONE, cp: int = 1) -> FootprintInBatch:
    """The FootprintInBatch of a workload (DseError when the layout does not divide the model)."""
    sc = Scenario.make(batch=1, prompt_len=prompt_len, gen_len=gen_len, weights=weights, activations=activations,
                       kv=kv, tp=tp, pp=pp, ep=ep, flash_attention=flash_attention, techniques=techniques, cp=cp)
    a1, a2, a3 = (_live_activations(model, replace(sc, batch=b), buffer) for b in (1, 2, 3))
    slope, intercept = a2 - a1, 2 * a1 - a2
    if not np.allclose(a3, 3 * slope + intercept, rtol=1e-12, atol=0.0):
        raise AssertionError(f"live activations of '{model.name}' are not affine in the batch")
    return FootprintInBatch(weight_bytes(model, sc),
                            kv_cache_bytes_per_sequence(model, sc), slope, intercept, ep, pp)


__all__ = ["WorkloadTables", "tables", "WorkloadBatch", "workload_batch", "TABLE_ROWS", "STACK_SHARE", "STACKED_ROWS",
           "row_blocks", "FootprintInBatch", "footprint_in_batch", "resolve_model", "NON_LAYER_OPS",
           "peak_activation_bytes"]

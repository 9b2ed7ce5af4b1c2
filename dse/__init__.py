"""dse: design-space exploration of LLM-inference hardware.

Public entry: ``from dse import evaluate`` (design points as columns -> ``Evaluation``),
``prepare`` (the same, prepared once and priced under several efficiency models) and
``analyze`` (one design point from objects, with its per-operator tables); ``keep_freed_memory``
for a process whose job is evaluating (``basis.memory``: fewer page faults, 10-15 % faster).
"""
from basis.memory import keep_freed_memory
from dse.system.analysis import Analysis, analyze
from dse.system.evaluator import Evaluation, Plan, evaluate, prepare

__all__ = ["evaluate", "prepare", "Evaluation", "Plan", "analyze", "Analysis", "keep_freed_memory"]

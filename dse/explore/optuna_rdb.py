"""A batch of trial attributes written to an Optuna RDBStorage in one transaction.

Optuna's public storage API writes one attribute per call, each its own transaction (an
SQLite commit fsyncs): a population's metrics and constraints (~30 attributes a trial) took
four times as long as the rest of an SQLite study. ``record_attrs`` writes them all in one
transaction on the storage's tables, found by reflection through its public ``engine``
(``trials``, ``trial_user_attributes``, ``trial_system_attributes``: Optuna's schema, kept
by its migrations), values encoded as Optuna encodes them (``json.dumps``). No private
Optuna module is imported. Where the tables are not as expected, or a trial of the batch
is no longer RUNNING, nothing is written and the caller writes through the public API.
"""
from __future__ import annotations

import json
import weakref

_TABLES = ("trials", "trial_user_attributes", "trial_system_attributes")
_RUNNING = "RUNNING"          # TrialState.RUNNING as Optuna stores it (its name)
_reflected: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tables(engine) -> dict:
    """{table name: SQLAlchemy Table} of ``_TABLES``, reflected once per engine."""
    import sqlalchemy
    if engine not in _reflected:
        meta = sqlalchemy.MetaData()
        meta.reflect(engine, only=list(_TABLES))
        _reflected[engine] = {name: meta.tables[name] for name in _TABLES}
    return _reflected[engine]


def record_attrs(storage, study_id: int, items) -> bool:
    """Write the user attrs and system attrs of running trials, ``items`` = [(trial number,
    user attrs, system attrs)], in one transaction on ``storage`` (an RDBStorage) with none
    of them set before; whether they were written (False: nothing written, see the module)."""
    import sqlalchemy
    engine = getattr(storage, "engine", None)
    if engine is None or not items:
        return not items
    try:
        t = _tables(engine)
        trials, user, system = (t[name] for name in _TABLES)
        numbers = [n for n, _, _ in items]
        with engine.begin() as conn:             # one transaction: rolled back on any error
            q = sqlalchemy.select(trials.c.trial_id, trials.c.number, trials.c.state).where(
                trials.c.study_id == study_id, trials.c.number.in_(numbers)).with_for_update()
            found = {n: (tid, getattr(state, "name", state)) for tid, n, state in conn.execute(q)}
            if sorted(found) != sorted(numbers) or any(state != _RUNNING for _, state in found.values()):
                return False         # a trial finished meanwhile (failed as stale): trial by trial
            rows = {user: [], system: []}
            for n, user_attrs, system_attrs in items:
                tid = found[n][0]
                rows[user] += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in user_attrs.items()]
                rows[system] += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)}
                                 for k, v in system_attrs.items()]
            for table, values in rows.items():
                if values:
                    conn.execute(table.insert(), values)
        return True
    except (sqlalchemy.exc.SQLAlchemyError, KeyError, AttributeError):   # another schema, a blip: the public API
        return False

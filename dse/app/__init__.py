"""``dse explore``: a local web app (Dash and Plotly) over the one ``evaluate`` and the run readers.

Two views: a design point (every parameter of ``dse.system.params.TABLE`` as a control; the
operators on the roofline, the time breakdown, memory and the summary of ``analyze_point``, the
same evaluation ``dse analyze`` prints) and a run (the rows a run folder kept: x, y, colour,
facet, filters, hover, a design opened in the design-point view, designs side by side).

- ``data``: the controls derived from the parameter table, their values as design-point columns,
  and a run folder's rows (read column by column, as the report reads them);
- ``figures``: the Plotly figures and tables of a design point and of a run (pure functions);
- ``callbacks``: what each control changes, as pure functions, and their Dash wiring;
- ``layout``: the page and the Dash application (served on 127.0.0.1, its scripts served
  locally, nothing fetched from outside);
- ``cli``: the ``explore`` subcommand.

Recomputes no physics: every number shown comes from ``evaluate`` or from the run's files.
"""

"""Reports stay fast whatever the size of a study, by construction (no timings here):

- importing the report, the plots and the CLI imports no plotting library; drawing a plot
  imports matplotlib alone (not seaborn, not scipy);
- a large cloud of designs or a large Pareto front is drawn as one density mesh, so the
  figure holds the same artists for 6,000 designs as for 60,000;
- the report figures are laid out once, with fixed margins, and every label, title,
  legend and colour bar still lies inside the figure, clear of the other panels;
- the plot style is applied while a figure is drawn and never leaks into the caller's
  matplotlib settings."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dse.explore.pareto import pareto_mask
from dse.present import plots

HEAVY = ("matplotlib", "seaborn", "scipy")


def _modules_after(code: str) -> set[str]:
    """Top-level packages loaded by a fresh interpreter after running ``code``."""
    r = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted({m.split('.')[0] "
                        "for m in sys.modules})))"], capture_output=True, text=True, check=True)
    return set(r.stdout.split())


def test_importing_the_report_plots_and_cli_imports_no_plotting_library():
    loaded = _modules_after("import dse.present.report, dse.present.plots, dse.present.display, "
                            "dse.present.document, dse.present.bottleneck, dse.present.compare, dse.study.cli")
    assert "dse" in loaded and not loaded & set(HEAVY)


def test_drawing_a_plot_imports_matplotlib_but_not_seaborn_or_scipy(tmp_path):
    loaded = _modules_after(
        "import pandas as pd\nfrom dse.present.plots import pareto_plot\n"
        "d = pd.DataFrame({'tpot_s': [1e-3, 2e-3, 3e-3], 'output_tokens_per_s': [300.0, 200.0, 100.0], "
        "'point': [0, 1, 2]})\n"
        f"pareto_plot({str(tmp_path / 'p.png')!r}, d, d.iloc[:1], 'tpot_s', 'output_tokens_per_s', "
        "{'tpot_s': 'min', 'output_tokens_per_s': 'max'})")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "matplotlib" in loaded and not loaded & {"seaborn", "scipy"}


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting functions save (still written to their files)."""
    drawn = []
    save = plots._save

    def keep(fig, path):
        drawn.append(fig)
        save(fig, path)
    monkeypatch.setattr(plots, "_save", keep)
    return drawn


def _cloud(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` designs on a grid of 84 bandwidths (like a grid study) with throughputs and FP8 peaks."""
    rng = np.random.default_rng(seed)
    bw = np.geomspace(1e12, 1.6e13, 84)[rng.integers(0, 84, n)]
    return pd.DataFrame({"memory_bandwidth": bw, "output_tokens_per_s": rng.uniform(10, 4000, n) * bw / 1.6e13,
                         "peak_fp8": rng.uniform(2.5e14, 1e16, n), "point": np.arange(n), "feasible": True})


SENSES = {"output_tokens_per_s": "max", "memory_bandwidth": "min", "peak_fp8": "min"}


def _pareto(path, background, front, **kw):
    return plots.pareto_plot(path, background, front, "memory_bandwidth", "output_tokens_per_s", SENSES, **kw)


def test_a_large_cloud_is_one_density_mesh_and_the_figure_does_not_grow_with_it(tmp_path, figures):
    from matplotlib.collections import PathCollection, QuadMesh
    artists = []
    for n in (plots.LARGE_CLOUD + 1000, 10 * plots.LARGE_CLOUD):
        cloud = _cloud(n)
        rec = _pareto(tmp_path / f"{n}.png", cloud, cloud.iloc[:5])
        ax = figures[-1].axes[0]
        meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
        assert rec["background_mode"] == "density" and rec["mode"] == "points" and len(meshes) == 1
        assert meshes[0].get_array().sum() == n                         # every design counted once
        assert all(len(c.get_offsets()) <= 5 for c in ax.collections if isinstance(c, PathCollection))
        assert rec["legend"][0] == f"feasible designs ({n:,} shown): density"
        artists.append(sorted(type(a).__name__ for a in ax.get_children()))
    assert artists[0] == artists[1]                                     # the same figure, 10x the designs


def test_a_small_cloud_is_drawn_point_by_point(tmp_path, figures):
    cloud = _cloud(300)
    rec = _pareto(tmp_path / "p.png", cloud, cloud.iloc[:5])
    offsets = [len(c.get_offsets()) for c in figures[-1].axes[0].collections]
    assert rec["background_mode"] == "points" and 300 in offsets and 5 in offsets


def test_a_large_front_counts_every_design_in_cells_of_the_grid_levels(tmp_path, figures):
    from matplotlib.collections import QuadMesh
    cloud = _cloud(plots.LARGE_FRONT + 500, seed=1)
    rec = _pareto(tmp_path / "f.png", cloud.iloc[:400], cloud)
    assert rec["mode"] == "density" and rec["density_designs"] == len(cloud)
    mesh = [c for c in figures[-1].axes[0].collections if isinstance(c, QuadMesh)][-1]
    counts = mesh.get_array()
    assert rec["density_cells"] == int((counts > 0).sum())
    columns = int((np.asarray(counts.filled(0)).sum(axis=0) > 0).sum())
    assert columns == cloud["memory_bandwidth"].nunique()             # one column of cells per bandwidth level
    assert len(figures[-1].axes) == 3                                   # the panel and two colour bars


def _one_cell_each(levels, edges):
    """Whether each level lies strictly inside a cell of its own."""
    cell = np.searchsorted(edges, levels)
    return (np.diff(edges) > 0).all() and len(np.unique(cell)) == len(levels) and \
        (edges[cell - 1] < levels).all() and (levels < edges[cell]).all()


def test_cell_edges_put_each_grid_level_in_its_own_cell_and_cover_a_continuous_range():
    levels = np.geomspace(1.0, 16.0, 84)
    for log in (False, True):
        edges = plots._edges(np.repeat(levels, 3), log, 100)
        assert _one_cell_each(levels, edges)
    assert len(plots._edges(levels, True, 100)) == 85                  # evenly spread levels: cells side by side
    two = np.array([1.0, 16.0])                                         # two levels far apart: narrow cells
    edges = plots._edges(two, False, 100)
    cell = np.searchsorted(edges, two)
    assert _one_cell_each(two, edges) and (edges[cell] - edges[cell - 1] <= 2 * 2 * 15 / 100 + 1e-12).all()
    v = np.random.default_rng(2).uniform(3.0, 700.0, 5000)
    for log in (False, True):
        edges = plots._edges(v, log, 64)
        assert len(edges) == 65 and edges[0] <= v.min() and edges[-1] >= v.max()
        assert plots._density(v, v, edges, edges).sum() == len(v)
    assert len(plots._edges(np.array([5.0, 5.0]), True, 64)) == 2        # one value: one cell around it


def _inside(fig):
    """Every axes' drawn extent (tick labels, labels, title), legend and title lies inside the
    figure; figure legends cover no axes; the panels' extents do not overlap."""
    fig.set_dpi(plots.DPI)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [(ax, ax.get_tightbbox(r)) for ax in fig.axes if ax.get_visible()]
    extras = list(fig.legends) + [t for t in fig.texts if t.get_text()]      # the title
    for what, box in boxes + [(e, e.get_window_extent(r)) for e in extras]:
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
            (what, box, page)
    for legend in fig.legends:
        lb = legend.get_window_extent(r)
        for ax, _ in boxes:
            assert not lb.overlaps(ax.bbox), (legend, ax)
    panels = [(ax, b) for ax, b in boxes if getattr(ax, "_colorbar", None) is None]   # not the colour bars
    for i, (a, ba) in enumerate(panels):
        for b, bb in panels[i + 1:]:
            overlap = min(ba.x1, bb.x1) - max(ba.x0, bb.x0), min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            assert min(overlap) <= 1, (a, b)


def test_report_figures_keep_every_label_inside_and_clear_of_the_panels(tmp_path, figures):
    from dse.system.analysis import analyze_point
    cloud = _cloud(plots.LARGE_FRONT + 500, seed=3)
    _pareto(tmp_path / "large.png", cloud.iloc[:8000], cloud, title="a long title " * 8, note="a note " * 20)
    rng = np.random.default_rng(4)
    small = pd.DataFrame({"weights": rng.choice(["fp16", "fp8", "int4"], 300), "kv": rng.choice(["fp16", "fp8"], 300),
                          "activations": rng.choice(["fp16", "fp8", "int8"], 300),
                          "tpot_s": rng.uniform(1e-3, 9e-3, 300), "output_tokens_per_s": rng.uniform(200, 20000, 300)})
    small["point"] = np.arange(300)
    front = small[pareto_mask(small[["output_tokens_per_s", "tpot_s"]].to_numpy(), ["max", "min"])]
    plots.pareto_plot(tmp_path / "facets.png", small, front, "tpot_s", "output_tokens_per_s",
                      {"output_tokens_per_s": "max", "tpot_s": "min"}, hue="weights", style="kv", facet="activations")
    a = analyze_point({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 16, "prompt_len": 1024,
                       "gen_len": 128, "weights": "fp8", "activations": "fp8", "kv": "fp8"})[0]
    plots.roofline_plot(tmp_path / "r.png", a, title="roofline")
    plots.breakdown_plot(tmp_path / "b.png", [{"label": "best output_tokens_per_s\n(point 994223)", "point": 0,
                                               "analysis": a}, {"label": "b\n(point 1)", "point": 1, "analysis": a}])
    rows = pd.DataFrame({"point": range(9), "feasible": True, "batch": 2 ** np.arange(9),
                         "output_tokens_per_s": 60.0 * 2 ** np.arange(9), "tpot_s": 0.016 + 1e-4 * 2 ** np.arange(9)})
    plots.sweep_plot(tmp_path / "s.png", [{"data": rows, "x": "batch", "ys": ["output_tokens_per_s", "tpot_s"],
                                           "hue": None}], "a sweep " * 12)
    assert len(figures) == 5
    for fig in figures:
        assert fig.get_layout_engine() is None                          # laid out once, not at each draw
        _inside(fig)


def test_the_plot_style_does_not_leak_into_matplotlib_settings(tmp_path):
    import matplotlib
    before = dict(matplotlib.rcParams)
    cloud = _cloud(50)
    _pareto(tmp_path / "p.png", cloud, cloud.iloc[:3])
    assert dict(matplotlib.rcParams) == before

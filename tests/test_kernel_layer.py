"""The kernel layer (dse.core.kernel_model, fitted by dse.fit.kernel_tables): the shipped model
reproduces the closed forms it must (a huge GEMM is compute-bound, its time proportional to its ops
and never faster than peak; a GEMV is bandwidth-bound, its time proportional to its bytes), grows
with size, prices arrays of design points at once, and predicts measured kernel rows
(tests/data/kernel_*.csv, a sample of NVIDIA's aiconfigurator-core tables, see
tests/data/kernel_tables_sample.md) within the figures the README states, including a GPU the
fit never saw."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dse.core import kernel_model as km
from dse.core.efficiency import KernelHardware
from dse.fit import kernel_tables as kt

DATA = Path(__file__).parent / "data"
MODEL = km.load_kernel_model()
PRM = MODEL["parameters"]
GPUS = list(MODEL["hardware"])
HW_TABLE = pd.read_csv(DATA / "kernel_hardware.csv").set_index("gpu")


def _rows(kind: str) -> pd.DataFrame:
    return pd.read_csv(DATA / f"kernel_{kind}.csv")


def _fraction_of_peak(t, ops, peak):
    return ops / (peak * t)


#: L40S: the fit puts its huge BF16 GEMMs at ~0.83 of peak where the tables measure 0.55 (median); a
#: 350 W card's clock under sustained tensor load is not among the model's features (known gap). The
#: power model (hwmodels.power, TDP basis) cannot supply it: it puts L40S at 307 W at its BF16 peak,
#: under its 350 W TDP (clock_fraction 1.0, as for H100, H200, B200, GB200 and RTX PRO 6000)
_POWER_LIMITED = pytest.mark.xfail(strict=True, reason="power/clock limit not a feature of the kernel layer")


@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm", "b200_sxm", "gb300", "rtx_pro_6000_server",
                                 pytest.param("l40s", marks=_POWER_LIMITED)])
def test_huge_gemm_is_compute_bound_near_the_measured_fraction(gpu):
    """m = n = k from 16384 to 32768: time grows as the ops (8x), the implied fraction of peak is
    at most 1 and within 20 % (the refit with per-SM terms: B200 +15 %, GB200 +18 %, the worst measured HBM GPU
    on it; README 'Kernel layer') of the median the tables measured on that GPU's BF16 GEMMs with
    m, n, k >= 8192 (tests/data/kernel_gemm_large.csv: every such row of the tables)."""
    hw = km.measured_hardware(gpu, MODEL)
    size = np.array([16384.0, 32768.0])
    t = km.gemm_time(size, size, size, "bf16", hw, PRM["gemm"])
    assert t[1] / t[0] == pytest.approx(8.0, rel=0.05)
    frac = _fraction_of_peak(t, 2 * size ** 3, float(hw.peak_16))
    assert np.all(frac <= 1.0)
    big = pd.read_csv(DATA / "kernel_gemm_large.csv")
    big = big[big.gpu == gpu]
    measured = np.median(_fraction_of_peak(big.seconds, 2 * big.m * big.n * big.k, HW_TABLE.loc[gpu, "peak_16"]))
    assert frac[1] == pytest.approx(measured, rel=0.20)


@pytest.mark.parametrize("gpu", ["h100_sxm", "b200_sxm", "rtx_pro_6000_server"])
def test_gemv_is_bandwidth_bound(gpu):
    """One row times a 16k x 32k..16k x 64k BF16 weight (1-2 GiB, far above the L2): time grows as the
    bytes (2x) and the achieved bandwidth is between half and all of the peak bandwidth."""
    hw = km.measured_hardware(gpu, MODEL)
    n = np.array([32768.0, 65536.0])
    t = km.gemm_time(1.0, n, 16384.0, "bf16", hw, PRM["gemm"])
    assert t[1] / t[0] == pytest.approx(2.0, rel=0.05)
    achieved = 16384.0 * n * 2 / t / float(hw.bandwidth)
    assert np.all((0.5 < achieved) & (achieved <= 1.0))


@pytest.mark.parametrize("gpu", GPUS)
def test_time_grows_with_size(gpu):
    """More rows, a longer context or a longer prompt never makes a kernel faster (within 5 %,
    the spread of neighbouring measured shapes: m and m + 1 differ by 3 % in the median)."""
    hw = km.measured_hardware(gpu, MODEL)
    m = 2.0 ** np.arange(0, 15)
    for fmt in ("bf16", "fp8"):
        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336)):
            t = km.gemm_time(m, n, k, fmt, hw, PRM["gemm"])
            assert np.all(t[1:] >= 0.95 * t[:-1]), (fmt, n, k, t)
    s = 2.0 ** np.arange(4, 17)
    t = km.generation_attention_time(8, s, 32, 8, 128, 2, hw, PRM["generation_attention"])
    assert np.all(t[1:] >= 0.95 * t[:-1])
    s = 2.0 ** np.arange(4, 15)
    t = km.context_attention_time(1, s, 32, 8, 128, "bf16", hw, PRM["context_attention"])
    assert np.all(t[1:] >= 0.95 * t[:-1])
    size = 2.0 ** np.arange(10, 29)
    t = km.collective_time("all_reduce", size, 8, hw, PRM["collective"])
    assert np.all(t[1:] >= 0.95 * t[:-1])


def test_priced_over_design_points_at_once():
    """[points, operators] arrays give, element by element, what each point and operator gives alone."""
    rng = np.random.default_rng(3)
    peak = rng.uniform(3e14, 3e15, (5, 1))
    hw = km.hardware_of(peak, 2 * peak, 4 * peak, rng.uniform(1e12, 8e12, (5, 1)), l2_bytes=5e7)
    m = np.array([[1.0, 64.0, 4096.0]])
    t = km.gemm_time(m, 8192, 8192, "fp8", hw, PRM["gemm"])
    assert t.shape == (5, 3)
    for i in range(5):
        one = km.hardware_of(peak[i, 0], 2 * peak[i, 0], 4 * peak[i, 0], hw.bandwidth[i, 0], sms=hw.sms[i, 0],
                             l2_bytes=5e7)
        for j in range(3):
            assert t[i, j] == pytest.approx(float(km.gemm_time(m[0, j], 8192, 8192, "fp8", one, PRM["gemm"])),
                                            rel=1e-12)


#: the shipped model on rows of the sample (same GPUs; most rows were not among those fitted):
#: median and p90 APE at most (README 'Kernel layer', fit error, plus a margin for 150-250 rows per GPU)
IN_SAMPLE = {"gemm": (11, 35), "generation_attention": (13, 56), "context_attention": (15, 50),
             "collective": (10, 40)}


@pytest.mark.parametrize("kind", list(IN_SAMPLE))
def test_shipped_model_predicts_measured_rows(kind):
    rows = _rows(kind)
    e = kt.ape(kt.predict_rows(kind, rows, HW_TABLE, PRM[kind]), rows.seconds.to_numpy())
    median, p90 = IN_SAMPLE[kind]
    assert np.median(e) <= median and np.percentile(e, 90) <= p90, (np.median(e), np.percentile(e, 90))


#: leave one GPU out on the sample: fit on the other GPUs' rows, predict the held-out GPU's
#: (figures: README 'Kernel layer', leave-one-GPU-out, plus a margin for the small sample)
TRANSFER = {("gemm", "b300_sxm"): (15, 40), ("context_attention", "h200_sxm"): (20, 55)}


@pytest.mark.slow
@pytest.mark.parametrize("kind, held_out", list(TRANSFER))
def test_transfer_to_a_gpu_the_fit_never_saw(kind, held_out):
    rows = _rows(kind)
    prm = kt.fit_kind(kind, rows[rows.gpu != held_out], HW_TABLE, start=PRM[kind])
    test = rows[rows.gpu == held_out]
    e = kt.ape(kt.predict_rows(kind, test, HW_TABLE, prm), test.seconds.to_numpy())
    median, p90 = TRANSFER[(kind, held_out)]
    assert np.median(e) <= median and np.percentile(e, 90) <= p90, (np.median(e), np.percentile(e, 90))


def test_shipped_model_cites_its_hardware_and_source():
    """Every measured GPU's physical description says where it comes from; the model says what it was
    fitted on and when."""
    assert "aiconfigurator-core" in MODEL["source"] and MODEL["date"] and MODEL["conditions"]
    for name, h in MODEL["hardware"].items():
        assert h["source"] and h["sms"] > 0 and h["bandwidth"] > 0, name
        assert h["smem_bytes"] in (100 * 1024, 164 * 1024, 228 * 1024) and "Compute Capabilities" in h["source"], name


def test_preset_with_tables_says_so():
    assert km.source_of("h100-sxm", MODEL).startswith("measured tables (h100_sxm")
    assert km.source_of("mi300x", MODEL).startswith("learned transfer")


def test_fractions_reproduce_the_kernel_time_in_the_roofline():
    """The fractions handed to the evaluator's roofline, max(ops / (peak f_c), bytes / (bw f_m)),
    give back the kernel layer's time for a skinny and a square GEMM."""
    hw = km.measured_hardware("h200_sxm", MODEL)
    m = np.array([1.0, 8192.0])
    n = k = 8192.0
    t = km.gemm_time(m, n, k, "bf16", hw, PRM["gemm"])
    ops, nbytes = 2 * m * n * k, (m * k + k * n) * 2 + m * n * 2
    fc, fm = km.achieved_fractions(ops, nbytes, hw.peak_16, hw.bandwidth, t)
    assert np.maximum(ops / (hw.peak_16 * fc), nbytes / (hw.bandwidth * fm)) == pytest.approx(t, rel=1e-12)
    assert np.all((fc <= 1) & (fm <= 1))


@pytest.mark.parametrize("kind", ["gemm", "generation_attention", "context_attention", "collective"])
def test_band_from_held_out_residuals_covers_the_sample(kind):
    """The band (5th-95th percentile of measured / predicted over the leave-one-out rows) holds at
    least 85 % of the sample's rows under the shipped model."""
    low, high = km.band_of(kind, MODEL)
    rows = _rows(kind)
    ratio = rows.seconds.to_numpy() / kt.predict_rows(kind, rows, HW_TABLE, PRM[kind])
    assert low < 1 < high
    assert np.mean((ratio >= low) & (ratio <= high)) >= 0.85


def test_refit_tool_refuses_a_folder_without_tables_in_one_line(tmp_path, capsys):
    assert kt.main([str(tmp_path), "--out", str(tmp_path / "m.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "h100_sxm.yaml" in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "m.yaml").exists()


@pytest.mark.parametrize("kind", ["gemm", "generation_attention", "context_attention", "collective"])
def test_prediction_equals_the_fitted_design(kind):
    """The predictor sums the correction one feature at a time; the fitter's design matrix times the
    shipped weights gives the same times (to 1e-12)."""
    rows = _rows(kind)
    base, X = kt.predict_rows(kind, rows, HW_TABLE, {**PRM[kind], "design": True})
    expected = base * np.exp(X @ np.asarray(PRM[kind]["correction"]))
    assert kt.predict_rows(kind, rows, HW_TABLE, PRM[kind]) == pytest.approx(expected, rel=1e-12)


def test_a_gemv_reaches_less_of_a_bandwidth_its_sms_cannot_keep_in_flight():
    """Little's law: the SMs draw at most sms x bw_sm bytes/s, in series with the memory. A large GEMV
    (1 GiB of BF16 weights, far above the L2) on H100's 132 SMs takes, in the base law (no correction),
    bytes / (fm x device) + t0 with device = 1 / (1 / bandwidth + 1 / (132 bw_sm)); with twice the
    bandwidth and the same SMs it is faster, by less than 2x."""
    prm = {**PRM["gemm"], "correction": None}
    nbytes = 16384.0 * 32768 * 2
    times = []
    for bw in (3.35e12, 6.7e12):
        hw = km.hardware_of(989e12, 1979e12, 1979e12, bw, sms=132, l2_bytes=50 * 2**20)
        t = float(km.gemm_time(1.0, 32768.0, 16384.0, "bf16", hw, prm))
        device = 1.0 / (1.0 / bw + 1.0 / (132 * prm["bw_sm"]))
        assert t == pytest.approx(nbytes / (prm["fm"] * device) + prm["t0"]["bf16"], rel=0.05)
        times.append(t)
    assert 1.0 < times[0] / times[1] < 2.0


def test_a_larger_group_slows_a_slow_shared_link_more_than_nvlink():
    """The collectives' link terms: from 2 to 8 GPUs, a 64 MB all-reduce's time per bus byte grows more
    on PCIe 4.0 x16 (32 GB/s, GPUs sharing the host bridge) than on NVLink 4 (450 GB/s)."""
    prm = PRM["collective"]
    growth = []
    for link in (32e9, 450e9):
        hw = km.hardware_of(989e12, 1979e12, 1979e12, 3.35e12, sms=132, link_bandwidth=link, link_latency=0.0)
        t2, t8 = km.collective_time("all_reduce", 64 * 2**20, np.array([2.0, 8.0]), hw, prm)
        growth.append((t8 / (2 * 7 / 8)) / (t2 / (2 * 1 / 2)))
    assert growth[0] > growth[1]


#: the sample's decode rows with more than GROUPED_HEADS_MAX query heads a K/V head (the per-head
#: fallback kernel, 106 rows over the 8 GPUs): median and p90 APE at most (measured 52.7 % / 92.2 %;
#: the fit before the fallback: 75.9 % / 115 %)
FALLBACK = (60, 100)


def test_decode_attention_beyond_the_grouped_kernel_follows_the_tables():
    """Beyond 32 query heads a K/V head the tables' decode kernel is 20-50x slower per byte (the
    per-head fallback); the shipped model predicts the sample's measured rows there within FALLBACK,
    and a 64:1 head group on H100 takes longer than a 32:1 group of the same K/V bytes by more than
    the 2x its query heads alone would cost on the tensor cores (the tables, s >= 4096: 0.52 of the
    bandwidth at 32:1, 0.029 at 64:1, ~18x)."""
    rows = _rows("generation_attention")
    big = rows[rows.heads / rows.kv_heads > km.GROUPED_HEADS_MAX]
    e = kt.ape(kt.predict_rows("generation_attention", big, HW_TABLE, PRM["generation_attention"]),
               big.seconds.to_numpy())
    assert np.median(e) <= FALLBACK[0] and np.percentile(e, 90) <= FALLBACK[1], (np.median(e), np.percentile(e, 90))
    hw = km.measured_hardware("h100_sxm", MODEL)
    t32, t64 = km.generation_attention_time(64.0, 8192.0, np.array([32.0, 64.0]), 1.0, 128.0, 2.0, hw,
                                            PRM["generation_attention"])
    assert t64 / t32 > 2.0


def test_decode_floor_follows_the_sm_size_above_hoppers_only():
    """The decode-attention kernel's fixed floor (rows of <= 64 cached tokens, b h <= 256, a grouped
    kernel: tests/data/kernel_generation_attention.csv) is 8.5-9.2 us on H100, H200, L40S and RTX PRO
    6000 (SMs of 0.33-1.0 x Hopper's dense ops/s) and 10.9-11.4 us on the Blackwell HBM GPUs
    (1.9-2.3 x): the shipped model's median predicted / measured on those rows is within 0.9-1.2 on
    every GPU (the power law in the SM's size before the hinge: H100 1.24, H200 1.23), and its floor
    is Hopper's for an SM smaller than Hopper's."""
    d = _rows("generation_attention")
    d = d[(d.length <= 64) & (d.batch * d.heads <= 256) & (d.heads / d.kv_heads <= km.GROUPED_HEADS_MAX)]
    ratio = kt.predict_rows("generation_attention", d, HW_TABLE, PRM["generation_attention"]) / d.seconds
    per_gpu = ratio.groupby(d.gpu).median()
    assert set(per_gpu.index) == set(GPUS)
    assert per_gpu.between(0.9, 1.2).all(), per_gpu.round(3).to_dict()
    hopper = km.measured_hardware("h100_sxm", MODEL)
    small = km.hardware_of(hopper.peak_16 / 3, hopper.peak_8 / 3, hopper.peak_4 / 3, hopper.bandwidth, sms=hopper.sms)
    prm = {**PRM["generation_attention"], "correction": None}
    assert km._floor(prm["t0"], small, prm) == pytest.approx(km._floor(prm["t0"], hopper, prm), rel=1e-12)


def test_recorded_transfer_figures_sit_beside_the_others(tmp_path):
    """record_transfer adds the engine-version figures to the model file's transfer section and
    keeps its header comment and every other key (the copy loads as the shipped one does)."""
    path = tmp_path / "kernel_model.yaml"
    path.write_text(km.KERNEL_MODEL_FILE.read_text())
    figures = {"gemm leave one engine version out": {"all": {"rows": 3, "median_ape_pct": 1.0, "p90_ape_pct": 2.0}}}
    kt.record_transfer(path, figures)
    after = km.load_kernel_model(path)
    assert path.read_text().startswith("# The kernel layer's fitted coefficients")
    assert after["transfer"]["gemm leave one engine version out"] == figures["gemm leave one engine version out"]
    assert after["parameters"] == MODEL["parameters"]
    assert set(MODEL["transfer"]) <= set(after["transfer"])


def test_prefill_tile_rows_are_what_fits_the_shared_memory():
    """The tile's query rows: the largest power of two in [16, 128] with rows x d x e x (1 + 2 x 2)
    bytes (a Q tile and two stages of K and V tiles) within the SM's shared memory (CUDA C++
    Programming Guide: 100 KB per SM at compute capability 8.9 and 12.0, 228 KB at 9.0 and 10.0)."""
    small, large = 100 * 1024, 228 * 1024
    # 100 KB / (256 x 2 x 5) = 40 rows -> 32; 228 KB / 2560 = 91 -> 64; FP8 halves the bytes: twice the rows
    assert km.attention_tile_rows(256, 2, small) == 32 and km.attention_tile_rows(256, 2, large) == 64
    assert km.attention_tile_rows(256, 1, small) == 64 and km.attention_tile_rows(128, 2, small) == 64
    assert km.attention_tile_rows(128, 2, large) == 128 and km.attention_tile_rows(64, 2, small) == 128
    assert km.attention_tile_rows(4096, 2, 1024) == 16                      # never below the smallest tile
    # the measured GPUs' shared memory by compute capability (kernel_tables.GPU_FEATURES)
    assert {g: f["smem_bytes"] // 1024 for g, f in kt.GPU_FEATURES.items() if g in ("l40s", "rtx_pro_6000_server",
            "h100_sxm", "b200_sxm", "a100_sxm")} == {"l40s": 100, "rtx_pro_6000_server": 100, "h100_sxm": 228,
                                                      "b200_sxm": 228, "a100_sxm": 164}


def test_a_template_design_defaults_to_hoppers_shared_memory():
    """hardware_of without a shared-memory figure takes SMEM_DEFAULT, 228 KB (compute capability 9.0
    and 10.0); a given figure is kept."""
    assert km.hardware_of(989e12, 1979e12, 1979e12, 3.35e12).smem_bytes == 228 * 1024
    assert km.hardware_of(989e12, 1979e12, 1979e12, 3.35e12, smem_bytes=100 * 1024).smem_bytes == 100 * 1024


def test_large_heads_on_small_shared_memory_run_slower_and_small_heads_do_not():
    """Two GPUs alike but for the shared memory (100 KB against 228 KB a SM): a head size of 256
    prefills slower on the smaller one (smaller tiles), a head size of 64 (128-row tiles on both)
    takes the same time; a model fitted before the feature (no r_fill) reads no shared memory."""
    prm = PRM["context_attention"]
    if "r_fill" not in prm:
        pytest.skip("the shipped model has no shared-memory tile")
    hw = {kb: km.hardware_of(989e12, 1979e12, 1979e12, 3.35e12, sms=132, l2_bytes=50 * 2**20,
                             smem_bytes=kb * 1024) for kb in (100, 228)}
    t = {kb: km.context_attention_time(16, 8192, 32, 8, np.array([64.0, 256.0]), "bf16", h, prm) for kb, h in hw.items()}
    assert t[100][0] == pytest.approx(t[228][0], rel=1e-12)
    assert t[100][1] > 1.1 * t[228][1]
    old = {k: v for k, v in prm.items() if k != "r_fill"}
    assert km.context_attention_time(16, 8192, 32, 8, 256, "bf16", hw[100], {**old, "correction": None}) == \
        pytest.approx(km.context_attention_time(16, 8192, 32, 8, 256, "bf16", hw[228], {**old, "correction": None}))


def test_gddr_cards_large_head_prefill_within_the_stated_band():
    """L40S and RTX PRO 6000 (100 KB of shared memory a SM) prefilling with head sizes 192-256 at
    batch x length >= 4096 (41 rows of the sample): the tables measure them at a median 1.36x the
    shipped model (1.73x before the shared-memory tile), median APE at most 30 % (42 % before);
    the HBM GPUs' rows of the same head sizes stay at a median APE under 10 %."""
    rows = _rows("context_attention")
    ratio = rows.seconds.to_numpy() / kt.predict_rows("context_attention", rows, HW_TABLE, PRM["context_attention"])
    gddr = rows.gpu.isin(["l40s", "rtx_pro_6000_server"]).to_numpy()
    large = ((rows.head_dim >= 192) & (rows.batch * rows.length >= 4096)).to_numpy()
    r = ratio[gddr & large]
    assert r.size >= 40
    assert 1.0 <= np.median(r) <= 1.45 and np.median(100 * np.abs(1 / r - 1)) <= 30, np.median(r)
    assert np.median(100 * np.abs(1 / ratio[~gddr & (rows.head_dim >= 192).to_numpy()] - 1)) <= 10


def test_refit_of_one_kind_needs_the_model_it_refits_in(tmp_path, capsys):
    """``--kind`` refits one operator kind inside the model file ``--out``: without that file, one
    line naming it and exit 2, nothing written."""
    out = tmp_path / "missing.yaml"
    assert kt.main([str(tmp_path), "--out", str(out), "--kind", "context_attention"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "missing.yaml" in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_the_evaluators_hardware_carries_the_shared_memory():
    """``efficiency.KernelHardware`` (what ``evaluate`` hands the kernel layer) keeps each point's
    shared memory through ``at``, ``take`` and ``model_hardware``, and defaults to SMEM_DEFAULT."""
    peaks = np.full((2, 9), 989e12)                          # one peak a compute class (COMPUTE_CLASSES)
    k = KernelHardware(peaks, np.array([3.35e12, 0.864e12]), np.array([132.0, 142.0]), np.array([5e7, 5e7]),
                       np.array([228.0, 100.0]) * 1024)
    assert k.at(1).smem_bytes == 100 * 1024 and list(k.take([1, 0]).smem_bytes) == [100 * 1024, 228 * 1024]
    assert np.ravel(k.model_hardware().smem_bytes).tolist() == [228 * 1024, 100 * 1024]
    assert KernelHardware((989e12,) * 9, 3.35e12, 132.0, 5e7).model_hardware().smem_bytes == km.SMEM_DEFAULT

"""The GPU catalog: every figure has a value, a source and a date."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from servelab.catalog import FIGURES, get_gpu, gpu_names

REQUIRED = {"H100-SXM", "H100-PCIe", "H200", "A100-80GB", "A100-40GB", "L4", "L40S", "B200",
            "MI300X"}


def test_catalog_has_the_gpus_users_ask_for():
    assert set(gpu_names()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_figure_is_sourced_and_dated(name):
    raw = tomllib.loads(resources.files("servelab.catalog").joinpath("gpus.toml").read_text())
    for fig in FIGURES:
        item = raw[name].get(fig)
        if item is None:  # optional: no FP8 on A100; runtime memory only where logged
            assert fig == "memory_runtime_gib" or (
                fig == "fp8_dense_tflops" and name.startswith("A100"))
            continue
        assert item["value"] > 0
        assert item["source"].strip()
        assert item["date"].strip()
    spec = get_gpu(name)
    assert spec.hbm_bytes_per_s > 1e11
    assert spec.peak_flops("bf16") > 1e13


def test_known_datasheet_figures():
    h100 = get_gpu("H100-SXM")
    assert (h100.memory_datasheet_gb, h100.hbm_bandwidth_tbps) == (80, 3.35)
    assert h100.fp8_dense_tflops == pytest.approx(2 * h100.bf16_dense_tflops, rel=0.01)
    assert get_gpu("A100-80GB").fp8_dense_tflops is None

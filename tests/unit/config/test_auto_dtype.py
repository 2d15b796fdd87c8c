"""``model.dtype: auto`` (``config/auto_dtype.py``): bf16 where the hardware computes it natively, fp32 on CPUs that
would emulate it — decided from the CPU's flags, said in one log line; an explicit bf16 on such a CPU is warned
about with the measured rates. The machines' flags are given as ``/proc/cpuinfo`` files."""

from __future__ import annotations

import logging

import pytest

from hybridrl.config import load_config
from hybridrl.config.auto_dtype import native_bf16_flags, resolve_dtype

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture
def cpuinfo(tmp_path):
    def write(text: str):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return path
    return write


def test_auto_is_fp32_on_a_cpu_without_native_bf16_and_says_so(cpuinfo, caplog):
    with caplog.at_level(logging.INFO, logger="hybridrl.config.auto_dtype"):
        assert resolve_dtype("auto", "cpu", cpuinfo=cpuinfo(AVX2_ONLY)) == "float32"
    assert caplog.text.count("model.dtype=auto → float32") == 1 and "no AVX-512 BF16, no AMX" in caplog.text


def test_auto_is_bf16_where_it_is_native(cpuinfo, caplog):
    with caplog.at_level(logging.INFO, logger="hybridrl.config.auto_dtype"):
        assert resolve_dtype("auto", "cpu", cpuinfo=cpuinfo(SAPPHIRE_RAPIDS)) == "bfloat16"
        assert resolve_dtype("auto", "cuda", cpuinfo=cpuinfo(AVX2_ONLY)) == "bfloat16"  # accelerators: bf16
    assert "avx512_bf16, amx_bf16" in caplog.text and "(accelerator)" in caplog.text
    assert native_bf16_flags(cpuinfo(SAPPHIRE_RAPIDS)) == ["avx512_bf16", "amx_bf16"]


def test_explicit_bf16_on_an_emulating_cpu_is_kept_and_warned_about_with_measured_rates(cpuinfo, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config.auto_dtype"):
        assert resolve_dtype("bfloat16", "cpu", cpuinfo=cpuinfo(AVX2_ONLY)) == "bfloat16"
    assert "bf16 matmuls are emulated here — measured" in caplog.text and "GFLOP/s fp32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridrl.config.auto_dtype"):
        assert resolve_dtype("float32", "cpu", cpuinfo=cpuinfo(AVX2_ONLY)) == "float32"
        assert resolve_dtype("bfloat16", "cpu", cpuinfo=cpuinfo(SAPPHIRE_RAPIDS)) == "bfloat16"
    assert caplog.text == ""


def test_unreadable_flags_keep_bf16(tmp_path):
    assert native_bf16_flags(tmp_path / "missing") is None
    assert resolve_dtype("auto", "cpu", cpuinfo=tmp_path / "missing") == "bfloat16"


def test_a_loaded_config_never_says_auto():
    """Resolved when the config is validated (every loader path), so workers and the dumped config.yaml see the
    dtype that runs."""
    assert load_config([], check_paths=False).model.dtype in ("bfloat16", "float32")
    assert load_config(["model.dtype=float32"], check_paths=False).model.dtype == "float32"

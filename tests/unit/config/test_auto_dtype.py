"""``model.dtype: auto`` (``config/auto_dtype.py``): bf16 where the hardware computes it natively, fp32 on CPUs that
would emulate it — decided from the CPU's flags and an oneDNN ISA cap, said in one log line; an explicit bf16 on such a
CPU is warned about with the measured rates. The machines' flags are given as ``/proc/cpuinfo`` files."""

from __future__ import annotations

import logging

import pytest

from hybridrl.config import load_config
from hybridrl.config.auto_dtype import ISA_CAP_VARIABLES, isa_cap_without_bf16, native_bf16_flags, resolve_dtype

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture(autouse=True)
def no_isa_cap(monkeypatch):
    for name in ISA_CAP_VARIABLES:
        monkeypatch.delenv(name, raising=False)


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


@pytest.mark.parametrize("name", ISA_CAP_VARIABLES)
def test_an_onednn_isa_cap_below_bf16_counts_as_no_native_bf16(name, monkeypatch, cpuinfo, caplog):
    """``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX-512 BF16 CPU: oneDNN (torch's CPU bf16 matmuls) stays off the bf16
    instructions, so ``auto`` is fp32 and the line names the cap; a cap at or above AVX512_CORE_BF16 changes nothing."""
    monkeypatch.setenv(name, "avx2")
    assert isa_cap_without_bf16() == f"{name}=avx2"
    with caplog.at_level(logging.INFO, logger="hybridrl.config.auto_dtype"):
        assert resolve_dtype("auto", "cpu", cpuinfo=cpuinfo(SAPPHIRE_RAPIDS)) == "float32"
        assert resolve_dtype("auto", "cuda", cpuinfo=cpuinfo(SAPPHIRE_RAPIDS)) == "bfloat16"
    assert f"model.dtype=auto → float32 ({name}=avx2 keeps oneDNN off this CPU's native bf16" in caplog.text
    for value in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL"):
        monkeypatch.setenv(name, value)
        assert isa_cap_without_bf16() is None
        assert resolve_dtype("auto", "cpu", cpuinfo=cpuinfo(SAPPHIRE_RAPIDS)) == "bfloat16"


def test_an_isa_cap_on_a_cpu_without_bf16_still_says_what_the_cpu_lacks(monkeypatch, cpuinfo, caplog):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with caplog.at_level(logging.INFO, logger="hybridrl.config.auto_dtype"):
        assert resolve_dtype("auto", "cpu", cpuinfo=cpuinfo(AVX2_ONLY)) == "float32"
    assert "no AVX-512 BF16, no AMX" in caplog.text and "ONEDNN_MAX_CPU_ISA" not in caplog.text

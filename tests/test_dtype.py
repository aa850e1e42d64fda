"""engine.dtype: auto picks bfloat16 only where the CPU has native bf16 and a probe shows it is not slower."""

from pathlib import Path

import pytest

from lorapop.engine.dtype import choose_cpu_dtype, check_dtype_name, cpu_flags, resolve_dtype

AVX2_EPYC = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2\n"
GENOA = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
CONFIGS = Path(__file__).resolve().parents[1] / "lorapop" / "configs"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"


def _never_probe():
    raise AssertionError("the probe must not run on a CPU without native bf16")


def test_flags_are_read_from_cpuinfo():
    assert "avx512_bf16" in cpu_flags(GENOA)
    assert "avx512_bf16" not in cpu_flags(AVX2_EPYC)
    assert cpu_flags("no flags line here") == set()


def test_avx2_only_cpu_gets_float32_without_probing():
    dtype, reason = choose_cpu_dtype(cpu_flags(AVX2_EPYC), _never_probe)
    assert dtype == "float32" and "no native bfloat16" in reason


@pytest.mark.parametrize("cpuinfo", [GENOA, SAPPHIRE])
def test_native_bf16_cpu_follows_the_probe(cpuinfo):
    assert choose_cpu_dtype(cpu_flags(cpuinfo), lambda: 0.5)[0] == "bfloat16"
    assert choose_cpu_dtype(cpu_flags(cpuinfo), lambda: 1.0)[0] == "bfloat16"  # "at least as fast"
    dtype, reason = choose_cpu_dtype(cpu_flags(cpuinfo), lambda: 1.3)
    assert dtype == "float32" and "slower" in reason


def test_explicit_names_pass_through_and_bad_names_are_one_line_errors():
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(name, "cpu") == name
    with pytest.raises(ValueError, match="engine.dtype: 'fp8' is not one of auto"):
        check_dtype_name("fp8")


def test_auto_on_this_cpu_is_a_real_dtype_and_is_printed_once(capsys):
    first = resolve_dtype("auto", "cpu")
    assert first in ("float32", "bfloat16")
    assert resolve_dtype("auto", "cpu") == first
    err = capsys.readouterr().err
    assert err.count("engine.dtype=auto ->") <= 1  # once per process (another test may have printed it already)


def test_training_config_defaults_to_auto():
    from lorapop.config import Config, load_config

    assert Config().engine.dtype == "auto"
    assert load_config(str(CONFIGS / "cpu_demo.yaml")).engine.dtype == "auto"
    assert load_config(str(CONFIGS / "cpu_single.yaml")).engine.dtype == "auto"
    from lorapop.engine import EngineConfig

    assert EngineConfig().dtype == "float32"  # the library never casts a caller's model unless asked

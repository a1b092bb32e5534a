"""Which integer type 8-bit weights take, so that ONNX Runtime's integer GEMM does not saturate on this CPU.

On x86-64 without VNNI, MLAS multiplies uint8 activations by int8 weights with VPMADDUBSW, which adds two products
into int16 and saturates past 32767 (255 * 127 * 2 does not fit): a layer's output then drifts far from its float
one. ONNX Runtime's quantization guide gives two ways out for such CPUs: 7-bit weights (``reduce_range``) or uint8
weights (its u8 x u8 GEMM widens to int16 before it multiplies, and adds in int32). ``auto`` takes uint8 there,
which keeps all 8 bits, or 7 bits beside int8 activations (ONNX Runtime quantizes no int8 x uint8 pair); with VNNI
(AVX512-VNNI or AVX-VNNI), and on other architectures, weights stay int8, the fastest kernel. The CPU is the build
host's, where an onnxruntime artifact is validated.
"""

from __future__ import annotations

import enum
import functools
import platform

from aotforge.core.cpu_flags import cpu_flags
from aotforge.core.errors import OptionsError


class IntegerWeights(enum.StrEnum):
    AUTO = "auto"  # int8 where the CPU's u8 x s8 GEMM is exact, else uint8
    INT8 = "int8"  # ONNX Runtime's default
    INT8_7BIT = "int8-7bit"  # ONNX Runtime's reduce_range
    UINT8 = "uint8"


def integer_weights(
    setting: IntegerWeights | str, what: str, signed_activations: bool = False
) -> tuple[IntegerWeights, str]:
    """``setting`` resolved for this CPU (and int8 activations where ``signed_activations``), and why."""
    try:
        chosen = IntegerWeights(str(setting).lower())
    except ValueError:
        choices = ", ".join(w.value for w in IntegerWeights)
        raise OptionsError(f"{what} option weights is one of {choices}, got {setting!r}") from None
    if chosen is not IntegerWeights.AUTO:
        return chosen, f"weights={chosen.value}"
    why = saturating_cpu()
    if why and signed_activations:
        return IntegerWeights.INT8_7BIT, why + ": 7-bit int8 weights beside int8 activations"
    if why:
        return IntegerWeights.UINT8, why + ": uint8 weights"
    return IntegerWeights.INT8, "this CPU's u8 x s8 integer GEMM does not saturate: int8 weights"


@functools.cache
def saturating_cpu() -> str:
    """Why ONNX Runtime's u8 x s8 GEMM saturates on this CPU ("" where it does not)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    flags = cpu_flags()
    if not flags or flags & {"avx512_vnni", "avx_vnni"}:
        return ""  # VNNI, or the flags unknown (no /proc): ONNX Runtime's default
    return "this x86-64 CPU has no VNNI, where ONNX Runtime's u8 x s8 GEMM saturates its int16 pair sums"

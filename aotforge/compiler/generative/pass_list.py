"""A text-generation build's pass list as a decoder takes it: what the default preset and ``--precision`` mean.

``--precision`` appends its pass to ``--passes`` (default ``O1``), which is right for encoders. For a decoder,
``O1`` (fold, dce: an encoder graph's cleanup) stands for the text-generation default, no graph passes, and
``int8`` (static Q/DQ of activations, calibrated) means weight-only at 8 bits: a decode step is bound by
reading its weights, and the weight-only kernels quantize each step's activations themselves (nothing to
calibrate). So ``--precision int4`` and ``--precision int8`` both build a weight-only decoder, and its int4
weights are calibrated by :data:`~aotforge.passes.quantize_weight_only.DECODER_INT4_METHOD` unless
``weight-only.method`` names another.
"""

from __future__ import annotations

from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import OptionsError
from aotforge.passes import DEFAULT_PRESET
from aotforge.passes.quantize_weight_only import DECODER_INT4_METHOD

#: The pass a decoder's int8 is, and the parameter that makes it 8-bit.
DECODER_INT8 = ("weight-only", {"bits": 8})


def decoder_pass_options(opts: BuildOptions) -> BuildOptions:
    """``opts`` with the default preset dropped and ``int8`` spelled as weight-only at 8 bits."""
    names = [n for n in opts.passes.names if n != DEFAULT_PRESET]
    if "int8" not in names:
        return _int4_method(opts.with_fields({"passes.names": tuple(names)}))
    pass_name, int8_params = DECODER_INT8
    if pass_name in names:
        raise OptionsError(
            f"int8 and {pass_name} both set a text-generation build's precision (its int8 is {pass_name} at 8 bits): "
            "give one of them"
        )
    if "int8" in opts.passes.params:
        raise OptionsError(
            f"a text-generation build's int8 is {pass_name} at 8 bits: give its parameters as "
            f"--pass-opt {pass_name}.KEY=VALUE, not int8.KEY"
        )
    user = dict(opts.passes.params.get(pass_name, {}))
    if str(user.get("bits", 8)) != "8":
        raise OptionsError(
            f"--precision int8 and {pass_name}.bits={user['bits']} disagree: use --precision int4 for 4 bits"
        )
    passes = tuple(pass_name if n == "int8" else n for n in names)
    params = {**opts.passes.params, pass_name: {**int8_params, **user}}
    return opts.with_fields({"passes.names": passes, "passes.params": params})


def _int4_method(opts: BuildOptions) -> BuildOptions:
    """``opts`` with the decoder's int4 method set where weight-only builds 4 bits and no method was given."""
    pass_name = DECODER_INT8[0]
    user = opts.passes.params.get(pass_name, {})
    if pass_name not in opts.passes.names or "method" in user or str(user.get("bits", 4)) != "4":
        return opts
    params = {**opts.passes.params, pass_name: {**user, "method": DECODER_INT4_METHOD}}
    return opts.with_fields({"passes.params": params})

"""onnxruntime's intra-op spin option: text-generation builds default to a short spin, the user's setting wins, and
the artifact's sessions open with it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import aotforge
from aotforge.core.errors import OptionsError
from aotforge.targets.onnxruntime import OrtOptions, session_options

SPIN = "session.intra_op.spin_duration_us"
ALLOW = "session.intra_op.allow_spinning"


def _entry(options: Any, key: str) -> str | None:
    """A session config entry, or None when unset (ORT raises for a key never set)."""
    try:
        return str(options.get_session_config_entry(key))
    except Exception:
        return None


def test_text_generation_builds_default_to_a_short_spin() -> None:
    """The backend's default sits under the user's target options, and only text-generation builds get it."""
    from aotforge.compiler.generative.build import _target_options
    from aotforge.compiler.options import BuildOptions
    from aotforge.targets import get_target
    from aotforge.targets.generative import generative_backend
    from aotforge.targets.onnxruntime.decoder import TARGET_DEFAULTS

    backend, target = generative_backend("onnxruntime"), get_target("onnxruntime")

    def spin(target_options: dict[str, Any]) -> int:
        opts = BuildOptions(target="onnxruntime", target_options=target_options)
        return int(_target_options(opts, target, backend).intra_op_spin_us)

    assert spin({}) == TARGET_DEFAULTS["intra_op_spin_us"] > 0
    assert spin({"intra_op_threads": 2}) == TARGET_DEFAULTS["intra_op_spin_us"]
    assert spin({"intra_op_spin_us": "-1"}) == -1  # from the CLI, a string: the user's wins
    assert OrtOptions().intra_op_spin_us == -1  # other builds keep ORT's own spinning


def test_spin_option_becomes_session_entries() -> None:
    """N > 0 bounds the spin, 0 turns it off, -1 sets nothing (ORT's own); below -1 is refused."""
    for spin, entries in ((20, ("20", None)), (0, (None, "0")), (-1, (None, None))):
        options = session_options(OrtOptions(intra_op_spin_us=spin))
        assert (_entry(options, SPIN), _entry(options, ALLOW)) == entries
    with pytest.raises(OptionsError, match="intra_op_spin_us must be microseconds >= 0, or -1"):
        OrtOptions(intra_op_spin_us=-2)


def test_artifact_sessions_open_with_the_spin(llama_ort: Any) -> None:
    """The build records the spin (manifest, ``session.json``) and every session of the loaded engine has it."""
    from aotforge.targets.onnxruntime.decoder import TARGET_DEFAULTS

    spin = TARGET_DEFAULTS["intra_op_spin_us"]
    assert llama_ort.manifest.target.options["intra_op_spin_us"] == spin
    assert json.loads((llama_ort.path / "session.json").read_text())["intra_op_spin_us"] == spin
    engine = aotforge.load(llama_ort.path)._generative().engine
    for session in (engine.prefill_session, engine.decode_session, engine.verify_session):
        assert _entry(session.get_session_options(), SPIN) == str(spin)

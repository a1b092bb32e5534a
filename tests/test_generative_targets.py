"""What a text-generation artifact does on every CPU target alike, each test once over both (``llama_ort`` and
``llama_tvm``, tests/conftest.py: the tiny Llama built for each): token-exact batches against transformers,
eos per sequence, the cache's limits, seeded sampling, stream == generate. What only one target builds (ORT's
fused attention and weight file, tvm's buckets, kernels and packed weights): tests/test_generative.py and
tests/test_generative_tvm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.core.errors import InputSpecError
from tests.conftest import CPU_TARGETS
from tests.llm_models import (
    ARCHITECTURES,
    MAX_SEQ,
    NEW,
    TVM_BUCKETS,
    assert_build_token_exact,
    build_text_generation,
    left_padded,
    tiny_causal_lm,
)

_FIXTURE = {"onnxruntime": "llama_ort", "tvm": "llama_tvm"}


@pytest.fixture(params=CPU_TARGETS)
def llama_built(request: pytest.FixtureRequest) -> Any:
    """The tiny Llama's artifact for each CPU target (each built once a run)."""
    return request.getfixturevalue(_FIXTURE[request.param])


def test_llama_directory_batch_is_token_exact_against_transformers(llama_built: Any) -> None:
    assert_build_token_exact(llama_built, tiny_causal_lm("llama"))


#: Each build exports (~25 s) and compiles (onnxruntime ~10 s, tvm ~40 s) on 2 busy cores: Llama runs by
#: default (above), the others behind slow.
@pytest.mark.slow
@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "llama"] + ["llama-tied"])
def test_greedy_batch_is_token_exact_against_transformers(arch: str, target: str, tmp_path: Path) -> None:
    """Each architecture, built from the module itself."""
    model = tiny_causal_lm(arch)
    options = {"target_options": TVM_BUCKETS} if target == "tvm" else {}
    assert_build_token_exact(build_text_generation(model, tmp_path, target=target, name=arch, **options), model)


def test_stops_at_eos_per_sequence(llama_built: Any) -> None:
    artifact = aotforge.load(llama_built.path)
    ids, mask = left_padded()
    free = artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)[:, ids.shape[1] :]
    eos = int(free[0, 3])  # the first sequence emits it at step 3 (or before)
    out = artifact.generate(ids, NEW, attention_mask=mask, eos_token_id=eos)[:, ids.shape[1] :]
    first_stop = [int(np.argmax(row == eos)) if (row == eos).any() else None for row in free]
    steps = out.shape[1]
    assert steps == max(s + 1 if s is not None else NEW for s in first_stop)
    for row, stop in enumerate(first_stop):
        if stop is None:
            np.testing.assert_array_equal(out[row], free[row, :steps])
        else:
            np.testing.assert_array_equal(out[row, : stop + 1], free[row, : stop + 1])
            assert (out[row, stop:] == eos).all(), "a finished sequence repeats eos"


def test_end_of_cache_is_a_clear_error(llama_built: Any) -> None:
    artifact = aotforge.load(llama_built.path)
    with pytest.raises(InputSpecError, match=f"max_seq_len={MAX_SEQ}"):
        artifact.generate(np.arange(60)[None, :], 6)
    # Exactly full is fine: 60 + 5 new tokens write 64 positions.
    assert artifact.generate(np.arange(60)[None, :], 5, ignore_eos=True).shape == (1, 65)
    with pytest.raises(InputSpecError, match="max_batch 2"):
        artifact.generate(np.zeros((3, 4), dtype=np.int64), 2)


def test_seeded_sampling_is_reproducible(llama_built: Any) -> None:
    artifact = aotforge.load(llama_built.path)
    ids, mask = left_padded()
    kw = {"attention_mask": mask, "do_sample": True, "top_k": 50, "top_p": 0.9, "temperature": 1.3}
    a = artifact.generate(ids, NEW, seed=7, ignore_eos=True, **kw)
    np.testing.assert_array_equal(a, artifact.generate(ids, NEW, seed=7, ignore_eos=True, **kw))
    assert not np.array_equal(a, artifact.generate(ids, NEW, seed=8, ignore_eos=True, **kw))
    assert not np.array_equal(a, artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True))
    top1 = artifact.generate(ids, NEW, attention_mask=mask, do_sample=True, top_k=1, seed=3, ignore_eos=True)
    np.testing.assert_array_equal(top1, artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True))


def test_stream_yields_what_generate_returns(llama_built: Any) -> None:
    artifact = aotforge.load(llama_built.path)
    ids, mask = left_padded()
    steps = list(artifact.stream(ids, NEW, attention_mask=mask, ignore_eos=True))
    assert len(steps) == NEW and all(s.shape == (2,) for s in steps)
    np.testing.assert_array_equal(
        np.stack(steps, axis=1), artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)[:, -NEW:]
    )

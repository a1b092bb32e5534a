"""The serving runtime (``aotforge.runtime``) over real tiny artifacts on both CPU targets.

Requests arrive while others run, prompts are prefilled in chunks, prefixes are reused and sequences are
preempted; whatever the schedule, greedy tokens equal the artifact's own ``generate`` for the same prompt.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aotforge.artifacts.engine_loader import load_async_engine, load_engine
from aotforge.artifacts.loader import load
from aotforge.core.errors import InputSpecError
from aotforge.runtime.async_engine import AsyncEngine
from aotforge.runtime.detokenizer import Detokenizer
from aotforge.runtime.engine import LLMEngine
from aotforge.runtime.kv_blocks import KVBlockManager
from aotforge.runtime.outputs import FinishReason, StepStats
from aotforge.runtime.params import EngineConfig, SamplingParams
from tests.llm_models import MAX_BATCH, MAX_SEQ

GREEDY = SamplingParams(max_tokens=12, temperature=0)
RNG = np.random.default_rng(7)
PROMPTS = [[int(t) for t in RNG.integers(3, 500, size=n)] for n in (7, 3, 20, 33, 16, 40)]
PROMPTS[4] = PROMPTS[3][:32] + [9, 8, 7]  # shares two 16-token blocks with the fourth prompt


@pytest.fixture(params=["onnxruntime", "tvm"])
def artifact(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(f"llama_{'ort' if request.param == 'onnxruntime' else 'tvm'}").path)


def _engine(path: Path, **config: Any) -> LLMEngine:
    engine, _, _ = load_engine(path, EngineConfig(**{"max_num_seqs": MAX_BATCH, **config}))
    engine.eos_token_ids = frozenset()  # random weights: never stop early, as generate(ignore_eos=True)
    return engine


def _expected(path: Path, prompts: list[list[int]], new: int = 12) -> list[list[int]]:
    loaded = load(path)
    return [[int(t) for t in loaded.generate(np.array([p]), new, ignore_eos=True)[0, len(p) :]] for p in prompts]


def _run(engine: LLMEngine, arrivals: dict[int, list[tuple[str, list[int]]]]) -> tuple[dict, list[StepStats]]:
    """Step until done, adding ``arrivals[step]`` before that step; tokens by request, each step's stats."""
    tokens: dict[str, list[int]] = {}
    stats = []
    step = 0
    while engine.has_unfinished() or any(s >= step for s in arrivals):
        for request_id, prompt in arrivals.get(step, []):
            engine.add_request(request_id, prompt, GREEDY)
            tokens[request_id] = []
        for out in engine.step():
            assert out.error is None
            tokens[out.request_id] += out.token_ids
        stats.append(engine.last_stats)
        step += 1
    return tokens, stats


def test_requests_arriving_mid_run_are_token_exact(artifact: Path) -> None:
    engine = _engine(artifact)
    arrivals = {0: [("0", PROMPTS[0]), ("1", PROMPTS[1]), ("2", PROMPTS[2])], 4: [("3", PROMPTS[3])]}
    arrivals[9] = [("4", PROMPTS[4]), ("5", PROMPTS[5])]
    tokens, stats = _run(engine, arrivals)
    assert [tokens[str(i)] for i in range(6)] == _expected(artifact, PROMPTS)
    assert max(s.num_running for s in stats) == MAX_BATCH
    assert any(s.num_waiting for s in stats)  # more requests than slots: some waited
    assert stats[-1].kv_blocks_used == 0 and stats[-1].num_running == 0


def test_prompts_prefill_in_chunks_within_the_token_budget(artifact: Path) -> None:
    engine = _engine(artifact, max_num_batched_tokens=8)
    tokens, stats = _run(engine, {0: [("a", PROMPTS[3])], 2: [("b", PROMPTS[5])]})
    assert [tokens["a"], tokens["b"]] == _expected(artifact, [PROMPTS[3], PROMPTS[5]])
    assert all(s.prompt_tokens + s.generation_tokens <= 8 + MAX_BATCH for s in stats)
    assert sum(s.prompt_tokens for s in stats) == len(PROMPTS[3]) + len(PROMPTS[5])
    assert sum(1 for s in stats if s.prompt_tokens) >= (len(PROMPTS[5]) + 7) // 8


def test_a_shared_prefix_is_computed_once(artifact: Path) -> None:
    engine = _engine(artifact, block_size=16)
    first, _ = _run(engine, {0: [("first", PROMPTS[3])]})
    second, stats = _run(engine, {0: [("second", PROMPTS[4])]})
    assert [first["first"], second["second"]] == _expected(artifact, PROMPTS[3:5])
    assert sum(s.prefix_cache_hits for s in stats) == 32
    assert sum(s.prompt_tokens for s in stats) == len(PROMPTS[4]) - 32


def test_prefix_caching_off_computes_every_prompt_token(artifact: Path) -> None:
    engine = _engine(artifact, block_size=16, enable_prefix_caching=False)
    _run(engine, {0: [("first", PROMPTS[3])]})
    _, stats = _run(engine, {0: [("second", PROMPTS[4])]})
    assert sum(s.prefix_cache_hits for s in stats) == 0
    assert sum(s.prompt_tokens for s in stats) == len(PROMPTS[4])


def test_preempted_sequences_are_recomputed_token_exact(artifact: Path) -> None:
    # 4-token blocks, 16 in all: one whole context, so two sequences growing to 40+ positions cannot both stay.
    engine = _engine(artifact, block_size=4, num_blocks=MAX_SEQ // 4)
    prompts = [PROMPTS[2], PROMPTS[3][:24]]
    tokens, stats = _run(engine, {0: [("a", prompts[0]), ("b", prompts[1])]})
    want = _expected(artifact, prompts)
    assert [tokens["a"], tokens["b"]] == want
    assert sum(s.num_preemptions for s in stats) >= 1
    assert all(s.kv_blocks_used <= MAX_SEQ // 4 for s in stats)


def test_kv_blocks_held_are_the_tokens_rounded_up_to_blocks(artifact: Path) -> None:
    engine = _engine(artifact, block_size=4)
    engine.add_request("a", PROMPTS[0], GREEDY)
    engine.add_request("b", PROMPTS[2], GREEDY)
    for _ in range(5):
        engine.step()
        held = [s.num_computed for s in engine.scheduler.running]  # positions whose keys/values the cache holds
        assert engine.last_stats.kv_blocks_used == sum(-(-n // 4) for n in held)
        assert engine.last_stats.kv_cache_usage == engine.last_stats.kv_blocks_used / engine.blocks.num_blocks
    while engine.has_unfinished():
        engine.step()
    assert engine.last_stats.kv_blocks_used == 0 and engine.blocks.num_free == engine.blocks.num_blocks


def test_eight_mixed_length_requests_at_once_are_token_exact(artifact: Path) -> None:
    # 4-token blocks: every table spans several blocks, taken from the pool in the order the requests grow.
    engine = _engine(artifact, block_size=4)
    lengths = (5, 1, 29, 12, 40, 3, 17, 8)
    prompts = [[int(t) for t in RNG.integers(3, 500, size=n)] for n in lengths]
    tokens, stats = _run(engine, {0: [(str(i), p) for i, p in enumerate(prompts)]})
    assert [tokens[str(i)] for i in range(8)] == _expected(artifact, prompts)
    assert stats[-1].kv_blocks_used == 0


def test_running_sequences_share_a_cached_prefix_block_once(artifact: Path) -> None:
    engine = _engine(artifact, block_size=16)
    engine.add_request("first", PROMPTS[3], GREEDY)
    engine.step()  # the first prompt's two full blocks are computed and cached
    engine.add_request("second", PROMPTS[4], GREEDY)
    engine.step()
    assert engine.last_stats.prefix_cache_hits == 32
    first, second = (engine.blocks.tables[r] for r in ("first", "second"))
    assert first[:2] == second[:2] and first[2:] != second[2:]
    assert engine.last_stats.kv_blocks_used == len(set(first) | set(second))
    while engine.has_unfinished():
        engine.step()
    assert engine.last_stats.kv_blocks_used == 0


def test_block_manager_reference_counts_and_evicts_least_recently_freed() -> None:
    blocks = KVBlockManager(num_blocks=4, block_size=2)
    prompt = [1, 2, 3, 4, 5]
    assert blocks.allocate("a", 5)
    blocks.cache_full_blocks("a", prompt)  # [1, 2] and [3, 4] are keyed; [5] is not full
    shared = blocks.cached_prefix(prompt + [6])
    assert shared == blocks.tables["a"][:2]
    assert blocks.allocate("b", 6, shared) and blocks.num_used == 4  # a's three blocks and b's own last one
    blocks.free("a")
    assert blocks.num_used == 3  # the two shared blocks stay held by b
    blocks.free("b")
    assert blocks.num_used == 0 and blocks.cached_prefix(prompt) == shared  # freed, still cached
    assert blocks.allocate("c", 4)  # takes the two uncached blocks first: the cache survives
    assert blocks.cached_prefix(prompt) == shared
    assert blocks.allocate("d", 2)  # then the least recently freed cached block: b's second ([3, 4])
    assert blocks.cached_prefix(prompt) == shared[:1]
    assert not blocks.allocate("e", 4) and "e" not in blocks.tables  # one block left: refused, nothing taken


def test_a_tvm_artifact_without_paged_functions_serves_through_its_slot_functions(llama_tvm: Any) -> None:
    path = Path(llama_tvm.path)
    step_engine = load(path)._generative().engine
    step_engine.paged = False  # what an artifact built before the paged functions reads as
    engine = LLMEngine(step_engine.model_runner(MAX_BATCH), EngineConfig(max_num_seqs=MAX_BATCH, block_size=4))
    assert type(engine.runner).__name__ == "TvmRowsRunner"
    tokens, stats = _run(engine, {0: [(str(i), p) for i, p in enumerate(PROMPTS[2:5])]})
    assert [tokens[str(i)] for i in range(3)] == _expected(path, PROMPTS[2:5])
    assert sum(s.prefix_cache_hits for s in stats) == 32 and stats[-1].kv_blocks_used == 0


def test_stops_at_eos_and_stop_token_ids(llama_ort: Any) -> None:
    path = Path(llama_ort.path)
    want = _expected(path, [PROMPTS[0]])[0]
    engine = _engine(path)
    engine.eos_token_ids = frozenset({want[3]})
    engine.add_request("eos", PROMPTS[0], GREEDY)
    engine.add_request("ids", PROMPTS[0], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(want[1],)))
    ignore = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs: dict[str, list[Any]] = {"eos": [], "ids": []}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
    assert [t for o in outs["eos"] for t in o.token_ids] == want[:4]
    assert outs["eos"][-1].finish_reason is FinishReason.STOP
    assert [t for o in outs["ids"] for t in o.token_ids] == want[:2]
    engine.add_request("ignore", PROMPTS[0], ignore)
    got = []
    while engine.has_unfinished():
        got += [t for o in engine.step() for t in o.token_ids]
    assert got == want  # ignore_eos: past the eos, all max_tokens


def test_the_serving_engine_stops_at_the_models_own_end_token_by_default(llama_ort: Any) -> None:
    """``aotforge serve``'s engine stops where the model's generation config says (the tiny Llama's eos, 2), which
    the build carried into the artifact beside the tokenizer."""
    import json

    from aotforge.core.decoder import GENERATION_CONFIG_FILE

    path = Path(llama_ort.path)
    eos = json.loads((path / GENERATION_CONFIG_FILE).read_text())["eos_token_id"]
    engine, _, _ = load_engine(path, EngineConfig(max_num_seqs=MAX_BATCH))
    assert engine.eos_token_ids == frozenset({eos})


def test_seeded_sampling_repeats_whatever_runs_beside_it(llama_ort: Any) -> None:
    engine = _engine(Path(llama_ort.path))
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=3)
    results = []
    for company in ([], [PROMPTS[5]]):
        engine.add_request("s", PROMPTS[1], params)
        for i, p in enumerate(company):
            engine.add_request(f"other{i}", p, SamplingParams(max_tokens=10, temperature=1.0, seed=9))
        got = []
        while engine.has_unfinished():
            got += [t for o in engine.step() if o.request_id == "s" for t in o.token_ids]
        results.append(got)
    assert results[0] == results[1] and len(results[0]) == 10


def test_requests_the_context_cannot_hold_are_refused_naming_both_limits(llama_ort: Any) -> None:
    engine = _engine(Path(llama_ort.path))
    with pytest.raises(InputSpecError, match=rf"context is {MAX_SEQ} tokens; the prompt has 60 and max_tokens is 10"):
        engine.add_request("long", list(range(60)), SamplingParams(max_tokens=10))
    with pytest.raises(InputSpecError, match="prompt is empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(InputSpecError, match="outside the vocabulary"):
        engine.add_request("vocab", [10**6], SamplingParams())
    with pytest.raises(InputSpecError, match=f"max_batch {MAX_BATCH}"):
        load_engine(Path(llama_ort.path), EngineConfig(max_num_seqs=MAX_BATCH + 1))
    assert not engine.has_unfinished()


def test_detokenizer_never_splits_a_character_and_cuts_at_a_stop_string() -> None:
    from tests.lm_bytes import byte_tokenizer, encode

    text = "héllo ✓ wörld, STOP here"
    detok = Detokenizer(byte_tokenizer(), stop=("STOP",))
    pieces = []
    for token in encode(text):
        detok.add(token)
        if detok.find_stop() >= 0:  # as the engine does: the request ends here
            break
        pieces.append(detok.take(final=False))
        assert "\ufffd" not in pieces[-1]
    pieces.append(detok.take(final=True))
    assert "".join(pieces) == "héllo ✓ wörld, "


def test_async_engine_streams_and_an_abandoned_request_frees_its_blocks(llama_ort: Any) -> None:
    engine = load_async_engine(Path(llama_ort.path), EngineConfig(max_num_seqs=MAX_BATCH))
    engine.engine.eos_token_ids = frozenset()
    want = _expected(Path(llama_ort.path), [PROMPTS[0]], 20)[0]

    async def main() -> list[int]:
        engine.start()
        got = [t async for o in engine.generate("full", PROMPTS[0], SamplingParams(max_tokens=20, temperature=0))
               for t in o.token_ids]  # fmt: skip
        stream = engine.generate("left", PROMPTS[2], SamplingParams(max_tokens=20, temperature=0))
        async for _ in stream:
            break  # the client goes away after its first token
        await stream.aclose()
        for _ in range(200):
            if engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.01)
        await engine.shutdown(5.0)
        return got

    assert asyncio.run(main()) == want
    assert engine.stats().kv_blocks_used == 0


class ThreadRecordingRunner:
    """The artifact's real model runner, noting which thread makes each call that computes; ``fail`` makes the
    decodes raise."""

    def __init__(self, runner: Any, fail: bool = False) -> None:
        self._runner, self.fail, self.threads = runner, fail, set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def _call(self, name: str, *args: Any) -> Any:
        self.threads.add(threading.get_ident())
        if self.fail and name == "decode":
            raise RuntimeError("injected warm-up fault")
        return getattr(self._runner, name)(*args)

    def prefill(self, *args: Any) -> Any:
        return self._call("prefill", *args)

    def extend(self, *args: Any) -> Any:
        return self._call("extend", *args)

    def decode(self, *args: Any) -> Any:
        return self._call("decode", *args)


def test_async_engine_calls_its_runner_from_its_step_thread_only(artifact: Path) -> None:
    """The warm-up included: tvm keeps a thread pool per calling thread, so a second thread's calls would leave
    a second pool's workers spinning beside the step thread's."""
    llm = _engine(artifact)
    runner = llm.runner = ThreadRecordingRunner(llm.runner)
    engine = AsyncEngine(llm, "recorded")

    async def main() -> list[int]:
        engine.start()
        got = [t async for o in engine.generate(None, PROMPTS[3], GREEDY) for t in o.token_ids]
        await engine.shutdown(5.0)
        return got

    assert asyncio.run(main()) == _expected(artifact, [PROMPTS[3]])[0]
    assert engine._thread is not None and runner.threads == {engine._thread.ident}


def test_async_engine_start_raises_a_warm_up_fault_and_starts_no_thread(llama_ort: Any) -> None:
    llm = _engine(Path(llama_ort.path))
    llm.runner = ThreadRecordingRunner(llm.runner, fail=True)
    engine = AsyncEngine(llm, "failing")
    with pytest.raises(RuntimeError, match="injected warm-up fault"):
        engine.start()
    assert engine._thread is None


@pytest.mark.parametrize("sampling", [{}, {"do_sample": True, "top_k": 50, "temperature": 1.3, "seed": 7}])
def test_generate_on_the_engine_returns_what_the_step_engine_did(artifact: Path, sampling: dict[str, Any]) -> None:
    """``load(path).generate()`` runs on the engine; greedy or seeded sampling, with a row stopping at an eos id
    (one, or either of two) before the other, it returns the very tokens the step engine's own loop
    (``GenerativeRunner.generate``) returns."""
    loaded = load(artifact)
    ids = np.zeros((2, 20), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate((PROMPTS[0], PROMPTS[2])):
        ids[row, 20 - len(prompt) :], mask[row, 20 - len(prompt) :] = prompt, 1
    free = loaded._generative().generate(ids, 12, attention_mask=mask, **sampling)
    stops = (int(free[0, 20 + 2]), int(free[1, 20 + 4]))  # rows stop after at most 3 and 5 tokens
    for eos in ({}, {"eos_token_id": stops[0]}, {"eos_token_id": stops}):
        kw = {"attention_mask": mask, **sampling, **eos}
        np.testing.assert_array_equal(
            loaded.generate(ids, 12, ignore_eos=True, **kw), loaded._generative().generate(ids, 12, **kw)
        )


def test_generate_calls_of_one_width_reuse_the_kv_memory_token_exact(artifact: Path) -> None:
    """Each ``generate()`` makes an engine over the artifact's runner; a call of the width before reuses its KV
    memory (allocating and clearing it again cost the lone stream its TTFT), and its tokens stay the step
    engine's even though that memory holds the previous call's keys past the new lengths."""
    loaded = load(artifact)
    runs = []
    for prompt in (PROMPTS[2], PROMPTS[0], PROMPTS[2]):
        ids = np.array([prompt], dtype=np.int64)
        np.testing.assert_array_equal(loaded.generate(ids, 10, ignore_eos=True), loaded._generative().generate(ids, 10))
        runner = loaded._generative().model_runner(1)
        pool = runner.paged.pool if getattr(runner, "paged", None) is not None else runner._views  # ort | tvm
        runs.append((runner, pool[0].ctypes.data))
    assert all(run == runs[0] for run in runs), "a call of the same width allocated its KV cache again"

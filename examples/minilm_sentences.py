"""English sentences for MiniLM int8 calibration and evaluation: two disjoint sets of 64, varied lengths.

Built from hand-written parts so lengths run from a few words to past the 128-token padding.
"""

from __future__ import annotations

_SUBJECTS = [
    "The old fisherman",
    "A young engineer",
    "My neighbour's cat",
    "The city council",
    "Our research team",
    "A tired student",
    "The orchestra",
    "Every morning the baker",
    "The hospital",
    "A small startup",
    "The museum guide",
    "Two hikers",
    "The new manager",
    "The river",
    "An elderly couple",
    "The football club",
]
_VERBS = [
    "repaired",
    "described",
    "painted",
    "ignored",
    "celebrated",
    "measured",
    "sold",
    "studied",
    "photographed",
    "questioned",
    "rebuilt",
    "translated",
    "cooked",
    "carried",
    "delayed",
    "announced",
]
_OBJECTS = [
    "the broken bridge",
    "a detailed report on climate change",
    "the quiet harbour at dawn",
    "the results of the election",
    "a loaf of sourdough bread",
    "the ancient manuscript",
    "the budget for next year",
    "the noisy engine",
    "a letter from an old friend",
    "the mountain trail",
    "the vaccine trial",
    "a chess tournament",
    "the flooded basement",
    "the price of coffee",
    "a concert in the park",
    "the software release",
]
_TAILS = [
    "",
    " before the storm arrived.",
    " because nobody else had the time or the patience to do it properly.",
    " while the rest of the town was asleep and the streets were completely empty.",
    " and then, after a long discussion that lasted well into the night, everyone agreed that the plan "
    "had been a mistake from the very beginning and that they should start again next spring.",
    " so that the children, who had been waiting for weeks, could finally see what all the fuss was about, "
    "even though the weather was terrible, the trains were late, the tickets were expensive and half of "
    "the speakers cancelled at the last minute because of a strike at the airport.",
]


def _make(offset: int, count: int) -> list[str]:
    out = []
    for i in range(count):
        k = offset + i
        s = _SUBJECTS[k % 16]
        v = _VERBS[(k // 16) % 16]  # (subject, verb) differ between the two sets
        o = _OBJECTS[(k * 5 + 1) % 16]
        tail = _TAILS[(k * 3 + k // 16) % len(_TAILS)] or "."
        out.append(f"{s} {v} {o}{tail}")
    return out


CALIBRATION = _make(0, 64)
EVALUATION = _make(128, 64)
assert len(EVALUATION) == 64 and not set(EVALUATION) & set(CALIBRATION)


def calibration_feeds(seq: int = 128) -> list[dict]:
    """Tokenized calibration sentences, one feed each (batch 1): ``--calibration`` callable."""
    from examples.minilm import tokenize

    batch = tokenize(CALIBRATION, seq=seq)
    return [{k: v[i : i + 1].numpy() for k, v in batch.items()} for i in range(len(CALIBRATION))]


def evaluation_feeds(seq: int = 128) -> list[dict]:
    """Tokenized held-out sentences (never calibrated on), one feed each: int8-dynamic's ``eval_dir`` callable."""
    from examples.minilm import tokenize

    batch = tokenize(EVALUATION, seq=seq)
    return [{k: v[i : i + 1].numpy() for k, v in batch.items()} for i in range(len(EVALUATION))]

"""tools/bench_quality.py's choice of configurations: names stripped, the timed one built too, an unknown name (a
value split at a comma) refused before anything is built, and every configuration naming its method."""

from __future__ import annotations

import pytest

from tools.bench_quality import CONFIGS, config_names


def test_configurations_are_stripped_and_the_timed_one_is_built() -> None:
    assert config_names("awq, gptq ,", "awq mixed-4") == ["awq", "gptq", "awq mixed-4"]
    assert config_names("rtn,awq", "awq") == ["rtn", "awq"]


def test_an_unknown_configuration_stops_the_run() -> None:
    with pytest.raises(SystemExit, match="unknown configuration '4 layers at 8 bits'"):
        config_names("awq, 4 layers at 8 bits", "awq")


def test_every_configuration_names_its_method() -> None:
    """The build's default method changes with measurements; a row's name must not."""
    assert all(any(opt.startswith("weight-only.method=") for opt in opts) for opts in CONFIGS.values())

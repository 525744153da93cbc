"""servelab: plan, simulate and measure ML and LLM inference serving."""

from servelab import drift
from servelab.api import (
    load,
    run_llm_load,
    run_llm_simulate,
    run_llm_validation,
    run_load,
    run_plan,
    run_simulate,
    run_sweep,
    run_validation,
)
from servelab.errors import ConfigError, InputError, ServelabError, StoreError
from servelab.scenario import Scenario, load_scenario, scenario_from_dict, scenario_to_toml

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "InputError",
    "Scenario",
    "ServelabError",
    "StoreError",
    "drift",
    "load",
    "load_scenario",
    "run_llm_load",
    "run_llm_simulate",
    "run_llm_validation",
    "run_load",
    "run_plan",
    "run_simulate",
    "run_sweep",
    "run_validation",
    "scenario_from_dict",
    "scenario_to_toml",
]

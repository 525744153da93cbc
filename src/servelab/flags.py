"""A scenario field's CLI flag, from its one declaration (`scenario.FIELDS`): its names and
its help. A command may name it or say it in its own words; the Python type is written
beside it (`Annotated[float | None, option("workload.qps")]`) for the type checker, and
tests/unit/test_scenario_fields.py holds it to the declaration's."""

from __future__ import annotations

from typing import Any

import typer

from servelab.scenario import FIELDS


def option(key: str, *, names: tuple[str, ...] | None = None, help: str | None = None) -> Any:
    f = FIELDS[key]
    return typer.Option(*(names or f.flags), help=help or f.help)

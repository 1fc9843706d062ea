"""trainsim: a discrete-event simulator of distributed neural-network training, from Python.

Describe a workload, a cluster and a parallel plan (the scenario format of ``docs/scenario.md``)
as a dict or a JSON file; get the same report as the command line's ``--json`` output, as a dict::

    import trainsim
    r = trainsim.simulate("experiments/core/gpt3-175b-1024xa100.json")
    r["iteration_s"], r["mfu"], r["fits"]

Every function takes ``scenario`` as either

* a ``str`` or :class:`os.PathLike`: a scenario file. Files it names (gradient traces, Hugging
  Face configs) are resolved against its folder, as the CLI does; or
* a mapping: the scenario itself. Files it names are resolved against ``base_dir`` (default: the
  current directory).

Invalid input raises :class:`ValueError` whose message is the CLI's: the key path, the value and
what is allowed (``invalid scenario: plan.tp: ...``), prefixed with the file name for a file. A
file that cannot be read raises :class:`OSError`. The simulation runs with the GIL released, so
threads can simulate scenarios in parallel.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import _native

if TYPE_CHECKING:  # pragma: no cover
    import pandas

__all__ = [
    "Scenario",
    "simulate",
    "train_run",
    "partition",
    "slices",
    "capacity",
    "presets",
    "search",
    "to_dataframe",
    "__version__",
]

__version__: str = _native._version()

#: A scenario: a file name, or the scenario's JSON object as a mapping.
Scenario = Union[str, "os.PathLike[str]", Mapping[str, Any]]

Report = Dict[str, Any]


def _source(scenario: Scenario, base_dir: Optional[Union[str, "os.PathLike[str]"]]) -> Dict[str, Any]:
    """The native functions' (path, text, base_dir) for a scenario."""
    base = None if base_dir is None else os.fspath(base_dir)
    if isinstance(scenario, (str, os.PathLike)):
        return {"path": os.fspath(scenario), "text": None, "base_dir": base}
    if isinstance(scenario, Mapping):
        try:
            text = json.dumps(scenario)
        except (TypeError, ValueError) as e:
            raise ValueError(f"invalid scenario: (file): not valid JSON: {e}") from e
        return {"path": None, "text": text, "base_dir": base}
    raise TypeError(f"scenario must be a file name (str or os.PathLike) or a mapping, not {type(scenario).__name__}")


def simulate(
    scenario: Scenario,
    *,
    base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    full: bool = False,
    network: Optional[str] = None,
) -> Report:
    """Simulate one training iteration and return its report.

    The report is the JSON object of ``trainsim simulate SCENARIO --json`` as a dict: among its
    keys ``iteration_s``, ``samples_per_s``, ``tokens_per_s``, ``mfu``, ``hfu``,
    ``bubble_fraction``, ``peak_memory_bytes`` with ``memory_breakdown``, ``fits``, ``plan``,
    ``stages`` and ``time_breakdown`` (all keys: ``docs/report.md``).

    Args:
        scenario: a scenario file or a scenario mapping (see the module's docstring).
        base_dir: where relative file names inside the scenario are resolved (default: the
            scenario file's folder, or the current directory for a mapping).
        full: simulate every device instead of one replica per symmetric group (``--full``).
        network: ``"fair"`` (default: links shared fairly among flows) or ``"ideal"``
            (``--network``).

    Raises:
        ValueError: the scenario is invalid, or its plan is too large to simulate; the message
            names the key.
        OSError: the scenario file cannot be read.
        RuntimeError: the simulated report broke a physical bound (a modelling error).
    """
    return json.loads(_native._simulate_json(**_source(scenario, base_dir), full=full, network=network))


def train_run(
    scenario: Scenario,
    runs: int = 1,
    price_per_gpu_hour: Optional[float] = None,
    *,
    base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Report:
    """Simulate a whole training run: its phases, then ``runs`` seeded runs of failures and
    checkpoints over them.

    The scenario needs a ``"run"`` section (``tokens``, ``iterations``, or ``dataset_samples``
    and ``epochs``; failures, checkpoints, restart, variability, seed). The result is the JSON
    object of ``trainsim train-run SCENARIO --json --runs RUNS``: ``wall_days``, ``gpu_hours``,
    ``goodput`` and ``interruptions`` (each a statistic: ``mean``, ``p50``, ``p90``),
    ``iterations``, ``tokens``, ``devices``, ``checkpoint``, ``lost``, ``cost_dollars`` (with a
    price), and the simulated phases: ``epochs``, ``total_s``, ``breakdown``, ``speedup``.

    Args:
        scenario: a scenario file or mapping with a ``run`` section.
        runs: Monte Carlo runs of failures, 1 to 100000.
        price_per_gpu_hour: dollars per GPU-hour, for ``cost_dollars``.
        base_dir: see :func:`simulate`.

    Raises:
        ValueError: invalid scenario, no ``run`` section, or ``runs``/``price_per_gpu_hour``
            out of range.
        OSError: the scenario file cannot be read.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= 100_000:
        raise ValueError(f"runs: {runs!r}; allowed: 1 to 100000")
    price = None if price_per_gpu_hour is None else float(price_per_gpu_hour)
    return json.loads(_native._train_run_json(**_source(scenario, base_dir), runs=runs, price_per_gpu_hour=price))


def partition(scenario: Scenario, *, base_dir: Optional[Union[str, "os.PathLike[str]"]] = None) -> Report:
    """Explore pipeline plans as BaPipe does (``trainsim partition --json``).

    For each schedule and micro-batch size, the balanced partition of the layers over the
    pipeline stages, simulated: ``candidates`` (``schedule``, ``micro_batch``, ``fits``,
    ``time_per_sample_s``, ``stages``...), ``best`` (the fastest that fits, or ``None`` when none
    does) and the speedups over data parallelism and over GPipe with uniform stages.

    Raises:
        ValueError: invalid scenario, or the plan uses token slicing (nothing to explore).
    """
    return json.loads(_native._partition_json(**_source(scenario, base_dir)))


def slices(
    scenario: Scenario,
    granularity: Optional[int] = None,
    *,
    base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Report:
    """TeraPipe's token-slicing optimiser (``trainsim slices --json``).

    Returns the chosen ``sub_batches`` with their ``slices`` (tokens per slice), the estimated
    pipeline latency ``latency_s``, its ``t_max_s``, and every evaluated candidate
    (``candidates``: ``t_max_s``, ``total_s``).

    Args:
        scenario: a scenario file or mapping (its ``plan.pp`` stages, ``plan.seq_len``).
        granularity: tokens per slicing unit; default: the plan's ``auto`` granularity, else 8,
            coarser so that a sequence has at most 256 units.

    Raises:
        ValueError: invalid scenario or granularity, or a problem too large to optimise.
    """
    return json.loads(_native._slices_json(**_source(scenario, base_dir), granularity=granularity))


def capacity(
    scenario: Scenario,
    vary: str = "params",
    *,
    base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Report:
    """The largest model each memory policy (none, ZeRO offload, Gemini...) trains on the
    scenario's devices, and its throughput (``trainsim capacity --json`` without ``--gpus``).

    Args:
        scenario: a scenario file or mapping with a transformer workload.
        vary: what grows: ``"params"``, ``"hidden"`` or ``"layers"``.

    Returns:
        ``{"vary", "devices", "policies": [{"policy", "max_params", "samples_per_s", ...}]}``.
    """
    return json.loads(_native._capacity_json(**_source(scenario, base_dir), vary=vary))


def presets() -> Dict[str, List[Dict[str, Any]]]:
    """The built-in presets (``trainsim presets --json``): ``devices``, ``links``, ``nodes``
    and ``workloads`` (name, parameters, published parameters, config), usable by name in a
    scenario."""
    return json.loads(_native._presets_json())


def search(
    scenario: Scenario,
    gpus: Optional[Union[int, Sequence[int]]] = None,
    top: int = 10,
    *,
    base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Search parallel plans for a scenario's workload and rank them (``trainsim search``).

    Args:
        scenario: a scenario file or mapping: its workload, cluster and training (the plan is
            what is searched).
        gpus: the device count, or counts, to search over (default: the scenario's cluster).
        top: how many ranked plans to return.
        base_dir: see :func:`simulate`.
        **options: further search options: ``frameworks``, a list of framework profiles
            to search too (or ``"all"``), as ``trainsim search --frameworks``; any other
            name is refused.

    Returns:
        The search result as a dict (its ranked plans, each with its report);
        :func:`to_dataframe` turns it into a table.

    Raises:
        ValueError: invalid scenario or options.
    """
    src = _source(scenario, base_dir)
    if src["path"] is not None:
        with open(src["path"], encoding="utf-8") as f:
            text = f.read()
        if src["base_dir"] is None:
            src["base_dir"] = os.path.dirname(src["path"])
    else:
        text = src["text"]
    opts: Dict[str, Any] = dict(options)
    opts["top"] = top
    if gpus is not None:
        opts["gpus"] = [gpus] if isinstance(gpus, int) else list(gpus)
    if src["base_dir"] is not None:
        opts["base_dir"] = src["base_dir"]
    return json.loads(_native._search_json(text, json.dumps(opts)))


# Columns first in a to_dataframe() table, when present.
_FIRST = (
    "name",
    "workload",
    "device",
    "devices",
    "plan.dp",
    "plan.tp",
    "plan.pp",
    "plan.schedule",
    "plan.virtual_stages",
    "plan.micro_batches",
    "plan.micro_batch",
    "plan.recompute",
    "plan.zero_stage",
    "iteration_s",
    "samples_per_s",
    "tokens_per_s",
    "mfu",
    "hfu",
    "bubble_fraction",
    "peak_memory_bytes",
    "fits",
)

# Keys of a search result (or a partition exploration) that hold its rows.
_ROW_KEYS = ("results", "ranked", "plans", "front", "candidates", "top")


def _flatten(row: Mapping[str, Any]) -> Dict[str, Any]:
    """A report's scalars, with one level of nested objects as ``outer.inner`` columns; a
    nested ``report`` (a search result's row) is merged in."""
    out: Dict[str, Any] = {}
    nested = row.get("report")
    if isinstance(nested, Mapping):
        out.update(_flatten(nested))
    for k, v in row.items():
        if k == "report":
            continue
        if v is None or isinstance(v, (str, int, float, bool)):
            out[k] = v
        elif isinstance(v, Mapping):
            for k2, v2 in v.items():
                if v2 is None or isinstance(v2, (str, int, float, bool)):
                    out[f"{k}.{k2}"] = v2
                elif k == "plan" and isinstance(v2, list):
                    out[f"{k}.{k2}"] = tuple(v2)
    return out


def _rows(data: Union[Mapping[str, Any], Iterable[Mapping[str, Any]]]) -> List[Mapping[str, Any]]:
    if isinstance(data, Mapping):
        if "iteration_s" in data or "report" in data:
            return [data]
        for key in _ROW_KEYS:
            rows = data.get(key)
            if isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows):
                return rows
        return [data]
    rows = list(data)
    for r in rows:
        if not isinstance(r, Mapping):
            raise TypeError(f"to_dataframe: expected reports (dicts), got {type(r).__name__}")
    return rows


def to_dataframe(data: Union[Mapping[str, Any], Iterable[Mapping[str, Any]]]) -> "pandas.DataFrame":
    """One row per report: a list of :func:`simulate` reports, one report, a :func:`search`
    result (its ranked plans), or a :func:`partition` exploration (its candidates).

    Columns: the reports' scalar fields (``name``, ``iteration_s``, ``mfu``,
    ``peak_memory_bytes``, ``fits``...) and their nested objects' scalars as ``outer.inner``
    (``plan.dp``, ``plan.schedule``, ``memory_breakdown.activations``...); the plan and the key
    metrics come first. Lists (per-stage tables) are left out.

    Needs pandas (``pip install pandas``), imported on first use.
    """
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("trainsim.to_dataframe needs pandas: pip install pandas") from e
    flat = [_flatten(r) for r in _rows(data)]
    df = pd.DataFrame(flat)
    first = [c for c in _FIRST if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]

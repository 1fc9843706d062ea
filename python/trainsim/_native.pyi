"""Type stubs of the native module: JSON text in, JSON text out (see trainsim/__init__.py)."""

from typing import Optional

def _simulate_json(
    path: Optional[str] = None,
    text: Optional[str] = None,
    base_dir: Optional[str] = None,
    full: bool = False,
    network: Optional[str] = None,
) -> str: ...
def _train_run_json(
    path: Optional[str] = None,
    text: Optional[str] = None,
    base_dir: Optional[str] = None,
    runs: int = 1,
    price_per_gpu_hour: Optional[float] = None,
) -> str: ...
def _partition_json(path: Optional[str] = None, text: Optional[str] = None, base_dir: Optional[str] = None) -> str: ...
def _slices_json(
    path: Optional[str] = None,
    text: Optional[str] = None,
    base_dir: Optional[str] = None,
    granularity: Optional[int] = None,
) -> str: ...
def _capacity_json(
    path: Optional[str] = None, text: Optional[str] = None, base_dir: Optional[str] = None, vary: str = "params"
) -> str: ...
def _presets_json() -> str: ...
def _search_json(scenario_json: str, options_json: str) -> str: ...
def _version() -> str: ...

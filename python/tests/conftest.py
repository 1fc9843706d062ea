"""Shared fixtures: the repository's paths and the CLI binary the package is compared with."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def example(rel: str) -> Path:
    return ROOT / rel


@pytest.fixture(scope="session")
def cli():
    """Run the release CLI (TRAINSIM_BIN, else target/release/trainsim): (exit code, stdout,
    stderr). Tests that compare with it are skipped when it is not built."""
    exe = Path(os.environ.get("TRAINSIM_BIN", ROOT / "target" / "release" / "trainsim"))
    if not exe.is_file():
        pytest.skip(f"{exe} not built (cargo build --release)")

    def run(*args: str):
        p = subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
        return p.returncode, p.stdout, p.stderr

    def run_json(*args: str):
        code, out, err = run(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    run.json = run_json
    return run

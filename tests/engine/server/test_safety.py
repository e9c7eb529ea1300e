"""Safety: loopback by default, no unconfirmed public bind, secrets never written, only our processes ended.

Servers here are the stand-in (tests/fakevllm.py) started by the real supervisor and CLI;
it demands the API key on every route but /health, as vLLM does.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine import errors, paths
from engine.flags import FlagSet
from engine.server import procs
from engine.server.supervisor import (
    Supervisor,
    bind_needs_confirmation,
    cleanup_all,
    list_registered,
)
from engine.session import Session
from loadgen import ArrivalSpec, WorkloadSpec
from tests import fakevllm

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("host", "key", "ask"),
    [("127.0.0.1", False, False), ("::1", False, False), ("localhost", False, False),
     ("0.0.0.0", False, True), ("::", False, True), ("10.1.2.3", False, True), ("gpu-box", False, True),
     ("0.0.0.0", True, False)],
)
def test_bind_policy(host: str, key: bool, ask: bool) -> None:
    assert bind_needs_confirmation(host, has_api_key=key) is ask


def test_default_bind_is_loopback(tmp_path: Path) -> None:
    sup = Supervisor(FlagSet(model=str(tmp_path), values={}))
    assert sup.host == "127.0.0.1"
    cmd = sup.build_command(8000)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"


async def test_public_bind_without_key_is_refused_unless_confirmed(tiny_model: Path) -> None:
    flags = FlagSet(model=str(tiny_model), values={})
    sup = Supervisor(flags, host="0.0.0.0", launcher=fakevllm.command())
    with pytest.raises(errors.UnsafeBind, match="--host 0.0.0.0") as info:
        await sup.start(timeout=30)
    assert "--api-key" in info.value.hint and sup.pid is None  # nothing was launched
    # With a key, or confirmed, it starts.
    keyed = Supervisor(flags.set("api-key", ["k-" + secrets.token_hex(4)]), host="0.0.0.0",
                       launcher=fakevllm.command())
    try:
        await keyed.start(timeout=30)
    finally:
        await keyed.stop()


def test_vtui_serve_public_host_without_key_refuses_clearly(tiny_model: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tui.cli", "serve", "--model", str(tiny_model), "--host", "0.0.0.0",
         "--launcher", " ".join(fakevllm.command())],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode != 0
    assert "error: --host 0.0.0.0 lets other machines reach the server" in out.stderr
    assert "hint:" in out.stderr and "Traceback" not in out.stderr
    assert not [e for e in list_registered() if "0.0.0.0" in e.url]


def test_vtui_serve_public_host_with_yes_warns_and_starts(tiny_model: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "serve", "--model", str(tiny_model), "--host", "0.0.0.0", "--yes",
         "--launcher", " ".join(fakevllm.command())],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not [e for e in list_registered() if "0.0.0.0" in e.url]:
            time.sleep(0.2)
        assert [e for e in list_registered() if "0.0.0.0" in e.url], "the confirmed public server started"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert "warning: --host 0.0.0.0 without --api-key" in err
    assert not [e for e in list_registered() if "0.0.0.0" in e.url]


def _grep_tree(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            try:
                if needle in path.read_bytes():
                    hits.append(path)
            except OSError:
                continue
    return hits


async def test_api_key_and_hf_token_are_never_written(tiny_model: Path, tmp_path: Path) -> None:
    api_key = "sk-vtui-" + secrets.token_hex(12)
    hf_token = "hf_" + secrets.token_hex(12)
    flags = FlagSet(model=str(tiny_model), values={}).set("api-key", [api_key]).set("hf-token", hf_token)
    session = Session(flags, workload=WorkloadSpec(input_len=16, output_len=8),
                      arrivals=ArrivalSpec(concurrency=2, num_requests=6), launcher=fakevllm.command(),
                      telemetry=False, workload_label="secret-run")
    outputs: list[str] = []
    try:
        # The apply preview (the diff dialog renders launch_argv) shows the key by reference.
        preview = " ".join(session.launch_argv())
        assert '--api-key "$VLLM_API_KEY"' in preview and api_key not in preview and hf_token not in preview
        outputs.append(preview)
        await session.start_server(timeout=30)
        # The server got the key (the stand-in answers 401 without it) and the run sent it.
        record = await session.run_workload()
        assert record.status in ("ok", "box-bound") and record.summary.figure("completed") == 6
        refs = session.supervisor.process_refs()
        for ref in refs:  # never in argv (ps shows argv to every user of the box)
            proc = ref.process()
            assert proc is not None
            assert not [a for a in proc.cmdline() if api_key in a or hf_token in a]
        for kind in ("docker", "serve", "results", "perfetto"):
            path = session.save_export(kind, tmp_path / "out" / f"export.{kind}")
            outputs.append(path.read_text())
        session.save_preset("secret-preset")
    finally:
        await session.close()
    cli = subprocess.run(
        [sys.executable, "-m", "tui.cli", "history", "export", str(record.history_id), "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert cli.returncode == 0, cli.stderr
    outputs += [cli.stdout, cli.stderr]
    assert "$VLLM_API_KEY" in outputs[0] or "VLLM_API_KEY" in outputs[0]  # docker line names the variable
    home = Path(os.environ["VTUI_HOME"])
    for secret in (api_key, hf_token):
        assert not [o for o in outputs if secret in o]
        assert _grep_tree(home, secret.encode()) == [], f"secret written under {home}"
        assert _grep_tree(tmp_path, secret.encode()) == []
        assert _grep_tree(paths.logs_dir(), secret.encode()) == []


def test_vtui_serve_with_a_key_prints_and_logs_no_secret(tiny_model: Path) -> None:
    api_key = "sk-vtui-" + secrets.token_hex(12)
    owner = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "serve", "--model", str(tiny_model), "--verbose",
         "--launcher", " ".join(fakevllm.command()), "--", "--api-key", api_key],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    seen: list[str] = []
    try:
        assert owner.stdout is not None
        for line in owner.stdout:
            seen.append(line)
            if "Ctrl-C to stop" in line:
                break
        owner.terminate()
        rest, _ = owner.communicate(timeout=20)
        seen.append(rest)
    finally:
        if owner.poll() is None:
            owner.kill()
    text = "".join(seen)
    assert "ready at" in text, text
    assert api_key not in text
    assert _grep_tree(Path(os.environ["VTUI_HOME"]), api_key.encode()) == []


FOREIGN = "import time, sys; time.sleep(120)  # vllm.entrypoints.openai.api_server --model x"


async def test_a_foreign_vllm_lookalike_survives_stop_and_cleanup(tiny_model: Path, own_servers_only: None) -> None:
    """A process that looks like vLLM (its argv says so) but that vtui did not start."""
    foreign = subprocess.Popen(
        [sys.executable, "-c", FOREIGN, "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"],
        start_new_session=True,
    )
    try:
        sup = Supervisor(FlagSet(model=str(tiny_model), values={}), launcher=fakevllm.command())
        await sup.start(timeout=30)
        ours = sup.process_refs()
        assert foreign.pid not in [r.pid for r in ours]
        await sup.stop()
        cleanup_all()
        # The registry never lists it (only servers some vtui started are recorded).
        assert foreign.pid not in [e.pid for e in list_registered()]
        await asyncio.sleep(0.2)
        assert foreign.poll() is None, "vtui ended a process it did not start"
        assert psutil.Process(foreign.pid).is_running()
        assert not [r for r in ours if r.alive()]
        # A registry file naming the foreign pid (a recycled pid, or a forged file) is not obeyed:
        # the start time does not match, so nothing is signalled.
        stale = procs.ProcRef(foreign.pid, psutil.Process(foreign.pid).create_time() - 100)
        assert procs.terminate_tree(stale, None, timeout=1) == []
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()

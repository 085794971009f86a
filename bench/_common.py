"""Shared machinery of the benchmarks: one fresh process per configuration, interleaved
repeats, medians with min–max, and plain-text tables.

A benchmark script runs in two roles. Without `--worker` it is the driver: for every
configuration it starts `python <script> --worker '<json>'` (a fresh interpreter, so no
compilation cache, thread pool or allocator state carries over between configurations),
`--processes` times, reads one JSON line back, and prints the table. With `--worker` it
measures one configuration and prints that JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def thread_env(threads: int | None) -> dict:
    """Environment limiting XLA, PyTorch (OpenMP) and numpy's BLAS to `threads` threads
    (None: leave every library its default)."""
    if not threads:
        return {}
    n = str(threads)
    env = {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
           "BENCH_THREADS": n}
    if threads == 1:
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                            " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    return env


def run_worker(script: str, config: dict, timeout: float = 900, threads: int | None = None,
               clock: str | None = None) -> dict:
    """Run `script --worker config` in a fresh interpreter; its last stdout line is JSON."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **thread_env(threads))
    env.setdefault("BENCH_CLOCK", os.environ.get("BENCH_CLOCK", "cpu"))
    if clock is not None:
        env["BENCH_CLOCK"] = clock
    proc = subprocess.run([sys.executable, script, "--worker", json.dumps(config)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {config} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


def peak_rss_mib() -> float:
    """The peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# "cpu": seconds of CPU used by this process (all its threads): what the work costs, and
# nearly blind to other processes competing for the cores. "wall": elapsed seconds.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS[os.environ.get("BENCH_CLOCK", "cpu")]


def current_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> bool:
    """Reset the process's RSS high-water mark to its current RSS (Linux: clear_refs 5), so
    that the next peak measured is that of what runs afterwards; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def timed(fn, steps: int) -> float:
    """Seconds per call of `fn` (which must block until its work is done) over `steps` calls."""
    t = clock()
    for _ in range(steps):
        fn()
    return (clock() - t) / steps


def calibrate(fn, target_s: float, max_steps: int = 100_000) -> int:
    """How many calls of `fn` take about `target_s` seconds (at least one)."""
    fn()
    n, t = 1, timed(fn, 1)
    while t * n < target_s / 4 and n < max_steps:
        n *= 4
        t = timed(fn, n)
    return max(1, min(max_steps, int(target_s / max(t, 1e-9))))


def interleaved(fns: dict, repeats: int, target_s: float) -> dict:
    """Time each callable `repeats` times, round-robin (so that load from other processes
    falls on every contestant alike); returns seconds per call for each repeat."""
    steps = {k: calibrate(f, target_s) for k, f in fns.items()}
    out = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            out[k].append(timed(f, steps[k]))
    return out


def med(xs) -> float:
    return statistics.median(xs)


def summary(xs, scale=1.0, fmt="{:.0f}") -> str:
    """median [min–max] of xs × scale."""
    xs = [x * scale for x in xs]
    return f"{fmt.format(med(xs))} [{fmt.format(min(xs))}–{fmt.format(max(xs))}]"


def paired_ratio(a, b):
    """Ratios a_i / b_i of repeats measured side by side (same process, same round)."""
    return [x / y for x, y in zip(a, b)]


def table(headers, rows) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                     + [line(r) for r in rows])


def add_common_args(ap, processes: int, repeats: int) -> None:
    ap.add_argument("--repeats", type=int, default=repeats, help=f"timed repeats per process (default {repeats})")
    ap.add_argument("--processes", type=int, default=processes,
                    help=f"fresh processes per configuration (default {processes})")
    ap.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                    help="cpu: CPU seconds of the benchmark process, all threads (default; robust on a "
                         "shared machine); wall: elapsed seconds")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for XLA, PyTorch and BLAS (default 1; 0 = each library's default)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)


def setup(args) -> None:
    """Apply --clock in the driver (workers inherit it through BENCH_CLOCK)."""
    global clock
    os.environ["BENCH_CLOCK"] = args.clock
    clock = CLOCKS[args.clock]


def machine(args=None) -> str:
    import platform

    import jax
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    extra = "" if args is None else (f"; clock: {args.clock}; threads per library: "
                                     f"{args.threads or 'default'}")
    return (f"python {platform.python_version()}, jax {jax.__version__}, {os.cpu_count()} CPUs, "
            f"load average {load:.1f} at start{extra}")


def lens_sgd_step(model, lr: float):
    """One SGD step of a lens expression on the mean half squared error: the batched forward
    pass, dL, the backward pass, then p − η (p')♯ with the Euclidean sharp (jit it yourself)."""
    from lenses import Euclidean, batch_loss, batched, dL, half_squared_error

    metric = Euclidean()

    def step(p, X, Y):
        out, pull = batched(model).vjp(X, p)
        L = batch_loss(half_squared_error, Y, reduction="mean")
        _, p_cov = pull(dL(L, out))
        return p - lr * metric.sharp(p, p_cov), L.fn(out)

    return step


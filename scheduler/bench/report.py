"""What scripts/bench makes of its measurements beside the table: perf_analyzer's
stability rule over repeated windows, the server-side split from the statistics
endpoint, the per-role CPU lines, CSV, and the throughput-latency plot (several runs on
one plot). Pure functions where they can be, so the unit tests run them without a
server; a client module, never imported by the server's processes.
"""

from __future__ import annotations

import csv
import json
import math
import os

# ---------------------------------------------------------------------- stability


def is_stable(windows: list[tuple[float, float]], percentage: float,
              count: int = 3) -> bool:
    """perf_analyzer's rule: the last `count` windows are stable when, for throughput
    and for the chosen latency alike, the largest is within `percentage` percent of
    the smallest. windows: (throughput, latency) per window."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    for values in zip(*last):
        if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
            return False
        lo, hi = min(values), max(values)
        if lo <= 0:
            if hi > 0:
                return False
            continue
        if hi / lo > 1 + percentage / 100.0:
            return False
    return True


# ---------------------------------------------------------------------- server side

STAT_KINDS = ("queue", "compute_input", "compute_infer", "compute_output")


def read_stats(control, model: str) -> dict | None:
    """The model's cumulative inference statistics {kind: (count, ns)} with `success`,
    through a blocking tritonclient (HTTP or gRPC); None where the server has none."""
    try:
        if control.__class__.__module__.startswith("tritonclient.grpc"):
            doc = control.get_inference_statistics(model, as_json=True, client_timeout=10)
        else:
            doc = control.get_inference_statistics(model)
    except Exception:
        return None
    return stats_from_json(doc)


def stats_from_json(doc: dict) -> dict | None:
    """Add up every version's inference_stats (gRPC's JSON drops zeros and writes int64
    as strings)."""
    stats = doc.get("model_stats") if isinstance(doc, dict) else None
    if not stats:
        return None
    out = {k: [0, 0] for k in ("success",) + STAT_KINDS}
    for version in stats:
        inf = version.get("inference_stats") or {}
        for k in out:
            entry = inf.get(k) or {}
            out[k][0] += int(entry.get("count", 0) or 0)
            out[k][1] += int(entry.get("ns", 0) or 0)
    return {k: tuple(v) for k, v in out.items()}


def server_split(before: dict | None, after: dict | None) -> dict:
    """Microseconds per request of each server-side phase between two read_stats()
    samples, over the requests that succeeded between them (perf_analyzer's
    "Server: queue, compute input, compute infer, compute output")."""
    if not before or not after:
        return {}
    n = after["success"][0] - before["success"][0]
    if n <= 0:
        return {"requests": 0}
    out = {"requests": n}
    for k in STAT_KINDS:
        out[f"{k}_us"] = round((after[k][1] - before[k][1]) / n / 1e3, 2)
    return out


# ---------------------------------------------------------------------- lines


def cpu_line(cpu_us: dict, note: str = "") -> str:
    """One line of CPU microseconds per request by role."""
    if not cpu_us:
        return f"    cpu us/request: {note or 'unknown'}"
    parts = []
    for role, us in cpu_us.items():
        shown = f"{us:.1f}" if us is not None else "-"
        parts.append(f"{role} {shown}")
    text = "    cpu us/request: " + " | ".join(parts)
    return text + (f"   ({note})" if note else "")


def server_line(split: dict) -> str:
    if not split:
        return "    server: no statistics endpoint answered"
    if not split.get("requests"):
        return "    server: no request counted by the statistics endpoint"
    return (f"    server: queue {split['queue_us']:.1f} us, compute input "
            f"{split['compute_input_us']:.1f} us, infer {split['compute_infer_us']:.1f} "
            f"us, output {split['compute_output_us']:.1f} us "
            f"(per request, {split['requests']} requests)")


# ---------------------------------------------------------------------- CSV

CSV_FIELDS = [
    # perf_analyzer's names where it has the column (latencies in microseconds)
    ("Concurrency", lambda r: r.get("concurrency")),
    ("Request Rate", lambda r: r.get("request_rate") or ""),
    ("Inferences/Second", lambda r: r.get("throughput")),
    ("Server Queue", lambda r: (r.get("server_stats") or {}).get("queue_us", "")),
    ("Server Compute Input", lambda r: (r.get("server_stats") or {}).get("compute_input_us", "")),
    ("Server Compute Infer", lambda r: (r.get("server_stats") or {}).get("compute_infer_us", "")),
    ("Server Compute Output",
     lambda r: (r.get("server_stats") or {}).get("compute_output_us", "")),
    ("p50 latency", lambda r: _us(r.get("p50_ms"))),
    ("p90 latency", lambda r: _us(r.get("p90_ms"))),
    ("p95 latency", lambda r: _us(r.get("p95_ms"))),
    ("p99 latency", lambda r: _us(r.get("p99_ms"))),
    ("Avg latency", lambda r: _us(r.get("mean_ms"))),
    ("Percentile", lambda r: r.get("percentile") or ""),
    ("Percentile latency", lambda r: _us(r.get("pct_ms"))),
    ("Protocol", lambda r: r.get("protocol")),
    ("Inputs", lambda r: r.get("inputs")),
    ("Requests", lambda r: r.get("requests")),
    ("Errors", lambda r: r.get("errors")),
    ("Achieved Rate", lambda r: r.get("achieved_rate") or ""),
    ("Late", lambda r: r.get("late") if r.get("request_rate") else ""),
    ("Unsent", lambda r: r.get("unsent") if r.get("request_rate") else ""),
    ("Stable", lambda r: "" if r.get("stable") is None else r.get("stable")),
    ("Sequences", lambda r: r.get("sequences") or ""),
    ("Responses/Second", lambda r: r.get("responses_per_s") or ""),
    ("First Response avg", lambda r: _us(r.get("ttft_mean_ms"))),
    ("First Response p50", lambda r: _us(r.get("ttft_p50_ms"))),
    ("First Response p99", lambda r: _us(r.get("ttft_p99_ms"))),
]


def _us(ms):
    return "" if ms is None else round(ms * 1e3, 1)


def write_csv(path: str, rows: list[dict]) -> None:
    """One line per point; then a column per CPU role (us per request), named
    'cpu us/req <role>', for every role any row has."""
    roles: list[str] = []
    for r in rows:
        for role in (r.get("cpu_us") or {}):
            if role not in roles:
                roles.append(role)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([h for h, _ in CSV_FIELDS] + [f"cpu us/req {r}" for r in roles])
        for r in rows:
            cpu = r.get("cpu_us") or {}
            w.writerow([get(r) for _, get in CSV_FIELDS] +
                       ["" if cpu.get(x) is None else cpu[x] for x in roles])


# ---------------------------------------------------------------------- -f

PA_SERVER = ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us")


def pa_csv_lines(rows: list[dict], verbose: bool = False) -> list[list]:
    """perf_analyzer's -f file (its report writer's layout): Concurrency (or Request
    Rate), Inferences/Second, Client Send, Network+Server Send/Recv, the server's
    queue and compute phases, Client Recv, p50/p90/p95/p99 latency (and the
    --percentile one), with --verbose-csv Avg latency, request/response and response
    wait; times in whole microseconds, rows by increasing throughput. tritonclient
    does not time the client's send and receive apart from the wait, so Client Send,
    Client Recv and request/response are 0 and that time is in Network+Server
    Send/Recv and response wait."""
    rate = any(r.get("request_rate") for r in rows)
    qs = {50.0, 90.0, 95.0, 99.0} | {float(r["percentile"]) for r in rows
                                     if r.get("percentile") is not None}
    header = ["Request Rate" if rate else "Concurrency", "Inferences/Second",
              "Client Send", "Network+Server Send/Recv", "Server Queue",
              "Server Compute Input", "Server Compute Infer", "Server Compute Output",
              "Client Recv"] + [f"p{q:g} latency" for q in sorted(qs)]
    if verbose:
        header += ["Avg latency", "request/response", "response wait"]
    out = [header]
    for r in sorted(rows, key=lambda r: r.get("throughput") or 0.0):
        split = r.get("server_stats") or {}
        server = [int(split.get(k) or 0) for k in PA_SERVER]
        avg = _whole_us(r.get("mean_ms"))
        line = [f"{r['request_rate']:g}" if rate else r.get("concurrency"),
                f"{r.get('throughput') or 0.0:.6g}", 0, max(avg - sum(server), 0),
                *server, 0]
        for q in sorted(qs):
            key = {50.0: "p50_ms", 90.0: "p90_ms", 95.0: "p95_ms", 99.0: "p99_ms"}.get(q)
            line.append(_whole_us(r.get(key) if key else r.get("pct_ms")))
        if verbose:
            line += [avg, 0, avg]
        out.append(line)
    return out


def _whole_us(ms) -> int:
    return 0 if ms is None or (isinstance(ms, float) and math.isnan(ms)) \
        else int(ms * 1e3)


def write_pa_csv(path: str, rows: list[dict], verbose: bool = False) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(pa_csv_lines(rows, verbose))


def over_threshold(rows, threshold_ms: float | None) -> bool:
    """perf_analyzer's -l: the last point's latency (its --percentile one, else the
    average) is above `threshold_ms`."""
    if threshold_ms is None or not threshold_ms or not rows:
        return False
    last = rows[-1]
    value = last.pct_ms if last.percentile is not None else last.mean_ms
    return value is not None and not math.isnan(value) and value > threshold_ms


# ---------------------------------------------------------------------- plot


def run_label(doc: dict, fallback: str) -> str:
    meta = doc.get("meta", {})
    cfg = meta.get("config", {})
    label = meta.get("label") or cfg.get("server")
    if label:
        return label
    if cfg:
        return f"{cfg.get('model', '?')} {cfg.get('protocol', '')}".strip()
    return fallback


def plot(path: str, runs: list[tuple[str, list[dict]]]) -> None:
    """Throughput (x) against p50 (solid) and p99 (dashed) latency (y), one color per
    run, in the sweep's order; runs: (label, rows as in the JSON)."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, rows) in enumerate(runs):
        pts = [r for r in rows if r.get("requests") and r.get("p50_ms") is not None]
        if not pts:
            continue
        color = f"C{i % 10}"
        x = [r["throughput"] for r in pts]
        ax.plot(x, [r["p50_ms"] for r in pts], "o-", color=color, label=f"{label} p50")
        ax.plot(x, [r["p99_ms"] for r in pts], "s--", color=color, label=f"{label} p99")
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_files(path: str, json_paths: list[str], extra=()) -> None:
    """Plot earlier runs' JSON files (and `extra` (label, rows) pairs) on one plot."""
    runs = list(extra)
    for p in json_paths:
        with open(p) as f:
            doc = json.load(f)
        stem = os.path.splitext(os.path.basename(p))[0]
        label = run_label(doc, stem)
        if any(label == other for other, _ in runs):
            label = f"{label} ({stem})"  # two runs of one server: tell them apart
        runs.append((label, doc.get("rows", [])))
    plot(path, runs)

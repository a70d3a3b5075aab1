"""What scripts/gpu_compare.py writes: results.json, kept on disk after every row (the
device call may be killed at its limit), the summaries behind its tables, the copy
counters from shmserve's log, and the PNG (`gpu_compare.py plot` draws it again
elsewhere from results.json, where the GPU machine had no matplotlib)."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from pathlib import Path

import compare


def clean(value):
    """JSON-safe: NaN and infinities become None, tuples lists, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


class Results:
    """results.json as the run goes: every change is written at once (to a temporary
    file, then renamed, so a reader never sees half of it)."""

    def __init__(self, path: Path, meta: dict):
        self.path = Path(path)
        self.data = {"status": "running", "meta": meta, "servers": {}, "phases": {},
                     "copies": {}, "png": None}

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(clean(self.data), indent=1) + "\n")
        os.replace(tmp, self.path)

    def phase(self, name: str, **fields) -> dict:
        entry = self.data["phases"].setdefault(
            name, {"status": "pending", "rows": [], "summary": []})
        entry.update(fields)
        self.save()
        return entry

    def add_row(self, phase: str, row: dict) -> None:
        self.data["phases"][phase]["rows"].append(row)
        self.save()

    def set(self, key: str, value) -> None:
        self.data[key] = value
        self.save()


# --------------------------------------------------------------------- summaries


def bench_summary(rows: list[dict], servers: list[str], points, model: str) -> list[dict]:
    """compare.summarize over a phase's rows, with Triton as the baseline when it took
    part (so each ratio reads shmserve / Triton, as the issue's table does)."""
    names = sorted({r["server"] for r in rows} | set(servers),
                   key=lambda n: (n != "triton", servers.index(n) if n in servers else 99))
    out = compare.summarize(rows, names, points)
    for entry in out:
        entry["model"] = model
        entry["label"] = point_label(entry["protocol"], entry["shape"], entry["shm"],
                                     entry["concurrency"])
    return [e for e in out if e["servers"]]


def cclient_summary(rows: list[dict]) -> list[dict]:
    """Per protocol: each server's mean over rounds of requests/s and CPU per request
    (its total and by role), and shmserve / Triton."""
    out = []
    for protocol in sorted({r["protocol"] for r in rows}):
        entry = {"protocol": protocol, "tool": "wrk" if protocol == "http" else "h2load",
                 "label": f"{'wrk' if protocol == 'http' else 'h2load'} {protocol} [1,16]",
                 "servers": {}, "ratio": {}}
        for name in sorted({r["server"] for r in rows}, key=lambda n: n != "triton"):
            rs = [r for r in rows if r["server"] == name and r["protocol"] == protocol
                  and r.get("requests")]
            if not rs:
                continue
            roles = sorted({k for r in rs for k in r.get("cpu_us_per_request", {})})
            entry["servers"][name] = {
                "throughput": statistics.mean(r["infer_per_s"] for r in rs),
                "by_round": {r["round"]: r["infer_per_s"] for r in rs},
                "cpu_us": {
                    **{k: statistics.mean(r["cpu_us_per_request"].get(k, 0.0) for r in rs)
                       for k in roles},
                    "server": statistics.mean(r["server_cpu_us_per_request"] for r in rs)},
                "client_cpu_us": _mean_or_none(r.get("client_cpu_us_per_request")
                                               for r in rs),
                "failed": sum(r.get("failed", 0) for r in rs)}
        t, s = entry["servers"].get("triton"), entry["servers"].get("shmserve")
        if t and s and t["throughput"]:
            entry["ratio"]["shmserve"] = s["throughput"] / t["throughput"]
        if entry["servers"]:
            out.append(entry)
    return out


def _mean_or_none(values):
    xs = [v for v in values if v is not None]
    return statistics.mean(xs) if xs else None


def point_label(protocol: str, shape, shm: str, concurrency: int) -> str:
    """'grpc 16 MiB cuda c=4' for big FP32 tensors, 'http [1,16] c=1' for small."""
    n = math.prod(shape) * 4
    size = f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else "[" + ",".join(map(str, shape)) + "]"
    where = "" if shm == "none" else f" {shm}"
    return f"{protocol} {size}{where} c={concurrency}"


def format_cclient(summary: list[dict]) -> str:
    lines = [f"{'tool':>7} {'proto':>5} {'server':>9} {'infer/s':>9} {'server us/req':>14}"
             "  by role (us/req)"]
    for e in summary:
        for name, s in e["servers"].items():
            roles = ", ".join(f"{k} {v:.0f}" for k, v in s["cpu_us"].items()
                              if k != "server" and v)
            lines.append(f"{e['tool']:>7} {e['protocol']:>5} {name:>9} "
                         f"{s['throughput']:>9.0f} {s['cpu_us']['server']:>14.0f}  {roles}")
        if e["ratio"]:
            lines.append(f"{'':>7} {e['protocol']:>5} shmserve / Triton "
                         f"{e['ratio']['shmserve']:.2f}x")
    return "\n".join(lines)


# the summary shmserve logs per model at exit (scheduler/scheduling/dynamic_scheduler.py)
_SUMMARY = re.compile(r"model '([^']+)' version (\d+): (\d+) rows in (\d+) batches; "
                      r"batch sizes \{([^}]*)\}; bytes copied host=(\d+) h2d=(\d+) "
                      r"d2h=(\d+) d2d=(\d+)")


def copies_from_log(text: str) -> dict[str, dict]:
    """model -> its rows, batches, batch sizes and the bytes its workers copied by kind
    (host, h2d, d2h, d2d), from shmserve's exit summary (the last one of each model)."""
    out = {}
    for m in _SUMMARY.finditer(text):
        sizes = dict(item.split(":") for item in m.group(5).split(", ") if item)
        out[m.group(1)] = {
            "rows": int(m.group(3)), "batches": int(m.group(4)),
            "batch_sizes": {int(k): int(v) for k, v in sizes.items()},
            **dict(zip(("host", "h2d", "d2h", "d2d"), map(int, m.groups()[5:])))}
    return out


# --------------------------------------------------------------------- the PNG


def plot_rows(data: dict) -> list[tuple[str, str, list[tuple[str, dict]]]]:
    """(phase title, what the left panel shows, [(row label, {server: (that value,
    server CPU us per request)})]) for every measured phase that is not a check. The
    left panel is requests/s, or p50 for the phase that is about p50."""
    out = []
    for name, phase in data.get("phases", {}).items():
        if phase.get("check") or not phase.get("summary"):
            continue
        key, what = ("p50_ms", "p50 ms") if name == "p50" else ("throughput", "infer/s")
        rows = []
        for e in phase["summary"]:
            values = {srv: (s.get(key), (s.get("cpu_us") or {}).get("server"))
                      for srv, s in e["servers"].items()}
            rows.append((e["label"], values))
        out.append((phase.get("title", name), what, rows))
    return out


def plot(data: dict, path: Path) -> None:
    """Bars per row for every server: requests/s or p50 (left) and server CPU
    microseconds per request (right), one line of panels per phase. Needs matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    phases = plot_rows(data)
    if not phases:
        raise ValueError("nothing measured to plot")
    colors = {"triton": "tab:gray", "shmserve": "tab:blue"}
    fig, axes = plt.subplots(len(phases), 2, figsize=(14, 3.2 * len(phases)),
                             squeeze=False)
    for (title, what_left, rows), (ax_t, ax_c) in zip(phases, axes):
        servers = sorted({s for _, v in rows for s in v}, key=lambda n: n != "triton")
        width = 0.8 / max(len(servers), 1)
        for k, srv in enumerate(servers):
            xs = [i + (k - (len(servers) - 1) / 2) * width for i in range(len(rows))]
            for ax, j in ((ax_t, 0), (ax_c, 1)):
                ys = [(v.get(srv) or (None, None))[j] for _, v in rows]
                ax.bar(xs, [y or 0 for y in ys], width, label=srv,
                       color=colors.get(srv))
        for ax, what in ((ax_t, what_left), (ax_c, "server CPU us / request")):
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels([label for label, _ in rows], rotation=20, ha="right",
                               fontsize=8)
            ax.set_title(f"{title}: {what}", fontsize=9)
            ax.legend(fontsize=8)
    meta = data.get("meta", {})
    fig.suptitle(f"shmserve beside Triton on {meta.get('gpu') or meta.get('device', '?')}"
                 f" ({meta.get('started', '')})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The numbers and the table of scripts/attack_probe.py: the victim's latency and
errors over a window, and one markdown row per attack (as issue 25's table)."""

from __future__ import annotations

MIB = 1 << 20


def percentile(values: list[float], q: float) -> float | None:
    """q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def victim_stats(records: list, since: float | None = None,
                 until: float | None = None) -> dict:
    """Calls [t, ms, kind] in [since, until): counts and latency of the ones answered.
    A timeout counts at the timeout's length in max, so a hang is never hidden."""
    rs = [r for r in records if (since is None or r[0] >= since)
          and (until is None or r[0] < until)]
    ok = [r[1] for r in rs if r[2] == "ok"]
    timeouts = sum(r[2] == "timeout" for r in rs)
    errors = sum(r[2] == "error" for r in rs)
    out = {"calls": len(rs), "ok": len(ok), "timeouts": timeouts, "errors": errors,
           "p50_ms": percentile(ok, 50), "p99_ms": percentile(ok, 99),
           "max_ms": max(ok) if ok else None}
    if rs and len(rs) > 1:
        out["span_s"] = round(rs[-1][0] - rs[0][0], 3)
    return out


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def fmt_victim(s: dict | None) -> str:
    if not s or not s.get("calls"):
        return "no calls"
    bad = s["errors"] + s["timeouts"]
    err = f"{bad} err" + (f" ({s['timeouts']} timeout)" if s["timeouts"] else "")
    return f"{fmt_ms(s['p99_ms'])} / {fmt_ms(s['max_ms'])} ms, {err}, {s['ok']} ok"


def fmt_mib(v: int | None) -> str:
    if v is None:
        return "?"
    m = v / MIB
    return f"{m:+.0f}" if abs(m) >= 10 else f"{m:+.1f}"


def fmt_memory(mem: dict, start: bool = False) -> str:
    """'+peak / +after MiB', against the memory at the attack's start (shown too with
    `start`: a server still giving back an earlier attack's memory shows as a
    negative +after)."""
    if mem.get("start") is None:
        return "-"
    out = f"{fmt_mib(mem.get('delta_peak'))} / {fmt_mib(mem.get('delta_after'))} MiB"
    return out + (f" (of {mem['start'] / MIB:,.0f})" if start else "")


def table(rows: list[dict], server: str) -> str:
    """The markdown table of one server's rows."""
    lines = [f"### {server}", "",
             "| attack | victim gRPC p99 / max / errors | victim HTTP p99 / max / errors "
             "| memory +peak / +after | attacker's fate |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['label']} | - | - | - | n/a: {r['skipped']} |")
            continue
        fate = r["fate"] + (f" [{r['note']}]" if r.get("note") else "")
        lines.append(f"| {r['label']} | {fmt_victim(r['victim'].get('grpc'))} | "
                     f"{fmt_victim(r['victim'].get('http'))} | "
                     f"{fmt_memory(r['memory'], True)} | {fate.replace('|', '/')} |")
    return "\n".join(lines)


def _p99_max(s: dict) -> str:
    return f"{fmt_ms(s.get('p99_ms'))}/{fmt_ms(s.get('max_ms'))}"


def side_by_side(by_server: dict[str, list[dict]]) -> str:
    """One row per attack, one column per server: p99s, errors and memory in short."""
    names = list(by_server)
    labels = []
    for rows in by_server.values():
        for r in rows:
            if r["label"] not in labels:
                labels.append(r["label"])
    lines = ["| attack | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label in labels:
        cells = []
        for n in names:
            r = next((x for x in by_server[n] if x["label"] == label), None)
            if r is None:
                cells.append("-")
            elif r.get("skipped"):
                cells.append("n/a")
            else:
                g, h = r["victim"].get("grpc") or {}, r["victim"].get("http") or {}
                errs = sum(x.get("errors", 0) + x.get("timeouts", 0) for x in (g, h))
                cells.append(f"gRPC {_p99_max(g)}, HTTP {_p99_max(h)} ms; {errs} err; "
                             f"{fmt_memory(r['memory'])}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

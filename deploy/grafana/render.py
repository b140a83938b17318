#!/usr/bin/env python3
"""Draws the shipped dashboard (sluice-dashboard.json) from a live Prometheus into a PNG.

Grafana is not installable here (no Debian package, no PyPI one), so this draws each panel
itself, at the place and size the dashboard gives it: its queries evaluated over the
window asked for by Prometheus' own `query_range`, with every variable set to all
(`$policy`, `$proxy`: `.*`) and `$__rate_interval` to `--rate`. Time series are lines,
heatmaps are their buckets' rates as an image, stats their last value; a repeated panel
(per policy) is drawn once with every policy's series. What it shows is what Prometheus
answers to the dashboard's own queries: no number is made here.

The end-to-end test (tests/tests/envoy/prometheus.rs) runs it against its Prometheus when
SLUICE_DASHBOARD_PNG names a file: `deploy/grafana/snapshot.sh` makes docs/dashboard.png.

Usage: python3 deploy/grafana/render.py --prometheus http://127.0.0.1:9090 \\
           --start UNIX --end UNIX --out docs/dashboard.png [--rate 15s]
Needs matplotlib (deploy/grafana/render-requirements.txt).
"""

import argparse
import json
import math
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
COLUMNS = 24
# Inches per grid unit: wide enough to read a legend, as Grafana's default row height.
UNIT_W, UNIT_H = 0.9, 0.36


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list:
    body = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step}).encode()
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range", body, timeout=30) as response:
        answer = json.load(response)
    if answer.get("status") != "success":
        raise SystemExit(f"render.py: Prometheus refused {expr!r}: {answer}")
    return answer["data"]["result"]


def substitute(expr: str, rate: str) -> str:
    for name in ("${policy:regex}", "$policy", "${proxy:regex}", "$proxy"):
        expr = expr.replace(name, ".*")
    return expr.replace("$__rate_interval", rate)


def legend(template: str, metric: dict) -> str:
    text = template or ",".join(f"{k}={v}" for k, v in metric.items() if k != "__name__")
    for key, value in metric.items():
        text = text.replace("{{" + key + "}}", value).replace("{{ " + key + " }}", value)
    return text


def draw_timeseries(ax, results):
    drawn = 0
    for label, series in results:
        for s in series:
            times = [float(t) for t, _ in s["values"]]
            values = [float(v) if v not in ("NaN", "+Inf", "-Inf") else math.nan for _, v in s["values"]]
            ax.plot(times, values, linewidth=1.2, label=legend(label, s["metric"])[:48])
            drawn += 1
    if 0 < drawn <= 8:
        ax.legend(fontsize=6, loc="upper left", frameon=False)
    ax.set_xticks([])
    return drawn


def draw_heatmap(ax, results):
    """The buckets' rates (cumulative `le` series) as an image: one row per bucket."""
    series = [s for _, group in results for s in group if "le" in s["metric"]]
    if not series:
        return 0
    bound = lambda s: math.inf if s["metric"]["le"] == "+Inf" else float(s["metric"]["le"])  # noqa: E731
    series.sort(key=bound)
    rows, previous = [], None
    for s in series:
        values = [float(v) if v != "NaN" else 0.0 for _, v in s["values"]]
        rows.append([v - p for v, p in zip(values, previous)] if previous else values)
        previous = values
    ax.imshow(rows, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(series)), [s["metric"]["le"] for s in series], fontsize=5)
    ax.set_xticks([])
    return len(series)


def draw_stat(ax, results):
    values = [float(s["values"][-1][1]) for _, group in results for s in group if s["values"]]
    ax.axis("off")
    ax.text(0.5, 0.4, f"{values[-1]:.6g}" if values else "no data", ha="center", va="center", fontsize=20)
    return len(values)


def render(dashboard: dict, prometheus: str, start: float, end: float, rate: str, out: Path) -> list:
    panels = dashboard["panels"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    figure = plt.figure(figsize=(COLUMNS * UNIT_W, height * UNIT_H))
    step = max(1.0, (end - start) / 240)
    empty = []
    for panel in panels:
        pos = panel["gridPos"]
        left, width = pos["x"] / COLUMNS, pos["w"] / COLUMNS
        bottom, tall = 1 - (pos["y"] + pos["h"]) / height, pos["h"] / height
        if panel["type"] == "row":
            figure.text(0.005, bottom + tall / 2, panel["title"], fontsize=13, weight="bold", va="center")
            continue
        ax = figure.add_axes([left + 0.012, bottom + 0.12 * tall, width - 0.02, 0.74 * tall])
        ax.set_title(panel["title"].replace("$policy", "every policy"), fontsize=9, loc="left")
        ax.tick_params(labelsize=6)
        results = [
            (t.get("legendFormat", ""), query_range(prometheus, substitute(t["expr"], rate), start, end, step))
            for t in panel.get("targets", [])
            if t.get("expr")
        ]
        draw = {"heatmap": draw_heatmap, "stat": draw_stat}.get(panel["type"], draw_timeseries)
        if draw(ax, results) == 0:
            empty.append(panel["title"])
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    figure.text(0.995, 0.999, f"{dashboard['title']}: rendered from Prometheus by deploy/grafana/render.py",
                ha="right", va="top", fontsize=10, color="grey")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    return empty


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--start", type=float, required=True, help="Unix seconds")
    parser.add_argument("--end", type=float, required=True, help="Unix seconds")
    parser.add_argument("--rate", default="15s", help="what $__rate_interval stands for (default 15s)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dashboard", type=Path, default=HERE / "sluice-dashboard.json")
    args = parser.parse_args()
    dashboard = json.loads(args.dashboard.read_text())
    empty = render(dashboard, args.prometheus.rstrip("/"), args.start, args.end, args.rate, args.out)
    print(f"render.py: wrote {args.out}" + (f"; panels with no data: {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

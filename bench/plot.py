#!/usr/bin/python3
"""Plots of a vnet bench run: throughput bars, latency bars, MPI latency vs size.

usage: plot.py results.json OUTDIR
Writes throughput.png, latency.png and mpi_latency.png into OUTDIR.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def conditions(rows):
    return sorted({(r["mtu"], r["shaped"] or "unshaped") for r in rows})


def cases(rows):
    names = {r["case"] for r in rows}
    return sorted(names, key=lambda c: (c != "native", c != "routed", c != "vxlan", c))


def median(rows, case, cond, metric):
    for r in rows:
        if r["case"] == case and r["metric"] == metric and (r["mtu"], r["shaped"] or "unshaped") == cond:
            return r["median"]
    return None


def grid(n):
    """A figure with one panel per condition, two panels a row."""
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 4.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def save(fig, axes, path):
    """The legend on the first panel, then the figure to path."""
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(rows, metrics, ylabel, path, title, log=False):
    conds = conditions(rows)
    cs = cases(rows)
    fig, axes = grid(len(conds))
    width = 0.8 / max(len(cs), 1)
    for ax, cond in zip(axes, conds):
        for i, c in enumerate(cs):
            vals = [median(rows, c, cond, m) or 0 for m in metrics]
            xs = [j + i * width for j in range(len(metrics))]
            ax.bar(xs, vals, width, label=c)
        ax.set_xticks([j + width * (len(cs) - 1) / 2 for j in range(len(metrics))])
        ax.set_xticklabels(metrics, rotation=20)
        ax.set_title(f"MTU {cond[0]}, {cond[1]}")
        ax.set_ylabel(ylabel)
        if log:
            # The cases span three orders of magnitude (tens of us to
            # milliseconds): on a linear axis all but the slowest vanish.
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.grid(axis="y", alpha=0.3, which="both" if log else "major")
    fig.suptitle(title)
    save(fig, axes, path)


def mpi_latency(rows, path):
    conds = conditions(rows)
    cs = cases(rows)
    fig, axes = grid(len(conds))
    for ax, cond in zip(axes, conds):
        for c in cs:
            pts = []
            for r in rows:
                m = r["metric"]
                if r["case"] == c and m.startswith("mpi_lat_") and m.endswith("B_us") and \
                        (r["mtu"], r["shaped"] or "unshaped") == cond and r["median"] is not None:
                    pts.append((max(int(m[len("mpi_lat_"):-len("B_us")]), 0.5), r["median"]))
            pts.sort()
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes; 0 plotted at 1/2)")
        ax.set_ylabel("one-way latency (us)")
        ax.set_title(f"MPI ping-pong, MTU {cond[0]}, {cond[1]}")
        ax.grid(alpha=0.3, which="both")
    save(fig, axes, path)


def main():
    doc = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    rows = doc["results"]
    if not rows:
        print("plot.py: no results to plot", file=sys.stderr)
        return 1
    bars(rows, ["tcp1_gbps", "tcp4_gbps", "udp_gbps"], "Gbit/s", f"{out}/throughput.png", "Throughput (median)")
    bars(rows, ["ping56_rtt_us", "ping1024_rtt_us", "ping8000_rtt_us", "rr_tcp_p50_us", "rr_udp_p50_us",
                "mpi_lat_0B_us"], "microseconds (log scale)", f"{out}/latency.png",
         "Latency (median; lower is better)", log=True)
    mpi_latency(rows, f"{out}/mpi_latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

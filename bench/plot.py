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
    return sorted(names, key=lambda c: (c != "native", c != "routed", c != "bridged", c != "vxlan", c))


# What a reader calls each metric.
NAMES = {
    "tcp1_gbps": "TCP, 1 stream",
    "tcp4_gbps": "TCP, 4 streams",
    "udp_gbps": "UDP goodput",
    "ping56_rtt_us": "ping, 56 B",
    "ping1024_rtt_us": "ping, 1 KB",
    "ping8000_rtt_us": "ping, 8000 B",
    "rr_tcp_p50_us": "request-response TCP (p50)",
    "rr_udp_p50_us": "request-response UDP (p50)",
    "mpi_lat_0B_us": "MPI, 0 B one-way",
    "mpi_yield_lat_0B_us": "MPI, 0 B one-way, ranks yielding",
    "mpi_bw_peak_mbs": "MPI bandwidth (peak)",
    "cpu_s_per_gb": "CPU s per GB",
    "many_gbps": "TCP, 4 VMs x 2 streams",
    "many_cpu_s_per_gb": "CPU s per GB, 4 VMs",
}

# Cases drawn as reference lines across each metric's group, not as bars.
BASELINES = {"native": ("black", "-"), "routed": ("dimgray", "--"), "bridged": ("gray", ":")}


def row(rows, case, cond, metric):
    for r in rows:
        if r["case"] == case and r["metric"] == metric and (r["mtu"], r["shaped"] or "unshaped") == cond:
            return r
    return None


def median(rows, case, cond, metric):
    r = row(rows, case, cond, metric)
    return r["median"] if r else None


def spread(rows, case, cond, metric):
    """(median, below, above): the whisker from the repeats' min to max."""
    r = row(rows, case, cond, metric)
    if not r or r["median"] is None or not r.get("samples"):
        return None
    s = r["samples"]
    return r["median"], r["median"] - min(s), max(s) - r["median"]


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
    """One legend under the panels (it hides no bar), then the figure to path."""
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    rows = (len(labels) + 5) // 6
    fig.tight_layout(rect=(0, 0.025 + 0.025 * rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(rows, metrics, ylabel, path, title, log=False):
    """Bars for the overlays (median, whiskers from the repeats' min to max),
    the baselines as horizontal reference lines across each metric's group."""
    conds = conditions(rows)
    cs = [c for c in cases(rows) if c not in BASELINES]
    base = [c for c in cases(rows) if c in BASELINES]
    fig, axes = grid(len(conds))
    width = 0.8 / max(len(cs), 1)
    for ax, cond in zip(axes, conds):
        for i, c in enumerate(cs):
            got = [spread(rows, c, cond, m) for m in metrics]
            xs = [j + i * width for j, g in enumerate(got) if g]
            vals = [g[0] for g in got if g]
            err = [[g[1] for g in got if g], [g[2] for g in got if g]]
            ax.bar(xs, vals, width, yerr=err, capsize=2, error_kw={"elinewidth": 0.8}, label=c)
        for b in base:
            colour, style = BASELINES[b]
            for j, m in enumerate(metrics):
                v = median(rows, b, cond, m)
                if v:
                    ax.hlines(v, j - width / 2, j + 0.8 - width / 2, colors=colour, linestyles=style,
                              linewidth=1.2, label=b if j == 0 else None)
        ax.set_xticks([j + width * (len(cs) - 1) / 2 for j in range(len(metrics))])
        ax.set_xticklabels([NAMES.get(m, m) for m in metrics], rotation=20, ha="right", fontsize=8)
        ax.set_title(f"MTU {cond[0]}, {cond[1]}")
        ax.set_ylabel(ylabel)
        if log:
            # The cases span three orders of magnitude (tens of us to
            # milliseconds): on a linear axis all but the slowest vanish.
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.grid(axis="y", alpha=0.3, which="both" if log else "major")
    fig.suptitle(title + "; whiskers: the repeats' min to max; lines: the no-overlay baselines")
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
    bars(rows, ["tcp1_gbps", "tcp4_gbps", "udp_gbps", "many_gbps"], "Gbit/s", f"{out}/throughput.png", "Throughput (median)")
    bars(rows, ["ping56_rtt_us", "ping1024_rtt_us", "ping8000_rtt_us", "rr_tcp_p50_us", "rr_udp_p50_us",
                "mpi_lat_0B_us", "mpi_yield_lat_0B_us"], "microseconds (log scale)", f"{out}/latency.png",
         "Latency (median; lower is better)", log=True)
    mpi_latency(rows, f"{out}/mpi_latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

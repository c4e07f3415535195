"""The README table and plot for bench/throughput.py's results: figures side by side, and our engine's
ratio to each peer."""

import textwrap
from pathlib import Path

ROWS = [  # (label, scenario, metric, higher is better)
    ("offline output tok/s", "offline", "tokens_per_s", True),
    ("online output tok/s", "online", "tokens_per_s", True),
    ("online TTFT p50 (s)", "online", "ttft_p50_s", False),
    ("online TTFT p99 (s)", "online", "ttft_p99_s", False),
    ("online latency p50 (s)", "online", "latency_p50_s", False),
    ("online latency p99 (s)", "online", "latency_p99_s", False),
    ("batch-1 decode tok/s", "batch1", "decode_tokens_per_s", True),
    ("mixed load, short p95 latency (s), FCFS", "mixed_fcfs", "short_latency_p95_s", False),
    ("mixed load, short p95 latency (s), short-first", "mixed_short_first", "short_latency_p95_s", False),
]


def value(results: dict, engine: str, scenario: str, metric: str) -> float | None:
    return results["engines"].get(engine, {}).get(scenario, {}).get(metric)


def ratio(ours: float | None, peer: float | None, higher_is_better: bool) -> str:
    if ours is None or peer is None:
        return ""
    return f"{(ours / peer if higher_is_better else peer / ours):.2f}x"


def write_report(results: dict, plot: Path) -> str:
    peers = [engine for engine in ("transformers", "vllm") if engine in results["engines"]]
    header = ["", *results["engines"], *(f"ours vs {peer}" for peer in peers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, scenario, metric, higher in ROWS:
        figures = [value(results, engine, scenario, metric) for engine in results["engines"]]
        if all(figure is None for figure in figures):
            continue
        ours = value(results, "ours", scenario, metric)
        ratios = [ratio(ours, value(results, peer, scenario, metric), higher) for peer in peers]
        cells = ["" if figure is None else f"{figure:.2f}" for figure in figures]
        lines.append("| " + " | ".join([label, *cells, *ratios]) + " |")
    bandwidth = results["bandwidth"]
    lines.append(
        f"\nBatch-1 memory-bandwidth limit: {bandwidth['weight_bytes'] / 1e6:.0f} MB of weights per token "
        f"over {bandwidth['read_bandwidth_gb_s']:.1f} GB/s measured read bandwidth = "
        f"{bandwidth['limit_tokens_per_s']:.0f} tok/s ({results['dtype']}, {results['cpu_count']} cores)."
    )
    plot_ratios(results, peers, plot)
    return "\n".join(lines)


def plot_ratios(results: dict, peers: list[str], plot: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, bars = [], {peer: [] for peer in peers}
    for label, scenario, metric, higher in ROWS:
        ours = value(results, "ours", scenario, metric)
        if ours is None or not any(value(results, peer, scenario, metric) for peer in peers):
            continue
        labels.append(textwrap.fill(label.replace(" (s)", ""), 16))
        for peer in peers:
            peer_value = value(results, peer, scenario, metric)
            bars[peer].append((ours / peer_value if higher else peer_value / ours) if peer_value else 0)
    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(peers))
    for index, peer in enumerate(peers):
        axis.bar([i + index * width for i in range(len(labels))], bars[peer], width, label=f"vs {peer}")
    axis.axhline(1.0, color="grey", linewidth=1)
    axis.set_xticks([i + width * (len(peers) - 1) / 2 for i in range(len(labels))], labels, fontsize=7)
    axis.set_ylabel("our engine's advantage (x, higher is better)")
    axis.set_title(f"SmolLM2-135M, {results['dtype']}, {results['cpu_count']} CPU cores")
    axis.legend()
    figure.tight_layout()
    plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(plot, dpi=120)

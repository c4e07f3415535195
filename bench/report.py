"""The README table and plot for one results file of bench/throughput.py: each engine's median figure with
its range over the rounds, and our engine's ratio to each peer (the median of the per-round ratios).

    .venv/bin/python -m bench.report bench/results/<kind>/throughput_<dtype>.json
"""

import json
import sys
import textwrap
from pathlib import Path

ROWS = [  # (label, scenario, metric)
    ("offline output tok/s", "offline", "tokens_per_s"),
    ("short chats (decode-heavy) output tok/s", "short_chats", "tokens_per_s"),
    ("online output tok/s", "online", "tokens_per_s"),
    ("online TTFT p50 (s)", "online", "ttft_p50_s"),
    ("online TTFT p99 (s)", "online", "ttft_p99_s"),
    ("online latency p50 (s)", "online", "latency_p50_s"),
    ("online latency p99 (s)", "online", "latency_p99_s"),
    ("batch-1 decode tok/s", "batch1", "decode_tokens_per_s"),
    ("mixed load, short requests' p95 latency (s), FCFS", "mixed_fcfs", "short_latency_p95_s"),
    ("the same with our short-first policy", "mixed_short_first", "short_latency_p95_s"),
]
ENGINES = ("ours", "ours_int8", "ours_int8kv", "ours_int8_int8kv", "vllm", "transformers")
NAMES = {
    "ours": "ours",
    "ours_int8": "ours, int8 weights",
    "ours_int8kv": "ours, int8 KV",
    "ours_int8_int8kv": "ours, int8 weights + KV",
    "vllm": "vLLM CPU",
    "transformers": "transformers",
}


def cell(spread: dict | None, unit: str = "") -> str:
    if spread is None:
        return ""
    low, high = _number(spread["min"]), _number(spread["max"])
    return f"{_number(spread['median'])}{unit} ({low}-{high})"


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def machine_line(results: dict) -> str:
    machine = results["machine"]
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items() if version)
    return (
        f"{machine['cpu']}, {machine['cores']} cores ({' '.join(machine['flags'])}), "
        f"{machine['read_bandwidth_gb_s']} GB/s read; {results['dtype']}; {versions}; "
        f"median of {results['rounds']} rounds (min-max)"
    )


def write_report(results: dict, plot: Path) -> str:
    engines = [engine for engine in ENGINES if engine in results["engines"]]
    base = results.get("base", "ours")
    peers = [peer for peer in engines if peer != base]
    header = [
        "",
        *(NAMES[engine] for engine in engines),
        *(f"{NAMES[base]} vs {NAMES[peer]}" for peer in peers),
    ]
    lines = [machine_line(results), "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, scenario, metric in ROWS:
        figures = [results["engines"][engine].get(scenario, {}).get(metric) for engine in engines]
        if all(figure is None for figure in figures):
            continue
        ratios = [results["ratios"].get(peer, {}).get(scenario, {}).get(metric) for peer in peers]
        row = [label, *(cell(figure) for figure in figures), *(cell(ratio, "x") for ratio in ratios)]
        lines.append("| " + " | ".join(row) + " |")
    limit = results["bandwidth_limit"]
    lines.append(
        f"\nBatch-1 memory-bandwidth limit with {results['dtype']} weights: "
        f"{limit['weight_bytes'] / 1e6:.0f} MB per token over "
        f"{results['machine']['read_bandwidth_gb_s']} GB/s = {limit['tokens_per_s']:.0f} tok/s."
    )
    plot_ratios(results, base, peers, plot)
    return "\n".join(lines)


def plot_ratios(results: dict, base: str, peers: list[str], plot: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in ROWS if any(_ratio(results, peer, row) for peer in peers)]
    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(peers))
    for index, peer in enumerate(peers):
        spreads = [_ratio(results, peer, row) for row in rows]
        medians = [spread["median"] if spread else 0 for spread in spreads]
        errors = [
            [spread["median"] - spread["min"] if spread else 0 for spread in spreads],
            [spread["max"] - spread["median"] if spread else 0 for spread in spreads],
        ]
        positions = [i + index * width for i in range(len(rows))]
        axis.bar(positions, medians, width, yerr=errors, capsize=2, label=f"vs {NAMES[peer]}")
    axis.axhline(1.0, color="grey", linewidth=1)
    labels = [textwrap.fill(label.replace(" (s)", ""), 16) for label, _, _ in rows]
    axis.set_xticks([i + width * (len(peers) - 1) / 2 for i in range(len(rows))], labels, fontsize=7)
    axis.set_ylabel(f"{NAMES[base]}: advantage (x, higher is better)")
    machine = results["machine"]
    axis.set_title(
        f"SmolLM2-135M, {results['dtype']}, {machine['cpu']}, {machine['cores']} cores", fontsize=9
    )
    axis.legend()
    figure.tight_layout()
    plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(plot, dpi=120)


def _ratio(results: dict, peer: str, row: tuple) -> dict | None:
    _, scenario, metric = row
    return results["ratios"].get(peer, {}).get(scenario, {}).get(metric)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    results = json.loads(path.read_text())
    kind = results["machine"]["kind"]
    print(write_report(results, Path("docs") / f"throughput_{kind}_{results['dtype']}.png"))

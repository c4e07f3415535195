"""The admin page's engine panel: live plots of load, KV pool, prefix cache, throughput and time to first
token, polled with gr.Timer.  The samples are kept per browser tab (gr.State), a few minutes' worth."""

import time
from dataclasses import dataclass, field

import gradio as gr
import pandas as pd

from chatsvc.service import ChatService
from chatsvc.ui import html
from chatsvc.ui.identity import Identity, shows_errors
from chatsvc.views import EnginePanel

POLL_S = 2.0
KEPT_SAMPLES = 150  # five minutes at one poll every two seconds
PLOTS = {  # plot title -> (y axis title, {series name: how to read it from a panel})
    "Requests": ("requests", {"running": lambda p: p.running, "waiting": lambda p: p.waiting}),
    "KV pool usage": ("% of blocks", {"used": lambda p: 100 * p.kv_usage}),
    "Prefix-cache hit rate": ("% of prompt tokens", {"hits": lambda p: _percent(p.prefix_cache_hit_rate)}),
    "Throughput": (
        "tokens/s",
        {"generated": lambda p: p.generation_tokens_per_s, "prompt": lambda p: p.prompt_tokens_per_s},
    ),
    "Time to first token": ("seconds", {"p50": lambda p: p.ttft_p50_s, "p99": lambda p: p.ttft_p99_s}),
}


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction


@dataclass
class Samples:
    rows: list[dict] = field(default_factory=list)  # long format: at (monotonic s), plot, series, value

    def add(self, panel: EnginePanel, at: float) -> None:
        for plot, (_, series) in PLOTS.items():
            for name, read in series.items():
                if (value := read(panel)) is not None:
                    self.rows.append({"at": at, "plot": plot, "series": name, "value": float(value)})
        cutoff = len(PLOTS) * 2 * KEPT_SAMPLES
        del self.rows[:-cutoff]

    def frame(self, plot: str, now: float) -> pd.DataFrame:
        """The plot's points, timed in seconds before `now` (the right edge of the plot is now)."""
        rows = [{**row, "seconds": round(row["at"] - now, 1)} for row in self.rows if row["plot"] == plot]
        return pd.DataFrame(rows or None, columns=["seconds", "series", "value"])


def figures(panel: EnginePanel) -> str:
    items = [
        ("engine", panel.state),
        ("running", panel.running),
        ("waiting", panel.waiting),
        ("KV blocks used", f"{panel.kv_blocks_used} of {panel.kv_blocks_total}"),
        *[
            (name, value)
            for name, value in (
                ("weights", panel.weights),
                ("KV pool", panel.kv_pool),
                ("speculative decoding", panel.speculative),
                ("embedding models", panel.embedding_models),
            )
            if value
        ],
    ]
    if panel.session_memory is not None:
        items += [(name.replace("_", " "), value) for name, value in panel.session_memory.items()]
    note = html.unavailable(f"Session KV: {panel.note}") if panel.note else ""
    return html.stats(items) + note


class EnginePanelView:
    """Lays the panel out in the current Blocks; `start` and `tick` are its events."""

    def __init__(self, service: ChatService, identity: Identity):
        self.service = service
        self.identity = identity
        self.timer = gr.Timer(POLL_S, active=False)
        self.samples = gr.State(Samples())
        self.summary = gr.HTML(elem_id="engine-figures")
        self.plots = {}
        with gr.Row():
            for plot, (y_title, _) in PLOTS.items():
                self.plots[plot] = gr.LinePlot(
                    x="seconds",
                    y="value",
                    color="series",
                    title=plot,
                    y_title=y_title,
                    x_title="seconds ago",
                    y_lim=[0, None],
                    x_axis_format="~g",
                    y_axis_format="~g",
                    height=220,
                    min_width=320,
                    elem_classes="engine-plot",
                )
        self.timer.tick(
            self.tick,
            [self.samples],
            [self.summary, self.samples, *self.plots.values()],
            show_progress="hidden",
            api_name="engine_panel",
        )

    @shows_errors
    async def tick(self, samples: Samples, request: gr.Request) -> tuple:
        panel = await self.service.admin.engine_panel(await self.identity.admin(request))
        now = time.monotonic()
        samples.add(panel, now)
        return figures(panel), samples, *(samples.frame(plot, now) for plot in PLOTS)

"""The look: a calm Gradio theme on system fonts (nothing is fetched from font services), light and dark."""

import gradio as gr

SYSTEM_FONTS = ("system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


def theme() -> gr.themes.Base:
    return gr.themes.Soft(
        primary_hue="teal",
        secondary_hue="slate",
        neutral_hue="slate",
        radius_size="md",
        font=SYSTEM_FONTS,
        font_mono=MONO_FONTS,
    ).set(
        body_background_fill="#f7f8fa",
        body_background_fill_dark="#0f1419",
        block_background_fill="#ffffff",
        block_background_fill_dark="#161b22",
        button_primary_background_fill="*primary_600",
        button_primary_background_fill_hover="*primary_700",
    )

"""The browser UI: one module per page (chat, knowledge bases, admin), composed in app.py.

Handlers call the chat service only; who is calling comes from the Gradio login (identity.py)."""

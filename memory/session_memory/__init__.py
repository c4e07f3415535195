"""Session memory: each chat session's KV kept across turns, within budgets, persisted when idle."""

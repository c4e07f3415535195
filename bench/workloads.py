"""The requests every engine gets in the benchmarks: chat prompts as token ids, so all engines see the
same tokens.  Standard library and a tokenizer only: it also runs inside vLLM's virtual environment."""

import random
from dataclasses import asdict, dataclass

SYSTEM = "You are a concise assistant for a small online shop. Answer from the notes when they help."
TOPICS = ["shipping", "returns", "warranty", "payment", "sizes", "gift cards", "stock", "repairs"]
NOTE = (
    "Note {i}: the {topic} policy was updated on day {day}; customers in region {region} get a reply within "
    "{hours} hours, and orders above {amount} euros are handled by the senior team."
)


@dataclass
class Request:
    prompt_token_ids: list[int]
    max_tokens: int
    arrival: float = 0.0  # seconds after the run starts
    kind: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def chat_prompt(tokenizer, index: int, length: int) -> list[int]:
    """A chat prompt of about `length` tokens: the shared system prompt, notes, then a question."""
    rng = random.Random(index)
    notes = []
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}]
    while True:
        question = (
            f"Customer {index} asks: what is the {rng.choice(TOPICS)} policy for my order {1000 + index}?"
        )
        messages[1]["content"] = "\n".join([*notes, question])
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        if len(ids) >= length:
            return ids
        values = dict(day=rng.randint(1, 28), region=rng.randint(1, 9), hours=rng.randint(2, 48))
        notes.append(
            NOTE.format(i=len(notes), topic=rng.choice(TOPICS), amount=rng.randint(50, 900), **values)
        )


def offline(tokenizer, count: int = 32, new_tokens: int = 128) -> list[Request]:
    lengths = [40 + (560 * i) // (count - 1) for i in range(count)]  # 40 to 600 tokens
    return [Request(chat_prompt(tokenizer, i, length), new_tokens) for i, length in enumerate(lengths)]


def short_chats(tokenizer, count: int = 32, new_tokens: int = 128) -> list[Request]:
    """Decode-heavy: prompts of 40 to 80 tokens, all at once."""
    lengths = [40 + (40 * i) // (count - 1) for i in range(count)]
    return [Request(chat_prompt(tokenizer, 500 + i, length), new_tokens) for i, length in enumerate(lengths)]


def warm_up(tokenizer) -> list[Request]:
    """A few requests that take every path a run will (a long prompt's chunked prefill, decodes side by
    side), with prompts of their own, so the timed requests find nothing but the shared system prompt."""
    return [Request(chat_prompt(tokenizer, 900 + i, length), 8) for i, length in enumerate((40, 200, 700))]


def batch_one(tokenizer, new_tokens: int = 128) -> list[Request]:
    return [Request(chat_prompt(tokenizer, 999, 100), new_tokens)]


def online(tokenizer, count: int, rate: float, seed: int = 0) -> list[Request]:
    """Poisson arrivals; prompts of 40-600 tokens; 16 to 256 new tokens."""
    rng = random.Random(seed)
    requests, clock = [], 0.0
    for i in range(count):
        clock += rng.expovariate(rate)
        prompt = chat_prompt(tokenizer, 2000 + i, rng.randint(40, 600))
        requests.append(Request(prompt, rng.randint(16, 256), clock))
    return requests


MIXED_KINDS = [("short", 0.7, 40, 16), ("medium", 0.2, 300, 128), ("long", 0.1, 1500, 256)]


def mixed(tokenizer, count: int, rate: float, seed: int = 1) -> list[Request]:
    """The seeds' mixed load: 70% short, 20% medium, 10% long requests, Poisson arrivals."""
    rng = random.Random(seed)
    requests, clock = [], 0.0
    for i in range(count):
        clock += rng.expovariate(rate)
        kind, _, length, new_tokens = rng.choices(MIXED_KINDS, weights=[k[1] for k in MIXED_KINDS])[0]
        requests.append(Request(chat_prompt(tokenizer, 3000 + i, length), new_tokens, clock, kind))
    return requests

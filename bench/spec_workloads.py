"""The requests of bench/speculative.py: where replies repeat their context (knowledge-base answers, support
chats, rewrites) and where they do not (bench.throughput's offline prompts).  Seeded, so both variants get
the same token ids; `seed` keeps warm-up and each concurrency's prompts apart (no prefix-cache hits
between them)."""

import random
from dataclasses import dataclass

from bench import workloads

WORKLOADS = ("kb_answers", "support_chat", "rewrite", "offline")
PRODUCTS = [
    "Nordic Steel Kettle",
    "Alpine Down Jacket",
    "Harbor Oak Desk",
    "Lumen Desk Lamp",
    "Trail Runner 5",
]
NAMES = ["Anna Berg", "Jonas Keller", "Mia Laurent", "Omar Haddad", "Lena Novak", "Ravi Menon"]
KB_SYSTEM = "Answer from the passages. Quote the passage that answers the question word for word."
SUPPORT_SYSTEM = (
    "You are a support assistant for an online shop. Repeat the order details the customer gives."
)


@dataclass
class Request:
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = False


def passage(rng: random.Random, number: int) -> str:
    product = rng.choice(PRODUCTS)
    return (
        f"[{number}] The {product} (item {rng.randint(10000, 99999)}) ships within {rng.randint(2, 9)} "
        f"working days. It can be returned within {rng.choice([14, 30, 60])} days of delivery if it is "
        f"unused and in its original packaging; the refund reaches the customer's account within "
        f"{rng.randint(3, 10)} days. Repairs under warranty are free for {rng.randint(1, 5)} years."
    )


def chat_request(tokenizer, messages: list[dict], max_tokens: int, ignore_eos: bool = False) -> Request:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return Request(list(ids["input_ids"] if hasattr(ids, "keys") else ids), max_tokens, ignore_eos)


def kb_answer(tokenizer, rng: random.Random) -> Request:
    passages = [passage(rng, n) for n in (1, 2, 3)]
    wanted = rng.randint(1, 3)
    question = f"{chr(10).join(passages)}\n\nWhat does passage [{wanted}] say about returns and refunds?"
    messages = [{"role": "system", "content": KB_SYSTEM}, {"role": "user", "content": question}]
    return chat_request(tokenizer, messages, 128)


def rewrite(tokenizer, rng: random.Random) -> Request:
    old, new = rng.sample(NAMES, 2)
    text = " ".join(passage(rng, n).split("] ", 1)[1] for n in (1, 2))
    text = f"{old} ordered on Monday. {text} {old} asked for the invoice by email."
    question = f"Rewrite this text with one change: replace {old} with {new}. Keep everything else.\n\n{text}"
    return chat_request(tokenizer, [{"role": "user", "content": question}], 128)


def requests(workload: str, tokenizer, count: int, seed: int) -> list[Request]:
    if workload == "offline":  # bench.throughput's prompt lengths, 40 to 600 tokens, 128 new tokens
        lengths = [40 + (560 * i) // 31 for i in range(32)]
        return [
            Request(workloads.chat_prompt(tokenizer, seed + i, lengths[i % 32]), 128, True)
            for i in range(count)
        ]
    make = {"kb_answers": kb_answer, "rewrite": rewrite}[workload]
    return [make(tokenizer, random.Random(seed + i)) for i in range(count)]


def support_chats(count: int, seed: int, turns: int = 10) -> list[list[str]]:
    """Each chat: a customer's order, then questions that bring its details back."""
    chats = []
    for i in range(count):
        rng = random.Random(seed + i)
        order, product, name = rng.randint(100000, 999999), rng.choice(PRODUCTS), rng.choice(NAMES)
        opening = f"Hello, I am {name}. My order {order} for the {product} has not arrived yet."
        follow_ups = [
            f"Can you confirm the order number {order} and the product?",
            f"The {product} was a gift. Can it be delivered to another address?",
            "How long does a return take?",
            f"Please repeat my name and order number: {name}, order {order}.",
            f"Is the {product} covered by a warranty?",
            "What happens if the parcel is lost?",
            f"Summarize my case: {name}, order {order}, {product}, not delivered.",
            "Can I get a refund instead?",
            f"Thank you. Please confirm once more: order {order}, {product}.",
        ]
        chats.append([opening, *follow_ups][:turns])
    return chats

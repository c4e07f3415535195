"""Chat prompts of different lengths for engine tests and benchmarks."""

SYSTEM = (
    "You are a patient support assistant for an online bookshop. Answer in one or two sentences, "
    "be concrete, and never invent order numbers or prices that the customer did not give you."
)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Hi",
    "Explain photosynthesis in two sentences for a ten year old who loves plants and gardens.",
    "List three colors.",
    "My order 4417 has not arrived after two weeks. What can I do?",
    "Tell me a joke about cats.",
    "Who wrote Hamlet, and roughly when was it written? Please also name two other plays by the same author.",
    "Translate 'good morning' into Spanish.",
    "Can I return a book that I already started reading?",
]


def chat_prompts(tokenizer) -> list[str]:
    """Prompts of different lengths; the even ones share a long system prompt (prefix-cache hits)."""
    prompts = []
    for index, question in enumerate(QUESTIONS):
        messages = [{"role": "user", "content": question}]
        if index % 2 == 0:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return prompts

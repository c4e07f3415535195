"""Incremental detokenization with stop strings.

tokenizers' DecodeStream holds back bytes until they form whole UTF-8 characters, so a Chinese character
split across tokens never streams half-made.  When stop strings are set, the last len(longest stop) - 1
characters are held back too, so a stop string is never half-streamed before it is recognised.
"""

from tokenizers.decoders import DecodeStream

from engine.sampling_params import SamplingParams

PROMPT_CONTEXT_TOKENS = 4  # earlier tokens decide how the first new token is spaced


class Detokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self.backend = tokenizer.backend_tokenizer
        self.stream = DecodeStream(
            ids=prompt_token_ids[-PROMPT_CONTEXT_TOKENS:], skip_special_tokens=params.skip_special_tokens
        )
        self.stops = params.stop
        self.holdback = max((len(stop) for stop in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def add(self, token_id: int) -> bool:
        """Append a token's text; True when a stop string appeared (the text is cut before it)."""
        piece = self.stream.step(self.backend, token_id) or ""
        if not piece:
            return False
        searched_from = max(0, len(self.text) - self.holdback)
        self.text += piece
        found = [at for stop in self.stops if (at := self.text.find(stop, searched_from)) >= 0]
        if found:
            self.text = self.text[: min(found)]
        return bool(found)

    def take_new_text(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.sent, len(self.text) - self.holdback)
        new = self.text[self.sent : end]
        self.sent = end
        return new

"""The /v1 request's limits, checked before any work is done."""

import pytest
from pydantic import ValidationError

from chatsvc.api.openai_schemas import ChatCompletionRequest


def test_a_chat_request_holds_at_most_1000_messages():
    message = {"role": "user", "content": "hi"}
    assert len(ChatCompletionRequest.model_validate({"messages": [message] * 1000}).messages) == 1000
    with pytest.raises(ValidationError, match="at most 1000 items"):
        ChatCompletionRequest.model_validate({"messages": [message] * 1001})

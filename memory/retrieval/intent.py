"""What a query asks for, by transparent rules: each decision names the rule that made it.

Order matters: a summary request is recognised first, then a check against earlier turns, then a follow-up
on the latest turns (only when there are recent turns to follow up on); anything else is a knowledge
question.  English and Chinese cue phrases.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from memory.retrieval.tokenize import tokenize


class Intent(StrEnum):
    FOLLOW_UP = "follow_up"  # a detail of the recent turns
    FACT_CHECK = "fact_check"  # something said in earlier turns
    SUMMARY = "summary"  # the whole document or conversation
    KNOWLEDGE = "knowledge"  # a question for the knowledge base


@dataclass(frozen=True)
class Classification:
    intent: Intent
    rule: str


def _cues(*patterns: str) -> re.Pattern:
    return re.compile("|".join(patterns), re.IGNORECASE)


_SUMMARY = _cues(
    r"\bsumm?ar(y|ise|ize)\b",
    r"\bsum (it |this |that )?up\b",
    r"\boverview\b",
    r"\brecap\b",
    r"\btl;?dr\b",
    r"\b(main|key) (points|topics|takeaways|ideas)\b",
    r"\boutline\b",
    r"\bgist\b",
    r"\bin (brief|short|a nutshell)\b",
    r"\bwhat is (this|the) (document|file|report|conversation|chat) about\b",
    r"总结|概括|摘要|概述|要点|归纳",
)
_EARLIER_TURNS = _cues(
    r"\b(you|i|we)\b.*\b(earlier|before|previously|again|at the (start|beginning))\b",
    r"\b(you|i|we) (said|told|mentioned|decided|agreed|discussed|gave)\b",
    r"\bdid (i|you|we) (say|mention|tell|give|agree|decide)\b",
    r"\b(didn't|did not) (we|you|i)\b",
    r"\bremind me\b",
    r"\b(our|the) (first|last|previous|earlier) (conversation|chat|discussion)\b",
    r"\bwhat (you|i) told\b",
    r"\bwhat (was|were) (my|our)\b",
    r"之前|刚才|你说过|我说过|我说|你说|我提到|还记得|我们讨论|我们说",
)
_MORE_ON_THAT = _cues(
    r"\btell me more\b",
    r"\b(more|further) detail",
    r"\belaborate\b",
    r"\bexpand on\b",
    r"\bexplain (that|this|it|the \w+ (point|step|one))\b",
    r"\bwhat do you mean\b",
    r"\b(an )?example of (that|this|it)\b",
    r"\b(the|that) (first|second|third|last|latter|former) (one|point|step|option)\b",
    r"^(go on|continue|and then|why( is that| so)?)\W*$",
    r"什么意思|详细|具体|展开|再说|举个例子|为什么",
)
_REFERS_BACK = _cues(
    r"^(and|but|so|also|then|what about|how about)\b",
    r"\b(it|that|this|those|these|they|them|there|which one|one of them)\b",
)
SHORT_QUERY_TERMS = 4  # content terms; a question this short leans on the turns before it


def classify(query: str, recent_turns: Sequence[str] = ()) -> Classification:
    text = query.strip()
    if _SUMMARY.search(text):
        return Classification(Intent.SUMMARY, "asks for a summary or overview")
    if _EARLIER_TURNS.search(text):
        return Classification(Intent.FACT_CHECK, "refers to what was said in earlier turns")
    if recent_turns and _MORE_ON_THAT.search(text):
        return Classification(Intent.FOLLOW_UP, "asks for more on the latest turns")
    if recent_turns and _REFERS_BACK.search(text):
        terms = set(tokenize(text))
        if len(terms) <= SHORT_QUERY_TERMS:
            return Classification(Intent.FOLLOW_UP, "a short question that refers back")
        if terms & set(tokenize(recent_turns[-1])):
            return Classification(Intent.FOLLOW_UP, "refers back and shares words with the latest turn")
    return Classification(Intent.KNOWLEDGE, "no conversational cue: a knowledge question")

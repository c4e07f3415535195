"""What a query asks for, by transparent rules: each decision names the rule that made it.

Order matters: a summary request is recognised first, then a check against earlier turns, then a follow-up
on the latest turns (only when there are recent turns to follow up on); anything else is a knowledge
question.  English and Chinese cue phrases.  Chinese drops the subject a listener already knows, so a short
Chinese question after some turns ("多久能到账？"), or one that points back (这, 那, 呢), is about them.
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
    r"总结|概括|摘要|概述|归纳|提炼|梳理|捋一下|精简版|整理成|清单",
    r"要点|重点|核心内容|主要内容|大意|压成|讲明白|[一几两](句|段)话",
    r"(讲|说|写)了(些)?(什么|哪些|啥)|哪几(块|部分|方面)",
)
# Chinese: a pronoun and a verb of saying, with a time ("你之前说", "最开始你给的"); 之前 or 刚才 alone
# ("发货之前可以改地址吗？") is not about the conversation.
_EARLIER = "刚才|刚刚|之前|先前|以前|前面|一开始|最开始|开头|起初|第一次|最早"
_SAID = "说|讲|提|问|聊|给|告诉|答|回答|定"
_EARLIER_TURNS = _cues(
    r"\b(you|i|we)\b.*\b(earlier|before|previously|again|at the (start|beginning))\b",
    r"\b(you|i|we) (said|told|mentioned|decided|agreed|discussed|gave)\b",
    r"\bdid (i|you|we) (say|mention|tell|give|agree|decide)\b",
    r"\b(didn't|did not) (we|you|i)\b",
    r"\bremind me\b",
    r"\b(our|the) (first|last|previous|earlier) (conversation|chat|discussion)\b",
    r"\bwhat (you|i) told\b",
    r"\bwhat (was|were) (my|our)\b",
    rf"(你|我|咱们|我们)({_EARLIER})[^，。？！]{{0,3}}({_SAID})",
    rf"({_EARLIER})(你|我|咱们|我们)[^，。？！]{{0,3}}({_SAID})",
    r"(你|我)(说过|提过|提到过|讲过)|还记得|来着|提醒我|再(讲|说)一遍|重复一下",
    r"(给你|给我|帮我查)的|没错吧|没记错|对吧|是吧|对不对",
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
    r"什么意思|详细|具体|展开|再说|举个例子|比如|例如|为什么|然后呢|接下来呢",
    r"还有(别的|其他|什么)|(别的|其他)(办法|方法)",
)
_REFERS_BACK = _cues(
    r"^(and|but|so|also|then|what about|how about)\b",
    r"\b(it|that|this|those|these|they|them|there|which one|one of them)\b",
)
# Chinese points back with 这 / 那 / 哪 and asks on with 呢; after some turns that is enough.
_REFERS_BACK_CHINESE = re.compile(r"^(如果|要是|还有|可是|但是)|[这那它哪]|呢|也一样|一样吗")
SHORT_QUERY_TERMS = 4  # content terms; a question this short leans on the turns before it
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def classify(query: str, recent_turns: Sequence[str] = ()) -> Classification:
    text = query.strip()
    if _SUMMARY.search(text):
        return Classification(Intent.SUMMARY, "asks for a summary or overview")
    if _EARLIER_TURNS.search(text):
        return Classification(Intent.FACT_CHECK, "refers to what was said in earlier turns")
    if recent_turns and _MORE_ON_THAT.search(text):
        return Classification(Intent.FOLLOW_UP, "asks for more on the latest turns")
    if recent_turns:
        terms = _content_terms(text)
        short = len(terms) <= SHORT_QUERY_TERMS
        if _HAN.search(text) and (short or _REFERS_BACK_CHINESE.search(text)):
            return Classification(Intent.FOLLOW_UP, "a Chinese question that is short or points back")
        if _REFERS_BACK.search(text):
            if short:
                return Classification(Intent.FOLLOW_UP, "a short question that refers back")
            if terms & _content_terms(recent_turns[-1]):
                return Classification(Intent.FOLLOW_UP, "refers back and shares words with the latest turn")
    return Classification(Intent.KNOWLEDGE, "no conversational cue: a knowledge question")


def _content_terms(text: str) -> set[str]:
    """Words and CJK bigrams: a single Chinese character (的, 吗) says little about what text is about."""
    return {term for term in tokenize(text) if not (len(term) == 1 and _HAN.match(term))}

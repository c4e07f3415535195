"""Text -> index terms for BM25: lower-cased, stemmed English words without stop words, CJK characters.

A `\\w+` tokenizer would make a whole Chinese sentence one term, so a run of CJK characters becomes its
characters and its overlapping bigrams.  Measured on our Chinese dev questions (README, Retrieval), this
beat a word segmenter (jieba's Rust port, rjieba), alone or beside bigrams: a paraphrase shares characters
with its paragraph more often than whole words (没电 / 电量), and the bigrams keep word order.
"""

import re
import unicodedata
from collections import Counter
from functools import lru_cache

import snowballstemmer

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TERM_RUNS = re.compile(rf"(?P<cjk>[{_CJK}]+)|(?P<word>(?:(?![{_CJK}])[^\W_])+)")

# Function words that carry no topic; dropping them keeps postings short and scores on content words.
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not of off on once only or other our ours ourselves out over own same she should so some
    such than that the their theirs them themselves then there these they this those through to too under
    until up very was we were what when where which while who whom why will with would you your yours
    yourself yourselves""".split()  # noqa: SIM905 (a word list reads better as text)
)

_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    return _stemmer.stemWord(word)


def _cjk_terms(run: str) -> list[str]:
    return [*run, *(run[i : i + 2] for i in range(len(run) - 1))]


def tokenize(text: str) -> list[str]:
    """Index terms of `text`, in order, repeats kept (BM25 counts them)."""
    terms: list[str] = []
    for match in _TERM_RUNS.finditer(unicodedata.normalize("NFKC", text).lower()):
        if match.group("cjk"):
            terms.extend(_cjk_terms(match.group("cjk")))
        elif match.group("word") not in STOP_WORDS:
            terms.append(_stem(match.group("word")))
    return terms


def term_counts(text: str) -> Counter[str]:
    return Counter(tokenize(text))

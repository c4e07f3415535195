"""Which encoder and which Chinese terms: the comparisons behind the retriever's choices.

    .venv/bin/python -m bench.multilingual

Both encoders on the English sets (FAQ, HotpotQA) and on our Chinese knowledge base (dev and holdout
questions, in Chinese and in English); then, on the Chinese dev questions with e5, BM25 over each way of
cutting Chinese into terms (character bigrams, characters and bigrams, rjieba's words).  Prints Markdown
tables (the README's figures) and writes bench/results/multilingual.json.
"""

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import rjieba

from bench.machine import describe
from bench.retrieval import (
    CachingEncoder,
    Corpus,
    load_chinese,
    load_faq,
    load_hotpot,
    new_retriever,
    progress,
    ranking_metrics,
    search_ranking,
)
from memory.retrieval import Mode, store, tokenize
from memory.retrieval.embeddings import ENCODERS

RESULTS = Path(__file__).parent / "results" / "multilingual.json"
ENGLISH_SETS = {"FAQ": ["paraphrases", "paraphrases_dev", "paraphrases_holdout"], "HotpotQA": ["questions"]}


def _bigrams(run: str) -> list[str]:
    return [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]


CJK_TERMS = {
    "bigrams (before)": _bigrams,
    "characters + bigrams (ours)": tokenize._cjk_terms,
    "rjieba words": lambda run: rjieba.cut(run),
    "rjieba words + bigrams": lambda run: rjieba.cut(run) + _bigrams(run),
    "rjieba search words + characters": lambda run: rjieba.cut_for_search(run) + list(run),
}


@contextlib.contextmanager
def cjk_terms(split):
    """Swaps how tokenize cuts a CJK run into terms, for the indexes built inside."""
    saved = tokenize._cjk_terms
    tokenize._cjk_terms = split
    try:
        yield
    finally:
        tokenize._cjk_terms = saved


def metrics(retriever, corpus: Corpus, set_name: str, mode: Mode) -> dict[str, float]:
    queries = corpus.query_sets[set_name]
    rankings = [search_ranking(retriever, corpus, query, mode) for query in queries]
    return ranking_metrics(rankings, queries) | {"queries": len(queries)}


def corpora_with(folder: Path, encoder: str, loaders) -> tuple:
    """A retriever whose collections all use `encoder`, and the corpora loaded into it."""
    retriever = new_retriever(folder, len, [CachingEncoder(make()) for make in ENCODERS.values()])
    with retriever.engine.begin() as conn:
        for collection in ("faq", "hotpot", "zh"):
            store.set_collection_encoder(conn, collection, encoder)
    return retriever, [load(retriever) for load in loaders]


def encoder_comparison() -> dict:
    found = {}
    for encoder in ENCODERS:
        progress(f"indexing every set with {encoder}")
        with tempfile.TemporaryDirectory() as folder:
            retriever, corpora = corpora_with(Path(folder), encoder, (load_faq, load_hotpot, load_chinese))
            for corpus in corpora:
                sets = ENGLISH_SETS.get(corpus.name, list(corpus.query_sets))
                for set_name in sets:
                    for mode in (Mode.DENSE, Mode.HYBRID):
                        key = f"{corpus.name} {set_name} | {mode.value} | {encoder}"
                        found[key] = metrics(retriever, corpus, set_name, mode)
    return found


def segmentation_comparison() -> dict:
    found = {}
    for name, split in CJK_TERMS.items():
        progress(f"Chinese terms: {name}")
        with cjk_terms(split), tempfile.TemporaryDirectory() as folder:
            retriever, (corpus,) = corpora_with(Path(folder), "multilingual-e5-small", (load_chinese,))
            for mode in (Mode.BM25, Mode.HYBRID):
                found[f"{name} | {mode.value}"] = metrics(retriever, corpus, "dev (zh)", mode)
    return found


def print_table(title: str, rows: dict) -> None:
    print(f"\n### {title}\n\n| set \\| mode \\| variant | R@1 | R@5 | MRR |\n|---|---|---|---|")
    for key, m in rows.items():
        print(f"| {key} | {m['R@1']:.3f} | {m['R@5']:.3f} | {m['MRR']:.3f} |")


def main() -> None:
    report = {"machine": describe(None)}
    report["encoders"] = encoder_comparison()
    report["chinese_terms"] = segmentation_comparison()
    RESULTS.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print_table("Encoders", report["encoders"])
    print_table("Chinese terms (dev questions in Chinese, e5)", report["chinese_terms"])
    print("\nwritten to", RESULTS, file=sys.stderr)


if __name__ == "__main__":
    main()

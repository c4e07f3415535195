"""Measure retrieval on your own data.

    python -m memory.retriever eval --corpus CORPUS.jsonl --queries QUERIES.jsonl --k 5

Corpus lines are {"id", "text"}, query lines {"query", "gold_ids": [...]}.  Each corpus line becomes a
document in a temporary database; a query is answered by the ids of its k best documents.  Prints one JSON
object: recall@1, recall@k, MRR (over the top k) and p50/p95 query latency in milliseconds.
"""

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine

from memory.retrieval.hybrid import Mode
from memory.retrieval.retriever import MAX_K, Retriever
from memory.retrieval.tables import metadata


@dataclass
class LabelledQuery:
    query: str
    gold_ids: set[str]


def read_jsonl(path: Path, fields: tuple[str, ...]) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} line {number}: not JSON ({error})") from None
        if not isinstance(record, dict) or any(field not in record for field in fields):
            raise ValueError(f"{path} line {number}: needs the fields {', '.join(fields)}")
        records.append(record)
    if not records:
        raise ValueError(f"{path} has no records")
    return records


def ranked_names(
    retriever: Retriever, query: str, collections: Sequence[str], k: int, mode: Mode
) -> list[str]:
    """Names of the k best documents; a document's later paragraphs don't take a second rank."""
    names: list[str] = []
    for hit in retriever.search(query, collections, k=min(MAX_K, 4 * k), mode=mode):
        if hit.document_name not in names:
            names.append(hit.document_name)
    return names[:k]


def ranking_metrics(rankings: Sequence[Sequence[str]], golds: Sequence[set[str]], k: int) -> dict[str, float]:
    first_gold = [
        next((rank for rank, name in enumerate(ranking[:k], start=1) if name in gold), None)
        for ranking, gold in zip(rankings, golds, strict=True)
    ]
    return {
        "recall@1": float(np.mean([rank == 1 for rank in first_gold])),
        f"recall@{k}": float(np.mean([rank is not None for rank in first_gold])),
        "mrr": float(np.mean([1 / rank if rank else 0.0 for rank in first_gold])),
    }


def evaluate(
    retriever: Retriever, collections: Sequence[str], queries: Sequence[LabelledQuery], k: int, mode: Mode
) -> dict[str, float]:
    rankings, latencies = [], []
    ranked_names(retriever, queries[0].query, collections, k, mode)  # warm-up: first calls are slow
    for query in queries:
        start = time.perf_counter()
        rankings.append(ranked_names(retriever, query.query, collections, k, mode))
        latencies.append((time.perf_counter() - start) * 1000)
    metrics = ranking_metrics(rankings, [query.gold_ids for query in queries], k)
    metrics |= {"p50_ms": float(np.percentile(latencies, 50)), "p95_ms": float(np.percentile(latencies, 95))}
    return metrics


def run(corpus_path: Path, queries_path: Path, k: int, mode: Mode) -> dict:
    corpus = read_jsonl(corpus_path, ("id", "text"))
    queries = [
        LabelledQuery(str(record["query"]), {str(gold) for gold in record["gold_ids"]})
        for record in read_jsonl(queries_path, ("query", "gold_ids"))
    ]
    with tempfile.TemporaryDirectory() as folder:
        engine = create_engine(f"sqlite:///{Path(folder) / 'eval.sqlite'}")
        metadata.create_all(engine)
        # Only search is measured, so no context window is built and characters stand in for tokens.
        retriever = Retriever(engine, Path(folder), count_tokens=len)
        start = time.perf_counter()
        for record in corpus:
            retriever.add_document("eval", str(record["id"]), str(record["text"]), kind="text")
        index_seconds = time.perf_counter() - start
        metrics = evaluate(retriever, ["eval"], queries, k, mode)
        engine.dispose()
    return (
        {"mode": mode.value, "k": k, "documents": len(corpus), "queries": len(queries)}
        | metrics
        | {"index_seconds": round(index_seconds, 2)}
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m memory.retriever", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("eval", help="index a corpus, run labelled queries, print metrics as JSON")
    command.add_argument("--corpus", type=Path, required=True, help='JSONL lines {"id", "text"}')
    command.add_argument("--queries", type=Path, required=True, help='JSONL lines {"query", "gold_ids"}')
    command.add_argument("--k", type=int, default=5, help="documents per query (default 5)")
    command.add_argument("--mode", choices=[mode.value for mode in Mode], default=Mode.HYBRID.value)
    args = parser.parse_args(argv)
    if not 1 <= args.k <= MAX_K // 4:
        parser.error(f"--k must be between 1 and {MAX_K // 4}")
    try:
        result = run(args.corpus, args.queries, args.k, Mode(args.mode))
    except (OSError, ValueError) as error:
        parser.exit(2, f"error: {error}\n")
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")

import json

import pytest

from memory.retrieval.evaluate import main


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(record, ensure_ascii=False) for record in records) + "\n")
    return path


def test_eval_prints_recall_mrr_and_latency(tmp_path, capsys):
    corpus = write_jsonl(
        tmp_path / "corpus.jsonl",
        [
            {"id": "permit", "text": "A building permit takes ten weeks to process."},
            {"id": "heat", "text": "A heat pump cuts heating bills in winter."},
            {"id": "radon", "text": "Radon must be measured over two winter months."},
            {"id": "zh", "text": "建筑许可证需要十周。"},
        ],
    )
    queries = write_jsonl(
        tmp_path / "queries.jsonl",
        [
            {"query": "how long is permit processing", "gold_ids": ["permit"]},
            {"query": "cheaper ways to keep my house warm", "gold_ids": ["heat"]},
            {"query": "许可证多久", "gold_ids": ["zh"]},
            {"query": "unanswerable question about pianos", "gold_ids": ["missing"]},
        ],
    )
    main(["eval", "--corpus", str(corpus), "--queries", str(queries), "--k", "2"])
    result = json.loads(capsys.readouterr().out)
    assert result["recall@1"] == result["recall@2"] == result["mrr"] == 0.75
    assert (result["documents"], result["queries"], result["mode"]) == (4, 4, "hybrid")
    assert 0 < result["p50_ms"] <= result["p95_ms"]


def test_eval_explains_a_malformed_file(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "no id"}])
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--corpus", str(corpus), "--queries", str(corpus)])
    assert exit_info.value.code == 2
    assert "corpus.jsonl line 1: needs the fields id, text" in capsys.readouterr().err

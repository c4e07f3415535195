"""The retrieval command line: python -m memory.retriever eval --corpus C.jsonl --queries Q.jsonl --k 5"""

from memory.retrieval.evaluate import main

if __name__ == "__main__":
    main()

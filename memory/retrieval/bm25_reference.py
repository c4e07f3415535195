"""The baseline and oracle for our inverted index: rank_bm25's Okapi BM25, which scores every document for
every query, with the idf our index uses (Lucene's, never negative), so both give the same scores and
differ only in speed.  Used by the tests (as the oracle) and bench/retrieval.py (as the baseline)."""

import math

from rank_bm25 import BM25Okapi


class LuceneIdfBM25(BM25Okapi):
    def _calc_idf(self, nd):
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))

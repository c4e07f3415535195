"""What the tests and the benchmarks share: the oracle (transformers' own greedy generation), tiny random
models of each supported family, and chat prompts.  Like transformers' testing_utils, it ships with the
package so that both can import it; the engine itself never does."""

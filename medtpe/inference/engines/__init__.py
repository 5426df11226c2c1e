"""The engines behind one interface (`protocol`: token ids in, token ids out, one error type):
vLLM in this process (`vllm_engine`), one vLLM engine core fed by several API processes
(`shared`), and the one fake, answering at once, for tests and benchmarks (`instant`).
`factories` gives the program its real engine; vLLM is imported only when one starts."""

__all__ = ["factories", "instant", "protocol", "shared", "vllm_engine"]

"""The front end: prompts in, cumulative request outputs out (``LLM``, ``LLMEngine``, input and output processors)."""

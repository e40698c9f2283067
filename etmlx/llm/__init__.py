"""Language models: a Hugging Face or GGUF checkpoint to a ``.pte`` in ExecuTorch's
LLM-runner convention (``export``, ``causal_lm``, the caches it traces), and text from it
(``generation``, ``chat``, ``prompt_cache``, the ``export-llm``/``generate``/``chat``
commands in ``cli``). Importing a module here may import transformers; ``import etmlx``
does not."""

"""``etmlx serve``: an exported language model behind OpenAI's HTTP API (``app.py``), one
request at a time on its KV cache (``engine.py``), with prompt caches kept across requests
(``saved_prompts.py``), tool calls parsed (``tool_calls.py``) and JSON replies or tool
calls enforced by a grammar (``grammar.py``)."""

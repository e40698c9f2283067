"""Vision-language models in ExecuTorch's multimodal convention: a causal LM's methods plus
``vision_encoder`` and ``token_embedding`` and a ``text_decoder`` on embeddings (``export``),
and prompts whose image placeholders take the image's features (``images``)."""

"""Optional integrations with other libraries, each imported only when used (this package
imports none of them):

* :mod:`triton_workshop.integrations.transformers` - an attention implementation for Hugging Face
  transformers (``attn_implementation="triton_workshop"``) and ``patch_model(model)``, which
  patches a GPT-2 or Llama-style model in one call. Needs ``pip install transformers``.
"""

__all__: list[str] = []

"""provision: fleet provisioning for GPU inference servers (SGLang and vLLM), over SSH."""

__version__ = "0.1.0"

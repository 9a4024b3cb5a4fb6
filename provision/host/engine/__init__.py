"""The PATCH engine: AST edits of an inference engine's files (delegation, mapping entries, replacements),
the audit, the overlay rendering and preflight's readers.  STDLIB ONLY, pure.

Not host/inference/, the INFERENCE engines (the servers provision launches: SGLang, vLLM next).
"""

"""Pure log handling: the SGLang load-log parser and secret redaction."""

"""GGUF in, output directory out, and back: the GGUF reader, the writer (`convert`), export
and verify against the source (`rebuild`), the engine files (config.json, tokenizer) and
`inspect` (`describe`). Needs neither torch nor a GPU."""

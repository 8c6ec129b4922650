"""Weight loaders: HF safetensors folders (`hf`), GGUF files (`gguf`), shared checks (`build`)."""

"""Weight loaders: HF safetensors folders (`hf`), GGUF files (`gguf`), shared checks (`build`); and
the way back, decoder params to an HF folder (`export`)."""

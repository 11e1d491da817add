"""llama.cpp serving: GGUF models in process (llama-cpp-python), continuously batched."""

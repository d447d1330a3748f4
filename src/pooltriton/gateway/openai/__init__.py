"""OpenAI's and vLLM's dialect: /v1/embeddings, /classify, /score, /rerank, /pooling, /tokenize, /detokenize."""

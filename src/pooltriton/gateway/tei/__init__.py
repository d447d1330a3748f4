"""text-embeddings-inference's dialect: its routes, bodies, answers and error shape."""

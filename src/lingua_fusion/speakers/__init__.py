"""Who spoke: speaker labels from voice embeddings (the pure clusterer; the embeddings are models/speaker.py)."""

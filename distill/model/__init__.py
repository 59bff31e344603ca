"""Models: the resolver of model names, and the students' model code (unpadding, the segment-cosine head,
embeddings)."""
